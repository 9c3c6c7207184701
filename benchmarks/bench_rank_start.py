"""Rank start-up: a new interpreter per rank (``PERFSIM_RANK_START=spawn``) vs a fork
of the rank zygote (``fork``, the default; :mod:`perfsim.runtime.rank_start`).

Prints, both ways:

* per rank, the CPU-s spent before training: ``spawn``: a fresh interpreter importing
  what a rank imports before its first step (torch, torch._dynamo -- torch.optim loads
  it --, perfsim.runtime.worker); ``fork``: what the forked rank reports in its log;
* ``--runs`` digits-mlp pp2 runs of 1 step in one process through ``perfsim.runtime.run``
  (as the tests do): CPU-s of the whole process tree and wall;
* ``perfsim run --model gpt2-tiny --pp 2 --steps 5`` from a shell: the same two figures.

CPU-s count every process of the tree -- launcher, zygote, ranks --: this script makes
itself their child subreaper (``PR_SET_CHILD_SUBREAPER``, prctl(2)), so a zygote that
outlives its launcher is reaped and counted here too. The load average is printed first:
on a shared machine wall times only get slower; CPU-s are the steadier figure.

    python benchmarks/bench_rank_start.py [--runs 3] [--repeats 1]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

PY = sys.executable
IMPORTS = "import torch, torch._dynamo, perfsim.runtime.worker"
API_RUNS = """
import sys
from perfsim.runtime import run
for i in range({runs}):
    run(model="digits-mlp", pp=2, micro_batch=4, macro_batch=16, dataset_limit=32, steps=1,
        schedule="1f1b", timeout="60s", out=sys.argv[1] + f"/run{{i}}")
"""
FORKED = re.compile(r"perfsim: rank pid \d+ .* started in ([0-9.]+) CPU-s")


def tree(argv: list[str], method: str) -> tuple[float, float]:
    """(CPU-s of the process tree of ``argv``, wall s), ranks started by ``method``."""
    env = dict(os.environ, PERFSIM_RANK_START=method)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    while True:  # orphans (a zygote outliving its launcher) are ours to reap
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            break
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, wall


def median_tree(argv: list[str], method: str, repeats: int) -> str:
    got = [tree(argv, method) for _ in range(repeats)]
    return (f"{statistics.median(c for c, _ in got):6.2f} CPU-s  "
            f"{statistics.median(w for _, w in got):6.2f} s wall")


def forked_start_cpu(folder: str) -> list[float]:
    """What each forked rank of ``folder``'s runs reported as its start-up CPU-s."""
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            if re.fullmatch(r"rank\d+\.log", name):
                with open(os.path.join(root, name)) as f:
                    m = FORKED.match(f.readline())
                if m:
                    found.append(float(m.group(1)))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--runs", type=int, default=3, help="runs in one process (default 3)")
    ap.add_argument("--repeats", type=int, default=1, help="medians of this many repeats (default 1)")
    args = ap.parse_args()
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    spawn_start = [tree([PY, "-c", IMPORTS], "spawn")[0] for _ in range(max(3, args.repeats))]
    with tempfile.TemporaryDirectory(prefix="bench-rank-start-") as tmp:
        rows = []
        for method in ("spawn", "fork"):
            out = os.path.join(tmp, method)
            api = median_tree([PY, "-c", API_RUNS.format(runs=args.runs), out], method, 1)
            cli = median_tree([PY, "-m", "perfsim", "run", "--model", "gpt2-tiny", "--pp", "2", "--steps", "5",
                               "--no-progress", "--overwrite", "--out", os.path.join(tmp, f"cli-{method}")],
                              method, args.repeats)
            rows.append((method, api, cli))
        forked = forked_start_cpu(os.path.join(tmp, "fork"))
    print(f"rank start-up, per rank: spawn {statistics.median(spawn_start):.3f} CPU-s "
          f"(a fresh `python -c '{IMPORTS}'`); fork {statistics.median(forked):.3f} CPU-s "
          f"(median of {len(forked)} forked ranks' own report)")
    for method, api, cli in rows:
        print(f"{method:5s}  {args.runs} x digits-mlp pp2 1 step in one process: {api}   "
              f"perfsim run gpt2-tiny pp2 5 steps: {cli}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
