"""`perfsim validate`: the same configurations measured for real and predicted, compared.

    perfsim validate --model digits-mlp --pp 2 --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 \\
        --emulate-bandwidth 1Gbps,300Mbps,100Mbps --profile traces/cpu-2core.json
    perfsim validate --model digits-mlp --pp 1 --dp 2 --grad-compress none,qsgd-maxnorm:4 ...
    perfsim validate --model gpt2-tiny --pp 1 --tp 1,2 --emulate-bandwidth 1Gbps,100Mbps ...

Prints per bandwidth and compressor the predicted and measured throughput and
iteration time with the error of each row and the MAPE; writes
OUT/validation.csv and OUT/validation.png (predicted vs measured).
"""

from __future__ import annotations

HELP = "run configurations for real and in the simulator; compare throughput (MAPE) into CSV + plot"
EXAMPLES = """examples:
  perfsim validate --model digits-mlp --pp 2 --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 \\
      --emulate-bandwidth 1Gbps,300Mbps,100Mbps --profile traces/cpu-2core.json
  perfsim validate --model gpt2-tiny --pp 1 --dp 2 --grad-compress none,qsgd-maxnorm:4 --profile traces/cpu-2core.json
"""


def add_arguments(p) -> None:
    p.add_argument("--model", default="digits-mlp", help="model preset (default digits-mlp)")
    p.add_argument("--pp", type=int, default=2, help="pipeline stages (default 2)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas (default 1)")
    p.add_argument("--tp", default="1",
                   help="comma list of tensor-parallel degrees (perfsim run --tp; GPT models), e.g. 1,2")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron sequence parallelism on the --tp > 1 rows")
    p.add_argument("--schedule", default="1f1b",
                   help="comma list of gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v (default 1f1b)")
    p.add_argument("--virtual-stages", type=int, default=None,
                   help="model chunks per rank for interleaved-1f1b (default 2)")
    p.add_argument("--micro-batch", type=int, default=8, help="samples per micro-batch (default 8)")
    p.add_argument("--macro-batch", type=int, default=32, help="samples per replica per step (default 32)")
    p.add_argument("--compress", default="fp32", help="comma list of pipeline compression specs")
    p.add_argument("--grad-compress", default="none", help="comma list of data-parallel compression specs")
    p.add_argument("--emulate-bandwidth", default="none",
                   help="comma list of emulated link rates (needs root); 'none' = loopback, no emulation")
    p.add_argument("--emulate-latency", default="0ms", help="one-way latency of the emulated links")
    p.add_argument("--profile", required=False, default=None,
                   help="profile calibrated on this machine (perfsim calibrate)")
    p.add_argument("--link-model", default="profile", choices=("profile", "nominal"),
                   help="what the simulator is told about the link: the rate and per-message cost the "
                        "profile measured over that emulated link (default), or the nominal rate")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per measured run (default 20)")
    p.add_argument("--dataset-limit", type=int, default=None,
                   help="samples per epoch of the measured runs (default 4 steps' worth, so AQ-SGD's "
                        "uncompressed first epoch ends early)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1,
                   help="measured runs per row, the fastest counts (a shared machine only slows runs down)")
    p.add_argument("--out", "-o", "--output", dest="out", default=None,
                   help="output folder (default traces/validation/<model>-pp<P>-dp<D>)")
    p.add_argument("--reuse-measured", action="store_true",
                   help="re-predict against the measured results stored in OUT/runs (no new runs; "
                        "rows without a stored result are run)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (on a terminal) or stage lines (in a log)")


