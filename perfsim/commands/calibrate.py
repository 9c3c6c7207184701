"""`perfsim calibrate`: measure this machine and write a profile for `perfsim predict`.

Measures (see perfsim/calibrate/*.py for the methods):
  compute  per-layer (and per-stage) forward/backward time and optimizer step of
           each --model at each --micro-batch and --dtype;
  codecs   encode/decode time of every compressor and bit width over tensor sizes;
  comm     p2p, allreduce, allgather, alltoall over the real backend (gloo/NCCL),
           on loopback and under each --emulate-bandwidth (netns + tc).
Writes the profile atomically (perfsim.profile format, current version).
"""

from __future__ import annotations

HELP = "measure compute, encode/decode and communication costs of this machine into a profile"
EXAMPLES = """examples:
  perfsim calibrate --quick --output traces/mybox.json
  perfsim calibrate --model gpt2-tiny --micro-batch 1,4,8 --emulate-bandwidth 1Gbps,100Mbps --output traces/mybox.json
"""

DEFAULT_MODELS = "digits-mlp,gpt2-tiny"


def add_arguments(p) -> None:
    p.add_argument("--model", default=DEFAULT_MODELS,
                   help=f"comma list of model presets to time (default {DEFAULT_MODELS})")
    p.add_argument("--micro-batch", default="1,4", help="comma list of micro-batch sizes (default 1,4)")
    p.add_argument("--dtype", default="float32", help="comma list of compute dtypes (default float32)")
    p.add_argument("--stages", default="1,2",
                   help="pipeline degrees whose whole stages are timed too (default 1,2; '' for none)")
    p.add_argument("--stage-microbatches", type=int, default=4,
                   help="micro-batches per step when timing whole stages (default 4: the runs' "
                        "macro-batch 32 / micro-batch 8)")
    p.add_argument("--stage-schedule", default="1f1b",
                   help="schedule that drives the whole-stage timing (default 1f1b)")
    p.add_argument("--small-repeats", type=int, default=60,
                   help="repeats of comm messages up to 64 KB (bimodal: their mean is the simulator's "
                        "per-message fixed cost; default 60, --quick uses --repeats)")
    p.add_argument("--codecs", default="all",
                   help="comma list of compressor specs to time, 'all' (default) or 'none'")
    p.add_argument("--comm", default="p2p,allreduce,allgather,alltoall,messenger,late,framing,interference",
                   help="comma list of communication ops to time (messenger = execute mode's message "
                        "path, late = its receive posted after the data arrived, framing = its host "
                        "time per message, interference = compute alone vs under concurrent allreduces), or 'none'")
    p.add_argument("--emulate-bandwidth", default="",
                   help="also measure comm over emulated links of these rates (comma list, e.g. 1Gbps,100Mbps; "
                        "needs root for network namespaces)")
    p.add_argument("--emulate-latency", default="0ms", help="one-way delay of the emulated links (default 0ms)")
    p.add_argument("--emulate-ops", default="p2p,messenger,allreduce",
                   help="comm ops measured over the emulated links (default p2p,messenger,allreduce)")
    p.add_argument("--ranks", type=int, default=2,
                   help="ranks that will share this machine in the runs the profile is for: compute is timed "
                        "with cores/ranks threads and comm with this many ranks (default 2)")
    p.add_argument("--concurrent", action="store_true",
                   help="time compute in --ranks processes at once (contention between co-located ranks)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per point (default 15, quick 5)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (about a minute)")
    p.add_argument("--statistic", choices=("median", "min"), default="median",
                   help="what time_s records: the median of the repeats (default) or their minimum "
                        "(the undisturbed cost on a machine shared with other jobs)")
    p.add_argument("--efficiency", default="none",
                   help="also measure the compute model's efficiency curves (GEMM by shape, attention, "
                        "elementwise, norm, AdamW) in these dtypes: comma list of bfloat16, float16, "
                        "float32, tf32, 'all', or 'none' (default)")
    p.add_argument("--out", "-o", "--output", dest="output", default="traces/calibrated.json", help="profile file to write")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (on a terminal) or stage lines (in a log)")


