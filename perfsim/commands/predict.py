"""``perfsim predict``: simulate pipeline x data-parallel training with compression.

With no argument it runs the embedded default (GPT2-1.5B on 8 stages, the
AQ-SGD paper's V100 profile, 10 Gbps). Comma lists simulate every combination.
"""

from __future__ import annotations

import argparse
import logging
import sys

from perfsim import outputs, params
from perfsim.commands import input_paths, print_notes
from perfsim.errors import ConfigError

log = logging.getLogger(__name__)

HELP = "simulate training throughput over a network with communication compression"
EXAMPLES = """examples:
  perfsim predict
  perfsim predict --bandwidth 10Gbps,1Gbps,100Mbps --compress fp32,directq:fw4bw8,aqsgd:fw3bw6
  perfsim predict --pp 8 --dp 4 --schedule 1f1b --grad-compress none,qsgd-maxnorm:4 --format csv
  perfsim predict --profile default-v100 --topology example-geo --pp 4 --dp 2 -o r.json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    params.add_arguments(p, lists=True)
    g = p.add_argument_group("output")
    g.add_argument("--format", choices=("table", "csv", "json", "parquet"),
                   help="output format (default: from --out's suffix .txt/.csv/.json/.parquet, else table)")
    g.add_argument("--out", "-o", "--output", dest="output", help="write to FILE (atomically; a FIFO or "
                   "device in place) instead of stdout (- is stdout); a --format must agree with its suffix")
    g.add_argument("--trace", help="write a Chrome/Perfetto trace of the timeline (FILE.json); a grid of N "
                   "configurations writes FILE-0.json ... FILE-<N-1>.json, in the order of the output's rows")


def _grid(args) -> list[dict]:
    return params.expand(params.grid(params.from_args(args), cli=True))


def _trace_path(base: str, i: int, n: int) -> str:
    if n == 1:
        return base
    stem, dot, ext = base.rpartition(".")
    return f"{stem}-{i}.{ext}" if dot else f"{base}-{i}"


#: a grid's warning names at most this many of its configurations
MAX_NAMED = 4


def _label(grid: list[dict], i: int) -> str:
    """The values that tell configuration ``i`` of ``grid`` from the others (``bandwidth=1Gbps,
    compress=fp16``): what its trace file stands for."""
    from perfsim.units import format_bandwidth, format_time  # lazy: only for a grid with --trace

    shown = {"bandwidth": format_bandwidth, "latency": format_time}
    varying = [k for k in grid[0] if len({str(row.get(k)) for row in grid}) > 1]
    return ", ".join(f"{k}={shown.get(k, str)(grid[i][k])}" for k in varying)


def _json(results) -> str:
    """One configuration: one object (``summary``, ``stages``, ``microbatches``, ``links``),
    the same as ``perfsim run``'s result.json; several: a list of such objects."""
    data = [r.to_json_dict() for r in results]
    return outputs.json_text(data[0] if len(data) == 1 else data, default=str, allow_nan=False)


def run(args) -> int:
    from perfsim.api import predict  # lazy: perfsim --help does not load perfsim.api

    fmt = outputs.output_format(args.output, args.format, flag="--out")  # unknown suffix, no pyarrow: before any work
    if outputs.is_stdio(args.output):  # -o -: standard output, as without -o
        args.output = None
    inputs = input_paths(params.from_args(args))  # no output replaces an input file
    if args.output:
        outputs.check_file_target(args.output, "--out")
        outputs.check_not_input(args.output, inputs, "--out")
    elif fmt == "parquet":
        raise ConfigError("--format parquet: needs --out FILE (Parquet is binary)")
    if args.trace:
        outputs.check_file_target(args.trace, "--trace")
    grid = _grid(args)
    if outputs.is_stdio(args.trace) and (not args.output or len(grid) > 1):  # stdout holds one document
        raise ConfigError("--trace '-': standard output " + ("is the result's (give --out FILE for it)"
                          if not args.output else f"holds one trace, not the {len(grid)} of a grid (give --trace FILE)"))
    for i in range(len(grid) if args.trace else 0):
        outputs.check_not_input(_trace_path(args.trace, i, len(grid)), [*inputs, ("--out", args.output)], "--trace")
    results = []
    for i, config in enumerate(grid):
        log.debug("predict %s", config)
        res = predict(**config, trace=bool(args.trace), note_unused=True)
        if args.trace:
            res.write_trace(_trace_path(args.trace, i, len(grid)))
            res.trace_events = []
            if len(grid) > 1:  # not the FILE named: say which file holds which configuration
                log.info("wrote trace %s (%s)", _trace_path(args.trace, i, len(grid)), _label(grid, i))
        results.append(res)
    # each row with the parameters its summary does not show (seq_len, bucket_size ...): the rows
    # of a grid told apart
    shown = [params.shown_columns(config, r.summary) for r, config in zip(results, grid)]
    rows = [{**r.row(), **extra} for r, extra in zip(results, shown)]
    if fmt == "csv":
        data = outputs.records_csv(rows).encode()
    elif fmt == "json":
        data = _json(results).encode()
    elif fmt == "parquet":
        import pandas as pd  # lazy: pandas is heavy, only for Parquet

        data = outputs.frame_bytes(pd.DataFrame(rows), "parquet")
    else:
        # lazy: perfsim --help does not load perfsim.commands._predict_table
        from perfsim.commands._predict_table import render

        # the table: a column for each parameter the grid varies (gpu, seq_len ...); one
        # configuration's: a row for each parameter given
        varying = [k for k in grid[0] if len({str(c.get(k)) for c in grid}) > 1]
        if len(grid) == 1:  # one configuration: what the user gave, so two tables tell apart
            varying = [k for k, v in params.from_args(args).items() if v is not None]
        labels = [{params.column(k): v for k, v in params.plain(c).items() if k in varying} for c in grid]
        if not args.output:
            render(results, file=sys.stdout, labels=labels)
            _warn_memory(results, grid)
            return 0
        data = render(results, width=160, color=False, labels=labels).encode()
    outputs.emit(args.output, data.decode() if args.output is None else data)
    if args.output:
        log.info("wrote %s (%d configuration%s)", args.output, len(results), "s" * (len(results) != 1))
    _warn_memory(results, grid)
    return 0


def _warn_memory(results, grid: list[dict] | None = None) -> None:
    """Each distinct ``memory_warning`` of the results (a peak over the profile's GPU or every
    preset, :func:`perfsim.api._warn_memory`) once on stderr, after the output is written; then
    each distinct note of their ``notes`` once (:func:`perfsim.api.prediction_notes` decides
    them: a TP group wider than a node, network settings a job inside one node does not use, a
    topology's extremes, settings given but not used). In a grid (``grid``: its configurations) a
    warning names the configurations it is about (:func:`_label`), at most :data:`MAX_NAMED`."""
    which: dict[str, list[int]] = {}
    for i, r in enumerate(results):
        if r.summary.get("memory_warning"):
            which.setdefault(r.summary["memory_warning"], []).append(i)
    for note, rows in which.items():
        if grid is not None and len(grid) > 1:  # a grid: which of its configurations (they read alike)
            named = [_label(grid, i) for i in rows[:MAX_NAMED]]
            more = f" and {len(rows) - MAX_NAMED} more" if len(rows) > MAX_NAMED else ""
            note += " (every configuration)" if len(rows) == len(grid) else f" ({'; '.join(named)}{more})"
        log.warning("warning: %s", note)
    print_notes(r.summary for r in results)
