"""How long `perfsim calibrate --quick` takes (target: <= 60 s on the 2-core machine).

    python benchmarks/bench_calibrate.py [--runs N] [-- extra calibrate flags]

Runs the command as a user would (a subprocess, default flags), and prints its
wall time, its CPU time (user + system, from the children's rusage: what the
command itself consumed, which load from other processes does not inflate),
the load average before and after (a loaded machine stretches the wall time),
and the wall time of each stage from the profile's metadata.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("extra", nargs="*", help="more calibrate flags (after --)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            out = os.path.join(tmp, f"quick{i}.json")
            load0 = os.getloadavg()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "perfsim", "calibrate", "--quick", "--no-progress",
                                "--output", out, *args.extra], capture_output=True, text=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return r.returncode
            user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
            with open(out) as fh:
                cal = json.load(fh)["metadata"]["calibration"]
            print(f"calibrate --quick: wall {wall:.1f} s, cpu {user + sys_:.1f} s (user {user:.1f} s, "
                  f"sys {sys_:.1f} s); load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} "
                  f"after; {os.cpu_count()} cores; estimated {cal.get('estimated_s')} s")
            for stage, s in cal.get("stage_wall_s", {}).items():
                print(f"  {stage:60s} {s:7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