def _ints(text: str, flag: str) -> tuple[int, ...]:
    from perfsim.errors import ConfigError
    from perfsim.units import split_list

    out = []
    for part in split_list(text):
        try:
            v = int(part)
        except ValueError:
            raise ConfigError(f"{flag} {part!r}: not an integer") from None
        if v < 1:
            raise ConfigError(f"{flag} {v}: must be >= 1")
        out.append(v)
    return tuple(out)


#: seconds per point of each stage on an idle 2-core VM, (--quick, full): the quick
#: figures are the CPU time of `perfsim calibrate --quick` (2026-11-23, 31 s for 96
#: compute, 686 codec points and one loopback sweep), the full ones reproduce the
#: 280 s of the full calibration behind traces/cpu-2core.json (docs/validation.md)
SECONDS_PER_POINT = {"compute": (0.05, 0.12), "codec": (0.03, 0.08)}
#: seconds per communication sweep, (--quick, full): loopback, one emulated rate
SECONDS_PER_COMM_SWEEP = {"loopback": (8.0, 90.0), "emulated": (15.0, 40.0)}


def estimate_seconds(compute_cfgs, codec_cfg, comm_cfgs, quick: bool) -> float:
    """Seconds a calibration with these configs takes on an idle 2-core VM: the
    number of points of each stage times its measured cost per point."""
    from perfsim.calibrate import codecs as cc
    from perfsim.calibrate.compute import count_records

    i = 0 if quick else 1
    est = sum(count_records(c) for c in compute_cfgs) * SECONDS_PER_POINT["compute"][i]
    if codec_cfg is not None:
        sizes = len(cc.QUICK_SIZES if quick else cc.FULL_SIZES)
        per_spec = (sizes + len(set(codec_cfg.boundaries))) * 2
        est += len(codec_cfg.resolved_specs()) * per_spec * SECONDS_PER_POINT["codec"][i]
    for c in comm_cfgs:
        est += SECONDS_PER_COMM_SWEEP["emulated" if c.emulate_bandwidth else "loopback"][i]
    return est


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _describe_comm(cfg) -> str:
    from perfsim.units import format_bandwidth

    where = f"over {format_bandwidth(cfg.emulate_bandwidth)}" if cfg.emulate_bandwidth else "loopback"
    return f"{where} ({','.join(cfg.ops)})"


