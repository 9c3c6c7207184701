"""Speed of ``perfsim plan``: configurations per minute on a 64-GPU cluster.

    python benchmarks/bench_plan.py [--jobs 1] [--top 5]

Plans GPT2-1.5B (the embedded V100 profile) on 16 nodes x 4 GPUs at 1 Gbps, global
batch 64, over the default search space, and prints the candidates, how many were
simulated and pruned, and the rates: candidates decided per minute (simulated or
pruned by a bound) and simulations per minute. The issue's target: >= 1,000
configurations per minute on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from perfsim.plan import plan  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    t = time.perf_counter()
    res = plan(model="gpt2-xl", nodes=16, gpus_per_node=4, global_batch=64, bandwidth="1Gbps",
               top=args.top, jobs=args.jobs)
    wall = time.perf_counter() - t
    print(f"candidates {res.total}, simulated {res.evaluated}, pruned {res.pruned}, rejected {res.rejected}")
    print(f"wall {wall:.1f} s: {60 * res.total / wall:.0f} candidates/min, "
          f"{60 * res.evaluated / wall:.0f} simulations/min (jobs={args.jobs}, load {os.getloadavg()[0]:.1f})")
    print(f"best: {res.rows()[0]['pp']} stages x {res.rows()[0]['dp']} replicas, "
          f"{res.rows()[0]['compress']} + {res.rows()[0]['grad_compress']}, "
          f"{res.rows()[0]['iteration_s']:.3f} s/iteration")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
