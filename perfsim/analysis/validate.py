"""Validation: the same configuration measured (execute mode) and predicted (simulator).

For every ([schedule,] bandwidth, pipeline compression, gradient compression[,
tp]) of a grid, :func:`run_row` runs execute mode (``perfsim.runtime.run``:
real torch.distributed training, over a ``tc``-shaped link when a bandwidth is
given) and ``perfsim.api.predict`` with a profile calibrated on the same
machine, and compares throughput and iteration time: per-row signed error
``(predicted - measured) / measured`` and the mean absolute percentage error
(MAPE) over rows.

What the simulator is told about the link (``link_model``): only the nominal
emulated rate and the profile. ``predict`` builds the link itself with the same
transport model it uses for every prediction (:mod:`perfsim.link`): ``profile``
(default) passes ``link_model="auto"`` -- the link ``perfsim calibrate
--emulate-bandwidth`` measured at that rate (achieved rate, per-message fixed
cost, the shaper's token bucket; point-to-point fits for pipelines, allreduce
fits for collectives), nominal where the profile has no measurement at that rate
(``link_source`` column says which); ``nominal`` ignores the measurement. Loopback
rows (no emulated rate) get the profile's loopback measurement as an ideal NIC
(:func:`link_params`). Nothing is fitted to the validation runs themselves.
Execute mode posts each stage's receives a step ahead
(:mod:`perfsim.runtime.pipeline`), so gloo's receiver-driven p2p finds its
receive posted: pipeline rows are eager. The results, grid by grid, are in
``docs/validation.md``.

Re-running a grid on the same ``out`` resumes it, like ``perfsim sweep``: a row whose
measurement is stored under the same key (below) is kept and predicted again, the others
are measured; a ``validation.csv`` that is not a validation table, or that holds rows of
another grid, is refused (:func:`perfsim.analysis.measured.check_table`) unless
``overwrite``, which measures every row again.

``reuse_measured``: re-predict against the measured results already stored in
the row's run folders (``runs/<row>/result.json`` and its repeats), else in the
grid's ``validation.csv`` (its measured columns), instead of running again -- for
a changed simulator, the measurements stay valid -- as long as they were taken
with the same run parameters and perfsim version (:mod:`perfsim.analysis.measured`;
otherwise the row is measured again, and a warning says why).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from perfsim import outputs
from perfsim.analysis.measured import (_TABLES, check_table, chosen_repeat, measure_key, repeat_choice,  # noqa: F401 (tests)
                                      reused, write_key)
from perfsim.analysis.plot_files import save_figure
from perfsim.analysis.plots import plot_validation
from perfsim.api import build_configs, predict
from perfsim.engine.plan import build_plan
from perfsim.errors import ConfigError
from perfsim.fabrics import Nic
from perfsim.job import Job, chosen_chunks
from perfsim.link import Link
from perfsim.models.datasets import dataset_samples
from perfsim.models.registry import get_model_spec
from perfsim.shaping import check_rate
from perfsim.profile import load_profile
from perfsim.runtime import make_config, run
from perfsim.units import format_bandwidth, parse_bandwidth, parse_time, split_list

#: figures compared per row (predicted_<m>, measured_<m>, error_<m>_pct)
METRICS = ("throughput_samples_per_s", "iteration_s")
#: breakdown columns copied from both sides for diagnosis
BREAKDOWN = ("compute_s", "comm_s", "encode_s", "idle_s", "dp_sync_s", "optimizer_s",
             "pipeline_bytes", "dp_bytes", "bubble_fraction", "tp_comm_s", "tp_bytes", "tied_bytes")
LINK_MODELS = ("profile", "nominal")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidationPlan:
    """A validation grid.

    base: parameters shared by every row (model, pp, dp, schedule, micro_batch,
      macro_batch): the names of ``perfsim run`` / ``perfsim predict`` flags.
    bandwidths: emulated link rates in bits/s; None = no emulation (loopback).
    compresses, grad_compresses: pipeline / data-parallel compression specs.
    schedules: pipeline schedules, one row each (empty: ``base``'s).
    tps: tensor-parallel degrees (``perfsim run --tp``; a grid axis, innermost);
      sequence_parallel: Megatron sequence parallelism on the ``tp > 1`` rows.
    latency_s: emulated one-way latency.
    steps: optimizer steps per measured run (the first, and AQ-SGD's uncompressed
      first epoch, are not measured -- see perfsim.runtime.measure).
    dataset_limit: samples per epoch of the measured runs (short epochs so that
      AQ-SGD reaches its compressed phase); the prediction uses the same.
    profile: calibrated profile path; link_model: ``profile`` or ``nominal``.
    out: folder for the per-run outputs and the comparison table.
    runtime_model: describe the model to the simulator with execute mode's
      own parameter counts (:func:`runtime_workload`), not the preset's.
    reuse_measured: reuse the measurements stored in ``out`` (see the module's docstring);
      otherwise a grid re-run resumes: a row measured earlier under the same key (every run
      parameter and perfsim's version) is kept, the others are measured; ``overwrite``:
      every row is measured again.
    repeats: measured runs per row, reduced to one as the profile's calibration reduced
      its own repeats (:func:`repeat_choice`: ``min`` -> the fastest run, ``median`` -> the
      middle one), so both sides of a row's error are the same statistic (all repeats are
      kept in ``measured_throughput_all``).
    row_drift: before each row measured now, a drift check (:func:`row_drift_file`); the row is
      predicted a second time with the profile's compute as that check timed it
      (``predicted_drifted_*`` and ``error_drifted_*`` columns, ``row_compute_drift``: the check's
      median compute ratio): on a shared machine whose speed moves between rows, the error of the
      model apart from the machine's drift.
    """

    base: dict[str, Any]
    bandwidths: tuple[float | None, ...] = (None,)
    compresses: tuple[str, ...] = (str(Job.compress),)
    grad_compresses: tuple[str, ...] = (str(Job.grad_compress),)
    schedules: tuple[str, ...] = ()
    tps: tuple[int, ...] = (1,)
    sequence_parallel: bool = False
    latency_s: float = 0.0
    steps: int = 20
    dataset_limit: int | None = None
    profile: str | None = None
    link_model: str = "profile"
    out: str = "traces/validation/run"
    reuse_measured: bool = False
    overwrite: bool = False
    seed: int = 0
    repeats: int = 1
    #: before each row measured now, time the model's compute again as the profile's calibration
    #: did (:func:`row_drift_file`): the row is also predicted with the machine's speed of that moment
    row_drift: bool = False
    runtime_model: bool = True
    extra_run: dict[str, Any] = field(default_factory=dict)
    #: strategy facts of execute mode the simulator must be told: the runtime
    #: averages gradients after the whole step (perfsim.runtime.worker syncs them
    #: after run_step returns), so no overlap with the backward pass
    extra_predict: dict[str, Any] = field(default_factory=lambda: {"overlap": False})

    def __post_init__(self):
        if self.repeats < 1:
            raise ConfigError(f"repeats={self.repeats}: must be >= 1")
        if self.link_model not in LINK_MODELS:
            raise ConfigError(f"link_model={self.link_model!r}: choose from {', '.join(LINK_MODELS)}")
        if self.steps < 3:
            raise ConfigError(f"steps={self.steps}: need >= 3 (the first step is not measured)")
        if not self.compresses or not self.grad_compresses or not self.bandwidths or not self.tps:
            raise ConfigError("validation grid: empty list of bandwidths, compressors or tp degrees")
        for t in self.tps:
            if not isinstance(t, int) or isinstance(t, bool) or t < 1:
                raise ConfigError(f"tp={t!r}: must be an integer >= 1")
        for b in self.bandwidths:
            if b is not None and not b > 0:
                raise ConfigError(f"bandwidth {b}: must be > 0")
        if self.latency_s < 0:
            raise ConfigError(f"latency {self.latency_s}: must be >= 0")
        if self.profile is None:
            raise ConfigError("validation needs --profile (a profile calibrated on this machine)")
        if self.overwrite and self.reuse_measured:
            raise ConfigError("--overwrite measures every row again, --reuse-measured reuses the stored "
                              "measurements: give one or the other")

    def rows(self) -> list[dict[str, Any]]:
        """Every ([schedule,] bandwidth, compress, grad_compress[, tp]) combination, in order
        (``schedule`` only with several schedules, ``tp`` only in a grid with a TP axis)."""
        rows = [{"bandwidth": b, "compress": c, "grad_compress": g, **({"tp": t} if self.tps != (1,) else {})}
                for b in self.bandwidths for c in self.compresses for g in self.grad_compresses
                for t in self.tps]
        if not self.schedules:
            return rows
        return [{"schedule": s, **r} for s in self.schedules for r in rows]


def parse_bandwidths(text: str) -> tuple[float | None, ...]:
    """``"1Gbps,100Mbps"`` -> (1e9, 1e8); ``none`` / ``loopback`` -> None."""
    out: list[float | None] = []
    for part in split_list(text, "--emulate-bandwidth"):
        out.append(None if part.lower() in ("none", "loopback", "off") else
                   parse_bandwidth(part, "--emulate-bandwidth"))
        if out[-1] is not None:
            check_rate(out[-1])
    return tuple(out) or (None,)


# ----------------------------------------------------------------------------- link parameters
def link_params(profile, bandwidth_bps: float | None, latency_s: float, link_model: str,
                dp_only: bool) -> tuple[dict[str, Any], str | None]:
    """What ``predict`` is told about a row's link: the nominal rate and the link model
    (predict resolves the calibrated link itself, :func:`perfsim.link.resolve_link`).
    Loopback rows (no emulated rate) have no nominal rate: the profile's loopback
    measurement is passed as an ideal NIC of that rate (its source is returned too)."""
    if bandwidth_bps is not None:
        return {"bandwidth": bandwidth_bps, "latency": latency_s,
                "link_model": "auto" if link_model == "profile" else "nominal"}, None

    op = "allreduce" if dp_only else "p2p"
    link = Link.calibrated(profile, None, latency_s, op=op)
    if link is None:
        raise ConfigError(f"profile {profile.path!r}: no {op} records for loopback; "
                          "calibrate with comm ops to validate without emulation")
    return ({"nic": Nic(1, link.rate_bps, "ideal"), "latency": link.one_way_s, "link_model": "nominal",
             "link_burst": link.burst_bytes}, link.source)


# ----------------------------------------------------------------------------- running
def runtime_workload(model: str, folder) -> Path:
    """A workload file describing the model exactly as execute mode builds it.

    Layer names and boundary shapes come from the preset (so compute times are
    still read from the profile by model and layer name); parameter counts are
    those of ``perfsim.runtime.models.build_layer`` -- e.g. the runtime's GPT LM head
    has its own V*d weight (untied, or a synced copy: ``tied_values``), which changes
    the gradient bytes a data-parallel step exchanges.
    """
    from perfsim.runtime.models import build_layer  # lazy: perfsim.runtime.models loads torch

    spec = get_model_spec(model)
    layers = []
    for i, lay in enumerate(spec.layers()):
        mod = build_layer(spec, i, 0)
        layers.append({"name": lay.name, "params": int(sum(p.numel() for p in mod.parameters())),
                       "out_shape": list(lay.out_shape), "flops": lay.flops_fwd})
    # the last layer (the head)'s own V x d weight: with --tied-embedding sync a copy of the embedding's table
    tied = {"tied_values": mod.lm_head.weight.numel()} if hasattr(mod, "lm_head") else {}
    path = Path(folder) / f"workload-{spec.name}.json"
    outputs.write_text(path, outputs.json_text({"name": spec.name, "tokens_per_sample": spec.tokens_per_sample,
                                                **tied, "layers": layers}))
    return path


def _drop_checkpoint(run_dir: str) -> None:
    """Validation runs need the measurements, not the model: remove the checkpoint."""
    shutil.rmtree(Path(run_dir) / "ckpt", ignore_errors=True)


def _summary_figures(result, prefix: str) -> dict[str, Any]:
    s = result.summary
    out = {f"{prefix}_{m}": s.get(m) for m in METRICS}
    out.update({f"{prefix}_{b}": s.get(b) for b in BREAKDOWN})
    return out


def run_row(plan: ValidationPlan, row: dict[str, Any], profile, index: int,
            runner: Callable[..., Any] | None = None, predictor: Callable[..., Any] | None = None
            ) -> dict[str, Any]:
    """Measure and predict one row; returns the comparison row."""
    runner = run if runner is None else runner
    predictor = predict if predictor is None else predictor

    bw = row["bandwidth"]
    base = dict(plan.base)
    if row.get("schedule"):
        base["schedule"] = row["schedule"]
    if chosen_chunks(base.get("schedule"), base.get("virtual_stages")) is None:  # the others fix their own
        base.pop("virtual_stages", None)
    tp = int(row.get("tp", 1))
    # pp = 1: every message is a collective (DP gradients, TP activations): allreduce fits
    dp_only = int(base.get("pp", 1)) == 1
    tag = f"{index:02d}-{format_bandwidth(bw) if bw else 'loopback'}-{row['compress']}-{row['grad_compress']}"
    if plan.schedules:
        tag += f"-{base['schedule']}"
    if tp > 1:
        base["tp"] = tp
        if plan.sequence_parallel:
            base["sequence_parallel"] = True
        tag += f"-tp{tp}" + ("sp" if plan.sequence_parallel else "")
    run_dir = Path(plan.out) / "runs" / tag.replace(":", "_")
    drift_file = row_drift_file(plan, tag)
    run_params = dict(base, compress=row["compress"], grad_compress=row["grad_compress"],
                      steps=plan.steps, seed=plan.seed, out=str(run_dir), **plan.extra_run)
    if plan.dataset_limit:
        run_params["dataset_limit"] = plan.dataset_limit
    if bw is not None:
        run_params["emulate_bandwidth"] = bw
        if plan.latency_s:
            run_params["emulate_latency"] = plan.latency_s
    t0 = time.perf_counter()
    key, key_params = measure_key(run_params)
    measured, tputs, stored_key = None, [], None
    choice = repeat_choice(profile)
    if not plan.overwrite:  # --reuse-measured, or a re-run resuming (only what its key still holds)
        measured, tputs, stored_key = reused(plan, row, run_dir, key, key_params, unchecked=plan.reuse_measured,
                                             choice=choice)
    kept = measured is not None
    if plan.row_drift and not kept:  # the machine's compute speed right before this row's runs
        _time_row_drift(plan, base, tp, profile, drift_file)
    elif not kept:  # an earlier run's check does not describe the runs made now
        drift_file.unlink(missing_ok=True)
    runs = []
    for k in range(0 if measured is not None else plan.repeats):
        # a re-measurement replaces the row's earlier run (perfsim run refuses that otherwise)
        params = dict(run_params, out=str(run_dir) + (f"-r{k}" if k else ""), overwrite=True)
        m = runner(**params)
        _drop_checkpoint(params["out"])
        write_key(params["out"], key, key_params)
        stored_key = key
        tputs.append(m.summary.get("throughput_samples_per_s") or 0.0)
        runs.append(m)
    if runs:
        measured = chosen_repeat(runs, choice)
    wall = time.perf_counter() - t0
    link, loopback_source = link_params(profile, bw, plan.latency_s, plan.link_model, dp_only)
    pred_params = dict(base, compress=row["compress"], grad_compress=row["grad_compress"], profile=profile,
                       **link, **plan.extra_predict)
    latency_made = measured.summary.get("latency_in")
    if bw is not None and plan.latency_s and latency_made != "kernel":
        # the kernel never saw this latency (the messenger added it: perfsim.netem), so no TCP
        # window bounds the run's connections (perfsim.tcp); an older run that does not say is
        # taken as this machine's emulation, which has no sch_netem
        pred_params.setdefault("tcp_window", "off")
        pred_params.setdefault("tcp_slow_start_after_idle", "off")  # nor a round trip to restart over
    # a TP row keeps the preset: the workload file has no architecture, and the TP split of
    # the measured layer times needs it (perfsim.engine.compute.tp_measured_split)
    if plan.runtime_model and tp == 1:
        pred_params.pop("model", None)
        pred_params["workload"] = str(runtime_workload(base["model"], plan.out))
    # the measured runs' epoch: the model's data set (the workload file above has none),
    # shortened by --dataset-limit
    samples = dataset_samples(get_model_spec(base["model"]), plan.dataset_limit) or plan.dataset_limit
    if samples:
        pred_params["dataset_samples"] = samples
    predicted, note = _predict(predictor, pred_params, tp)
    out = {"model": base.get("model"), "bandwidth_bps": bw, "latency_s": plan.latency_s,
           "compress": row["compress"], "grad_compress": row["grad_compress"],
           "schedule": base.get("schedule"),
           "virtual_stages": predicted.summary.get("virtual_stages") if predicted is not None else None,
           "pp": base.get("pp"), "dp": base.get("dp"),
           "tp": tp, "sequence_parallel": bool(base.get("sequence_parallel", False)),
           "predict_note": note,
           "micro_batch": base.get("micro_batch"), "macro_batch": base.get("macro_batch"),
           **_link_columns(predicted.summary if predicted is not None else {}, dp_only, loopback_source),
           "measured_steps": measured.summary.get("measured_steps"),
           # who made the emulated latency (perfsim.runtime.measure.latency_in): decides the TCP window
           "measured_latency_in": latency_made if isinstance(latency_made, str) else "",
           "measured_repeats": len(tputs),
           # which repeat counts: the profile's own statistic (repeat_choice); a reused row keeps its earlier one
           "measured_repeat_choice": "" if kept else choice,
           # measured by an earlier run of the grid (resumed, --reuse-measured), not by this one
           "measured_reused": kept,
           "measured_throughput_all": ";".join(f"{t:.2f}" for t in tputs),
           "run_wall_s": round(wall, 2), "run_dir": str(run_dir), "measured_key": stored_key}
    out.update(_summary_figures(predicted, "predicted") if predicted is not None else
               {k: None for k in _summary_figures(measured, "predicted")})
    out.update(_summary_figures(measured, "measured"))
    for m in METRICS:
        p, q = out[f"predicted_{m}"], out[f"measured_{m}"]
        out[f"error_{m}_pct"] = 100.0 * (p - q) / q if p is not None and q else math.nan
    if plan.row_drift:
        out.update(_drifted_columns(plan, profile, pred_params, tp, drift_file, out))
    return out


def row_drift_file(plan: ValidationPlan, tag: str) -> Path:
    """Where a row's drift check goes (``<out>/row-drift/<row>.json``): a profile of the model's
    compute timed right before the row's runs; kept with the table (what re-predicts the row
    at the machine's speed of that moment reads it)."""
    return Path(plan.out) / "row-drift" / (tag.replace(":", "_") + ".json")


def _time_row_drift(plan: ValidationPlan, base: dict[str, Any], tp: int, profile, path: Path) -> None:
    """Time the row's model as the profile's calibration did, into ``path``
    (:func:`perfsim.calibrate.compare.drift_check`); a profile it cannot re-time (no layer
    records of the model at this micro-batch, or not a CPU profile) is refused before the runs."""
    from perfsim.calibrate.compare import drift_check  # lazy: the calibration harness is heavy

    path.parent.mkdir(parents=True, exist_ok=True)
    result = drift_check(profile, base["model"], int(base["micro_batch"]), str(path), int(base.get("pp", 1)),
                         schedule=base.get("schedule"), tp=tp)
    if result is None:
        raise ConfigError(f"--row-drift: profile {plan.profile} has no CPU layer records of {base['model']} at "
                          f"micro-batch {base['micro_batch']} to time again")


def _drifted_columns(plan: ValidationPlan, profile, pred_params: dict[str, Any], tp: int, path: Path,
                     row: dict[str, Any]) -> dict[str, Any]:
    """The row predicted with the profile's compute as its drift check timed it
    (:func:`perfsim.calibrate.compare.refreshed`), beside the check's median compute ratio; NaN
    where the row has no check (measured before, without ``row_drift``)."""
    from perfsim.calibrate.compare import compute_drift, refreshed  # lazy: as above
    from perfsim.profile import load_profile  # lazy: import perfsim does not load perfsim.profile

    cols = {"row_compute_drift": math.nan, "row_drift_file": ""}
    cols.update({f"predicted_drifted_{m}": math.nan for m in METRICS})
    cols.update({f"error_drifted_{m}_pct": math.nan for m in METRICS})
    if not path.is_file():
        return cols
    now = load_profile(str(path))
    predicted, _ = _predict(predict, dict(pred_params, profile=refreshed(profile, now)), tp)
    cols["row_compute_drift"] = compute_drift(now, profile)
    cols["row_drift_file"] = str(path)
    if predicted is not None:
        for m in METRICS:
            p, q = predicted.summary.get(m), row[f"measured_{m}"]
            cols[f"predicted_drifted_{m}"] = p
            cols[f"error_drifted_{m}_pct"] = 100.0 * (p - q) / q if p is not None and q else math.nan
    return cols


def _link_columns(summary: dict[str, Any], dp_only: bool, source: str | None = None) -> dict[str, Any]:
    """The link the prediction used (collective link for data-parallel-only rows)."""
    pre = "collective_link" if dp_only else "link"
    return {"predict_bandwidth_bps": summary.get(f"{pre}_rate_bps"),
            "predict_latency_s": summary.get(f"{pre}_one_way_s"),
            "predict_burst_bytes": summary.get(f"{pre}_burst_bytes"),
            "predict_collective_algo": summary.get("collective_algo"),
            "link_source": source or summary.get(f"{pre}_source")}


def _predict(predictor, params: dict[str, Any], tp: int):
    """``(Result, "")``; for a TP row whose predictor refuses ``tp`` as an unknown
    parameter (a ``predictor`` passed in without tensor parallelism; perfsim's own
    predicts it), ``(None, reason)``: the row keeps its measurement
    (``--reuse-measured`` re-predicts it later) and its error is NaN."""
    try:
        return predictor(**params), ""
    except ConfigError as exc:
        if tp > 1 and "'tp'" in str(exc) and "unknown parameter" in str(exc):
            return None, f"not predicted: {exc}"
        raise


def run_validation(plan: ValidationPlan, progress: Callable[[str], None] | None = None,
                   runner=None, predictor=None, on_row: Callable[[list[dict]], None] | None = None):
    """Every row of the plan -> a pandas DataFrame (also written as CSV by the caller).
    ``progress(label)`` is called before each row, ``on_row(rows)`` after it with the
    comparison rows so far."""
    import pandas as pd  # lazy: pandas is heavy, needed only here

    profile = load_profile(plan.profile)
    _TABLES.pop(str(Path(plan.out) / "validation.csv"), None)  # the table as stored now, not an earlier read
    rows = []
    for i, row in enumerate(plan.rows()):
        if progress:
            bw = format_bandwidth(row["bandwidth"]) if row["bandwidth"] else "loopback"
            progress(f"{bw} {row['compress']} grad={row['grad_compress']} tp={row.get('tp', 1)}")
        rows.append(run_row(plan, row, profile, i, runner, predictor))
        if on_row:
            on_row(rows)
    return pd.DataFrame(rows)


def summarize(df, metric: str = "throughput_samples_per_s") -> dict[str, float]:
    """MAPE, worst absolute error and rows over 10 % for ``metric``, over the rows that
    were predicted (``rows``; ``rows_measured_only`` were not, see :func:`_predict`)."""
    import pandas as pd  # lazy: pandas is heavy, needed only here

    err = pd.to_numeric(df[f"error_{metric}_pct"], errors="coerce").abs().dropna()
    out = {"rows": int(len(err)), "mape_pct": float(err.mean()) if len(err) else math.nan,
           "worst_pct": float(err.max()) if len(err) else math.nan,
           "rows_over_10pct": int((err > 10).sum())}
    if len(err) < len(df):
        out["rows_measured_only"] = int(len(df) - len(err))
    return out


def summarize_drifted(df) -> dict[str, float] | None:
    """Iteration-time MAPE and mean signed error of the rows predicted at their own drift
    check's compute speed (``error_drifted_iteration_s_pct``), and the range of those checks'
    compute ratios; None when no row has one."""
    import pandas as pd  # lazy: as above

    if "error_drifted_iteration_s_pct" not in df:
        return None
    err = pd.to_numeric(df["error_drifted_iteration_s_pct"], errors="coerce").dropna()
    if not len(err):
        return None
    drift = pd.to_numeric(df["row_compute_drift"], errors="coerce").dropna()
    return {"rows": int(len(err)), "mape_pct": float(err.abs().mean()), "mean_signed_pct": float(err.mean()),
            "drift_min": float(drift.min()), "drift_max": float(drift.max())}


def _f(x) -> float:
    """A figure for printing: NaN where a row has none (a TP row not predicted)."""
    try:
        return math.nan if x is None else float(x)
    except (TypeError, ValueError):
        return math.nan


def _tp_label(r) -> str:
    tp = r.get("tp", 1)
    tp = 1 if tp is None or tp != tp else int(tp)
    return f"tp{tp}" + ("+sp" if r.get("sequence_parallel") is True else "") if tp > 1 else "-"


def _has_tp(df) -> bool:
    return "tp" in df and bool((df["tp"].fillna(1) > 1).any())


def _several_schedules(df) -> bool:
    """True when the grid ran more than one schedule (the tables then name each row's)."""
    return "schedule" in df and df["schedule"].nunique() > 1


def format_table(df) -> str:
    """A terminal table: per row predicted vs measured throughput and iteration time."""
    sched = _several_schedules(df)
    tp = _has_tp(df)
    head = (f"{'schedule':<17}" if sched else "") + (
        f"{'bandwidth':>10} {'compress':<16} {'grad':<16} " + (f"{'tp':<6} " if tp else "") +
        f"{'pred sps':>9} {'meas sps':>9} "
        f"{'err %':>7} {'pred it ms':>10} {'meas it ms':>10} {'err %':>7}")
    lines = [head, "-" * len(head)]
    for _, r in df.iterrows():
        bw = format_bandwidth(r["bandwidth_bps"]) if r["bandwidth_bps"] == r["bandwidth_bps"] and \
            r["bandwidth_bps"] is not None else "loopback"
        lines.append(
            (f"{r['schedule']:<17}" if sched else "") +
            f"{bw:>10} {r['compress']:<16} {r['grad_compress']:<16} " + (f"{_tp_label(r):<6} " if tp else "") +
            f"{_f(r['predicted_throughput_samples_per_s']):9.1f} {_f(r['measured_throughput_samples_per_s']):9.1f} "
            f"{_f(r['error_throughput_samples_per_s_pct']):+7.1f} {1e3 * _f(r['predicted_iteration_s']):10.2f} "
            f"{1e3 * _f(r['measured_iteration_s']):10.2f} {_f(r['error_iteration_s_pct']):+7.1f}")
    s = summarize(df)
    t = summarize(df, "iteration_s")
    lines.append(f"throughput MAPE {s['mape_pct']:.1f} % (worst {s['worst_pct']:.1f} %, "
                 f"{s['rows_over_10pct']} of {s['rows']} rows > 10 %); iteration-time MAPE "
                 f"{t['mape_pct']:.1f} %")
    return "\n".join(lines)


def markdown_table(df) -> str:
    """The comparison as a markdown table (for notes and the README)."""
    sched = _several_schedules(df)
    tp = _has_tp(df)
    lines = [("| schedule " if sched else "") + "| bandwidth | compress | grad | " + ("tp | " if tp else "") +
             "predicted samples/s | measured samples/s | error % "
             "| predicted iteration ms | measured iteration ms |",
             ("| --- " if sched else "") + "| --- | --- | --- | " + ("--- | " if tp else "") +
             "---: | ---: | ---: | ---: | ---: |"]
    for _, r in df.iterrows():
        bw = r["bandwidth_bps"]
        bw = format_bandwidth(bw) if bw is not None and bw == bw else "loopback"
        lines.append((f"| {r['schedule']} " if sched else "") +
                     f"| {bw} | {r['compress']} | {r['grad_compress']} | " + (f"{_tp_label(r)} | " if tp else "") +
                     f"{_f(r['predicted_throughput_samples_per_s']):.1f} | {_f(r['measured_throughput_samples_per_s']):.1f} | "
                     f"{_f(r['error_throughput_samples_per_s_pct']):+.1f} | {1e3 * _f(r['predicted_iteration_s']):.2f} | "
                     f"{1e3 * _f(r['measured_iteration_s']):.2f} |")
    s = summarize(df)
    lines.append("")
    lines.append(f"Throughput MAPE {s['mape_pct']:.1f} %, worst row {s['worst_pct']:.1f} %, "
                 f"{s['rows_over_10pct']} of {s['rows']} rows above 10 %.")
    notes = sorted({n for n in df.get("predict_note", []) if isinstance(n, str) and n})
    lines += [f"{n} (measured only; `--reuse-measured` predicts it once the simulator has it)" for n in notes]
    return "\n".join(lines)


def plot(df, path, title: str | None = None) -> Path:
    """Predicted-vs-measured figure (PNG or SVG by suffix), drawn by perfsim.analysis.plots."""
    import matplotlib  # lazy: matplotlib is heavy, needed only here

    matplotlib.use("Agg")
    path = Path(path)

    fig = plot_validation(df, title=title)
    return save_figure(fig, path)


def write_csv(df, path) -> Path:
    """``df`` as CSV at ``path``, atomically (:func:`perfsim.outputs.write_frame`)."""
    path = Path(path)
    outputs.write_frame(path, df, "csv")
    return path


def parse_latency(text: str | None) -> float:
    return 0.0 if not text else parse_time(text, "--emulate-latency")


def check_specs(plan: ValidationPlan) -> None:
    """Check every compression spec of ``plan`` against both the simulator (the
    engine plans the configuration) and the runtime (execute mode's config
    validation) before any slow measured run starts. ConfigError naming the spec."""
    base = {k: v for k, v in plan.base.items() if k in ("model", "pp", "dp", "schedule",
                                                         "micro_batch", "macro_batch")}
    for c in plan.compresses:
        for g in plan.grad_compresses:
            try:
                workload, strategy, _, profile = build_configs(**base, compress=c, grad_compress=g,
                                                               profile=plan.profile)
                build_plan(workload, strategy, profile)
            except ConfigError as exc:
                raise ConfigError(f"the simulator rejects compress={c} grad_compress={g}: {exc}") from None
            try:
                make_config(**plan.base, compress=c, grad_compress=g, steps=plan.steps,
                            out=plan.out, **plan.extra_run)
            except ConfigError as exc:
                raise ConfigError(f"the runtime rejects compress={c} grad_compress={g}: {exc}") from None
