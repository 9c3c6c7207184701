"""Write the kernel bandwidth tables of docs/gpu.md and README.md from one stored run.

    python scripts/kernel_table.py traces/gpu/<device>-kernels-<date>.csv [--check]

The CSV is a run of ``benchmarks/bench_kernels.py`` (its rows name the device and the UTC
date). Each document holds a block between ``<!-- kernel-table:NAME ... -->`` and
``<!-- kernel-table:end -->`` (NAME ``full`` in docs/gpu.md, ``short`` in README.md); the
block is replaced by a dated line naming the device, the CSV and the copy bandwidth of the
run, and a table of ``pct_copy`` per kernel and size (a range over the bit widths of a row).
No figure in those blocks is typed by hand. ``--check`` rewrites nothing and exits 1 when a
block differs from what this CSV gives (tests/test_kernel_table.py runs it on the repository).
Exit 2: an unreadable CSV, a CSV without device/date columns, or a document without its block.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from kernel_csv import CsvError, device_of, read_rows, shares, size_labels  # noqa: E402

QUANT = (2, 3, 4, 8)
#: (label, kernel, way, bit widths) of each table row
FULL = (
    ("encode 2/3/4/8 bit (single pass)", "encode", "triton", QUANT),
    ("encode 2/3/4/8 bit (two passes: torch scales, then a rounding kernel)", "encode", "triton-2pass", QUANT),
    ("encode, plain torch reference on the GPU", "encode", "torch", QUANT),
    ("AQ-SGD sender step 2/3/4/8 bit (single pass)", "aqsgd", "triton", QUANT),
    ("AQ-SGD sender step (two passes)", "aqsgd", "triton-2pass", QUANT),
    ("AQ-SGD, plain torch", "aqsgd", "torch", QUANT),
    ("decode 2/3/4/8 bit", "decode", "triton", QUANT),
    ("decode 1 bit (signs x scale)", "decode", "triton", (1,)),
    ("encode 1 bit with error feedback (1-bit Adam; two passes: norm, then signs)", "encode", "triton", (1,)),
    ("lane-packed all-reduce: pack 4-bit codes, 2 workers", "pack-lanes", "triton", (4,)),
    ("lane-packed all-reduce: unpack the summed words", "unpack-lanes", "triton", (4,)),
)
SHORT = (
    ("encode 2/3/4/8 bit, single pass", "encode", "triton", QUANT),
    ("AQ-SGD sender step, single pass", "aqsgd", "triton", QUANT),
    ("decode 2/3/4/8 bit", "decode", "triton", QUANT),
    ("the same encoders as plain torch ops", "encode", "torch", QUANT),
)
DOCS = (("docs/gpu.md", "full", FULL), ("README.md", "short", SHORT))
_BLOCK = re.compile(r"<!-- kernel-table:(?P<name>\w+)[^>]*-->\n.*?<!-- kernel-table:end -->", re.S)


def _span(values: list[float]) -> str:
    lo, hi = round(min(values)), round(max(values))
    return f"{lo} %" if lo == hi else f"{lo}–{hi} %"


def _size(label: str) -> str:
    return re.sub(r"(\d)([KMG]B)$", r"\1 \2", label)


def render(rows: list[dict], csv_rel: str, name: str, spec) -> str:
    """The block ``name`` (markers included) for the rows of one run."""
    device = device_of(rows)
    dates = sorted({r.get("date") for r in rows if r.get("date")})
    if not device or len(dates) != 1:
        raise CsvError(f"{csv_rel}: names no single device and date (a bench_kernels CSV of 2026-11-27 "
                       "or later does)")
    pct = shares(rows)
    labels = size_labels(rows)
    sizes = sorted(labels)
    copy = {}
    for r in rows:
        copy.setdefault(r["size_bytes"], float(r["copy_gbps"]))
    bw = ", ".join(f"{copy[s] / 1e3:.1f} TB/s at {_size(labels[s])}" for s in sizes)
    lines = [f"<!-- kernel-table:{name} (written by scripts/kernel_table.py {csv_rel}; do not edit) -->",
             f"Measured {dates[0]} on an {device} (`{csv_rel}`; regenerate: `python scripts/kernel_table.py "
             f"{csv_rel}`). Copy bandwidth in the same run: {bw}.", "",
             "| kernel | " + " | ".join(_size(labels[s]) for s in sizes) + " |",
             "| --- |" + " ---: |" * len(sizes)]
    for label, kernel, way, bits in spec:
        cells = []
        for s in sizes:
            vals = [pct[(s, kernel, b, way)] for b in bits if (s, kernel, b, way) in pct]
            cells.append(_span(vals) if vals else "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("<!-- kernel-table:end -->")
    return "\n".join(lines)


def update(text: str, block: str, name: str, path: str) -> str:
    found = [m for m in _BLOCK.finditer(text) if m.group("name") == name]
    if len(found) != 1:
        raise CsvError(f"{path}: expected one '<!-- kernel-table:{name} -->' ... '<!-- kernel-table:end -->' "
                       f"block, found {len(found)}")
    m = found[0]
    return text[:m.start()] + block + text[m.end():]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="the stored run (traces/gpu/<device>-kernels-<date>.csv)")
    ap.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 when a table is stale")
    ap.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)  # the tests' copy of the docs
    args = ap.parse_args(argv)
    stale = []
    try:
        rows = read_rows(args.csv)
        rel = os.path.relpath(os.path.abspath(args.csv), ROOT)
        for doc, name, spec in DOCS:
            path = os.path.join(args.root, doc)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise CsvError(f"{path}: {e.strerror}") from None
            new = update(text, render(rows, rel, name, spec), name, doc)
            if new == text:
                continue
            stale.append(doc)
            if not args.check:
                tmp = f"{path}.tmp{os.getpid()}"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(new)
                os.replace(tmp, path)
    except CsvError as e:
        print(f"kernel_table: {e}", file=sys.stderr)
        return 2
    if args.check and stale:
        print(f"kernel_table: {', '.join(stale)} differ from {args.csv}; run "
              f"python scripts/kernel_table.py {args.csv}", file=sys.stderr)
        return 1
    print(f"kernel_table: {'checked' if args.check else 'wrote'} {', '.join(d for d, _, _ in DOCS)} "
          f"from {args.csv}" + (f" ({', '.join(stale)} rewritten)" if stale and not args.check else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
