"""The ``perfsim`` subcommands, one module each (dispatched by :mod:`perfsim.cli`),
and the flags several of them share.

A command module parses its flags, calls one library function and prints what
it returns; the work itself lives in the library (``perfsim.predict``,
``perfsim.run``, ``perfsim.calibrate``, ``perfsim.validate`` ...).
"""

from __future__ import annotations

import argparse
import inspect
import logging
from typing import Any, Callable, Iterable, Mapping

from perfsim import params
from perfsim.errors import ConfigError
from perfsim.units import format_time

log = logging.getLogger(__name__)


def print_notes(summaries: Iterable[dict[str, Any]]) -> None:
    """Each distinct note of the ``notes`` of ``summaries`` once on stderr: predict's, sweep's
    and plan's notes, decided where the prediction is made (:func:`perfsim.api.prediction_notes`);
    a summary read back from a table holds them as :func:`perfsim.result.notes_of` reads."""
    from perfsim.result import notes_of  # lazy: perfsim --help does not load perfsim.result

    for note in dict.fromkeys(n for s in summaries for n in notes_of(s.get("notes"))):
        log.warning("note: %s", note)


#: the predict parameters that name files (the roles of :func:`perfsim.api.input_files`)
FILE_PARAMS = ("profile", "model", "workload", "topology")


def interval_text(summary: Mapping[str, Any]) -> str:
    """A prediction's 80 % interval of the iteration time, ``3.1s-3.9s`` (:mod:`perfsim.engine.uncertainty`),
    or a dash where none is stated: the cell predict's and plan's tables show."""
    lo, hi = summary.get("iteration_s_low"), summary.get("iteration_s_high")
    return "-" if lo is None or hi is None else f"{format_time(lo)}-{format_time(hi)}"


def input_paths(values: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(flag, path)`` of each file the predict parameters ``values`` read (every value of a
    comma list; the default profile when none is given), resolved as predict resolves them
    (:func:`perfsim.api.input_files`): what no output may be (:func:`perfsim.outputs.check_not_input`).
    A value that is not valid is left to the command's own error."""
    from perfsim.api import input_files  # lazy: perfsim --help does not load perfsim.api

    found = []
    for name in FILE_PARAMS:
        try:
            given = params.values_of(name, values[name], True) if values.get(name) is not None else [None]
        except ConfigError:
            continue
        for value in given:
            if value is not None or name == "profile":
                found.append((f"--{name}", input_files(**{name: value}).get(name)))
    return found


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
