"""Proof of ``perfsim plan``: its top choice against two runner-ups, measured for real.

    sudo python benchmarks/plan_proof.py [--bandwidth 100Mbps] [--steps 30] [--csv out.csv]

Plans gpt2-tiny on this machine's two CPU ranks (2 "nodes" of one device, the profile
``traces/cpu-2core.json``) over an emulated link, global batch 32, then trains the
winner, the best configuration with another pipeline compression and the best with
another parallelism with ``perfsim run --emulate-bandwidth`` (root: network
namespaces + tc) and prints predicted and measured iteration time, time per unit of
progress (iteration x steps ratio) and whether the measured order is the predicted
one. Run it on a quiet machine: the three runs share its two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from perfsim.plan import SearchSpace, plan, run_command  # noqa: E402

PROFILE = os.path.join(os.path.dirname(__file__), "..", "traces", "cpu-2core.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--bandwidth", default="100Mbps")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--profile", default=PROFILE, help="profile calibrated on THIS machine (default cpu-2core)")
    args = ap.parse_args()
    res = plan(model="gpt2-tiny", nodes=2, gpus_per_node=1, global_batch=32, profile=args.profile,
               bandwidth=args.bandwidth, top=1000,
               space=SearchSpace(micro_batch=(4, 8), compress=("fp32", "directq:fw4bw8", "aqsgd:fw3bw6"),
                                 grad_compress=("none", "qsgd-maxnorm:4")))
    print("\n".join(res.notes))
    # the winner, the best with another pipeline compression, the best with another
    # parallelism: runner-ups that differ in what the plan decides
    best = res.ranked[0]
    other_comp = next(c for c in res.ranked if c.params["compress"] != best.params["compress"])
    other_par = next(c for c in res.ranked
                     if (c.params["pp"], c.params["dp"]) != (best.params["pp"], best.params["dp"]))
    chosen = [best, *sorted({id(c): c for c in (other_comp, other_par)}.values(), key=lambda c: c.score())]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(chosen, 1):
            cmd = run_command(c.params) + f" --steps {args.steps} --no-progress --out {tmp}/run{i}"
            proc = subprocess.run([sys.executable, "-m", "perfsim", *shlex.split(cmd)[1:]],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"run {i} failed: {proc.stderr.strip()[-300:]}")
                return 1
            with open(f"{tmp}/run{i}/result.json") as f:
                measured = json.load(f)["summary"]["iteration_s"]
            ratio = c.steps_ratio or 1.0
            rows.append(dict(rank=i, config=cmd.split(" --steps")[0].replace("perfsim run ", ""),
                             predicted_s=c.summary["iteration_s"], measured_s=measured,
                             predicted_score=c.summary["iteration_s"] * ratio, measured_score=measured * ratio))
    print(f"{'#':>2} {'predicted':>10} {'measured':>10} {'error':>7}  configuration")
    for r in rows:
        err = r["predicted_s"] / r["measured_s"] - 1
        print(f"{r['rank']:>2} {r['predicted_s'] * 1e3:8.1f}ms {r['measured_s'] * 1e3:8.1f}ms {err:+7.1%}  {r['config']}")
    order = [r["rank"] for r in sorted(rows, key=lambda r: r["measured_score"])]
    print(f"measured order (by iteration x steps ratio): {order} -> ranking "
          f"{'holds' if order == sorted(order) else 'does NOT hold'}")
    if args.csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