def run(args) -> int:
    from perfsim.analysis import validate as v
    from perfsim.errors import ConfigError
    from perfsim.models.specs import get_model_spec
    from perfsim.units import split_list

    get_model_spec(args.model)
    for name in ("pp", "dp", "micro_batch", "macro_batch", "steps"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    if args.macro_batch % args.micro_batch:
        raise ConfigError(f"--macro-batch {args.macro_batch}: not a multiple of --micro-batch {args.micro_batch}")
    if args.profile is None:
        raise ConfigError("--profile: required (a profile calibrated on this machine, see perfsim calibrate)")
    from perfsim.profile import load_profile

    load_profile(args.profile)  # a bad file fails before any run starts
    schedules = tuple(s.lower() for s in split_list(args.schedule))
    from perfsim.runtime.config import RunConfig
    from perfsim.schedules import VIRTUAL_STAGE_SCHEDULES

    for s in schedules:  # a schedule that does not fit fails before any run starts
        RunConfig(model=args.model, pp=args.pp, dp=args.dp, schedule=s, micro_batch=args.micro_batch,
                  macro_batch=args.macro_batch,
                  virtual_stages=args.virtual_stages if s in VIRTUAL_STAGE_SCHEDULES else None)
    base = {"model": args.model, "pp": args.pp, "dp": args.dp, "schedule": schedules[0],
            "micro_batch": args.micro_batch, "macro_batch": args.macro_batch}
    if args.virtual_stages is not None:
        base["virtual_stages"] = args.virtual_stages
    tps = []
    for part in split_list(args.tp):
        try:
            tps.append(int(part))
        except ValueError:
            raise ConfigError(f"--tp {part!r}: not an integer") from None
        if tps[-1] < 1:
            raise ConfigError(f"--tp {part!r}: must be >= 1")
    from perfsim.runtime.tensor_parallel import check_tp

    if args.sequence_parallel and max(tps) == 1:
        raise ConfigError("--sequence-parallel: needs a --tp > 1")
    for t in tps:  # a TP degree the model cannot take fails before any run
        check_tp(get_model_spec(args.model), t, args.sequence_parallel and t > 1)
    limit = args.dataset_limit or 4 * args.macro_batch * args.dp
    tp_tag = "-tp" + "_".join(str(t) for t in tps) + ("sp" if args.sequence_parallel else "") \
        if tps != [1] else ""
    out = args.out or f"traces/validation/{args.model}-pp{args.pp}-dp{args.dp}{tp_tag}"
    plan = v.ValidationPlan(
        base=base, bandwidths=v.parse_bandwidths(args.emulate_bandwidth),
        compresses=tuple(split_list(args.compress)), grad_compresses=tuple(split_list(args.grad_compress)),
        schedules=schedules if len(schedules) > 1 else (),
        tps=tuple(tps), sequence_parallel=args.sequence_parallel,
        latency_s=v.parse_latency(args.emulate_latency), steps=args.steps, dataset_limit=limit,
        profile=args.profile, link_model=args.link_model, out=out, seed=args.seed, repeats=args.repeats,
        reuse_measured=args.reuse_measured)
    v.check_specs(plan)  # every spec, against the simulator and the runtime, before the first run

    if any(b is not None for b in plan.bandwidths):  # emulation needs root: say so before any run
        from perfsim.netem import check_privileges

        check_privileges()
    if not 0 <= args.seed < 2**32:
        raise ConfigError(f"--seed {args.seed}: must be in 0..{2**32 - 1}")
    from perfsim.outputs import check_dir_target, locked_dir

    check_dir_target(out, "--out")
    with locked_dir(out, "--out"):  # a second validate on the same folder is refused
        return _validate(args, plan, base, limit, out)


def _validate(args, plan, base, limit, out) -> int:
    import json

    from perfsim.analysis import validate as v
    from perfsim.profile import load_profile
    from perfsim.result import atomic_write_text

    import pandas as pd

    from perfsim.progress import Progress

    rows = []
    profile = load_profile(args.profile)
    plan_rows = plan.rows()
    bar = Progress(len(plan_rows), "run", enabled=not args.no_progress, prefix="validate: ")
    try:
        for i, row in enumerate(plan_rows):
            what = f"{row['bandwidth'] or 'loopback'} {row['compress']} {row['grad_compress']} tp{row.get('tp', 1)}"
            bar.stage(f"row {i + 1}/{len(plan_rows)} {what}")
            rows.append(v.run_row(plan, row, profile, i))
            df = pd.DataFrame(rows)
            v.write_csv(df, f"{out}/validation.csv")  # partial results survive an interruption
            bar(what)
    finally:
        bar.close()
    df = pd.DataFrame(rows)
    csv = v.write_csv(df, f"{out}/validation.csv")
    print(v.format_table(df))
    summary = {**v.summarize(df), "iteration": v.summarize(df, "iteration_s"),
               "profile": args.profile, "link_model": args.link_model, "base": base,
               "steps": args.steps, "dataset_limit": limit,
               "load_average": __import__("os").getloadavg(), "reuse_measured": args.reuse_measured}
    if args.reuse_measured:  # the measurements are older: keep the load they were taken under
        import os

        try:
            with open(os.path.join(out, "summary.json")) as f:
                old = json.load(f)
            summary["measured_load_average"] = old.get("measured_load_average", old.get("load_average"))
        except (OSError, ValueError):
            pass
    atomic_write_text(f"{out}/summary.json", json.dumps(summary, indent=1, default=str))
    atomic_write_text(f"{out}/validation.md", v.markdown_table(df) + "\n")
    print(f"wrote {csv}", end="")
    if not args.no_plot and summary["rows"] == 0:  # e.g. TP rows the simulator cannot predict yet
        print(" (no plot: no row was predicted)", end="")
    elif not args.no_plot:
        png = v.plot(df, f"{out}/validation.png",
                     title=f"{args.model} pp={args.pp} dp={args.dp} tp={args.tp}: predicted vs measured "
                           f"(MAPE {summary['mape_pct']:.1f} %)")
        print(f" and {png}", end="")
    print()
    return 0
