"""Measure the loss curves behind ``perfsim plan``'s steps-to-loss ratios.

    python scripts/convergence_curves.py [--model gpt2-tiny] [--steps 300] [--out FILE]
    python scripts/convergence_curves.py --model digits-mlp --specs aqsgd:fw4bw8,none  # re-measure some
    python scripts/convergence_curves.py --seeds 5   # five seeds per spec: ratios with intervals

Trains the model with ``perfsim run`` once per compressor -- pipeline compressors on
a 2-stage pipeline, gradient compressors on 2 data-parallel replicas -- with the
same seed, data and learning rate (``--seeds N``: seeds 0..N-1 each, a list of curves
per spec, from which the plan takes 95 % intervals), and writes the curves in the format of
:mod:`perfsim.convergence` (default ``perfsim/data/convergence/<model>.json``).
Runs go to a temporary folder; the output is written atomically at the end.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from perfsim.plan import GRADIENT_COMPRESSION, PIPELINE_COMPRESSION  # noqa: E402
from perfsim.result import atomic_write_text  # noqa: E402


def curve(run_dir: str) -> list[list[float]]:
    with open(os.path.join(run_dir, "losses.csv")) as f:
        return [[int(r["step"]), float(r["loss"])] for r in csv.DictReader(f)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", default="1e-3")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per spec (0..N-1; default 1)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", choices=("pipeline", "gradient"), default=None,
                    help="measure only these curves and keep the others of an existing file")
    ap.add_argument("--specs", default=None,
                    help="comma list: measure only these specs and keep the other curves of an existing file")
    ap.add_argument("--hang-timeout", default="300s",
                    help="perfsim run --hang-timeout (default 300s: a loaded machine stalls ranks)")
    args = ap.parse_args()
    specs = set(args.specs.split(",")) if args.specs else None
    out = args.out or os.path.join(os.path.dirname(__file__), "..", "perfsim", "data", "convergence",
                                   f"{args.model}.json")
    data = {"model": args.model, "smoothing": 10, "pipeline": {}, "gradient": {}}
    if (args.only or specs) and os.path.exists(out):
        with open(out) as f:
            data.update({k: v for k, v in json.load(f).items() if k in ("pipeline", "gradient", "source")})
        if args.only and not specs:
            data[args.only] = {}
    if args.seeds < 1:
        ap.error("--seeds: at least 1")
    # the job pinned flag by flag (not left to run's defaults, which may change)
    common = ["--model", args.model, "--steps", str(args.steps), "--lr", args.lr, "--optimizer", "adamw",
              "--micro-batch", "8", "--macro-batch", "32",
              "--no-progress", "--hang-timeout", args.hang_timeout, "--timeout", args.hang_timeout]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [("pipeline", c, ["--pp", "2", "--dp", "1", "--schedule", "1f1b", "--compress", c]) for c in PIPELINE_COMPRESSION]
        jobs += [("gradient", g, ["--pp", "1", "--dp", "2", "--grad-compress", g]) for g in GRADIENT_COMPRESSION]
        for part, spec, flags in jobs:
            if (args.only and part != args.only) or (specs and spec not in specs):
                continue
            curves = []
            for seed in range(args.seeds):
                run_dir = os.path.join(tmp, f"{part}-{spec.replace(':', '_')}-{seed}")
                cmd = [sys.executable, "-m", "perfsim", "run", *common, "--seed", str(seed), *flags,
                       "--out", run_dir]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{part} {spec} seed {seed}: failed ({proc.stderr.strip().splitlines()[-1:]})",
                          file=sys.stderr)
                    break
                curves.append(curve(run_dir))
                print(f"{part:8} {spec:18} seed {seed} final loss {curves[-1][-1][1]:.4f}", flush=True)
            if len(curves) == args.seeds:  # every seed or none: seeds pair with the reference's
                data[part][spec] = curves[0] if args.seeds == 1 else curves
    seeds = "--seed 0" if args.seeds == 1 else f"--seed 0..{args.seeds - 1}"
    source = (f"perfsim run --steps {args.steps} --lr {args.lr} --optimizer adamw --micro-batch 8 "
              f"--macro-batch 32 {seeds} (pipeline: --pp 2 --schedule 1f1b; "
              f"gradient: --dp 2); {datetime.date.today().isoformat()}")
    if specs and data.get("source") and data["source"] != source:
        source = f"{data['source']}; {','.join(sorted(specs))}: {source}"
    data["source"] = source
    atomic_write_text(out, json.dumps(data, indent=0) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
