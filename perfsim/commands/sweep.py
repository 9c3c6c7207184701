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

#: flag -> (predict parameter, help); comma lists, like `perfsim predict`
_GRID_FLAGS = {
    "--model": ("model", "model preset(s), e.g. gpt2-xl,gpt2-large"),
    "--workload": ("workload", "workload file(s) instead of a preset"),
    "--profile": ("profile", "calibration profile(s)"),
    "--topology": ("topology", "heterogeneous topology file(s)"),
    "--bandwidth": ("bandwidth", "link rates, e.g. 10Gbps,1Gbps,100Mbps,10Mbps"),
    "--latency": ("latency", "one-way latencies, e.g. 0ms,5ms,50ms"),
    "--compress": ("compress", "pipeline compression, e.g. fp32,directq:fw4bw8,aqsgd:fw3bw6"),
    "--grad-compress": ("grad_compress", "DP gradient compression, e.g. none,qsgd-maxnorm:4"),
    "--schedule": ("schedule", "gpipe,1f1b"),
    "--pp": ("pp", "pipeline stages, e.g. 4,8"),
    "--dp": ("dp", "data-parallel replicas, e.g. 1,4"),
    "--micro-batch": ("micro_batch", "samples per micro-batch, e.g. 1,2,4"),
    "--macro-batch": ("macro_batch", "samples per macro-batch per replica"),
    "--epochs": ("epochs", "epochs for the end-to-end time"),
    "--dataset-samples": ("dataset_samples", "samples per epoch"),
    "--bucket-size": ("bucket_size", "gradient bucket sizes, e.g. 25MiB"),
    "--gpus-per-node": ("gpus_per_node", "devices per node"),
    "--intra-node-bandwidth": ("intra_node_bandwidth", "intra-node rates, e.g. 300GB/s"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep_file", nargs="?", metavar="SWEEP.toml",
                   help="TOML sweep file: predict parameter = value or [values] (flags override)")
    grid = p.add_argument_group("grid (comma lists; every combination runs)")
    for flag, (dest, text) in _GRID_FLAGS.items():
        grid.add_argument(flag, dest=dest, metavar="LIST", default=None, help=text)
    grid.add_argument("--partition", default=None, metavar="COUNTS",
                      help="layer counts per stage, e.g. 7,6,6,6,6,6,6,7 (one value; a list of "
                           "partitions goes in the sweep file)")
    grid.add_argument("--no-overlap", action="store_true",
                      help="sync gradients only after the backward pass")
    grid.add_argument("--no-nic-sharing", action="store_true",
                      help="give every flow the full link (lower bound)")
    p.add_argument("--out", "-o", "--output", dest="out", default="sweep.csv", metavar="FILE",
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
    flags = {dest: getattr(args, dest) for dest, _ in _GRID_FLAGS.values()}
    flags["partition"] = [args.partition] if args.partition else None
    flags["overlap"] = False if args.no_overlap else None
    flags["nic_sharing"] = False if args.no_nic_sharing else None
    spec = spec.merged(flags)
    table = run_sweep(spec, args.out, jobs=args.jobs, backend=args.backend,
                      skip_invalid=args.skip_invalid, resume=not args.fresh,
                      progress=False if args.no_progress else None,
                      report=lambda line: print(line, file=sys.stderr))
    n = len(table.summary)
    msg = f"wrote {n} configuration{'s' if n != 1 else ''} to {args.out}"
    if not table.stages.empty:
        msg += f" (per-stage rows: {sibling_path(args.out, 'stages')})"
    print(msg)
    if not table.errors.empty:
        print(f"{len(table.errors)} configuration(s) rejected: "
              f"{sibling_path(args.out, 'errors').with_suffix('.csv')}", file=sys.stderr)
    return 0
