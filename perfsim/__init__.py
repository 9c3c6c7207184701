"""perfsim: a network-aware simulator and real-cluster performance modeller for
distributed training with communication compression.

The Python API mirrors the command line one to one (``perfsim predict
--grad-compress qsgd-maxnorm:4`` is ``perfsim.predict(grad_compress="qsgd-maxnorm:4")``)::

    import perfsim
    r = perfsim.predict(bandwidth="100Mbps", compress="aqsgd:fw3bw6")
    r.to_frame()                        # one-row pandas DataFrame
    df = perfsim.sweep(bandwidth=["10Gbps", "100Mbps"], compress=["fp32", "aqsgd:fw3bw6"]).to_frame()
    best = perfsim.plan(model="gpt2-xl", nodes=4, bandwidth="1Gbps").to_frame()
    prof = perfsim.calibrate("traces/mybox.json", quick=True)     # measure this machine (torch)
    m = perfsim.run(model="digits-mlp", pp=2, steps=20)           # train for real, measured Result
    df = perfsim.validate(profile="traces/mybox.json", compress="fp32,aqsgd:fw3bw6")

The predict parameters are described once, in :mod:`perfsim.params`; importing
perfsim is cheap (the simulator, pandas and torch load on first use).
Read the code in the order given in README.md ("Read the code in this order").
"""

from __future__ import annotations

import dataclasses
import inspect as _inspect
import logging as _logging
from typing import TYPE_CHECKING, Any, Callable

from perfsim import params as _params
from perfsim.errors import ConfigError
from perfsim.params import BY_NAME, RUN_JOB_PARAMS
from perfsim.runtime.config import RUN_OPTIONS, RunConfig

if TYPE_CHECKING:  # pragma: no cover
    from perfsim.analysis.sweep import SweepTable
    from perfsim.plan import PlanResult
    from perfsim.profile import Profile
    from perfsim.result import Result

__version__ = "0.1.0"

_logging.getLogger("perfsim").addHandler(_logging.NullHandler())


def predict(**params: Any) -> "Result":
    from perfsim.api import predict as _predict  # lazy: import perfsim does not load perfsim.api

    return _predict(**params, note_unused=True)  # the caller's own settings: say which are unused


predict.__signature__ = _params.signature(extra=(  # type: ignore[attr-defined]
    _inspect.Parameter("trace", _inspect.Parameter.KEYWORD_ONLY, default=False, annotation="bool"),))
predict.__doc__ = f"""Simulate one configuration; the keyword arguments are ``perfsim predict``'s flags.

Returns a :class:`perfsim.result.Result`: ``.summary`` (dict), ``.to_frame()`` (one-row
DataFrame), ``.to_frame("stages" | "microbatches" | "links")``. Raises
:class:`ConfigError` naming the parameter on bad input.

Parameters (units: bits/s for rates, seconds for times, bytes for sizes; strings
such as ``"100Mbps"``, ``"5ms"``, ``"25MiB"`` are parsed):
{_params.doc_table()}
    trace (bool, default False):
        record a Chrome/Perfetto timeline in ``Result.trace_events`` (``Result.write_trace(path)``)
"""


def sweep(*, out: str | None = None, jobs: int | None = None, skip_invalid: bool = False,
          resume: bool = True, progress: bool | None = None,
          predict: Callable[..., Any] | None = None, **grid: Any) -> "SweepTable":
    from perfsim.analysis.sweep import run_sweep  # lazy: import perfsim does not load perfsim.analysis.sweep

    return run_sweep(grid, out, jobs=jobs, skip_invalid=skip_invalid, resume=resume,
                     progress=progress, predict=predict)


sweep.__signature__ = _inspect.Signature([  # type: ignore[attr-defined]
    *(_inspect.Parameter(p.name, _inspect.Parameter.KEYWORD_ONLY, default=None,
                         annotation=f"{p.annotation} | list | None") for p in _params.PARAMS),
    *(p for p in _inspect.signature(sweep).parameters.values() if p.kind != p.VAR_KEYWORD),
], return_annotation="SweepTable")
sweep.__doc__ = f"""Predict every combination of the given values (``perfsim sweep``).

Each predict parameter takes one value, a list or a comma-list string; the
others keep predict's defaults. Returns a :class:`~perfsim.analysis.sweep.SweepTable`:
``.to_frame()`` (one row per configuration, predict's summary columns +
``config_id``), ``.stages``, ``.errors``.

out: write the table (.csv/.parquet; "-": CSV on stdout) and resume from it on a re-run:
    a stored row is reused only while its inputs (column ``input_key``: perfsim's
    version, the SHA-256 of every input file) are unchanged, else recomputed with a
    warning; rows of another grid in ``out`` are refused (``resume=False`` replaces them).
jobs: worker processes (default: in-process for small grids, a pool above
    :data:`perfsim.analysis.sweep.POOL_THRESHOLD` configurations).
skip_invalid: record configurations predict rejects instead of stopping.
predict: the function to call per configuration (default :func:`perfsim.predict`).

Grid parameters:
{_params.doc_table()}
"""


def run(**params: Any) -> "Result | None":
    from perfsim.runtime import run as _run  # lazy: import perfsim does not load perfsim.runtime._entry

    return _run(**params)


