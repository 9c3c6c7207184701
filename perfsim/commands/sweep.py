"""``perfsim sweep``: run a grid of predict configurations in parallel into one table.

    perfsim sweep --bandwidth 10Gbps,1Gbps,100Mbps,10Mbps \\
        --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 --out runs/speedup.csv
    perfsim sweep sweep.toml --out runs/big.parquet --backend ray

Flags take the same comma lists as ``perfsim predict`` and override the keys of
an optional TOML sweep file. Re-running an interrupted sweep resumes from
``OUT.part.jsonl``; ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse

HELP = "run a grid of predict configurations in parallel into a CSV/Parquet table (resumable)"

#: flag name -> predict parameter (comma lists, like `perfsim predict`)
_GRID_FLAGS = {
    "--model": "model", "--workload": "workload", "--profile": "profile",
    "--topology": "topology", "--bandwidth": "bandwidth", "--latency": "latency",
    "--compress": "compress", "--grad-compress": "grad_compress", "--schedule": "schedule",
    "--pp": "pp", "--dp": "dp", "--micro-batch": "micro_batch",
    "--macro-batch": "macro_batch", "--epochs": "epochs",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep_file", nargs="?", metavar="SWEEP.toml",
                   help="TOML sweep file: predict parameter = value or [values] (flags override)")
    grid = p.add_argument_group("grid (comma lists; every combination runs)")
    for flag, dest in _GRID_FLAGS.items():
        grid.add_argument(flag, dest=dest, metavar="LIST", default=None)
    p.add_argument("--out", "-o", default="sweep.csv", metavar="FILE",
                   help="output table, .csv or .parquet (default: sweep.csv); per-stage rows go "
                        "to FILE's stem + .stages.csv/.parquet")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="worker processes for the local backend (default: all cores)")
    p.add_argument("--backend", default="local", choices=("local", "ray", "dask"),
                   help="where to run: local process pool, or an existing Ray/Dask cluster "
                        "(optional extra perfsim[cluster]; RAY_ADDRESS / DASK_SCHEDULER_ADDRESS)")
    p.add_argument("--fresh", action="store_true",
                   help="ignore results of an earlier (interrupted) run and start over")
    p.add_argument("--skip-invalid", action="store_true",
                   help="record configurations the simulator rejects in FILE's stem + "
                        ".errors.csv instead of stopping")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import sys

    from perfsim.analysis.sweep import SweepSpec, load_sweep_file, run_sweep, sibling_path

    spec = load_sweep_file(args.sweep_file) if args.sweep_file else SweepSpec({})
    spec = spec.merged({dest: getattr(args, dest) for dest in _GRID_FLAGS.values()})
    table = run_sweep(spec, args.out, jobs=args.jobs, backend=args.backend,
                      skip_invalid=args.skip_invalid, resume=not args.fresh,
                      progress=False if args.no_progress else None)
    n = len(table.summary)
    msg = f"wrote {n} configuration{'s' if n != 1 else ''} to {args.out}"
    if not table.stages.empty:
        msg += f" (per-stage rows: {sibling_path(args.out, 'stages')})"
    print(msg)
    if not table.errors.empty:
        print(f"{len(table.errors)} configuration(s) rejected: "
              f"{sibling_path(args.out, 'errors').with_suffix('.csv')}", file=sys.stderr)
    return 0
