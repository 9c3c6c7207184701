"""``perfsim plan``: rank the ways to train a model on a cluster, compression included.

Examples::

    perfsim plan --model gpt2-xl --nodes 4 --gpus-per-node 4 --bandwidth 1Gbps --global-batch 64
    perfsim plan --model gpt2-tiny --nodes 2 --bandwidth 100Mbps --global-batch 32 --emit-run
    perfsim plan --model gpt2-xl --nodes 8 --bandwidth 100Mbps --global-batch 64 --format json --plot pareto.png
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "search parallelism, schedule and compression for a model on a cluster; rank by time to loss"

#: system flags passed through to the simulator when given (the simulator checks them)
_SYSTEM_FLAGS = ("bandwidth", "latency", "topology", "profile", "gpu", "intra_node_fabric", "nic",
                 "precision", "intra_node_bandwidth")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = __doc__.split("Examples::", 1)[1]
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    g = p.add_argument_group("model and cluster")
    g.add_argument("--model", default="gpt2-xl", help="model preset (default gpt2-xl)")
    g.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    g.add_argument("--gpus-per-node", type=int, default=1, help="GPUs per node (default 1)")
    g.add_argument("--global-batch", type=int, default=32, help="samples per optimizer step, all replicas (default 32)")
    for name in _SYSTEM_FLAGS:
        g.add_argument("--" + name.replace("_", "-"), default=None,
                       help="as in perfsim predict (default: predict's)")
    g = p.add_argument_group("search")
    g.add_argument("--tp", help="tensor-parallel degrees to search (comma list; default: divisors of gpus-per-node)")
    g.add_argument("--pp", help="pipeline degrees to search (default: every divisor that fits the layers)")
    g.add_argument("--micro-batch", help="micro-batch sizes (default: 1,2,4,8 where they divide)")
    g.add_argument("--schedule", default="gpipe,1f1b,zb-h1,interleaved-1f1b",
                   help="schedules (default gpipe,1f1b,zb-h1,interleaved-1f1b)")
    g.add_argument("--compress", default=None, help="pipeline compressions (default: fp32 to aqsgd:fw2bw4)")
    g.add_argument("--grad-compress", default=None, help="gradient compressions (default: none to powersgd:2)")
    g.add_argument("--recompute", default="none,full", help="recomputation modes (default none,full)")
    g.add_argument("--target-loss", type=float, default=None,
                   help="loss to reach (default: what uncompressed training reaches at half its measured budget)")
    g.add_argument("--convergence", default=None,
                   help="loss curves (bundled model name or JSON file; default: the model's own if shipped)")
    g.add_argument("--top", type=int, default=5, help="configurations to report (default 5)")
    g.add_argument("--jobs", type=int, default=1, help="worker processes for the simulations (default 1)")
    g.add_argument("--backend", choices=("process", "dask"), default="process",
                   help="parallel backend of --jobs: a local process pool (default) or Dask (perfsim[dask])")
    g.add_argument("--dask-scheduler", default=None,
                   help="address of a dask.distributed scheduler (tcp://host:8786) to spread a large search "
                        "over its workers (with --backend dask)")
    g = p.add_argument_group("output")
    g.add_argument("--format", choices=("table", "json", "csv"), default="table")
    g.add_argument("--out", "-o", "--output", dest="output", help="write to FILE (atomically) instead of stdout")
    g.add_argument("--emit-run", action="store_true", help="print the perfsim run command of the winner")
    g.add_argument("--plot", help="Pareto plot of throughput vs wire bytes (PNG/SVG)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _ints(text, flag):
    from perfsim.errors import ConfigError
    from perfsim.units import split_list

    if text is None:
        return None
    try:
        return tuple(int(v) for v in split_list(text))
    except ValueError:
        raise ConfigError(f"--{flag} {text!r}: need a comma list of integers") from None


def _strs(text):
    from perfsim.units import split_list

    return None if text is None else tuple(split_list(text))


def _table(result) -> str:
    from perfsim.units import format_time

    lines = [f"{'#':>2} {'tp':>3} {'pp':>3} {'dp':>3} {'sched':>6} {'mb':>3} {'compress':>15} "
             f"{'grad':>15} {'iteration':>10} {'samples/s':>10} {'steps x':>8} {'to loss':>10}"]
    for row in result.rows():
        ttl, ratio = row["time_to_loss_s"], row["steps_ratio"]
        ratio_text = "" if ratio is None else f"{ratio:.2f}"
        lines.append(f"{row['rank']:>2} {row['tp']:>3} {row['pp']:>3} {row['dp']:>3} {row['schedule']:>6} "
                     f"{row['micro_batch']:>3} {row['compress']:>15} {row['grad_compress']:>15} "
                     f"{format_time(row['iteration_s']):>10} {row['throughput_samples_per_s']:>10.4g} "
                     f"{ratio_text:>8} "
                     f"{'' if ttl is None else format_time(ttl):>10}")
    lines.append("")
    lines.append(f"{result.total} candidates: {result.evaluated} simulated, {result.pruned} pruned by bounds, "
                 f"{result.rejected} rejected")
    lines += [f"note: {n}" for n in result.notes]
    lines += ["", result.explanation]
    return "\n".join(lines) + "\n"


def _plot(result, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from perfsim.plan import pareto_front
    from perfsim.result import atomic_write_bytes

    pts, labels = [], []
    for c in result.all_evaluated:
        if c.summary is None:
            continue
        s = c.summary
        wire = (s.get("pipeline_bytes") or 0) + (s.get("dp_bytes") or 0)
        pts.append((wire, s["throughput_samples_per_s"]))
        labels.append(f"{c.params['compress']}+{c.params['grad_compress']}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, alpha=0.5, label="simulated")
    front = pareto_front([(p[0], p[1]) for p in pts])
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "o-", color="C3", label="Pareto front")
    for i in front[:8]:
        ax.annotate(labels[i], pts[i], fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("symlog")
    ax.set_xlabel("bytes on the wire per iteration (less = more aggressive compression)")
    ax.set_ylabel("samples/s")
    ax.legend()
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=path.rsplit(".", 1)[-1].lower() if "." in path else "png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def run(args) -> int:
    from perfsim.errors import ConfigError
    from perfsim.plan import SearchSpace, plan, run_command
    from perfsim.result import atomic_write_text

    kw = {}
    for name in ("schedule", "compress", "grad_compress", "recompute"):
        v = _strs(getattr(args, name))
        if v is not None:
            kw["schedules" if name == "schedule" else name] = v
    space = SearchSpace(tp=_ints(args.tp, "tp"), pp=_ints(args.pp, "pp"),
                        micro_batch=_ints(args.micro_batch, "micro-batch"), **kw)
    system = {n: getattr(args, n) for n in _SYSTEM_FLAGS if getattr(args, n) is not None}
    bar = None
    if not args.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="perfsim plan", unit="config", file=sys.stderr)
    try:
        result = plan(model=args.model, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                      global_batch=args.global_batch, target_loss=args.target_loss,
                      convergence=args.convergence, space=space, top=args.top, jobs=args.jobs,
                      backend=args.backend, dask_scheduler=args.dask_scheduler,
                      progress=bar.update if bar else None, **system)
    finally:
        if bar:
            bar.close()
    if not result.ranked:
        raise ConfigError("no configuration fits: " + "; ".join(
            sorted({c.rejected for c in result.all_evaluated if c.rejected})[:3]))
    if args.format == "json":
        text = json.dumps(result.rows(), indent=1, default=str) + "\n"
    elif args.format == "csv":
        text = result.to_frame().to_csv(index=False)
    else:
        text = _table(result)
    if args.output:
        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text)
    if args.plot:
        _plot(result, args.plot)
    if args.emit_run:
        cmd = run_command(result.ranked[0].params)
        print(cmd or f"# {args.model} has no perfsim run implementation (runtime models: gpt2-tiny, "
                     f"gpt2-small-byte, digits-mlp, ...)", file=sys.stderr if args.format != "table" else sys.stdout)
    return 0
