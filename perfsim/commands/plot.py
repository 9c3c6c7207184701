"""``perfsim plot``: figures from a sweep / validate table.

    perfsim plot runs/speedup.csv --kind speedup --out speedup.svg
    perfsim plot runs/speedup.csv --kind breakdown --filter bandwidth=100Mbps
    perfsim plot traces/validation/gpt2-tiny-pp2/validation.csv --kind validation
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfsim.commands import add_out
from perfsim.errors import ConfigError
from perfsim.outputs import is_stdio

HELP = "draw throughput / speed-up / breakdown / bubble / validation figures from a table (PNG, SVG)"
EXAMPLES = """examples:
  perfsim plot runs/speedup.csv --kind speedup --out speedup.svg
  perfsim plot runs/speedup.csv --kind breakdown --filter bandwidth=100Mbps
  perfsim plot traces/validation/gpt2-tiny-pp2/validation.csv --kind validation
"""
KINDS = ("throughput", "speedup", "breakdown", "bubble", "validation")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("table", metavar="TABLE",
                   help="a `perfsim sweep` table (.csv/.parquet), a `perfsim validate` CSV, "
                        "or a Result JSON from predict/run; - reads CSV or JSON from stdin")
    # no argparse `choices`: an unknown kind is a ConfigError naming it (one line, exit 2)
    p.add_argument("--kind", "-k", default="throughput", metavar="KIND",
                   help=f"figure: {' | '.join(KINDS)} (default: throughput)")
    add_out(p, None, "output .png, .svg or .pdf (default: TABLE's stem + .KIND.png; - writes a PNG "
                     "to stdout)", metavar="FILE")
    p.add_argument("--filter", "-f", action="append", default=[], metavar="COL=VALUE[,VALUE]",
                   help="keep matching rows first; repeatable (e.g. bandwidth=100Mbps, pp=8)")
    p.add_argument("--stages", metavar="FILE",
                   help="per-stage table for --kind breakdown (default: TABLE's stem + .stages)")
    p.add_argument("--metric", default="throughput_samples_per_s",
                   help="column to plot for throughput/speedup/validation "
                        "(default: throughput_samples_per_s)")
    p.add_argument("--baseline", metavar="METHOD",
                   help="speed-up baseline method (default: fp32, or none for grad compression)")
    p.add_argument("--title", help="figure title (default: generated)")


def run(args: argparse.Namespace) -> int:
    # lazy: perfsim --help does not load perfsim.analysis.plot_files
    from perfsim.analysis.plot_files import load_tables, save_figure
    from perfsim.analysis.plots import make_figure  # lazy: perfsim --help does not load perfsim.analysis.plots

    if args.kind not in KINDS:
        raise ConfigError(f"--kind {args.kind!r}: unknown (choose from {', '.join(KINDS)})")
    table = Path(args.table)
    if is_stdio(args.table) and not args.out:
        raise ConfigError("--out: needed when the table comes from standard input (-)")
    out = Path(args.out) if args.out else table.with_name(f"{table.stem}.{args.kind}.png")
    if not is_stdio(out) and out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ConfigError(f"--out {str(out)!r}: unknown format (use .png, .svg or .pdf)")
    summary, stages = load_tables(args.table, args.stages)
    fig = make_figure(args.kind, summary, stages, metric=args.metric, baseline=args.baseline,
                      title=args.title, filters=args.filter)
    save_figure(fig, out)
    print(f"wrote {'a PNG to stdout' if is_stdio(out) else out}", file=sys.stderr if is_stdio(out) else sys.stdout)
    return 0
