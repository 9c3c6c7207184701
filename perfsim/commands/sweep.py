"""``perfsim sweep``: run a grid of predict configurations into one table.

    perfsim sweep --bandwidth 10Gbps,1Gbps,100Mbps,10Mbps \\
        --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 --out runs/speedup.csv
    perfsim sweep sweep.toml --out runs/big.parquet

Flags take the same comma lists as ``perfsim predict`` and override the keys of
an optional TOML sweep file. Re-running an interrupted sweep resumes from
``OUT.part.jsonl``; ``--fresh`` (or ``--overwrite``) starts over. A finished row is
reused only while its inputs are unchanged (:func:`perfsim.analysis.sweep.input_key`);
an ``OUT`` holding rows of another grid is refused, never silently replaced.
"""

from __future__ import annotations

import argparse
import sys

from perfsim import params
from perfsim.commands import add_no_progress, add_out, print_notes
from perfsim.outputs import is_stdio

HELP = "run a grid of predict configurations into a CSV/Parquet table (resumable)"
EXAMPLES = """examples:
  perfsim sweep --bandwidth 10Gbps,1Gbps,100Mbps,10Mbps --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 -o speedup.csv
  perfsim sweep sweep.toml --latency 0ms,50ms -o runs/big.parquet
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep_file", nargs="?", metavar="SWEEP.toml",
                   help="TOML sweep file: predict parameter = value or [values] (flags override)")
    params.add_arguments(p, lists=True)
    add_out(p, "sweep.csv", "output table, .csv or .parquet (default: sweep.csv); per-stage rows go "
                            "to FILE's stem + .stages.csv/.parquet; - writes the table as CSV to stdout "
                            "(no resume, no per-stage rows)", metavar="FILE")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="worker processes at most (default: all cores; a pool is used only when "
                        "the grid is long enough to pay for it; 1 = in-process)")
    p.add_argument("--fresh", "--overwrite", dest="fresh", action="store_true",
                   help="ignore and replace the results of an earlier (interrupted) run in FILE, "
                        "even those of another grid, and start over")
    p.add_argument("--skip-invalid", action="store_true",
                   help="record configurations the simulator rejects in FILE's stem + "
                        ".errors.csv instead of stopping")
    add_no_progress(p, "no progress bar")


def run(args: argparse.Namespace) -> int:
    # lazy: perfsim --help does not load perfsim.analysis.sweep
    from perfsim.analysis.sweep import SweepSpec, load_sweep_file, run_sweep, sibling_path

    spec = load_sweep_file(args.sweep_file) if args.sweep_file else SweepSpec({})
    spec = spec.merged(params.grid(params.from_args(args), cli=True))
    table = run_sweep(spec, args.out, jobs=args.jobs, skip_invalid=args.skip_invalid,
                      resume=not args.fresh, progress=False if args.no_progress else None)
    if "notes" in table.summary:  # every row's (a TP group wider than a node, a setting unused ...)
        print_notes({"notes": n} for n in table.summary["notes"])
    n = len(table.summary)
    msg = f"wrote {n} configuration{'s' if n != 1 else ''} to {args.out}"
    if is_stdio(args.out):  # the table is on stdout: the note goes to stderr
        print(f"wrote {n} configuration{'s' if n != 1 else ''} to stdout", file=sys.stderr)
        return 0
    if not table.stages.empty:
        msg += f" (per-stage rows: {sibling_path(args.out, 'stages')})"
    print(msg)
    if not table.errors.empty:
        print(f"{len(table.errors)} configuration(s) rejected: "
              f"{sibling_path(args.out, 'errors').with_suffix('.csv')}", file=sys.stderr)
    return 0
