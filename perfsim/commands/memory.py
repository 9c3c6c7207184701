"""``perfsim memory``: does a job fit in GPU memory, and which single change makes it fit."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "peak memory per GPU of a job, and what each single change (ZeRO, recomputation, TP/PP, ...) saves"
EXAMPLES = """examples:
  perfsim memory --model llama2-7b --gpu h100 --tp 1 --pp 1 --dp 8 --micro-batch 4 --precision bf16
  perfsim memory --model tests/data/configs/mixtral-8x7b.json --gpu h100 --dp 8 --ep 8 --pp 1 --format json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from perfsim import params
    from perfsim.commands import add_out

    params.add_arguments(p, lists=False)
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    add_out(p, None, "write to FILE (atomically) instead of stdout (- is stdout)", metavar="FILE")


def run(args) -> int:
    from perfsim import outputs, params
    from perfsim.analysis.memory_fit import memory_report, render

    out = None if outputs.is_stdio(args.out) else args.out
    if out:
        outputs.check_file_target(out, "--out")
    values = params.from_args(args)
    values.pop("allow_oom", None)
    report = memory_report(**values)
    text = (json.dumps(report.to_dict(), indent=1) if args.format == "json" else render(report)) + "\n"
    if out:
        outputs.write_text(out, text)
    else:
        sys.stdout.write(text)
    return 0