def _run_signature() -> _inspect.Signature:
    """``perfsim run``'s keywords from the tables its flags come from: the job's parameters
    (:data:`perfsim.params.RUN_JOB_PARAMS` of :data:`perfsim.params.PARAMS`, defaults
    RunConfig's, i.e. the job's) and run's own options (:data:`perfsim.runtime.config.RUN_OPTIONS`)."""
    fields = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}
    kw = _inspect.Parameter.KEYWORD_ONLY
    out = [_inspect.Parameter(name, kw, default=fields[name], annotation=BY_NAME[name].annotation)
           for name in RUN_JOB_PARAMS]
    out += [_inspect.Parameter(o.name, kw, annotation=o.annotation,
                               default=False if o.kind == "switch" else  # out, resume: None, RunConfig's resolves
                               None if o.name in ("out", "resume") else fields[o.field])
            for o in RUN_OPTIONS]
    out.append(_inspect.Parameter("progress", kw, default=None, annotation="Callable[[dict], None] | None"))
    return _inspect.Signature(out, return_annotation="Result | None")


run.__signature__ = _run_signature()  # type: ignore[attr-defined]
run.__doc__ = """Train for real with torch.distributed and measure it (``perfsim run``).

    The keywords are ``perfsim run``'s flags (see the signature): the job's
    (:data:`perfsim.params.RUN_JOB_PARAMS`, the fields of :class:`perfsim.job.Job`, parsed as
    :func:`predict` parses them) and run's own (:data:`perfsim.runtime.config.RUN_OPTIONS`):
    ``emulate_bandwidth`` in bits/s or
    ``"100Mbps"`` (needs root: network namespaces + tc), ``emulate_latency`` and
    ``timeout`` in seconds or ``"5ms"``; ``progress`` is called with
    ``{"step", "steps", "loss"}`` after each step. Returns the measured
    :class:`~perfsim.result.Result` (the schema of :func:`predict`); under torchrun,
    None on ranks other than 0.
    """


from perfsim.analysis import validate_grid as _validate_grid  # noqa: E402  (torch-free)


def _known_keywords(func: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Every keyword of ``kwargs`` is a parameter of ``func.__signature__`` (a
    ConfigError naming the unknown ones, as predict, sweep, plan and run raise)."""
    known = func.__signature__.parameters  # type: ignore[attr-defined]
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        raise ConfigError(f"{func.__name__}: unknown keyword(s) {unknown} (known: {', '.join(known)})")


def validate(**kwargs: Any):
    _known_keywords(validate, kwargs)
    return _validate_grid.validate(**kwargs)


validate.__signature__ = _inspect.signature(_validate_grid.validate)  # type: ignore[attr-defined]
validate.__doc__ = _validate_grid.validate.__doc__


from perfsim.calibrate import calibration as _calibration  # noqa: E402  (torch-free)


def calibrate(out: str = "traces/calibrated.json", **params: Any):
    _known_keywords(calibrate, params)
    return _calibration.calibrate(out, **params)


calibrate.__signature__ = _inspect.Signature([  # type: ignore[attr-defined]
    *(p for p in _inspect.signature(_calibration.calibrate).parameters.values() if p.kind != p.VAR_KEYWORD),
    *_inspect.signature(_calibration.plan_calibration).parameters.values()])
calibrate.__doc__ = _calibration.calibrate.__doc__ + """
    The keywords, their defaults and checks: :func:`perfsim.calibrate.calibration.plan_calibration`.
    Example::

        profile = perfsim.calibrate("traces/mybox.json", model="gpt2-tiny", quick=True)
        perfsim.predict(model="gpt2-tiny", pp=2, profile="traces/mybox.json")
"""


from perfsim import plan as _plan_module  # noqa: E402  (bound now, so the function below keeps the name)


def plan(**kwargs: Any) -> "PlanResult":
    return _plan_module.plan(**kwargs)


plan.__signature__ = _inspect.signature(_plan_module.plan)  # type: ignore[attr-defined]
plan.__doc__ = (_plan_module.plan.__doc__ or "") + """
    Returns a :class:`perfsim.plan.PlanResult`: ``.to_frame()`` (one row per ranked
    configuration), ``.explanation``. The module is :mod:`perfsim.plan` (import its
    names with ``from perfsim.plan import ...``).
"""


def load_profile(spec: "str | Profile | None" = None) -> "Profile":
    """A calibration profile from a file, a shipped name (``default-v100``) or None (the default):
    the caller's own copy (editing it changes no prediction given the file's name)."""
    import copy  # lazy: only here

    from perfsim.api import _load_profile  # lazy: import perfsim does not load perfsim.api

    profile = _load_profile(spec)
    if profile is spec:
        return profile
    # a copy: the API caches the file's Profile, which an edit of the caller's would change
    mine = copy.deepcopy(profile)
    mine.forget()
    return mine


def compressors(shape: tuple[int, ...] = (1, 1024, 1600)):
    """Every accepted compressor spec with its wire bytes for ``shape`` (a DataFrame;
    columns as ``perfsim compressors --format csv``)."""
    import pandas as pd  # lazy: pandas is heavy, needed only here

    # lazy: import perfsim does not load perfsim.compression.catalog
    from perfsim.compression.catalog import COLUMNS, rows

    return pd.DataFrame(rows(tuple(shape)), columns=list(COLUMNS))


def memory_report(**params: Any):
    """Does a job fit: the peak memory per GPU of the job (``perfsim predict``'s keywords)
    and of each single change that lowers it, with a combination that fits where no single
    one does (:class:`perfsim.analysis.memory_fit.MemoryReport`; ``perfsim memory``)."""
    from perfsim.analysis import memory_fit  # lazy: import perfsim does not load perfsim.analysis.memory_fit

    return memory_fit.memory_report(**params)


memory_report.__signature__ = _params.signature(ret="MemoryReport")  # type: ignore[attr-defined]

__all__ = ["__version__", "ConfigError", "predict", "sweep", "plan", "memory_report", "run", "validate", "calibrate",
           "load_profile", "compressors"]
