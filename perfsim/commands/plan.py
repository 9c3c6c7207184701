"""``perfsim plan``: rank the ways to train a model on a cluster, compression included.

Every ``perfsim predict`` flag is accepted: a search dimension (tp, pp, dp, micro-batch,
schedule, virtual stages, ZeRO, recomputation, attention, sequence parallelism,
precision, fabric, compression: ``perfsim.search_space``) takes one value (pinned) or a
comma list (searched) in place of its defaults; any other flag takes one value.

Examples::

    perfsim plan --model gpt2-xl --nodes 4 --gpus-per-node 4 --bandwidth 1Gbps --global-batch 64
    perfsim plan --model gpt2-tiny --nodes 2 --bandwidth 100Mbps --global-batch 32 --emit-run
    perfsim plan --model config.json --gpu h100 --nodes 2 --gpus-per-node 8 --bandwidth 100Gbps \\
        --global-batch 64 --zero 1 --recompute none,selective --emit megatron
    perfsim plan --model gpt2-xl --nodes 8 --bandwidth 100Mbps --global-batch 64 --format json --plot pareto.png
"""

from __future__ import annotations

import argparse
import logging
import sys

from perfsim import outputs, params
from perfsim.commands import input_paths, interval_text, print_notes
from perfsim.emit import EMIT_KINDS, check_emit, emit
from perfsim.errors import ConfigError
from perfsim.plan import pareto_front, plan
from perfsim.units import format_time

log = logging.getLogger(__name__)

HELP = "search parallelism, schedule and compression for a model on a cluster; rank by time to loss"

#: predict parameters the plan derives itself (from --global-batch and the split)
_OWN = ("global_batch", "macro_batch")
#: output formats (``-o x.json`` writes JSON: the suffix picks the format, perfsim.outputs)
FORMATS = ("table", "json", "csv")
#: seconds between two progress lines when stderr is not a terminal
PROGRESS_EVERY_S = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = __doc__.split("Examples::", 1)[1]
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    g = p.add_argument_group("cluster")
    g.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    g.add_argument("--global-batch", type=int, default=32,
                   help="samples per optimizer step, all replicas (default 32)")
    params.add_arguments(p, lists=True, skip=_OWN)
    g = p.add_argument_group("search")
    g.add_argument("--target-loss", type=float, default=None,
                   help="loss to reach (default: what uncompressed training reaches at half its measured budget)")
    g.add_argument("--convergence", default=None,
                   help="loss curves: a bundled model name, a JSON file, or perfsim run output folders (comma "
                        "list, or one folder holding them); default: the model's own if shipped")
    g.add_argument("--top", type=int, default=5, help="configurations to report (default 5)")
    g.add_argument("--jobs", type=int, default=1, help="worker processes for the simulations (default 1)")
    g.add_argument("--backend", choices=("process", "dask"), default="process",
                   help="parallel backend of --jobs: a local process pool (default) or Dask (perfsim[dask])")
    g.add_argument("--dask-scheduler", default=None,
                   help="address of a dask.distributed scheduler (tcp://host:8786) to spread a large search "
                        "over its workers (with --backend dask)")
    g = p.add_argument_group("output")
    g.add_argument("--format", choices=FORMATS, default=None,
                   help="output format (default: from the --out suffix, .txt, .csv or .json, else table)")
    g.add_argument("--out", "-o", "--output", dest="output",
                   help="write to FILE (atomically; its suffix picks the format) instead of stdout (- is stdout)")
    g.add_argument("--emit", choices=EMIT_KINDS, default=None,
                   help="also print the winner as a command: megatron (Megatron-LM's flags), torchrun (a "
                        "torchrun command line around them) or perfsim (perfsim run)")
    g.add_argument("--emit-run", action="store_true", help="the same as --emit perfsim")
    g.add_argument("--plot", help="Pareto plot of throughput vs wire bytes (.png, .svg or .pdf)")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (as -q; a bar on a terminal, else a line every few "
                        "seconds: PERFSIM_PROGRESS_EVERY sets the seconds)")


def _check_outputs(args) -> None:
    """Refuse an output that cannot be written before the search (one line, exit 2); the
    format from ``--format`` or the output's suffix (a disagreeing pair refused)."""
    args.format = outputs.output_format(args.output, args.format, allowed=FORMATS, flag="--out")
    if args.output:
        outputs.check_file_target(args.output, "--out")
        curves = [("--convergence", c.strip()) for c in (args.convergence or "").split(",")]
        outputs.check_not_input(args.output, [*input_paths(params.from_args(args)), *curves], "--out")
    if args.plot:
        # lazy: perfsim --help does not load perfsim.analysis.plot_files
        from perfsim.analysis.plot_files import check_figure_target

        check_figure_target(args.plot, "--plot")


