"""Validation: the same configuration measured (execute mode) and predicted (simulator).

For every (bandwidth, pipeline compression, gradient compression) of a grid we
run ``perfsim.runtime.api.run`` -- real torch.distributed training, over a
``tc``-shaped link when a bandwidth is given -- and ``perfsim.api.predict``
with a profile calibrated on this machine, and compare throughput and
iteration time: per-row signed error ``(predicted - measured) / measured`` and
the mean absolute percentage error (MAPE) over rows.

What the simulator is told about the link (``link_model``):

* ``nominal``: the emulated rate and latency as given;
* ``profile`` (default): what ``perfsim calibrate --emulate-bandwidth`` measured
  over that same emulated link, with the real backend -- the asymptotic rate
  (slope of the large-message fit, i.e. TCP/IP framing and the shaper's real
  rate) and the fixed one-way cost of a message (the smallest message's time
  minus its bytes at that rate: gloo's per-message work, syscalls, veth and
  bridge traversal). Point-to-point fits serve pipelines, allreduce fits
  data-parallel-only runs (with 2 ranks a ring allreduce of S bytes is one
  exchange of S bytes: T = S/B + 2 latency, so the per-exchange latency is half
  the fitted fixed cost). Nothing is fitted to the validation runs themselves:
  the link numbers come from separate micro-benchmarks recorded in the profile.

* the shaper's token bucket (``t(s) = alpha + max(0, s - b) / rate``), passed
  as ``link_burst``: the bucket :mod:`perfsim.netem` configured
  (:func:`perfsim.netem.tbf_burst_bytes`) times the payload share of a frame
  (fitted rate / nominal rate); profiles without pooled small-message means fall
  back to the burst ``perfsim calibrate`` fitted over that link
  (``metadata.network[].burst_bytes``), whose knee is only known to within the
  4x step between two measured sizes;
* gloo's point-to-point is receiver-driven (a send's bytes move once the
  receiver posted its receive), but execute mode posts each stage's receives a
  step ahead (:mod:`perfsim.runtime.pipeline`), so a send finds its receive
  posted and pipeline rows use ``p2p_protocol="eager"``;
* small messages fit in every link's token bucket, so their expected fixed cost
  is pooled over all emulated rates (:func:`pooled_small_message_s`).

Rows fall back to ``nominal`` when the profile has no measurement at that rate
(``link_source`` column says which was used).

``reuse_measured``: re-predict against the measured results already stored in
the row's run folders (``runs/<row>/result.json`` and its repeats) instead of
running again -- for a changed simulator, the measurements stay valid.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from perfsim.errors import ConfigError
from perfsim.units import format_bandwidth, parse_bandwidth, parse_time

#: figures compared per row (predicted_<m>, measured_<m>, error_<m>_pct)
METRICS = ("throughput_samples_per_s", "iteration_s")
#: breakdown columns copied from both sides for diagnosis
BREAKDOWN = ("compute_s", "comm_s", "encode_s", "idle_s", "dp_sync_s", "optimizer_s",
             "pipeline_bytes", "dp_bytes", "bubble_fraction")
LINK_MODELS = ("profile", "nominal")


@dataclass(frozen=True)
class ValidationPlan:
    """A validation grid.

    base: parameters shared by every row (model, pp, dp, schedule, micro_batch,
      macro_batch): the names of ``perfsim run`` / ``perfsim predict`` flags.
    bandwidths: emulated link rates in bits/s; None = no emulation (loopback).
    compresses, grad_compresses: pipeline / data-parallel compression specs.
    latency_s: emulated one-way latency.
    steps: optimizer steps per measured run (the first, and AQ-SGD's uncompressed
      first epoch, are not measured -- see perfsim.runtime.measure).
    dataset_limit: samples per epoch of the measured runs (short epochs so that
      AQ-SGD reaches its compressed phase); the prediction uses the same.
    profile: calibrated profile path; link_model: ``profile`` or ``nominal``.
    out: folder for the per-run outputs and the comparison table.
    runtime_model: describe the model to the simulator with execute mode's
      own parameter counts (:func:`runtime_workload`), not the preset's.
    repeats: measured runs per row; the fastest counts. On a shared machine
      interference from other jobs only ever slows a run down, so the fastest
      repeat is the best estimate of the undisturbed machine the profile was
      calibrated on (all repeats are kept in ``measured_throughput_all``).
    """

    base: dict[str, Any]
    bandwidths: tuple[float | None, ...] = (None,)
    compresses: tuple[str, ...] = ("fp32",)
    grad_compresses: tuple[str, ...] = ("none",)
    latency_s: float = 0.0
    steps: int = 20
    dataset_limit: int | None = None
    profile: str | None = None
    link_model: str = "profile"
    out: str = "traces/validation/run"
    reuse_measured: bool = False
    seed: int = 0
    repeats: int = 1
    runtime_model: bool = True
    extra_run: dict[str, Any] = field(default_factory=dict)
    #: strategy facts of execute mode the simulator must be told: the runtime
    #: averages gradients after the whole step (perfsim/runtime/worker.py calls
    #: sync_gradients after run_step), so no overlap with the backward pass
    extra_predict: dict[str, Any] = field(default_factory=lambda: {"overlap": False})

    def __post_init__(self):
        if self.repeats < 1:
            raise ConfigError(f"repeats={self.repeats}: must be >= 1")
        if self.link_model not in LINK_MODELS:
            raise ConfigError(f"link_model={self.link_model!r}: choose from {', '.join(LINK_MODELS)}")
        if self.steps < 3:
            raise ConfigError(f"steps={self.steps}: need >= 3 (the first step is not measured)")
        if not self.compresses or not self.grad_compresses or not self.bandwidths:
            raise ConfigError("validation grid: empty list of bandwidths or compressors")
        for b in self.bandwidths:
            if b is not None and not b > 0:
                raise ConfigError(f"bandwidth {b}: must be > 0")
        if self.latency_s < 0:
            raise ConfigError(f"latency {self.latency_s}: must be >= 0")
        if self.profile is None:
            raise ConfigError("validation needs --profile (a profile calibrated on this machine)")

    def rows(self) -> list[dict[str, Any]]:
        """Every (bandwidth, compress, grad_compress) combination, in order."""
        return [{"bandwidth": b, "compress": c, "grad_compress": g}
                for b in self.bandwidths for c in self.compresses for g in self.grad_compresses]


def parse_bandwidths(text: str) -> tuple[float | None, ...]:
    """``"1Gbps,100Mbps"`` -> (1e9, 1e8); ``none`` / ``loopback`` -> None."""
    out: list[float | None] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        out.append(None if part.lower() in ("none", "loopback", "off") else
                   parse_bandwidth(part, "--emulate-bandwidth"))
    return tuple(out) or (None,)


# ----------------------------------------------------------------------------- link parameters
@dataclass(frozen=True)
class Link:
    """Bandwidth (bits/s), one-way latency (s), token-bucket burst (bytes) and p2p
    protocol handed to the simulator."""

    bandwidth_bps: float
    latency_s: float
    source: str
    burst_bytes: float = 0.0
    protocol: str = "eager"
    control_latency_s: float | None = None

    def predict_params(self) -> dict[str, Any]:
        out = {"bandwidth": self.bandwidth_bps, "latency": self.latency_s,
               "link_burst": self.burst_bytes, "p2p_protocol": self.protocol}
        if self.control_latency_s is not None:
            out["p2p_control_latency"] = self.control_latency_s
        return out


def _fits(profile, op: str, name: str) -> list[dict]:
    return [r for r in profile.records if r["op"] == op and r.get("name") == name]


def _expected_s(rec: dict) -> float:
    """A small message's expected time: the mean of its repeats (``mean_s`` that
    ``perfsim calibrate`` records), else its ``time_s``. Small messages are
    bimodal on this machine (~0.1 ms, or a wait for the next 4-ms kernel tick,
    HZ = 250); the median of 15 repeats lands on either mode, while a run of many
    messages pays the mean (linearity of expectation)."""
    from perfsim.calibrate.profile_io import parse_source

    mean = parse_source(rec.get("source")).get("mean_s")
    try:
        return float(mean) if mean is not None else float(rec["time_s"])
    except ValueError:
        return float(rec["time_s"])


#: messages up to this size fit inside every emulated link's token bucket
#: (perfsim.netem: burst >= 16 x 1514 B), so they cost the same at any rate
POOL_MAX_BYTES = 16384


def pooled_small_message_s(profile, op: str, base: str) -> float | None:
    """Expected time of a burst-resident small message, pooled over every emulated rate.

    A message that fits in the shaper's token bucket never waits for the rate,
    so its time -- gloo's per-message work plus, with probability p, a wait for
    the next 4-ms kernel tick -- is one quantity at 100 Mbps, 300 Mbps or 1 Gbps.
    Its mean is what a run of many messages pays, but p is small and the
    samples of one ping-pong loop are correlated (the loop can lock onto the
    tick's phase): one rate's 60 repeats gave 0.09-1.2 ms in two quiet
    calibrations. The repeat-weighted mean of every ``<base>@<rate>`` record
    up to :data:`POOL_MAX_BYTES` uses all of them (~500 samples). None when
    the profile has no such records with a recorded mean.
    """
    total = weight = 0.0
    for r in profile.records:
        name = str(r.get("name", ""))
        if r["op"] != op or not name.startswith(f"{base}@") or r["size_bytes"] > POOL_MAX_BYTES:
            continue
        if "mean_s=" not in str(r.get("source", "")):
            continue
        n = float(r.get("repeats") or 1)
        total += n * _expected_s(r)
        weight += n
    return total / weight if weight else None


def link_from_profile(profile, nominal_bps: float | None, latency_s: float, *, dp_only: bool,
                      link_model: str = "profile") -> Link:
    """The link the simulator should model for one validation row (module docstring).

    Pipeline rows use execute mode's own message path (``messenger`` records) when
    the profile has it, else the raw backend p2p; data-parallel-only rows the
    allreduce. Rate: slope through the clearly bandwidth-bound sizes
    (:func:`perfsim.calibrate.fit.fit_shaped_link`; the shaper's burst does not
    bias it); fixed cost: the smallest message's time.
    """
    from perfsim.calibrate.fit import fit_shaped_link
    from perfsim.calibrate.profile_io import comm_name

    backend = profile.metadata.get("backend", "gloo")
    if link_model == "nominal" and nominal_bps is not None:
        return Link(nominal_bps, latency_s, "nominal")
    # gloo's TCP pairs are receiver-driven, but execute mode posts its receives a
    # step ahead: a send finds its receive posted (Link's default protocol, eager)
    op = "allreduce" if dp_only else "p2p"
    names = [comm_name(backend, nominal_bps)] if dp_only else \
        [comm_name("messenger", nominal_bps), comm_name(backend, nominal_bps)]
    for name in names:
        raw = sorted(_fits(profile, op, name), key=lambda r: r["size_bytes"])
        if len(raw) < 3:
            continue
        sizes, times = [r["size_bytes"] for r in raw], [r["time_s"] for r in raw]
        link = fit_shaped_link(sizes, times)
        if link is None:  # never bandwidth-bound (fast loopback): slope of the two largest
            (s0, t0), (s1, t1) = (sizes[-2], times[-2]), (sizes[-1], times[-1])
            beta = (t1 - t0) / (s1 - s0) if s1 > s0 and t1 > t0 else t1 / s1
            rate_Bps, alpha = 1.0 / beta, sorted(times[:3])[len(times[:3]) // 2]
        else:
            rate_Bps, alpha = link.rate_Bps, link.alpha_s
        pooled = (pooled_small_message_s(profile, op, name.split("@")[0])
                  if nominal_bps is not None else None)
        if pooled is not None:
            # the fixed cost is the EXPECTED small-message time, pooled over rates
            alpha = pooled
        elif any("mean_s=" in str(r.get("source", "")) for r in raw[:3]):
            # the fixed cost is the EXPECTED small-message time (see _expected_s)
            alpha = sorted(_expected_s(r) for r in raw[:3])[len(raw[:3]) // 2]
        # alpha (median of the three smallest) is the middle small message's time. If
        # the fitted burst clearly exceeds that message, it passed inside the burst
        # and alpha is the fixed cost; otherwise it paid its bytes at the rate and the
        # fit's burst absorbed them (t = alpha + (s - b)/rate = fixed + (s - (b - s1))/rate)
        burst = float(link.burst_bytes) if link is not None and nominal_bps is not None else 0.0
        if pooled is not None and nominal_bps is not None:
            # the bucket perfsim.netem configured, in payload bytes (tbf counts frames;
            # the fitted rate / nominal rate is the payload share of a frame): exact,
            # where the fitted knee falls anywhere between two 4x-apart sizes
            from perfsim.netem import tbf_burst_bytes

            burst = tbf_burst_bytes(nominal_bps) * min(1.0, 8.0 * rate_Bps / nominal_bps)
        if pooled is not None or burst > 2 * sizes[1]:
            fixed = alpha
        else:
            fixed = max(0.0, alpha - sizes[1] / rate_Bps)
            burst = max(0.0, burst - sizes[1])
        lat = fixed / 2 if dp_only else fixed  # 2-rank ring allreduce: two latency-bound steps
        return Link(8.0 * rate_Bps, lat + latency_s, f"profile {op} {name}", burst)
    if nominal_bps is None:
        raise ConfigError(f"profile {profile.path!r}: no {op} records for {names[-1]!r}; "
                          "calibrate with comm ops to validate without emulation")
    return Link(nominal_bps, latency_s, f"nominal (profile has no {op} {names[-1]})")


# ----------------------------------------------------------------------------- running
def runtime_workload(model: str, folder) -> Path:
    """A workload file describing the model exactly as execute mode builds it.

    Layer names and boundary shapes come from the preset (so compute times are
    still read from the profile by model and layer name); parameter counts are
    those of ``perfsim.runtime.models.build_layer`` -- e.g. the runtime unties
    GPT's LM head (+V*d parameters), which changes the gradient bytes a
    data-parallel step exchanges.
    """
    import json

    from perfsim.models.specs import get_model_spec
    from perfsim.result import atomic_write_text

    from perfsim.runtime.models import build_layer

    spec = get_model_spec(model)
    layers = []
    for i, lay in enumerate(spec.layers()):
        mod = build_layer(spec, i, 0)
        layers.append({"name": lay.name, "params": int(sum(p.numel() for p in mod.parameters())),
                       "out_shape": list(lay.out_shape), "flops": lay.flops_fwd})
    path = Path(folder) / f"workload-{spec.name}.json"
    atomic_write_text(path, json.dumps({"name": spec.name, "tokens_per_sample": spec.tokens_per_sample,
                                        "layers": layers}, indent=1))
    return path


def _drop_checkpoint(run_dir: str) -> None:
    """Validation runs need the measurements, not the model: remove the checkpoint."""
    import shutil

    shutil.rmtree(Path(run_dir) / "ckpt", ignore_errors=True)


def _stored_measurements(run_dir: Path, repeats: int):
    """The fastest stored measured run of a row (``result.json`` of ``run_dir`` and its
    ``-r<k>`` repeats, all that are stored), or (None, []) when none is stored."""
    import json
    from types import SimpleNamespace

    best, tputs = None, []
    k = 0
    while True:
        path = Path(str(run_dir) + (f"-r{k}" if k else "")) / "result.json"
        k += 1
        if not path.exists():
            if k > max(repeats, 1):
                break
            continue
        try:
            summary = json.loads(path.read_text())["summary"]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"{path}: unreadable stored measurement ({e})") from None
        tputs.append(summary.get("throughput_samples_per_s") or 0.0)
        if best is None or tputs[-1] > (best.summary.get("throughput_samples_per_s") or 0.0):
            best = SimpleNamespace(summary=summary)
    return best, tputs


def _summary_figures(result, prefix: str) -> dict[str, Any]:
    s = result.summary
    out = {f"{prefix}_{m}": s.get(m) for m in METRICS}
    out.update({f"{prefix}_{b}": s.get(b) for b in BREAKDOWN})
    return out


def run_row(plan: ValidationPlan, row: dict[str, Any], profile, index: int,
            runner: Callable[..., Any] | None = None, predictor: Callable[..., Any] | None = None
            ) -> dict[str, Any]:
    """Measure and predict one row; returns the comparison row."""
    if runner is None:
        from perfsim.runtime.api import run as runner
    if predictor is None:
        from perfsim.api import predict as predictor

    bw = row["bandwidth"]
    base = dict(plan.base)
    dp_only = int(base.get("pp", 1)) == 1
    tag = f"{index:02d}-{format_bandwidth(bw) if bw else 'loopback'}-{row['compress']}-{row['grad_compress']}"
    run_dir = Path(plan.out) / "runs" / tag.replace(":", "_")
    run_params = dict(base, compress=row["compress"], grad_compress=row["grad_compress"],
                      steps=plan.steps, seed=plan.seed, out=str(run_dir), **plan.extra_run)
    if plan.dataset_limit:
        run_params["dataset_limit"] = plan.dataset_limit
    if bw is not None:
        run_params["emulate_bandwidth"] = bw
        if plan.latency_s:
            run_params["emulate_latency"] = plan.latency_s
    t0 = time.perf_counter()
    measured = None
    tputs = []
    if plan.reuse_measured:
        measured, tputs = _stored_measurements(run_dir, plan.repeats)
    for k in range(0 if measured is not None else plan.repeats):
        params = dict(run_params, out=str(run_dir) + (f"-r{k}" if k else ""))
        m = runner(**params)
        _drop_checkpoint(params["out"])
        tputs.append(m.summary.get("throughput_samples_per_s") or 0.0)
        if measured is None or tputs[-1] > (measured.summary.get("throughput_samples_per_s") or 0.0):
            measured = m
    wall = time.perf_counter() - t0
    link = link_from_profile(profile, bw, plan.latency_s, dp_only=dp_only, link_model=plan.link_model)
    pred_params = dict(base, compress=row["compress"], grad_compress=row["grad_compress"],
                       profile=profile, **link.predict_params(), **plan.extra_predict)
    if plan.runtime_model:
        pred_params.pop("model", None)
        pred_params["workload"] = str(runtime_workload(base["model"], plan.out))
    if plan.dataset_limit:
        pred_params["dataset_samples"] = plan.dataset_limit
    predicted = predictor(**pred_params)
    out = {"model": base.get("model"), "bandwidth_bps": bw, "latency_s": plan.latency_s,
           "compress": row["compress"], "grad_compress": row["grad_compress"],
           "schedule": base.get("schedule"), "pp": base.get("pp"), "dp": base.get("dp"),
           "micro_batch": base.get("micro_batch"), "macro_batch": base.get("macro_batch"),
           "predict_bandwidth_bps": link.bandwidth_bps, "predict_latency_s": link.latency_s,
           "predict_burst_bytes": link.burst_bytes, "predict_p2p_protocol": link.protocol,
           "link_source": link.source, "measured_steps": measured.summary.get("measured_steps"),
           "measured_repeats": len(tputs),
           "measured_throughput_all": ";".join(f"{t:.2f}" for t in tputs),
           "run_wall_s": round(wall, 2), "run_dir": str(run_dir)}
    out.update(_summary_figures(predicted, "predicted"))
    out.update(_summary_figures(measured, "measured"))
    for m in METRICS:
        p, q = out[f"predicted_{m}"], out[f"measured_{m}"]
        out[f"error_{m}_pct"] = 100.0 * (p - q) / q if p is not None and q else math.nan
    return out


def run_validation(plan: ValidationPlan, progress: Callable[[str], None] | None = None,
                   runner=None, predictor=None):
    """Every row of the plan -> a pandas DataFrame (also written as CSV by the caller)."""
    import pandas as pd

    from perfsim.profile import load_profile

    profile = load_profile(plan.profile)
    rows = []
    for i, row in enumerate(plan.rows()):
        if progress:
            bw = format_bandwidth(row["bandwidth"]) if row["bandwidth"] else "loopback"
            progress(f"{bw} {row['compress']} grad={row['grad_compress']}")
        rows.append(run_row(plan, row, profile, i, runner, predictor))
    return pd.DataFrame(rows)


def summarize(df, metric: str = "throughput_samples_per_s") -> dict[str, float]:
    """MAPE, worst absolute error and rows over 10 % for ``metric``."""
    err = df[f"error_{metric}_pct"].abs()
    return {"rows": int(len(df)), "mape_pct": float(err.mean()), "worst_pct": float(err.max()),
            "rows_over_10pct": int((err > 10).sum())}


def format_table(df) -> str:
    """A terminal table: per row predicted vs measured throughput and iteration time."""
    head = (f"{'bandwidth':>10} {'compress':<16} {'grad':<16} {'pred sps':>9} {'meas sps':>9} "
            f"{'err %':>7} {'pred it ms':>10} {'meas it ms':>10} {'err %':>7}")
    lines = [head, "-" * len(head)]
    for _, r in df.iterrows():
        bw = format_bandwidth(r["bandwidth_bps"]) if r["bandwidth_bps"] == r["bandwidth_bps"] and \
            r["bandwidth_bps"] is not None else "loopback"
        lines.append(
            f"{bw:>10} {r['compress']:<16} {r['grad_compress']:<16} "
            f"{r['predicted_throughput_samples_per_s']:9.1f} {r['measured_throughput_samples_per_s']:9.1f} "
            f"{r['error_throughput_samples_per_s_pct']:+7.1f} {1e3 * r['predicted_iteration_s']:10.2f} "
            f"{1e3 * r['measured_iteration_s']:10.2f} {r['error_iteration_s_pct']:+7.1f}")
    s = summarize(df)
    t = summarize(df, "iteration_s")
    lines.append(f"throughput MAPE {s['mape_pct']:.1f} % (worst {s['worst_pct']:.1f} %, "
                 f"{s['rows_over_10pct']} of {s['rows']} rows > 10 %); iteration-time MAPE "
                 f"{t['mape_pct']:.1f} %")
    return "\n".join(lines)


def markdown_table(df) -> str:
    """The comparison as a markdown table (for notes and the README)."""
    lines = ["| bandwidth | compress | grad | predicted samples/s | measured samples/s | error % "
             "| predicted iteration ms | measured iteration ms |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for _, r in df.iterrows():
        bw = r["bandwidth_bps"]
        bw = format_bandwidth(bw) if bw is not None and bw == bw else "loopback"
        lines.append(f"| {bw} | {r['compress']} | {r['grad_compress']} | "
                     f"{r['predicted_throughput_samples_per_s']:.1f} | {r['measured_throughput_samples_per_s']:.1f} | "
                     f"{r['error_throughput_samples_per_s_pct']:+.1f} | {1e3 * r['predicted_iteration_s']:.2f} | "
                     f"{1e3 * r['measured_iteration_s']:.2f} |")
    s = summarize(df)
    lines.append("")
    lines.append(f"Throughput MAPE {s['mape_pct']:.1f} %, worst row {s['worst_pct']:.1f} %, "
                 f"{s['rows_over_10pct']} of {s['rows']} rows above 10 %.")
    return "\n".join(lines)


def plot(df, path, title: str | None = None) -> Path:
    """Predicted-vs-measured figure (PNG or SVG by suffix), drawn by perfsim.analysis.plots."""
    import matplotlib

    matplotlib.use("Agg")
    path = Path(path)
    from perfsim.analysis.plots import plot_validation, save_figure

    fig = plot_validation(df, title=title)
    return save_figure(fig, path)


def write_csv(df, path) -> Path:
    from perfsim.result import atomic_write_text

    path = Path(path)
    atomic_write_text(path, df.to_csv(index=False))
    return path


def parse_latency(text: str | None) -> float:
    return 0.0 if not text else parse_time(text, "--emulate-latency")
