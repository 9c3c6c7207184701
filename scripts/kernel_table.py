"""Write the kernel bandwidth tables of docs/gpu.md and README.md from one stored run.

    python scripts/kernel_table.py traces/gpu/<device>-kernels-<date>.csv \
        [--bisect traces/gpu/<device>-bisect-<date>.csv] [--check]

The CSV is a run of ``benchmarks/bench_kernels.py`` (its rows name the device and the UTC
date). Each document holds a block between ``<!-- kernel-table:NAME ... -->`` and
``<!-- kernel-table:end -->`` (NAME ``full`` in docs/gpu.md, ``short`` in README.md); the
block is replaced by a dated line naming the device, the CSV and the copy bandwidth of the
run, and a table of ``pct_copy`` per kernel and size (a range over the bit widths of a row;
the median of a kernel's passes when the run repeated them). ``--bisect`` also writes the block
``bisect`` of docs/gpu.md: each tree of a ``scripts/kernel_bisect.py`` run. No figure in those blocks is typed by hand. ``--check`` rewrites nothing and exits 1 when a
block differs from what this CSV gives (tests/kernels/test_kernel_table.py runs it on the repository).
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


#: (label, kernel, size in bytes) of the bisect table's columns (bit widths 2/3/4/8)
BISECT = (("encode 16 MB", "encode", 16_000_000), ("encode 256 MB", "encode", 256_000_000),
          ("AQ-SGD 256 MB", "aqsgd", 256_000_000), ("decode 256 MB", "decode", 256_000_000))


def render_bisect(rows: list[dict], csv_rel: str) -> str:
    """The block ``bisect``: per tree (in the order measured), the public entries' share of the
    copy bandwidth, the median of the tree's passes, as a range over 2/3/4/8 bits."""
    if "tree" not in rows[0]:
        raise CsvError(f"{csv_rel}: has no 'tree' column (not a kernel_bisect CSV)")
    trees = list(dict.fromkeys(r["tree"] for r in rows))
    device, dates = device_of(rows), sorted({r.get("date") for r in rows if r.get("date")})
    passes = max(int(r.get("pass") or 1) for r in rows)
    lines = [f"<!-- kernel-table:bisect (written by scripts/kernel_table.py --bisect {csv_rel}; do not edit) -->",
             f"Measured {dates[0] if dates else '?'} on an {device} (`{csv_rel}`, {passes} passes in ABBA "
             f"order, median per kernel; regenerate with `--bisect {csv_rel}`).", "",
             "| tree | " + " | ".join(c[0] for c in BISECT) + " |", "| --- |" + " ---: |" * len(BISECT)]
    for t in trees:
        pct = shares([r for r in rows if r["tree"] == t])
        cells = []
        for _, kernel, size in BISECT:
            vals = [pct[(size, kernel, b, "triton")] for b in QUANT if (size, kernel, b, "triton") in pct]
            cells.append(_span(vals) if vals else "–")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("csv", help="the stored run (traces/gpu/<device>-kernels-<date>.csv)")
    ap.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 when a table is stale")
    ap.add_argument("--bisect", help="also the bisect table of docs/gpu.md, from this kernel_bisect CSV")
    ap.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)  # the tests' copy of the docs
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.csv)
        rel = os.path.relpath(os.path.abspath(args.csv), ROOT)
        blocks = [(doc, name, render(rows, rel, name, spec)) for doc, name, spec in DOCS]
        if args.bisect:
            blocks.append(("docs/gpu.md", "bisect", render_bisect(
                read_rows(args.bisect, all_trees=True), os.path.relpath(os.path.abspath(args.bisect), ROOT))))
        old: dict[str, str] = {}
        new: dict[str, str] = {}
        for doc, name, block in blocks:
            path = os.path.join(args.root, doc)
            if doc not in old:
                try:
                    with open(path, encoding="utf-8") as f:
                        old[doc] = new[doc] = f.read()
                except OSError as e:
                    raise CsvError(f"{path}: {e.strerror}") from None
            new[doc] = update(new[doc], block, name, doc)
    except CsvError as e:
        print(f"kernel_table: {e}", file=sys.stderr)
        return 2
    stale = [doc for doc in old if new[doc] != old[doc]]
    if args.check:
        if stale:
            print(f"kernel_table: {', '.join(stale)} differ from {args.csv}"
                  f"{f' and {args.bisect}' if args.bisect else ''}; run python scripts/kernel_table.py "
                  f"{args.csv}{f' --bisect {args.bisect}' if args.bisect else ''}", file=sys.stderr)
            return 1
        print(f"kernel_table: {', '.join(old)} match {args.csv}")
        return 0
    for doc in stale:
        path = os.path.join(args.root, doc)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(new[doc])
        os.replace(tmp, path)
    print(f"kernel_table: {', '.join(stale) or 'nothing'} rewritten from {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
