"""The ``perfsim`` subcommands, one module each (dispatched by :mod:`perfsim.cli`),
and the flags several of them share.

A command module parses its flags, calls one library function and prints what
it returns; the work itself lives in the library (``perfsim.predict``,
``perfsim.run``, ``perfsim.calibrate``, ``perfsim.validate`` ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from typing import Any, Callable

from perfsim.runtime.config import RunConfig


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return v


def add_out(p: argparse.ArgumentParser, default: str | None, help: str, metavar: str | None = None) -> None:
    """``--out`` / ``-o`` (``--output`` an alias): every command names its output so."""
    p.add_argument("--out", "-o", "--output", dest="out", default=default, metavar=metavar, help=help)


def add_no_progress(p: argparse.ArgumentParser,
                    help: str = "no progress bar (on a terminal) or stage lines (in a log)") -> None:
    p.add_argument("--no-progress", action="store_true", help=help)


def add_keywords(p: argparse.ArgumentParser, func: Callable[..., Any], helps: dict[str, str],
                 choices: dict[str, tuple[str, ...]] | None = None) -> None:
    """One flag per keyword of ``func`` named in ``helps`` (``micro_batch`` ->
    ``--micro-batch``), its default the keyword's: a bool is a switch, an int an
    integer; ``{default}`` in a help text is replaced by the default."""
    params = inspect.signature(func).parameters
    for name, text in helps.items():
        default = params[name].default
        kw: dict[str, Any] = {"default": default, "help": text.format(default=default)}
        if isinstance(default, bool):
            kw["action"] = "store_true"
        elif isinstance(default, int) or params[name].annotation in ("int | None", "int"):
            kw["type"] = int
        if choices and name in choices:
            kw["choices"] = choices[name]
        p.add_argument("--" + name.replace("_", "-"), **kw)


#: the flags of one training job shared by ``perfsim run`` and ``perfsim validate``:
#: name -> (help for one value, help for a comma list or None where a list is not taken)
JOB_FLAGS = {
    "model": ("model preset: digits-mlp, gpt2-tiny, gpt2-small-byte (default {default})", None),
    "pp": ("pipeline stages (default {default})", None),
    "dp": ("data-parallel replicas (default {default})", None),
    "tp": ("tensor-parallel ranks per stage, Megatron layout via torch.distributed.tensor.parallel "
           "(GPT models; ranks ordered TP, then DP, then PP; default {default})",
           "comma list of tensor-parallel degrees (perfsim run --tp; GPT models), e.g. 1,2"),
    "sequence_parallel": ("with --tp > 1: Megatron sequence parallelism (LayerNorms on a slice of the sequence)",
                          "Megatron sequence parallelism on the --tp > 1 rows"),
    "tied_embedding": ("GPT's LM head: untied (its own weight) or sync (tp 1: a copy of the token embedding, "
                       "its gradient all-reduced with the first stage's after the data-parallel sync, as "
                       "Megatron-LM does; default {default})", None),
    "schedule": ("gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v (default {default})",
                 "comma list of gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v (default {default})"),
    "virtual_stages": ("model chunks per rank for interleaved-1f1b (default 2; zb-v always 2)", None),
    "compress": ("pipeline compression: fp32, fp16, directq:fw4bw8, aqsgd:fw3bw6 ...",
                 "comma list of pipeline compression specs"),
    "grad_compress": ("data-parallel compression: none, qsgd-maxnorm:4, powersgd:2, onebit-lamb ... "
                      "(1-bit optimizers: onebit-adam:warmup=N, N uncompressed warm-up steps, "
                      "default 100; a resumed run uses the N given now)",
                      "comma list of data-parallel compression specs"),
    "zero": ("0, or 3: every layer under torch's fully_shard (FSDP2: per-layer all-gather and "
             "reduce-scatter; pp 1, tp 1, no gradient compression; default {default})", None),
    "micro_batch": ("samples per micro-batch (default {default})", None),
    "macro_batch": ("samples per replica per step (default {default})", None),
}


def add_job_arguments(p: argparse.ArgumentParser, lists: bool = False) -> None:
    """The :data:`JOB_FLAGS`, defaults those of :class:`perfsim.runtime.config.RunConfig`;
    ``lists``: ``--tp``, ``--schedule``, ``--compress``, ``--grad-compress`` take comma
    lists (one grid row per value, ``perfsim validate``)."""
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for name, (one, many) in JOB_FLAGS.items():
        default = defaults[name]
        kw: dict[str, Any] = {"default": default}
        if isinstance(default, bool):
            kw["action"] = "store_true"
        elif lists and many is not None:
            kw["default"] = str(default)
        elif name == "zero":
            kw["type"] = int
        elif name != "model" and not isinstance(default, str):
            kw["type"] = positive_int
        kw["help"] = (many if lists and many is not None else one).format(default=default)
        p.add_argument("--" + name.replace("_", "-"), **kw)
