"""Fail loudly when a kernel lost bandwidth against the last accepted measurement.

    python scripts/kernel_regress.py NEW.csv [--baseline traces/gpu/<accepted>.csv]
        [--tolerance 5] [--ways triton] [--tree LABEL] [--baseline-tree LABEL]

Both CSVs come from ``benchmarks/bench_kernels.py`` (or ``scripts/kernel_bisect.py``, whose
rows name their tree: pick one with ``--tree`` / ``--baseline-tree``). For every
(size, kernel, bits) of the chosen ways present in both, the share of the copy bandwidth
(``pct_copy``, each run against its own copy baseline) may fall by at most ``--tolerance``
percentage points. Every drop beyond it is printed as one line naming kernel, bits, size,
the old and the new share; the exit status is then 1. Exit 2: a file that cannot be read,
no rows in common, or two different devices (shares of two GPUs are not comparable).
Without ``--baseline`` the newest ``traces/gpu/<device>-kernels-<date>.csv`` is used (the
last accepted run; ``scripts/kernel_table.py`` writes the docs from it). Rows of several passes
of one kernel (``bench_kernels.py --repeat``, the two passes of a bisect) count by their median.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from kernel_csv import CsvError, device_of, read_rows, shares, size_labels  # noqa: E402


_ACCEPTED = re.compile(r"^[a-z0-9]+-kernels-(\d{4}-\d{2}-\d{2})\.csv$")


def latest_accepted() -> str | None:
    """The newest accepted kernel CSV, ``traces/gpu/<device>-kernels-<YYYY-MM-DD>.csv`` by its
    date (other runs kept beside it carry a suffix and are never taken)."""
    found = [(m.group(1), p) for p in glob.glob(os.path.join(ROOT, "traces", "gpu", "*-kernels-*.csv"))
             if (m := _ACCEPTED.match(os.path.basename(p)))]
    return max(found)[1] if found else None


def compare(old_rows: list[dict], new_rows: list[dict], tolerance: float, ways) -> tuple[list[str], int]:
    """(one line per drop beyond ``tolerance`` points, rows compared)."""
    old, new = shares(old_rows), shares(new_rows)
    labels = size_labels(new_rows)
    drops, n = [], 0
    for key in sorted(set(old) & set(new)):
        size, kernel, bits, way = key
        if way not in ways:
            continue
        n += 1
        if old[key] - new[key] > tolerance:
            drops.append(f"REGRESSION {kernel} {bits}-bit ({way}) at {labels[size]}: "
                         f"{old[key]:.1f} % -> {new[key]:.1f} % of copy bandwidth "
                         f"({new[key] - old[key]:+.1f} points, tolerance {tolerance:g})")
    return drops, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("new", help="CSV of the fresh run")
    ap.add_argument("--baseline", help="CSV of the last accepted run (default: newest in traces/gpu)")
    ap.add_argument("--tolerance", type=float, default=5.0, help="points of pct_copy (default 5)")
    ap.add_argument("--ways", default="triton", help="ways compared (default: triton)")
    ap.add_argument("--tree", help="the tree of NEW to check (a kernel_bisect CSV)")
    ap.add_argument("--baseline-tree", help="the tree of the baseline (a kernel_bisect CSV)")
    args = ap.parse_args(argv)
    try:
        if args.tolerance < 0:
            raise CsvError(f"--tolerance {args.tolerance:g}: must be >= 0")
        new_rows = read_rows(args.new, args.tree)
        base = args.baseline or latest_accepted()
        if base is None:
            raise CsvError("no --baseline and no traces/gpu/*-kernels-*.csv to compare against")
        old_rows = read_rows(base, args.baseline_tree)
        d_old, d_new = device_of(old_rows), device_of(new_rows)
        if d_old and d_new and d_old != d_new:
            raise CsvError(f"{base} was measured on {d_old}, {args.new} on {d_new}: not comparable")
        drops, n = compare(old_rows, new_rows, args.tolerance, set(args.ways.split(",")))
        if n == 0:
            raise CsvError(f"{args.new} and {base} have no (size, kernel, bits, way) in common")
    except CsvError as e:
        print(f"kernel_regress: {e}", file=sys.stderr)
        return 2
    what = f"{args.new}{f' [{args.tree}]' if args.tree else ''} against {base}" \
           f"{f' [{args.baseline_tree}]' if args.baseline_tree else ''}"
    if drops:
        print(f"kernel_regress: FAILED, {len(drops)} of {n} rows lost more than {args.tolerance:g} "
              f"points ({what}):", file=sys.stderr)
        for line in drops:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"kernel_regress: ok, {n} rows within {args.tolerance:g} points ({what})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
