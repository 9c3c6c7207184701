"""Speed of ``perfsim plan``: seconds to plan a 64-GPU and a 1024-GPU cluster, one process.

    python benchmarks/bench_plan.py [--only 64|1024|llama] [--top 5]

* 64 GPUs: GPT2-1.5B (the embedded V100 profile) on 16 nodes x 4 GPUs at 1 Gbps,
  global batch 64 -- the default search space;
* 1024 GPUs: Llama-3-8B (tests/data/llama-3-8b-config.json) on 128 nodes x 8 H100 at
  100 Gbps, global batch 1024, sequence 8192 -- the default space with the H100 defaults
  (bf16, NVLink4; ZeRO, recomputation, attention, sequence parallelism searched);
* llama: the issue's Llama-3-8B case, 2 nodes x 8 H100 at 100 Gbps, global batch 64.

Prints per case the candidates, how many were simulated, pruned and rejected, the wall
and CPU seconds of this single process, the machine's load average (the figures are
only comparable at rest: ``cat /proc/loadavg``) and the winner. The issue's targets on
2 cores: 64 GPUs <= 10 s, 1024 GPUs <= 60 s, the Llama case <= 30 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from perfsim.plan import plan  # noqa: E402

LLAMA = os.path.join(HERE, "..", "tests", "data", "llama-3-8b-config.json")
CASES = {
    "64": dict(model="gpt2-xl", nodes=16, gpus_per_node=4, global_batch=64, bandwidth="1Gbps"),
    "1024": dict(model=LLAMA, seq_len=8192, gpu="h100", nodes=128, gpus_per_node=8, global_batch=1024, bandwidth="100Gbps"),
    "llama": dict(model=LLAMA, seq_len=8192, gpu="h100", nodes=2, gpus_per_node=8, global_batch=64, bandwidth="100Gbps"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--only", choices=tuple(CASES), action="append")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    for name in args.only or CASES:
        kw = CASES[name]
        load = os.getloadavg()[0]
        t, c = time.perf_counter(), time.process_time()
        res = plan(top=args.top, **kw)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        best = res.ranked[0]
        p = best.params
        gpus = kw["nodes"] * kw["gpus_per_node"]
        print(f"{gpus} GPUs ({name}): {res.total} candidates, {res.evaluated} simulated, {res.pruned} pruned, "
              f"{res.rejected} rejected; wall {wall:.1f} s, cpu {cpu:.1f} s (load {load:.1f} at start, "
              f"{os.getloadavg()[0]:.1f} at end)")
        print(f"  best: TP {p.get('tp', 1)} x PP {p['pp']} x DP {p['dp']}, {best.summary['schedule']}, "
              f"micro-batch {p['micro_batch']}, {p['compress']} + {p['grad_compress']}: "
              f"{best.summary['iteration_s']:.3f} s/iteration")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
