"""The parameters of a prediction, described once.

:data:`PARAMS` (:mod:`perfsim.param_table`) is the single description of everything
``perfsim predict`` takes: name, type, default, unit, help text and where the value goes
(a :class:`~perfsim.config.Strategy` or :class:`~perfsim.config.System` field). It
drives

* the ``perfsim predict`` and ``perfsim sweep`` flags, and the job flags of ``perfsim run``
  and ``perfsim validate`` (:func:`add_arguments`; :data:`RUN_JOB_PARAMS`),
* the keyword arguments, annotations and docstring of :func:`perfsim.predict`
  and :func:`perfsim.sweep` (:func:`signature`, :func:`doc_table`),
* sweep grids and their configuration ids (:func:`normalize`), and
* the conversion into config dataclasses (:func:`perfsim.api.build_configs`).

Adding a predict parameter means adding one :class:`Param` to :data:`PARAMS` (and the
field it fills); nothing else lists the parameters.

Values are converted once, at this edge, into SI (bits/s, seconds, bytes):
``"100Mbps"`` and ``1e8`` are the same bandwidth (:mod:`perfsim.param_values`).

This module is the one to import: it holds the command line and the Python API made
from the table, and re-exports the table (:mod:`perfsim.param_table`) and the values
(:mod:`perfsim.param_values`).
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any, Mapping

from perfsim.job import JOB_FIELDS, Job, chosen_chunks
from perfsim.param_table import BY_NAME, DEFAULTS, KINDS, NAMES, ONE_VALUE, PARAMS, Param
from perfsim.param_values import (column, expand, grid, normalize, parse_bool, parse_device_order, plain,
                                  resolved, shown_columns, split_models, values_of)

__all__ = [
    # the table (perfsim.param_table)
    "BY_NAME", "DEFAULTS", "KINDS", "NAMES", "ONE_VALUE", "PARAMS", "Param",
    # values (perfsim.param_values)
    "column", "expand", "grid", "normalize", "parse_bool", "parse_device_order", "plain", "resolved",
    "shown_columns", "split_models", "values_of",
    # the command line and the Python API (here)
    "RUN_HELPS", "RUN_JOB_PARAMS", "add_arguments", "doc_table", "from_args", "run_job", "signature",
]


# ---------------------------------------------------------------- command line

def _flag_help(p: Param, lists: bool, default: Any = None) -> str:
    text = p.help
    if p.choices:
        text += f" ({', '.join(map(str, p.allowed))})"
    default = p.default if default is None else default
    if default is not None:
        text += f" (default {str(default).lower() if p.kind == 'bool' else default})"
    if lists and p.kind not in ONE_VALUE:
        text += "; a comma list runs every value"
    return text


def add_arguments(parser: argparse.ArgumentParser, lists: bool | tuple[str, ...] = True,
                  skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None,
                  shown: Mapping[str, Any] | None = None, helps: Mapping[str, str] | None = None) -> None:
    """One flag per parameter (but those in ``skip``; only those in ``only`` when given),
    grouped as workload / strategy / system. Flags default to None (= the parameter's
    default); with ``lists`` (True, or the names that do) a flag takes a comma list.
    Booleans are ``--x/--no-x``. ``shown``: the default a command states in the help
    where it is not the parameter's (``perfsim run``'s model); ``helps``: a command's own
    help text of a parameter."""
    groups = {g: parser.add_argument_group(g) for g in ("workload", "strategy", "system")}
    shown, helps = shown or {}, helps or {}
    for p in PARAMS:
        if p.name in skip or (only is not None and p.name not in only):
            continue
        many = lists if isinstance(lists, bool) else p.name in lists
        g = groups[p.group]
        help_p = Param(p.name, p.kind, p.default, helps[p.name], p.group, choices=p.choices) \
            if p.name in helps else p
        if p.kind == "bool":
            g.add_argument(p.flag, dest=p.name, action=argparse.BooleanOptionalAction, default=None,
                           help=_flag_help(help_p, False, shown.get(p.name)))
        else:
            metavar = "LIST" if many and p.kind not in ONE_VALUE else p.kind.upper()
            g.add_argument(p.flag, dest=p.name, default=None, metavar=metavar,
                           help=_flag_help(help_p, many, shown.get(p.name)))


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The parameters given on the command line (None for those not given)."""
    return {p.name: getattr(args, p.name, None) for p in PARAMS}


#: ``perfsim run``'s help text of each job parameter whose predict text does not hold for a
#: job trained on this machine's devices (:attr:`perfsim.param_table.Param.run_help`): what
#: ``run`` and ``validate`` pass as ``helps`` to :func:`add_arguments`
RUN_HELPS: dict[str, str] = {p.name: p.run_help for p in PARAMS if p.run_help}
#: the parameters that describe the job ``perfsim run`` trains: the model and the fields of
#: :class:`perfsim.job.Job` (run's flags and :func:`perfsim.run`'s keywords are these)
RUN_JOB_PARAMS: tuple[str, ...] = ("model", *JOB_FIELDS)
#: the job parameters that ``perfsim run`` keeps as given (the model preset is looked up by
#: RunConfig; the compressor specs are checked by the compressors themselves)
_KEPT = ("model", "compress", "grad_compress", "boundary_compress")


def run_job(values: Mapping[str, Any], cli: bool = False) -> dict[str, Any]:
    """The job parameters of ``values`` (None: not given) normalised as predict normalises
    them (:func:`normalize`; ``cli``: errors name the flag): what ``perfsim run`` and
    :func:`perfsim.run` hand to RunConfig."""
    job = {name: values[name] if name in _KEPT else normalize(name, values[name], cli)
           for name in RUN_JOB_PARAMS if values.get(name) is not None}
    if "virtual_stages" in job:  # as predict takes it: the interleaved schedule's chunk count
        job["virtual_stages"] = chosen_chunks(job.get("schedule", Job.schedule), job["virtual_stages"])
    return job


# ---------------------------------------------------------------- Python API

def signature(extra: tuple[inspect.Parameter, ...] = (), ret: str = "Result") -> inspect.Signature:
    """Keyword-only signature of the parameters (annotations as strings)."""
    ps = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default,
                            annotation=p.annotation) for p in PARAMS]
    return inspect.Signature([*ps, *extra], return_annotation=ret)


def _choices_ref(p: Param) -> str:
    """The choices as text without importing where they are defined (doc_table
    runs at ``import perfsim``)."""
    if isinstance(p.choices, str):
        module, name = p.choices.split(":")
        return f"one of {module}.{name}"
    return ", ".join(p.choices)


def doc_table() -> str:
    """The parameters as a docstring section (name, type, default, help)."""
    lines = []
    for p in PARAMS:
        default = "" if p.default is None else f", default {p.default!r}"
        lines.append(f"    {p.name} ({p.annotation}{default}):\n        {p.help}"
                     + (f" ({_choices_ref(p)})" if p.choices else ""))
    return "\n".join(lines)