def meta_cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run(args) -> int:
    import sys
    import time

    import torch

    from perfsim.calibrate import codecs as cc
    from perfsim.calibrate import comm as cm
    from perfsim.calibrate.compute import (ComputeConfig, count_records, measure_compute,
                                          measure_compute_concurrent)
    from perfsim.calibrate.efficiency import EfficiencyConfig, measure_efficiency
    from perfsim.calibrate.machine import machine_metadata
    from perfsim.calibrate.profile_io import build_profile
    from perfsim.errors import ConfigError
    from perfsim.models.specs import get_model_spec
    from perfsim.partition import partition_model
    from perfsim.units import parse_bandwidth, parse_time, split_list

    from perfsim.calibrate.timing import set_statistic
    from perfsim.progress import Progress

    set_statistic(args.statistic)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device available")
    if args.ranks < 1:
        raise ConfigError(f"--ranks {args.ranks}: must be >= 1")
    from perfsim.outputs import check_file_target

    check_file_target(args.output, "--out")
    quick = args.quick
    repeats = args.repeats if args.repeats is not None else (5 if quick else 15)
    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: must be >= 1")
    models = [m for m in split_list(args.model) if m.lower() != "none"]
    specs = [get_model_spec(m) for m in models]
    micro = _ints(args.micro_batch, "--micro-batch")
    if not micro:
        raise ConfigError("--micro-batch: empty")
    dtypes = tuple(split_list(args.dtype)) or ("float32",)
    stages = _ints(args.stages, "--stages") if args.stages.strip() else ()
    bandwidths = [parse_bandwidth(b, "--emulate-bandwidth") for b in split_list(args.emulate_bandwidth)]
    latency = parse_time(args.emulate_latency, "--emulate-latency")
    if bandwidths:  # preconditions of the link measurements, before minutes of compute ones
        from perfsim.netem import check_privileges, check_rate

        for bps in bandwidths:
            check_rate(bps)
        check_privileges()
    for spec in specs:
        too_many = [p for p in stages if p > len(spec.layers())]
        if too_many:
            raise ConfigError(f"--stages {too_many[0]}: {spec.name} has only {len(spec.layers())} layers")
    comm_ops = tuple(o for o in split_list(args.comm) if o.lower() != "none")

    compute_cfgs = []
    for spec in specs:
        n = len(spec.layers())
        compute_cfgs.append(ComputeConfig(
            model=spec.name, micro_batches=micro, dtypes=dtypes, device=device,
            warmup=2 if quick else 3, repeats=repeats, ranks=args.ranks,
            max_seconds=1.0 if quick else 5.0, stages=tuple(p for p in stages if p <= n),
            stage_microbatches=args.stage_microbatches, stage_schedule=str(args.stage_schedule).lower()))
    codec_cfg = None
    if args.codecs.strip().lower() != "none":
        names = None if args.codecs.strip().lower() == "all" else tuple(split_list(args.codecs))
        # the pipeline boundaries of these models at the calibrated stage counts (one per
        # distinct shape), each micro-batch: codecs timed after the stage that ends there
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
        # quick: no warm-up (a steady-state call precedes it) and repeats that stop once
        # 3 samples agree within 10 %
        codec_cfg = cc.CodecConfig(specs=names, sizes=cc.QUICK_SIZES if quick else cc.FULL_SIZES,
                                   device=device, repeats=repeats, max_seconds=0.5 if quick else 1.0,
                                   warmup=0 if quick else 2, rel_spread=0.1 if quick else None,
                                   threads=max(1, meta_cores() // args.ranks), boundaries=tuple(boundaries))
    comm_cfgs = []
    if comm_ops and args.ranks >= 2:
        threads = max(1, meta_cores() // args.ranks)
        common = dict(ops=comm_ops, world_size=args.ranks, repeats=repeats, warmup=2,
                      max_seconds=1.0 if quick else 3.0, threads=threads,
                      small_repeats=0 if quick else args.small_repeats)
        sizes = cm.QUICK_SIZES if quick else cm.FULL_SIZES
        comm_cfgs.append(cm.CommConfig(sizes=sizes, **common))
        # over a shaped link the rate shows only beyond the shaper's burst (up to 500 KB
        # at 1 Gbps): emulated sweeps always reach the MB range, capped by max_call_s
        emu_sizes = cm.QUICK_EMULATED_SIZES if quick else cm.FULL_SIZES
        emu_ops = tuple(o for o in split_list(args.emulate_ops) if o.lower() != "none")
        for bw in bandwidths:
            comm_cfgs.append(cm.CommConfig(sizes=emu_sizes, emulate_bandwidth=bw, emulate_latency=latency,
                                           max_call_s=0.4 if quick else 1.0,
                                           **{**common, "ops": emu_ops, "warmup": 1}))
    elif bandwidths:
        raise ConfigError("--emulate-bandwidth needs --comm ops and --ranks >= 2")

    eff = [d for d in split_list(args.efficiency) if d.lower() != "none"]
    if [d.lower() for d in eff] == ["all"]:
        eff = list(EfficiencyConfig.dtypes)
    for d in eff:
        if d not in EfficiencyConfig.dtypes:
            raise ConfigError(f"--efficiency {d!r}: choose from {', '.join(EfficiencyConfig.dtypes)}, all, none")
    eff_cfg = EfficiencyConfig(dtypes=tuple(eff), quick=quick, device=device) if eff else None

    stages_todo = [(f"compute {c.model}", count_records(c)) for c in compute_cfgs]
    if codec_cfg:
        stages_todo.append((f"codecs ({len(codec_cfg.resolved_specs())} specs)", cc.count_points(codec_cfg)))
    stages_todo += [(f"comm {_describe_comm(c)}", 1) for c in comm_cfgs]
    if eff_cfg:
        stages_todo.append((f"efficiency ({','.join(eff_cfg.dtypes)})", 1))
    total = sum(n for _, n in stages_todo)
    meta = machine_metadata(device)
    est = estimate_seconds(compute_cfgs, codec_cfg, comm_cfgs, quick)
    full = est if not quick else estimate_seconds(compute_cfgs, codec_cfg, comm_cfgs, False)
    print(f"calibrate: {total} points; the full calibration takes about {_minutes(full)}"
          + (f", --quick about {_minutes(est)}" if quick else "")
          + " on an idle 2-core machine", file=sys.stderr, flush=True)
    started = time.perf_counter()
    bar = Progress(total, "pt", enabled=not args.no_progress, prefix="calibrate: ")
    records: list[dict] = []
    stage_s: dict[str, float] = {}
    try:
        todo = iter(stages_todo)
        expected = 0

        def begin() -> None:  # the next stage; the bar completes the one before
            nonlocal expected
            bar.advance(max(0, expected - bar.done))
            name, n = next(todo)
            expected += n
            bar.stage(name)

        for cfg in compute_cfgs:
            t0 = time.perf_counter()
            begin()
            if args.concurrent and args.ranks > 1:
                recs = measure_compute_concurrent(cfg, bar)
            else:
                recs = measure_compute(cfg, bar)
            records += recs
            stage_s[f"compute {cfg.model}"] = time.perf_counter() - t0
        if codec_cfg:
            t0 = time.perf_counter()
            begin()
            records += cc.measure_codecs(codec_cfg, bar)
            stage_s["codecs"] = time.perf_counter() - t0
        for cfg in comm_cfgs:
            t0 = time.perf_counter()
            begin()
            records += cm.measure_comm(cfg, bar)
            stage_s[f"comm {_describe_comm(cfg)}"] = time.perf_counter() - t0
        if eff_cfg:
            t0 = time.perf_counter()
            begin()
            records += measure_efficiency(eff_cfg)
            stage_s["efficiency"] = time.perf_counter() - t0
        bar.advance(max(0, expected - bar.done))
        for r in records:
            if "skipped" in r:
                bar.note(f"calibrate: {r['op']} skipped ({r['skipped']})")
    finally:
        bar.close()
    meta.update({
        "calibration": {
            "quick": quick, "repeats": repeats, "ranks": args.ranks, "statistic": args.statistic,
            "compute_threads": compute_cfgs[0].effective_threads if compute_cfgs else None,
            "concurrent_compute": bool(args.concurrent and args.ranks > 1),
            "models": models, "micro_batches": list(micro), "dtypes": list(dtypes),
            "stages": list(stages), "emulated_bandwidths_bps": bandwidths,
            "emulated_latency_s": latency, "wall_s": round(time.perf_counter() - started, 2),
            "stage_wall_s": {k: round(v, 2) for k, v in stage_s.items()},
            "estimated_s": round(est, 1),
            "command": "perfsim calibrate " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "perfsim calibrate",
        }})
    profile = build_profile(records, meta)
    profile.save(args.output)
    n_fit = sum(1 for r in profile.records if r["op"].startswith("fit_"))
    print(f"wrote {args.output}: {len(profile.records)} records ({n_fit} fits) "
          f"in {time.perf_counter() - started:.1f} s on {meta['device_name']} ({meta['cores']} cores)")
    return 0
