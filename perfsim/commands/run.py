"""``perfsim run``: train for real with torch.distributed and measure it."""

from __future__ import annotations

import argparse
import sys

from perfsim import params
from perfsim.commands import add_no_progress, add_out, positive_int
from perfsim.compression.spec import parse_spec
from perfsim.params import run_job
from perfsim.runtime.config import RUN_OPTIONS, RunConfig

HELP = "train for real (torch.distributed pipeline x data x tensor parallel) and measure what predict predicts"
EXAMPLES = """examples:
  perfsim run --model digits-mlp --pp 2 --steps 20 --out runs/digits
  perfsim run --model gpt2-tiny --pp 2 --compress aqsgd:fw3bw6 --emulate-bandwidth 100Mbps --out runs/aq
  perfsim run --model digits-mlp --pp 1 --dp 2 --grad-compress qsgd-maxnorm:4 --out runs/dp
  perfsim run --model gpt2-tiny --pp 1 --tp 2 --out runs/tp
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The job's flags from :data:`perfsim.params.PARAMS` (the names of
    :data:`perfsim.params.RUN_JOB_PARAMS`, parsed as ``perfsim predict`` parses them), then
    run's own options (:data:`perfsim.runtime.config.RUN_OPTIONS`). A flag not given is
    None, so that ``--resume`` can take it from the checkpoint; the help states the default
    (RunConfig's, applied by :func:`perfsim.runtime.make_config`)."""
    # the defaults stated: RunConfig's where predict's depend on a GPU preset (schedule, macro_batch ...)
    shown = {name: v for name in params.RUN_JOB_PARAMS if params.BY_NAME[name].default is None
             and isinstance(v := getattr(RunConfig, name, None), (str, int)) and not isinstance(v, bool)}
    params.add_arguments(p, lists=False, only=params.RUN_JOB_PARAMS, shown={**shown, "model": RunConfig.model},
                         helps=params.RUN_HELPS)  # run's texts where predict's do not hold (Param.run_help)
    own = p.add_argument_group("run")
    types = {"int": int, "count": positive_int, "float": float, "text": str}
    for o in RUN_OPTIONS:
        if o.name == "out":
            add_out(own, None, o.help)
        elif o.kind == "switch":
            own.add_argument("--" + o.name.replace("_", "-"), action="store_true", help=o.help)
        else:
            own.add_argument("--" + o.name.replace("_", "-"), type=types[o.kind], default=None, help=o.help)
    add_no_progress(p, "no progress bar")


def run_params(args: argparse.Namespace) -> dict:
    """The keywords of :func:`perfsim.runtime.run` that the parsed flags ``args`` give: the
    job's parsed as ``perfsim predict`` parses them (an error names the flag), run's own as
    given, and the output folder (``perfsim-run`` unless ``--resume`` names one)."""
    params = run_job(vars(args), cli=True)
    params.update({o.name: getattr(args, o.name) for o in RUN_OPTIONS})
    params["out"] = args.out or (None if args.resume else "perfsim-run")
    return params


def run(args: argparse.Namespace) -> int:
    # lazy: perfsim.runtime.run pulls in torch
    from perfsim.runtime import RankFailure, TrainingDiverged, make_config, run as api_run, under_torchrun

    params = run_params(args)
    grad, out = args.grad_compress, params["out"]
    if args.resume:  # the resumed job's, from its checkpoint; the run folder that owns it
        from perfsim.runtime import checkpoint  # lazy: perfsim.runtime.checkpoint loads torch

        root, meta = checkpoint.find(args.resume)
        grad = grad or meta.get("config", {}).get("grad_compress")
        out = out or str(checkpoint.run_folder(root))
    gspec = parse_spec(grad or "none", "grad")  # for the header: the command line's edge
    warm = gspec.warmup_steps()
    if warm is not None and not under_torchrun():  # the run header: what the first steps do
        make_config(**params)  # a bad job is refused in one line, before the header
        print(f"perfsim run: {gspec.name} warm-up {warm} steps (fp32 allreduce, "
              "variance frozen after), then 1-bit momentum", file=sys.stderr)
    bar = None
    progress = None
    if not args.no_progress and not under_torchrun() and sys.stderr.isatty():
        from tqdm import tqdm  # lazy: tqdm is heavy, needed only here

        bar = tqdm(total=None, unit="step", desc="perfsim run", file=sys.stderr)

        def progress(info):
            bar.total = info["steps"]
            bar.n = info["step"]
            if info.get("loss") is not None:
                bar.set_postfix(loss=f"{info['loss']:.4f}", refresh=False)
            bar.refresh()
    try:
        result = api_run(progress=progress, **params)
    except (RankFailure, TrainingDiverged) as exc:
        print(f"perfsim run: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    if result is None:  # a non-zero rank under torchrun
        return 0
    s = result.summary
    loss = s.get("final_loss")
    loss_txt = f", final loss {loss:.4f}" if loss is not None else ""
    tp = f" tp={s['tp']}" + (" sp" if s.get("sequence_parallel") else "") if s.get("tp", 1) > 1 else ""
    tp += " tied" if s.get("tied_embedding") == "sync" else ""
    tp += f" zero={s['zero']} (FSDP2)" if s.get("zero") else ""
    warm_txt = f", 1-bit warm-up {s['onebit_warmup']} steps" if s.get("onebit_warmup") is not None else ""
    per = f" boundaries={s['boundary_compress']}" if s.get("boundary_compress") else ""
    print(f"{s['model']} pp={s['pp']} dp={s['dp']}{tp} {s['schedule']} compress={s['compress']}{per} "
          f"grad={s['grad_compress']}: {s['throughput_samples_per_s']:.1f} samples/s, "
          f"iteration {s['iteration_s'] * 1e3:.1f} ms, pipeline {s['pipeline_bytes'] / 1e6:.3f} MB/step"
          f"{loss_txt}{warm_txt} -> {out}")
    return 0
