"""Reading the CSV of ``benchmarks/bench_kernels.py`` (no torch needed).

One row per (size, kernel, bits, way) and run; ``pct_copy`` is the kernel's minimum traffic
per second as a share of the copy bandwidth measured at the same size in the same run.
Rows of several runs of one key (the two passes of ``scripts/kernel_bisect.py``) are
combined by their median. ``scripts/kernel_regress.py`` and ``scripts/kernel_table.py`` read
stored runs through this module only.
"""

from __future__ import annotations

import csv
import statistics

REQUIRED = ("size", "size_bytes", "kernel", "bits", "way", "pct_copy")


class CsvError(ValueError):
    """A kernel CSV that cannot be read (the scripts print it in one line, exit 2)."""


def read_rows(path: str, tree: str | None = None, all_trees: bool = False) -> list[dict]:
    """The rows of one CSV (only those of ``tree`` when given: a bisect CSV holds several;
    ``all_trees``: every tree's rows, for a reader that tells them apart)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise CsvError(f"{path}: {e.strerror}") from None
    if not rows:
        raise CsvError(f"{path}: no rows")
    missing = [c for c in REQUIRED if c not in rows[0]]
    if missing:
        raise CsvError(f"{path}: not a bench_kernels CSV (no column {missing[0]!r})")
    if tree is not None:
        if "tree" not in rows[0]:
            raise CsvError(f"{path}: has no 'tree' column (not a kernel_bisect CSV); drop --tree")
        rows = [r for r in rows if r["tree"] == tree]
        if not rows:
            raise CsvError(f"{path}: no rows of tree {tree!r}")
    elif not all_trees and "tree" in rows[0] and len({r["tree"] for r in rows}) > 1:
        raise CsvError(f"{path}: holds trees {sorted({r['tree'] for r in rows})}; name one with --tree")
    for r in rows:
        try:
            r["pct_copy"] = float(r["pct_copy"])
            r["size_bytes"] = int(r["size_bytes"])
            r["bits"] = int(r["bits"])
        except ValueError:
            raise CsvError(f"{path}: row {r['size']} {r['kernel']} {r['bits']}: not a number") from None
    return rows


def shares(rows: list[dict]) -> dict[tuple, float]:
    """``{(size_bytes, kernel, bits, way): median pct_copy}``."""
    acc: dict[tuple, list[float]] = {}
    for r in rows:
        acc.setdefault((r["size_bytes"], r["kernel"], r["bits"], r["way"]), []).append(r["pct_copy"])
    return {k: statistics.median(v) for k, v in acc.items()}


def size_labels(rows: list[dict]) -> dict[int, str]:
    """``{size_bytes: the size as written on the command line}`` (16MB, 1GB)."""
    return {r["size_bytes"]: r["size"] for r in rows}


def device_of(rows: list[dict]) -> str | None:
    """The device named in the rows (CSVs written before 2026-11-27 name none)."""
    names = {r.get("device") for r in rows if r.get("device")}
    return names.pop() if len(names) == 1 else None