def _table(result) -> str:
    ep = any(c.params.get("ep") for c in result.ranked)  # a mixture of experts: its expert parallelism searched
    cp = any(c.params.get("cp", 1) > 1 for c in result.ranked)  # context parallelism searched and ranked
    lines = [f"{'#':>2} {'tp':>3} " + (f"{'cp':>3} " if cp else "") + f"{'pp':>3} {'dp':>3} " + (f"{'ep':>3} " if ep else "")
             + f"{'sched':>16} {'mb':>3} {'zero':>6} {'recomp':>9} "
             f"{'attn':>8} {'sp':>3} {'prec':>4} {'compress':>14} {'grad':>14} {'iteration':>10} "
             f"{'80 % interval':>17} {'samples/s':>10} {'steps x [95 %]':>18} {'to loss':>10}"]
    for row, c in zip(result.rows(), result.ranked):
        p = c.params
        ttl, ratio = row["time_to_loss_s"], row["steps_ratio"]
        ratio_text = "" if ratio is None else f"{ratio:.2f}"
        if row.get("steps_ratio_lo") is not None:  # the 95 % interval over the curves' seeds
            ratio_text += f" [{row['steps_ratio_lo']:.2f},{row['steps_ratio_hi']:.2f}]"
        sched = row["schedule"] + (f"/{p['virtual_stages']}" if p.get("virtual_stages") else "")
        zero = f"{p.get('zero', 0)}" + ("+cpu" if p.get("offload") == "optimizer" else "")  # ZeRO-Offload
        lines.append(f"{row['rank']:>2} {row['tp']:>3} " + (f"{p.get('cp', 1):>3} " if cp else "") + f"{row['pp']:>3} {row['dp']:>3} "
                     + (f"{p.get('ep') or 1:>3} " if ep else "") + f"{sched:>16} "
                     f"{row['micro_batch']:>3} {zero:>6} {row.get('recompute') or p.get('recompute', 'none'):>9} "
                     f"{p.get('attention', 'megatron'):>8} {'yes' if p.get('sequence_parallel') else 'no':>3} "
                     f"{p.get('precision', 'fp32'):>4} {row['compress']:>14} {row['grad_compress']:>14} "
                     f"{format_time(row['iteration_s']):>10} {interval_text(row):>17} "
                     f"{row['throughput_samples_per_s']:>10.4g} "
                     f"{ratio_text:>18} "
                     f"{'' if ttl is None else format_time(ttl):>10}")
    lines.append("")
    lines.append(f"{result.total} candidates: {result.evaluated} simulated, {result.pruned} pruned by bounds, "
                 f"{result.rejected} rejected")
    lines += [f"note: {n}" for n in result.notes]
    lines += ["", result.explanation]
    return "\n".join(lines) + "\n"


def _plot(result, path: str) -> None:
    import matplotlib  # lazy: matplotlib is heavy, needed only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib is heavy, needed only here

    # lazy: perfsim --help does not load perfsim.analysis.plot_files
    from perfsim.analysis.plot_files import save_figure
    from perfsim.result import bytes_sent  # lazy: with the plot's other imports, only when one is drawn

    pts, labels = [], []
    for c in result.all_evaluated:
        if c.summary is None:
            continue
        s = c.summary
        pts.append((bytes_sent(s), s["throughput_samples_per_s"]))
        labels.append(f"{c.params['compress']}+{c.params['grad_compress']}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, alpha=0.5, label="simulated")
    front = pareto_front([(p[0], p[1]) for p in pts])
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "o-", color="C3", label="Pareto front")
    for i in front[:8]:
        ax.annotate(labels[i], pts[i], fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("symlog")
    ax.set_xlabel("bytes sent per iteration, every kind (less = more aggressive compression)")
    ax.set_ylabel("samples/s")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def run(args) -> int:
    from perfsim.progress import Progress, every_s  # lazy: perfsim --help does not load perfsim.progress

    if outputs.is_stdio(args.output):  # -o -: standard output, as without -o
        args.output = None
    _check_outputs(args)
    given = {k: v for k, v in params.from_args(args).items() if v is not None and k not in _OWN}
    model = given.pop("model", "gpt2-xl")
    if args.emit_run and args.emit not in (None, "perfsim"):  # one winner's command: which one?
        raise ConfigError(f"--emit-run (= --emit perfsim) contradicts --emit {args.emit}; give one")
    kind = args.emit or ("perfsim" if args.emit_run else None)
    if kind == "perfsim":
        check_emit(model)
    gpus_per_node = params.normalize("gpus_per_node", given.pop("gpus_per_node", 1), cli=True)
    bar = Progress(0, unit="configurations", enabled=not (args.no_progress or getattr(args, "quiet", False)), prefix="perfsim plan: ",
                   every=every_s(PROGRESS_EVERY_S))
    try:
        result = plan(model=model, nodes=args.nodes, gpus_per_node=gpus_per_node,
                      global_batch=args.global_batch, target_loss=args.target_loss,
                      convergence=args.convergence, top=args.top, jobs=args.jobs,
                      backend=args.backend, dask_scheduler=args.dask_scheduler, cli=True,
                      progress=bar.advance, total=bar.set_total, **given)
    finally:
        bar.close()
    if args.format == "json":
        text = outputs.json_text(result.rows(), default=str)
    elif args.format == "csv":
        text = outputs.frame_bytes(result.to_frame(), "csv").decode()
    else:
        text = _table(result)
    outputs.emit(args.output, text)
    if args.output:
        log.info("wrote %s (%d configuration%s)", args.output, len(result.ranked), "s" * (len(result.ranked) != 1))
    print_notes([result.ranked[0].summary])  # the winner's: e.g. a --bandwidth beside --nic
    if args.plot:
        _plot(result, args.plot)
    if kind:
        best = result.ranked[0].params
        print(emit(best, kind, nodes=args.nodes, global_batch=args.global_batch),
              file=sys.stderr if args.format != "table" and not args.output else sys.stdout)
    return 0
