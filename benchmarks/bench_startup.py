"""Start-up cost of the command line and of a sweep's process pool.

Prints, each as the median of ``--repeats`` fresh processes:

* ``perfsim predict`` (the embedded default) end to end, and ``perfsim --version``
  (interpreter + perfsim import);
* whether torch / numpy / triton were imported by predict (``-X importtime``);
* a sweep of 8 default-like configurations in-process vs on a 2-worker pool, and
  the pool's start-up cost (what :data:`perfsim.analysis.sweep.POOL_STARTUP_S` is
  set from).

The machine's load average is printed first: on a shared machine the figures
are disturbed by other jobs (they only get slower). Processes run with byte-code
caching on (``PYTHONPYCACHEPREFIX`` in a temp folder, warmed once), as after a
``pip install``; where the environment sets ``PYTHONDONTWRITEBYTECODE`` every
start also compiles every module, which is printed separately.

    python benchmarks/bench_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


CACHED = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
CACHED["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "perfsim-bench-pycache")


def wall(argv: list[str], repeats: int, env=None) -> str:
    """Median wall time and median CPU time (user + system) of fresh processes; on a
    loaded machine the CPU time is the closer estimate of the unloaded wall time."""
    env = CACHED if env is None else env
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    times, cpu = [], []
    for _ in range(repeats):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return f"{statistics.median(times):.3f} s wall, {statistics.median(cpu):.3f} s CPU"


SWEEP = """
import sys, time
from perfsim.analysis.sweep import run_sweep
grid = {{"model": "gpt2-tiny", "pp": 2, "macro_batch": 8,
        "bandwidth": ["10Gbps", "1Gbps", "100Mbps", "10Mbps"], "compress": ["fp32", "aqsgd:fw3bw6"]}}
t0 = time.perf_counter()
run_sweep(grid, None, jobs={jobs}, pool={pool}, progress=False)
print(time.perf_counter() - t0)
"""


def sweep_s(jobs: int, pool: bool, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-c", SWEEP.format(jobs=jobs, pool=pool)], check=True,
                              capture_output=True, text=True, env=CACHED)
        out.append(float(proc.stdout.strip().splitlines()[-1]))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
          "(figures on a loaded machine are upper bounds)")
    exe = [sys.executable, "-m", "perfsim"]
    print(f"perfsim --version            {wall([*exe, '--version'], args.repeats)}")
    print(f"perfsim predict (default)    {wall([*exe, 'predict'], args.repeats)}")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print(f"  without byte-code caching  {wall([*exe, 'predict'], args.repeats, os.environ)} "
              "(PYTHONDONTWRITEBYTECODE is set here)")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "perfsim", "predict"],
                          capture_output=True, text=True, check=True)
    mods = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    print("predict imports " + ", ".join(f"{m}: {'yes' if m in mods else 'no'}"
                                         for m in ("torch", "numpy", "triton", "pandas")))
    here = sweep_s(1, False, args.repeats)
    pooled = sweep_s(2, True, args.repeats)
    print(f"sweep of 8 configurations    in-process {here:.3f} s, 2-worker pool {pooled:.3f} s")
    per_config = here / 8
    startup = pooled - 8 * per_config / 2  # pool time = start-up + 8 configurations on 2 workers
    print(f"pool start-up cost           {max(startup, 0):.3f} s "
          f"(per configuration in-process: {per_config * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
