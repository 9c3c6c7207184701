"""``perfsim memory``: does a job fit in GPU memory, and which single change makes it fit."""

from __future__ import annotations

import argparse
import logging

from perfsim import outputs, params
from perfsim.commands import add_out, input_paths, print_notes

log = logging.getLogger(__name__)

HELP = "peak memory per GPU of a job, and what each single change (ZeRO, recomputation, TP/PP, ...) saves"
EXAMPLES = """examples:
  perfsim memory --model llama2-7b --gpu h100 --tp 1 --pp 1 --dp 8 --micro-batch 4 --precision bf16
  perfsim memory --model tests/data/configs/mixtral-8x7b.json --gpu h100 --dp 8 --ep 8 --pp 1 --format json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    params.add_arguments(p, lists=False)
    p.add_argument("--format", choices=("text", "json"), default=None,
                   help="output format (default: from the --out suffix, .txt or .json, else text)")
    add_out(p, None, "write to FILE (atomically; its suffix picks the format) instead of stdout (- is stdout)",
            metavar="FILE")


def run(args) -> int:
    # lazy: perfsim --help does not load perfsim.analysis.memory_fit
    from perfsim.analysis.memory_fit import memory_report, render

    # the format from --format or the suffix (JSON in m.json, never the text), before any work;
    # the text report is outputs' ``table`` (.txt)
    fmt = outputs.output_format(args.out, {"text": "table"}.get(args.format, args.format),
                                allowed=("table", "json"), flag="--out")
    out = None if outputs.is_stdio(args.out) else args.out
    values = params.from_args(args)
    if out:
        outputs.check_file_target(out, "--out")
        outputs.check_not_input(out, input_paths(values), "--out")
    values.pop("allow_oom", None)
    report = memory_report(**values)
    text = outputs.json_text(report.to_dict()) if fmt == "json" else render(report) + "\n"
    outputs.emit(out, text)
    if out:
        log.info("wrote %s", out)
    print_notes([{"notes": report.notes}])
    return 0
