"""Calibrate this machine into a profile: the Python API behind ``perfsim calibrate``.

    from perfsim.calibrate.calibration import calibrate   # also perfsim.calibrate(...)
    profile = calibrate("traces/mybox.json", model="gpt2-tiny", micro_batch=[1, 4],
                        emulate_bandwidth="1Gbps,100Mbps", quick=True)

:func:`calibrate` takes the flags of ``perfsim calibrate`` as keywords (a list
keyword takes a comma string or a sequence) and runs four stages, each a module
of this package:

* compute (:mod:`perfsim.calibrate.compute`): per-layer (and whole-stage)
  forward/backward time and optimizer step of every model, micro-batch and dtype;
* codecs (:mod:`perfsim.calibrate.codecs`): encode/decode time of every
  compressor over tensor sizes and at the pipeline boundaries of the models;
* comm (:mod:`perfsim.calibrate.comm`): p2p and collectives over the real
  backend (gloo/NCCL), on loopback and under each emulated rate (netns + tc);
* efficiency (:mod:`perfsim.calibrate.efficiency`, optional): the compute
  model's efficiency curves;
* tensor parallelism (:mod:`perfsim.calibrate.tensor_parallel`, optional): one TP
  rank's compute per micro-batch, timed by execute mode (``perfsim run --tp``).

:func:`plan_calibration` parses and checks the keywords into a
:class:`CalibrationPlan` (every user mistake is a :class:`ConfigError` naming the
flag, raised before minutes of measurement); :func:`run_calibration` measures a
plan and writes the profile atomically (:mod:`perfsim.profile` format).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from perfsim.calibrate.compare import stage_layer_ratios, stage_layer_warnings
from perfsim.errors import ConfigError
from perfsim.tcp import PROFILE_KEY as TCP_KEY
from perfsim.tcp import read_host as read_tcp_host

#: model presets timed by default
DEFAULT_MODELS = "digits-mlp,gpt2-tiny"
#: communication ops timed by default (messenger: execute mode's message path; late: its
#: receive posted after the data arrived; framing: its host time per message;
#: interference: compute alone vs under concurrent allreduces; reduce_scatter,
#: allgather_tensor: the calls tensor parallelism issues; fsdp: FSDP2's own host time
#: per unit, perfsim.calibrate.fsdp_host)
DEFAULT_COMM = ("p2p,allreduce,allgather,alltoall,reduce_scatter,allgather_tensor,messenger,late,framing,"
                "interference,fsdp")
#: communication ops timed over each emulated link by default (a kind's cost relative
#: to the allreduce depends on the link: host copies weigh less on a slow one; the
#: compute slowdown under traffic too: a paced slow link wakes the host per packet)
DEFAULT_EMULATE_OPS = "p2p,messenger,allreduce,reduce_scatter,allgather_tensor,interference"
STATISTICS = ("median", "min")
#: how whole stages are timed: ``run`` (execute mode itself, perfsim.calibrate.run_stages),
#: ``harness`` (perfsim.calibrate.compute drives the stage modules), ``auto`` (run on a
#: CPU; the harness on a GPU, where a run needs a GPU per rank, and with --quick)
STAGE_TIMINGS = ("auto", "run", "harness")
DEVICES = ("auto", "cpu", "cuda")

#: seconds per point of each stage on an idle 2-core VM, (quick, full); how they were
#: measured: docs/validation.md, "Measurement notes"
SECONDS_PER_POINT = {"compute": (0.05, 0.12), "codec": (0.03, 0.08)}
#: seconds per communication sweep, (quick, full): loopback, one emulated rate
SECONDS_PER_COMM_SWEEP = {"loopback": (8.0, 90.0), "emulated": (15.0, 40.0)}
#: seconds per tensor-parallel stage run (start-up of the ranks and 8 steps of gpt2-tiny)
SECONDS_PER_TP_RUN = 15.0
#: seconds per in-situ stage run (--stage-timing run: start-up of the ranks and 8 steps; 2.6-3.7 s)
SECONDS_PER_STAGE_RUN = 4.0


@dataclass(frozen=True)
class CalibrationPlan:
    """The checked configuration of one calibration: what each stage measures.

    compute: one :class:`~perfsim.calibrate.compute.ComputeConfig` per model.
    codecs: the :class:`~perfsim.calibrate.codecs.CodecConfig` (None: no codecs).
    comm: one :class:`~perfsim.calibrate.comm.CommConfig` per sweep (loopback,
      then each emulated rate).
    efficiency: the :class:`~perfsim.calibrate.efficiency.EfficiencyConfig` or None.
    tensor_parallel: one :class:`~perfsim.calibrate.tensor_parallel.TPStageConfig` per
      GPT model, micro-batch, TP degree, with and without sequence parallelism.
    run_stages: one :class:`~perfsim.calibrate.run_stages.RunStageConfig` per model,
      micro-batch and pipeline degree whose whole stages a short run times
      (``stage_timing`` ``run``; empty when the harness times them).
    concurrent: time compute, and the compressors' data-parallel paths, in ``ranks``
      processes at once.
    settings: what the profile's ``metadata["calibration"]`` records of the request.
    """

    compute: tuple
    codecs: Any
    comm: tuple
    efficiency: Any
    tensor_parallel: tuple
    run_stages: tuple
    device: str
    quick: bool
    ranks: int
    concurrent: bool
    statistic: str
    settings: dict

    def stages(self) -> list[tuple[str, int]]:
        """(name, points) of every stage, in the order they run."""
        from perfsim.calibrate import codecs as cc
        from perfsim.calibrate.compute import count_records

        # the model's compute first, all of it together (layers, TP ranks, whole stages): a shared
        # machine's speed moves within minutes, and the engine reads a stage's record beside its
        # layers' (docs/validation.md, session 27: stages timed 11 minutes after their layers)
        out = [(f"compute {c.model}", count_records(c)) for c in self.compute]
        out += [(f"tp {c.model} mb {c.micro_batch} tp={c.tp}{' sp' if c.sequence_parallel else ''}", 1)
                for c in self.tensor_parallel]
        out += [(f"stages {c.model} mb {c.micro_batch} pp={c.pp} (run)", 1) for c in self.run_stages]
        if self.codecs:
            out.append((f"codecs ({len(self.codecs.resolved_specs())} specs)", cc.count_points(self.codecs)))
        out += [(f"comm {_describe_comm(c)}", 1) for c in self.comm]
        if self.efficiency:
            out.append((f"efficiency ({','.join(self.efficiency.dtypes)})", 1))
        return out

    def estimate_seconds(self, quick: bool | None = None, flops_per_s: float | None = None) -> float:
        """Seconds this calibration takes (``quick``: as if run with or without ``--quick``;
        default: as planned): the per-point costs measured on an idle 2-core VM, plus, at
        ``flops_per_s`` (:func:`probe_flops` measures this machine's), the model's own layer
        and stage calls (:func:`compute_work_seconds`), which grow with its size."""
        quick = self.quick if quick is None else quick
        # the model's calls as planned (their repeats are the plan's)
        work = sum(compute_work_seconds(c, flops_per_s) for c in self.compute) if flops_per_s else 0.0
        return (estimate_seconds(self.compute, self.codecs, self.comm, quick) + work
                + SECONDS_PER_TP_RUN * len(self.tensor_parallel) + SECONDS_PER_STAGE_RUN * len(self.run_stages))


def estimate_seconds(compute_cfgs, codec_cfg, comm_cfgs, quick: bool) -> float:
    """Seconds a calibration with these configs takes on an idle 2-core VM beside the
    model's own compute (:func:`compute_work_seconds`): the number of points of each
    stage times its measured cost per point."""
    from perfsim.calibrate import codecs as cc
    from perfsim.calibrate.compute import count_records

    i = 0 if quick else 1
    est = sum(count_records(c) for c in compute_cfgs) * SECONDS_PER_POINT["compute"][i]
    if codec_cfg is not None:
        sizes = len(cc.QUICK_SIZES if quick else cc.FULL_SIZES)
        per_spec = (sizes + len(set(codec_cfg.boundaries))) * 2 + (2 * sizes if codec_cfg.dp_world else 0)
        est += len(codec_cfg.resolved_specs()) * per_spec * SECONDS_PER_POINT["codec"][i]
    for c in comm_cfgs:
        est += SECONDS_PER_COMM_SWEEP["emulated" if c.emulate_bandwidth else "loopback"][i]
    return est


def _timed_calls(call_s: float, warmup: int, repeats: int, max_seconds: float | None) -> int:
    """Calls :func:`perfsim.calibrate.timing.time_op` makes of a ``call_s`` call: the
    warm-up, then repeats until ``repeats``, or ``max_seconds`` of timed calls (>= 3)."""
    n = repeats
    if max_seconds is not None and call_s > 0:
        n = min(repeats, max(3, math.ceil(max_seconds / call_s)))
    return warmup + n


def compute_work_seconds(cfg, flops_per_s: float) -> float:
    """Seconds of the layer and stage calls :func:`perfsim.calibrate.compute.measure_compute`
    makes for ``cfg`` at ``flops_per_s``: a layer's forward takes its forward FLOPs times
    the micro-batch over the rate, its backward twice that (two GEMMs per forward GEMM,
    Kaplan et al. 2020, arXiv:2001.08361, Sec. 2.1) after an untimed forward; each is
    called :func:`_timed_calls` times. Whole stages (``cfg.stages``) run
    ``warmup + max(3, ceil(repeats / m))`` steps of ``m`` micro-batches, forward and
    backward, and the stages of one degree cover the model once. Host overheads and
    memory-bound layers are in the per-point cost (:data:`SECONDS_PER_POINT`)."""
    if not flops_per_s > 0:
        raise ConfigError(f"flops_per_s={flops_per_s!r}: must be > 0")
    total = 0.0
    layers = cfg.spec.layers()
    for mb in cfg.micro_batches:
        fwd = [lay.flops_fwd * int(mb) / flops_per_s for lay in layers]
        for f in fwd:
            total += _timed_calls(f, cfg.warmup, cfg.repeats, cfg.max_seconds) * f
            total += _timed_calls(2 * f, cfg.warmup, cfg.repeats, cfg.max_seconds) * 3 * f
        m = cfg.stage_microbatches
        steps = cfg.warmup + max(3, -(-cfg.repeats // m))
        total += len(cfg.stages) * steps * m * 3 * sum(fwd)
    return total * len(cfg.dtypes)


def probe_flops(device: str = "cpu", n: int = 768) -> float:
    """FLOP/s of an ``n x n x n`` float32 matrix product on ``device`` now (best of 2, after
    one warm-up; 0.9 GFLOP each, tens of milliseconds on an idle 2-core VM; smaller
    products read far slower under load, thread wake-ups dominate): the rate :func:`compute_work_seconds` prices
    the model's calls at. A busy machine reads slower, and so will the calibration."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = math.inf
    for k in range(3):
        sync()
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        if k:
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / max(best, 1e-9)


def _items(value: str | Sequence[Any] | None) -> list[Any]:
    """A comma string or a sequence as a list, ``none`` entries dropped, a repeated entry kept
    once (``--model gpt2-tiny,gpt2-tiny`` measured it twice), as predict's comma lists run it."""
    from perfsim.units import split_list

    parts = split_list(value) if isinstance(value, str) else list(value or ())
    return list(dict.fromkeys(p for p in parts if str(p).lower() != "none"))


def _names(value: str | Sequence[Any] | None) -> list[str]:
    return [str(p) for p in _items(value)]


def _ints(value: str | Sequence[Any], flag: str) -> tuple[int, ...]:
    out = []
    for part in _names(value):
        try:
            v = int(part)
        except ValueError:
            raise ConfigError(f"{flag} {part!r}: not an integer") from None
        if v < 1:
            raise ConfigError(f"{flag} {v}: must be >= 1")
        out.append(v)
    return tuple(out)


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _describe_comm(cfg) -> str:
    from perfsim.units import format_bandwidth

    where = f"over {format_bandwidth(cfg.emulate_bandwidth)}" if cfg.emulate_bandwidth else "loopback"
    return f"{where} ({','.join(cfg.ops)})"


def _codec_boundaries(specs, stages, micro) -> tuple[tuple[str, int, int, int], ...]:
    """The pipeline boundaries of these models at the calibrated stage counts (one per
    distinct shape), each micro-batch: codecs are timed after the stage that ends there."""
    from perfsim.partition import partition_model

    boundaries, seen = [], set()
    for spec in specs:
        layers = spec.layers()
        for pp in (p for p in stages if 2 <= p <= len(layers)):
            for k, (_, end) in enumerate(partition_model(spec, pp)[:-1]):
                for mb in micro:
                    key = (spec.name, mb, layers[end - 1].out_shape)
                    if key not in seen:
                        seen.add(key)
                        boundaries.append((spec.name, pp, k, mb))
    return tuple(boundaries)


def _tp_configs(specs, micro, degrees, device: str) -> tuple:
    """One TP stage measurement per GPT model, micro-batch and degree, without and (when
    the sequence divides) with sequence parallelism; ConfigError naming ``--tp`` for a
    degree a model cannot be split by."""
    from perfsim.calibrate.tensor_parallel import TPStageConfig
    from perfsim.models.tensor_parallel import check_tp
    from perfsim.models.transformer import TransformerSpec

    out = []
    for spec in specs:
        if not isinstance(spec, TransformerSpec):
            continue
        for t in (d for d in degrees if d > 1):
            try:
                check_tp(spec, t, False, spec.name)
            except ConfigError as exc:
                raise ConfigError(f"--tp {t}: {exc}") from None
            for sp in (False, True) if spec.seq_len % t == 0 else (False,):
                out += [TPStageConfig(spec.name, mb, t, sp, device=device) for mb in micro]
    if degrees and any(d > 1 for d in degrees) and not out:
        raise ConfigError("--tp: needs a GPT model in --model")
    return tuple(out)


def _stage_schedules(stage_schedule, stage_timing: str, degrees, microbatches: int) -> tuple[str, ...]:
    """The checked ``--stage-schedule`` list: known schedules; more than one, or one
    that is not plain (interleaved chunks, ZB-H1's split backward), only with
    ``--stage-timing run``, which times each in a run of its own."""
    from perfsim.schedules import PLAIN_SCHEDULES, SCHEDULES, build_table, get_schedule

    names = tuple(dict.fromkeys(n.lower() for n in _names(stage_schedule))) or ("1f1b",)
    for name in names:
        try:
            get_schedule(name)
        except ConfigError:
            raise ConfigError(f"--stage-schedule {name!r}: unknown (choose from {', '.join(SCHEDULES)})") from None
        for p in (d for d in degrees if d > 1):
            try:
                build_table(name, p, microbatches)
            except ConfigError as exc:
                raise ConfigError(f"--stage-schedule {name} at --stages {p}: {exc}") from None
    if stage_timing == "harness" and (len(names) > 1 or names[0] not in PLAIN_SCHEDULES):
        raise ConfigError(f"--stage-schedule {','.join(names)}: the harness times one of gpipe, 1f1b; "
                          f"--stage-timing run times each schedule in a run of its own")
    return names


def plan_calibration(*, model: str | Sequence[str] = DEFAULT_MODELS, micro_batch: str | Sequence[int] = "1,4",
                     dtype: str | Sequence[str] = "float32", stages: str | Sequence[int] = "1,2",
                     stage_microbatches: int = 4, stage_schedule: str = "1f1b", small_repeats: int = 60,
                     codecs: str | Sequence[str] = "all", comm: str | Sequence[str] = DEFAULT_COMM,
                     emulate_bandwidth: str | Sequence[Any] = "", emulate_latency: str | float = "0ms",
                     emulate_ops: str | Sequence[str] = DEFAULT_EMULATE_OPS, ranks: int = 2,
                     concurrent: bool = False, device: str = "auto", repeats: int | None = None,
                     quick: bool = False, statistic: str = "median",
                     efficiency: str | Sequence[str] = "none", tp: str | Sequence[int] = "",
                     stage_timing: str = "auto") -> CalibrationPlan:
    """Parse and check a calibration request (the keywords of :func:`calibrate`) into a
    :class:`CalibrationPlan`; nothing is measured. Raises :class:`ConfigError` naming
    the flag (``--micro-batch`` ...) on bad input, and checks the preconditions of
    the emulated links (root, a rate tc can shape) before any measurement."""
    import torch

    from perfsim.calibrate import codecs as cc
    from perfsim.calibrate import comm as cm
    from perfsim.calibrate.compute import ComputeConfig
    from perfsim.calibrate.efficiency import EfficiencyConfig
    from perfsim.calibrate.machine import usable_cores
    from perfsim.models.registry import get_model_spec
    from perfsim.units import parse_bandwidth, parse_time

    if statistic not in STATISTICS:
        raise ConfigError(f"--statistic {statistic!r}: choose from {', '.join(STATISTICS)}")
    if device not in DEVICES:
        raise ConfigError(f"--device {device!r}: choose from {', '.join(DEVICES)}")
    if stage_timing not in STAGE_TIMINGS:
        raise ConfigError(f"--stage-timing {stage_timing!r}: choose from {', '.join(STAGE_TIMINGS)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device available")
    if ranks < 1:
        raise ConfigError(f"--ranks {ranks}: must be >= 1")
    repeats = repeats if repeats is not None else (5 if quick else 15)
    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: must be >= 1")
    models = _names(model)
    specs = [get_model_spec(m) for m in models]
    micro = _ints(micro_batch, "--micro-batch")
    if not micro:
        raise ConfigError("--micro-batch: empty")
    dtypes = tuple(_names(dtype)) or ("float32",)
    degrees = _ints(stages, "--stages")
    bandwidths = [parse_bandwidth(b, "--emulate-bandwidth") for b in _items(emulate_bandwidth)]
    latency = parse_time(emulate_latency, "--emulate-latency")
    if bandwidths:  # preconditions of the link measurements, before minutes of compute ones
        from perfsim.netem import check_privileges
        from perfsim.shaping import check_rate

        for bps in bandwidths:
            check_rate(bps)
        check_privileges()
    for spec in specs:
        too_many = [p for p in degrees if p > len(spec.layers())]
        if too_many:
            raise ConfigError(f"--stages {too_many[0]}: {spec.name} has only {len(spec.layers())} layers")
    comm_ops = tuple(_names(comm))
    threads = max(1, usable_cores() // ranks)
    if stage_timing == "auto":  # --quick keeps its half minute: the harness is faster
        stage_timing = "harness" if device == "cuda" or quick else "run"
    schedules = _stage_schedules(stage_schedule, stage_timing, degrees, stage_microbatches)
    from perfsim.calibrate.run_stages import RunStageConfig
    from perfsim.schedules import PLAIN_SCHEDULES, stage_count

    run_stage_cfgs = tuple(RunStageConfig(spec.name, mb, p, ranks=ranks, microbatches=stage_microbatches,
                                          schedule=name, device=device)
                           for spec in specs for mb in micro for p in degrees for name in schedules
                           if p <= len(spec.layers()) and (p > 1 or name in PLAIN_SCHEDULES)
                           and p * stage_count(name, None) <= len(spec.layers())) if stage_timing == "run" else ()

    compute_cfgs = tuple(ComputeConfig(
        model=spec.name, micro_batches=micro, dtypes=dtypes, device=device,
        warmup=2 if quick else 3, repeats=repeats, ranks=ranks,
        max_seconds=1.0 if quick else 5.0,
        stages=tuple(p for p in degrees if p <= len(spec.layers())) if stage_timing == "harness" else (),
        stage_microbatches=stage_microbatches,
        # the harness's one plain schedule (checked); unused when runs time the stages
        stage_schedule=schedules[0] if stage_timing == "harness" else "1f1b") for spec in specs)
    codec_cfg = None
    codec_names = _names(codecs)
    if codec_names:
        # quick: no warm-up (a steady-state call precedes it) and repeats that stop once
        # 3 samples agree within 10 %
        codec_cfg = cc.CodecConfig(specs=None if [n.lower() for n in codec_names] == ["all"] else tuple(codec_names),
                                   sizes=cc.QUICK_SIZES if quick else cc.FULL_SIZES,
                                   device=device, repeats=repeats, max_seconds=0.5 if quick else 1.0,
                                   warmup=0 if quick else 2, rel_spread=0.1 if quick else None,
                                   threads=threads, boundaries=_codec_boundaries(specs, degrees, micro),
                                   dp_world=ranks if ranks >= 2 else 0,
                                   dp_ranks=ranks if concurrent and ranks >= 2 else 1)
    comm_cfgs = []
    if comm_ops and ranks >= 2:
        common = dict(ops=comm_ops, world_size=ranks, repeats=repeats, warmup=2,
                      max_seconds=1.0 if quick else 3.0, threads=threads,
                      small_repeats=0 if quick else small_repeats)
        comm_cfgs.append(cm.CommConfig(sizes=cm.QUICK_SIZES if quick else cm.FULL_SIZES, **common))
        # over a shaped link the rate shows only beyond the shaper's burst (up to 500 KB
        # at 1 Gbps): emulated sweeps always reach the MB range, capped by max_call_s
        emu_sizes = cm.QUICK_EMULATED_SIZES if quick else cm.FULL_SIZES
        emu_ops = tuple(_names(emulate_ops))
        for bw in bandwidths:
            comm_cfgs.append(cm.CommConfig(sizes=emu_sizes, emulate_bandwidth=bw, emulate_latency=latency,
                                           max_call_s=0.4 if quick else 1.0,
                                           **{**common, "ops": emu_ops, "warmup": 1}))
    elif bandwidths:
        raise ConfigError("--emulate-bandwidth needs --comm ops and --ranks >= 2")

    eff = _names(efficiency)
    if [d.lower() for d in eff] == ["all"]:
        eff = list(EfficiencyConfig.dtypes)
    for d in eff:
        if d not in EfficiencyConfig.dtypes:
            raise ConfigError(f"--efficiency {d!r}: choose from {', '.join(EfficiencyConfig.dtypes)}, all, none")
    eff_cfg = EfficiencyConfig(dtypes=tuple(eff), quick=quick, device=device) if eff else None
    tp_cfgs = _tp_configs(specs, micro, _ints(tp, "--tp"), device)
    concurrent = bool(concurrent and ranks > 1)
    settings = {
        "quick": quick, "repeats": repeats, "ranks": ranks, "statistic": statistic,
        "compute_threads": compute_cfgs[0].effective_threads if compute_cfgs else None,
        "concurrent_compute": concurrent, "models": models, "micro_batches": list(micro),
        "dtypes": list(dtypes), "stages": list(degrees), "stage_timing": stage_timing,
        "stage_schedules": list(schedules),
        "emulated_bandwidths_bps": bandwidths,
        "emulated_latency_s": latency}
    return CalibrationPlan(compute=compute_cfgs, codecs=codec_cfg, comm=tuple(comm_cfgs), efficiency=eff_cfg,
                           tensor_parallel=tp_cfgs, run_stages=run_stage_cfgs, device=device, quick=quick,
                           ranks=ranks, concurrent=concurrent,
                           statistic=statistic, settings=settings)


def run_calibration(plan: CalibrationPlan, out: str, *, progress: bool = True, command: str | None = None,
                    overwrite: bool = False, warn: bool = True):
    """Measure every stage of ``plan`` and write the profile to ``out`` (atomically);
    returns the :class:`~perfsim.profile.Profile`. A file already at ``out`` (an earlier
    profile: minutes or GPU-hours of measurements) is refused before anything is measured
    unless ``overwrite``.

    On stderr: first the estimate of how long the calibration takes, then a bar on a
    terminal or one line per stage in a log (``progress=False``: neither), and a line
    per skipped measurement. ``command`` is recorded in the profile's metadata (the
    command line that asked for it). ``warn``: say on stderr which whole stages disagree with
    their own layers (:func:`perfsim.calibrate.compare.stage_layer_warnings`; recorded either way)."""
    from perfsim.calibrate import codecs as cc
    from perfsim.calibrate import comm as cm
    from perfsim.calibrate.compute import measure_compute, measure_compute_concurrent
    from perfsim.calibrate.efficiency import measure_efficiency
    from perfsim.calibrate.machine import machine_metadata
    from perfsim.calibrate.profile_io import build_profile
    from perfsim.calibrate.run_stages import measure_run_stages
    from perfsim.calibrate.tensor_parallel import measure_tp_stage
    from perfsim.calibrate.timing import set_statistic
    from perfsim.outputs import check_file_target, is_stdio
    from perfsim.progress import Progress

    check_file_target(out, "--out")
    if not overwrite and not is_stdio(out) and os.path.lexists(out):
        raise ConfigError(f"--out {str(out)!r}: a file is there (an earlier profile?); --overwrite replaces it, "
                          "or give another --out")
    set_statistic(plan.statistic)
    stages = plan.stages()
    total = sum(n for _, n in stages)
    meta = machine_metadata(plan.device)
    rate = probe_flops(plan.device)
    est = plan.estimate_seconds(flops_per_s=rate)
    print(f"calibrate: {total} points, about {_minutes(est)} here (the model's calls priced at this "
          f"machine's {rate / 1e9:.0f} GFLOP/s now)", file=sys.stderr, flush=True)
    started = time.perf_counter()
    bar = Progress(total, "pt", enabled=progress, prefix="calibrate: ")
    measurements = [(f"compute {cfg.model}",
                     lambda cfg=cfg: (measure_compute_concurrent if plan.concurrent else measure_compute)(cfg, bar))
                    for cfg in plan.compute]  # in the order of plan.stages()
    measurements += [(f"tp {cfg.model} tp={cfg.tp}{' sp' if cfg.sequence_parallel else ''}",
                      lambda cfg=cfg: measure_tp_stage(cfg)) for cfg in plan.tensor_parallel]
    measurements += [(f"stages {cfg.model} pp={cfg.pp}", lambda cfg=cfg: measure_run_stages(cfg))
                     for cfg in plan.run_stages]
    if plan.codecs:
        measurements.append(("codecs", lambda: cc.measure_codecs(plan.codecs, bar)))
    measurements += [(f"comm {_describe_comm(cfg)}", lambda cfg=cfg: cm.measure_comm(cfg, bar))
                     for cfg in plan.comm]
    if plan.efficiency:
        measurements.append(("efficiency", lambda: measure_efficiency(plan.efficiency)))
    records: list[dict] = []
    stage_s: dict[str, float] = {}
    try:
        expected = 0
        for (key, measure), (name, n) in zip(measurements, stages):
            t0 = time.perf_counter()
            bar.advance(max(0, expected - bar.done))  # the bar completes the stage before
            expected += n
            bar.stage(name)
            records += measure()
            stage_s[key] = time.perf_counter() - t0
        bar.advance(max(0, expected - bar.done))
        for r in records:
            if "skipped" in r:
                bar.note(f"calibrate: {r['op']} skipped ({r['skipped']})")
    finally:
        bar.close()
    meta["calibration"] = {
        **plan.settings, "wall_s": round(time.perf_counter() - started, 2),
        "stage_wall_s": {k: round(v, 2) for k, v in stage_s.items()}, "estimated_s": round(est, 1),
        "command": command or "perfsim.calibrate()"}
    if plan.comm:  # the host's TCP sysctls bound a connection's window: predict reads them (perfsim.tcp)
        tcp = read_tcp_host()
        if tcp is not None:
            meta[TCP_KEY] = tcp
    profile = build_profile(records, meta)
    ratios = stage_layer_ratios(profile)
    if ratios:  # a whole stage against its own layers, timed minutes apart: did the machine hold still?
        profile.metadata["calibration"]["stage_layer_ratio"] = {k: round(v, 3) for k, v in ratios.items()}
        for line in stage_layer_warnings(ratios) if warn else ():
            print(line, file=sys.stderr, flush=True)
    profile.save(out)
    return profile


def calibrate(out: str = "traces/calibrated.json", *, progress: bool = True, command: str | None = None,
              overwrite: bool = False, **params: Any):
    """Measure this machine and write a profile for :func:`perfsim.predict` (``perfsim calibrate``).

    ``out``: the profile file to write (a file there is refused unless ``overwrite``). The other keywords are ``perfsim calibrate``'s
    flags (:func:`plan_calibration`; lists as comma strings or sequences): ``model``,
    ``micro_batch``, ``dtype``, ``stages``, ``stage_microbatches``, ``stage_schedule``,
    ``small_repeats``, ``codecs`` (``"all"``, ``"none"`` or specs), ``comm``,
    ``emulate_bandwidth`` (needs root), ``emulate_latency``, ``emulate_ops``, ``ranks``,
    ``concurrent``, ``device``, ``repeats``, ``quick``, ``statistic`` (``median`` or
    ``min``), ``efficiency``, ``tp`` (TP degrees whose ranks' compute execute mode times). ``progress``: a bar or stage lines on stderr. Returns the
    written :class:`~perfsim.profile.Profile`; raises :class:`ConfigError` naming the
    flag on bad input, before anything is measured."""
    plan = plan_calibration(**params)
    return run_calibration(plan, out, progress=progress, command=command, overwrite=overwrite)
