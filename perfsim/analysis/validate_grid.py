"""A whole validation grid, end to end: the function behind ``perfsim validate``
and :func:`perfsim.validate`.

:func:`validate` checks every input before the first (slow) measured run -- the
model, the profile, each schedule and tensor-parallel degree against execute
mode, each compression spec against the simulator and the runtime, root for
emulated links -- then measures and predicts every row
(:func:`perfsim.analysis.validate.run_validation`) under a lock on the output
folder, and writes ``validation.csv`` (after every row, so partial results
survive an interruption), ``summary.json``, ``validation.md`` and the plot.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Sequence

from perfsim.calibrate.machine import other_cpu
from perfsim.errors import ConfigError
from perfsim.job import Job, chosen_chunks
from perfsim.models.registry import get_model_spec
from perfsim.models.transformer import TransformerSpec
from perfsim.runtime.config import RunConfig
from perfsim.units import split_list

log = logging.getLogger(__name__)


#: what a validation grid changes from the job's defaults (:class:`perfsim.job.Job`, those of
#: ``perfsim predict`` and ``perfsim run``): a model that trains in seconds on a CPU, two
#: pipeline stages of 8-sample micro-batches under 1F1B; every other job default is the Job's
GRID_JOB = {"model": "digits-mlp", "pp": 2, "micro_batch": 8, "schedule": "1f1b"}


def _job_default(name: str) -> Any:
    """The default of job parameter ``name`` in a validation grid: :data:`GRID_JOB`'s, else the Job's."""
    return GRID_JOB[name] if name in GRID_JOB else getattr(Job, name)


def _names(value: str | Sequence[Any]) -> tuple[str, ...]:
    return tuple(split_list(value)) if isinstance(value, str) else tuple(str(v) for v in value)


def _degrees(value: str | int | Sequence[Any]) -> tuple[int, ...]:
    out = []
    for part in _names(str(value) if isinstance(value, int) else value):
        try:
            out.append(int(part))
        except ValueError:
            raise ConfigError(f"--tp {part!r}: not an integer") from None
        if out[-1] < 1:
            raise ConfigError(f"--tp {part!r}: must be >= 1")
    return tuple(out)


def _bandwidths(value) -> tuple[float | None, ...]:
    """A comma string (:func:`~perfsim.analysis.validate.parse_bandwidths`) or a sequence
    of rates (bits/s or ``"100Mbps"``; None = loopback)."""
    # lazy: import perfsim does not load perfsim.analysis.validate
    from perfsim.analysis.validate import parse_bandwidths

    if isinstance(value, str):
        return parse_bandwidths(value)
    return tuple(x for b in value for x in ((None,) if b is None else
                                            parse_bandwidths(b) if isinstance(b, str) else
                                            parse_bandwidths(f"{float(b)}bps")))


def default_out(model: str, pp: int, dp: int, tps: Sequence[int], sequence_parallel: bool,
                tied_embedding: str = "untied") -> str:
    """``traces/validation/<model>-pp<P>-dp<D>[-tp<T>_..[sp]][-tied]``: where a grid's files go
    by default."""
    tp_tag = "-tp" + "_".join(str(t) for t in tps) + ("sp" if sequence_parallel else "") \
        if tuple(tps) != (1,) else ""
    tied = "-tied" if tied_embedding == "sync" else ""
    return f"traces/validation/{model}-pp{pp}-dp{dp}{tp_tag}{tied}"


def validate(*, profile: str | None, model: str = _job_default("model"), pp: int = _job_default("pp"),
             dp: int = _job_default("dp"), tp: str | int | Sequence[int] = (_job_default("tp"),),
             sequence_parallel: bool = _job_default("sequence_parallel"),
             tied_embedding: str = _job_default("tied_embedding"),
             schedule: str | Sequence[str] = (_job_default("schedule"),),
             virtual_stages: int | None = _job_default("virtual_stages"), zero: int = _job_default("zero"),
             micro_batch: int = _job_default("micro_batch"), macro_batch: int = _job_default("macro_batch"),
             compress: str | Sequence[str] = (str(_job_default("compress")),),
             grad_compress: str | Sequence[str] = (str(_job_default("grad_compress")),),
             bandwidths: str | Sequence[Any] = (None,),
             latency: str | float | None = 0.0, link_model: str = "profile", steps: int = 20,
             dataset_limit: int | None = None, seed: int = 0, repeats: int = 1, reuse_measured: bool = False,
             overwrite: bool = False, out: str | None = None, plot: bool = True, progress: bool = True, drift_check: bool = True,
             row_drift: bool = False):
    """Measure and predict a grid, one row per configuration (``perfsim validate``).

    profile: a profile calibrated on this machine (``perfsim calibrate``).
    model, pp, dp, micro_batch, macro_batch, virtual_stages, sequence_parallel,
      tied_embedding, zero: ``perfsim run``'s flags, shared by every row (defaults: the
      job's, :class:`perfsim.job.Job`, with :data:`GRID_JOB`'s changes).
    tp, schedule, compress, grad_compress, bandwidths: the grid's axes (a sequence
      or a comma string; bandwidths in bits/s or ``"100Mbps"``, None or ``none`` =
      loopback, no emulation: emulated rates need root).
    latency: one-way latency of the emulated links (seconds or ``"5ms"``).
    link_model: ``profile`` (the link calibrated at that rate) or ``nominal``.
    steps, seed, repeats (the run that counts: as the profile chose among its repeats,
      :func:`perfsim.analysis.measured.repeat_choice`), dataset_limit (default: 4 steps'
      worth, so AQ-SGD's uncompressed first epoch ends early), reuse_measured
      (re-predict the measurements stored in ``out``): see
      :class:`perfsim.analysis.validate.ValidationPlan`.
    out: folder of the runs and the tables (default :func:`default_out`). A grid run again
      on the same folder resumes: rows measured earlier under the same run parameters and
      perfsim version are kept; a ``validation.csv`` of another grid (or not a validation
      table) is refused. ``overwrite``: measure every row again, replacing the table.
    plot: also draw ``validation.png``; progress: a bar or stage lines on stderr.
    drift_check: after runs made now, time the model's layers again as the profile's
      calibration did and compare (:func:`perfsim.calibrate.compare.drift_check`; the
      ratios go to ``summary["profile_drift"]``, a sentence to ``attrs["drift"]``): a
      shared machine drifts, and a profile that no longer describes it explains errors.
    row_drift: the same check before each row measured now (``<out>/row-drift/``, a few seconds
      a row); each row is also predicted with the compute that check timed (``predicted_drifted_*``,
      ``error_drifted_*``, ``row_compute_drift`` columns; ``summary["drifted"]``): the model's error
      apart from the machine's speed moving between the calibration and the row.

    Returns the comparison (a DataFrame: predicted, measured and error columns);
    its ``attrs`` hold ``summary`` (what ``summary.json`` holds), the paths ``csv``
    and ``png`` (None without a plot).
    Raises :class:`ConfigError` naming the flag on bad input, before anything runs.
    """
    from perfsim.analysis import validate as v  # lazy: import perfsim does not load perfsim.analysis.validate
    # lazy: import perfsim does not load perfsim.models.tensor_parallel
    from perfsim.models.tensor_parallel import check_tp
    from perfsim.outputs import check_dir_target, locked_dir  # lazy: import perfsim does not load perfsim.outputs

    spec = get_model_spec(model)
    for name, value in (("pp", pp), ("dp", dp), ("micro_batch", micro_batch), ("macro_batch", macro_batch),
                        ("steps", steps)):
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: must be >= 1")
    if macro_batch % micro_batch:
        raise ConfigError(f"--macro-batch {macro_batch}: not a multiple of --micro-batch {micro_batch}")
    if profile is None:
        raise ConfigError("--profile: required (a profile calibrated on this machine, see perfsim calibrate)")
    from perfsim.profile import load_profile  # lazy: import perfsim does not load perfsim.profile

    loaded = load_profile(profile)
    other = other_cpu(loaded.metadata)  # a bad file fails before any run starts
    if row_drift:
        from perfsim.calibrate.compare import can_drift_check  # lazy: the calibration side is heavy

        if not can_drift_check(loaded, model, micro_batch):
            raise ConfigError(f"--row-drift: profile {profile} has no CPU layer records of {model} at micro-batch "
                              f"{micro_batch} to time again (perfsim calibrate --model {model} --micro-batch "
                              f"{micro_batch} on this machine)")
    if other:  # runs measured here against another machine's costs: the errors would be the machines'
        log.warning("validate: profile %s was %s: its rows compare two machines (calibrate this one: "
                    "perfsim calibrate)", profile, other)
    schedules = tuple(s.lower() for s in _names(schedule))
    for s in schedules:  # a schedule that does not fit fails before any run starts
        RunConfig(model=model, pp=pp, dp=dp, schedule=s, micro_batch=micro_batch, macro_batch=macro_batch,
                  virtual_stages=chosen_chunks(s, virtual_stages),
                  tied_embedding=tied_embedding, zero=zero)
    base = {"model": model, "pp": pp, "dp": dp, "schedule": schedules[0], "micro_batch": micro_batch,
            "macro_batch": macro_batch}
    if zero:  # runs (FSDP2) and predictions (--zero 3) both take it
        base["zero"] = zero
    if virtual_stages is not None:
        base["virtual_stages"] = virtual_stages
    if tied_embedding != "untied":  # runs and predictions both take it
        base["tied_embedding"] = tied_embedding
    tps = _degrees(tp)
    if tied_embedding == "sync" and max(tps) > 1:
        RunConfig(model=model, pp=pp, tp=max(tps), tied_embedding=tied_embedding)  # names why not
    if sequence_parallel and max(tps) == 1:
        raise ConfigError("--sequence-parallel: needs a --tp > 1")
    for t in tps:  # a TP degree the model cannot take fails before any run
        check_tp(spec if isinstance(spec, TransformerSpec) else None, t, sequence_parallel and t > 1, model)
    limit = dataset_limit or 4 * macro_batch * dp
    out = out or default_out(model, pp, dp, tps, sequence_parallel, tied_embedding)
    plan = v.ValidationPlan(
        base=base, bandwidths=_bandwidths(bandwidths), compresses=_names(compress),
        grad_compresses=_names(grad_compress), schedules=schedules if len(schedules) > 1 else (),
        tps=tps, sequence_parallel=sequence_parallel,
        latency_s=latency if isinstance(latency, (int, float)) else v.parse_latency(latency),
        steps=steps, dataset_limit=limit, profile=str(profile), link_model=link_model, out=str(out),
        seed=seed, repeats=repeats, reuse_measured=reuse_measured, overwrite=overwrite, row_drift=row_drift)
    check_dir_target(plan.out, "--out")  # before the specs: their run config checks the folder too
    v.check_specs(plan)  # every spec, against the simulator and the runtime, before the first run
    if any(b is not None for b in plan.bandwidths):  # emulation needs root: say so before any run
        from perfsim.netem import check_privileges  # lazy: import perfsim does not load perfsim.netem

        check_privileges()
    if not 0 <= seed < 2**32:
        raise ConfigError(f"--seed {seed}: must be in 0..{2**32 - 1}")
    with locked_dir(plan.out, "--out"):  # a second validate on the same folder is refused
        v.check_table(plan)  # an earlier table of another grid is never replaced without --overwrite
        return _run_and_write(plan, plot=plot, progress=progress,
                              title=f"{model} pp={pp} dp={dp} tp={','.join(map(str, tps))}",
                              drift_check=drift_check)


def _profile_drift(plan) -> tuple[dict, str] | None:
    """({group: new / old}, a sentence) of the drift check after the runs, or None."""
    # lazy: import perfsim does not load perfsim.calibrate.compare
    from perfsim.calibrate.compare import comparison_text, drift_check
    from perfsim.profile import load_profile  # lazy: import perfsim does not load perfsim.profile

    if not plan.profile or not os.path.exists(plan.profile):
        return None
    result = drift_check(load_profile(plan.profile), plan.base["model"], plan.base["micro_batch"],
                         os.path.join(plan.out, "drift-check.json"), int(plan.base.get("pp", 1)),
                         plan.base.get("schedule"), tp=max(plan.tps))
    if result is None:
        return None
    return {g: r[0] for g, r in result.items()}, "drift check after the runs: " + comparison_text(result, plan.profile)


def _run_and_write(plan, *, plot: bool, progress: bool, title: str, drift_check: bool = True):
    """Run every row of ``plan`` with a progress bar, then write the grid's files."""
    import pandas as pd  # lazy: pandas is heavy, needed only here

    from perfsim import outputs  # lazy: import perfsim does not load perfsim.outputs
    from perfsim.analysis import validate as v  # lazy: import perfsim does not load perfsim.analysis.validate
    from perfsim.progress import Progress  # lazy: import perfsim does not load perfsim.progress

    out = plan.out
    total = len(plan.rows())
    bar = Progress(total, "run", enabled=progress, prefix="validate: ")
    labels: list[str] = []

    def begin(label: str) -> None:
        labels.append(label)
        bar.stage(f"row {len(labels)}/{total} {label}")

    def done(rows: list[dict]) -> None:
        v.write_csv(pd.DataFrame(rows), f"{out}/validation.csv")  # partial results survive an interruption
        bar(labels[-1])

    try:
        df = v.run_validation(plan, progress=begin, on_row=done)
    finally:
        bar.close()
    v.write_csv(df, f"{out}/validation.csv")
    kept = int(df["measured_reused"].sum())
    if kept and not plan.reuse_measured:
        log.info("validate: resumed: %d of %d rows kept as measured earlier in %s (same run parameters and "
                 "perfsim version); --overwrite measures them again", kept, len(df), out)
    drifted = v.summarize_drifted(df) if plan.row_drift else None
    summary = {**v.summarize(df), "iteration": v.summarize(df, "iteration_s"),
               **({"drifted": drifted} if drifted else {}),
               "profile": plan.profile, "link_model": plan.link_model, "base": plan.base,
               "steps": plan.steps, "dataset_limit": plan.dataset_limit,
               "load_average": os.getloadavg(), "reuse_measured": plan.reuse_measured, "rows_reused": kept}
    fresh = kept < len(df)  # some row measured now
    drift = _profile_drift(plan) if drift_check and fresh and not plan.reuse_measured else None
    if drift is not None:
        summary["profile_drift"] = drift[0]
    if plan.reuse_measured or not fresh:  # the measurements are older: keep the load they were taken under
        try:
            with open(os.path.join(out, "summary.json")) as f:
                old = json.load(f)
            summary["measured_load_average"] = old.get("measured_load_average", old.get("load_average"))
            if "profile_drift" in old:  # measured with the runs
                summary["profile_drift"] = old["profile_drift"]
        except (OSError, ValueError):
            pass
    outputs.write_text(f"{out}/summary.json", outputs.json_text(summary, default=str))
    outputs.write_text(f"{out}/validation.md", v.markdown_table(df) + "\n")
    df.attrs.update(summary=summary, csv=f"{out}/validation.csv", png=None, drift=drift[1] if drift else None)
    if plot and summary["rows"]:  # no plot when no row was predicted (e.g. TP rows the simulator lacks)
        df.attrs["png"] = str(v.plot(df, f"{out}/validation.png",
                                     title=f"{title}: predicted vs measured (MAPE {summary['mape_pct']:.1f} %)"))
    return df
