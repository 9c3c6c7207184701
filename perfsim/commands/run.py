"""``perfsim run``: train for real with torch.distributed and measure it."""

from __future__ import annotations

import argparse
import sys

HELP = "train for real (torch.distributed pipeline x data x tensor parallel) and measure what predict predicts"
EXAMPLES = """examples:
  perfsim run --model digits-mlp --pp 2 --steps 20 --out runs/digits
  perfsim run --model gpt2-tiny --pp 2 --compress aqsgd:fw3bw6 --emulate-bandwidth 100Mbps --out runs/aq
  perfsim run --model digits-mlp --pp 1 --dp 2 --grad-compress qsgd-maxnorm:4 --out runs/dp
  perfsim run --model gpt2-tiny --pp 1 --tp 2 --out runs/tp
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from perfsim.commands import JOB_FLAGS, add_job_arguments, add_no_progress, add_out, positive_int

    add_job_arguments(p)
    p.add_argument("--boundary-compress", default=None,
                   help="pipeline compression of single boundaries, BOUNDARY=SPEC,... (boundary k follows "
                        "stage k; the others use --compress), e.g. 1=aqsgd:fw2bw4 on a slow hop")
    p.add_argument("--device-order", default=None,
                   help="rank that runs each position of the TP, DP, PP rank order (a permutation, e.g. "
                        "0,2,1,3): under torchrun it places stages on hosts; over loopback all links share "
                        "one emulated rate (tp 1 only)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="optimizer steps in total (default 20; give --steps or --epochs, not both)")
    p.add_argument("--epochs", type=float, default=None,
                   help="train this many epochs instead of --steps (not with --steps)")
    p.add_argument("--seed", type=int, default=0, help="random seed, 0..4294967295 (default 0)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 0.001)")
    p.add_argument("--optimizer", default="adamw", help="adamw or sgd (momentum 0.9; default adamw)")
    p.add_argument("--partition", default=None,
                   help="layer counts per stage, e.g. 2,1,1,2 (default: balanced by parameters)")
    p.add_argument("--dataset-limit", type=positive_int, default=None,
                   help="use only the first N samples (shorter epochs)")
    add_out(p, None, "output folder (default perfsim-run; with --resume the run folder that owns the "
                     "checkpoint). A folder holding an earlier run is refused: --resume it or --overwrite it")
    p.add_argument("--resume", default=None,
                   help="continue the run whose checkpoint is in this folder (a run folder, its ckpt/ or a "
                        "ckpt/stepN): the model and every job flag come from the checkpoint (flags given "
                        "again must agree; --steps/--epochs, --checkpoint-every, --emulate-*, --timeout, "
                        "--device may change), outputs go to that run's folder")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the earlier run in --out (its results and its ckpt/ are removed first)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between checkpoints (default: only at the end)")
    p.add_argument("--emulate-bandwidth", default=None,
                   help="shape every rank's link with tc in its own network namespace, e.g. 100Mbps (root)")
    p.add_argument("--emulate-latency", default=None, help="one-way latency added to each link, e.g. 20ms")
    p.add_argument("--timeout", default="60s", help="p2p / collective timeout (default 60s)")
    p.add_argument("--hang-timeout", default="30s",
                   help="a rank whose heartbeat stops this long is named and the run stopped (default 30s)")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank; default cpu)")
    add_no_progress(p, "no progress bar")
    # a flag not given is None, so that --resume can take it from the checkpoint (the help
    # texts above state the defaults: RunConfig's, applied by perfsim.runtime.make_config)
    p.set_defaults(**{a.dest: None for a in p._actions
                      if a.dest in JOB_FLAGS or a.dest in ("seed", "lr", "optimizer", "checkpoint_every",
                                                            "timeout", "hang_timeout", "device")})


def run(args: argparse.Namespace) -> int:
    from perfsim.runtime import RankFailure, TrainingDiverged, run as api_run, under_torchrun

    params = dict(model=args.model, pp=args.pp, dp=args.dp, tp=args.tp,
                  sequence_parallel=args.sequence_parallel, tied_embedding=args.tied_embedding,
                  schedule=args.schedule,
                  virtual_stages=args.virtual_stages,
                  compress=args.compress, grad_compress=args.grad_compress,
                  boundary_compress=args.boundary_compress, device_order=args.device_order,
                  micro_batch=args.micro_batch, macro_batch=args.macro_batch, steps=args.steps,
                  epochs=args.epochs, seed=args.seed, lr=args.lr, optimizer=args.optimizer,
                  dataset_limit=args.dataset_limit, partition=args.partition,
                  out=args.out or (None if args.resume else "perfsim-run"),
                  resume=args.resume, overwrite=args.overwrite, checkpoint_every=args.checkpoint_every,
                  emulate_bandwidth=args.emulate_bandwidth, emulate_latency=args.emulate_latency,
                  timeout=args.timeout, hang_timeout=args.hang_timeout, device=args.device,
                  zero=args.zero or None)
    from perfsim.compression.spec import parse_spec

    grad, out = args.grad_compress, params["out"]
    if args.resume:  # the resumed job's, from its checkpoint; the run folder that owns it
        from perfsim.runtime import checkpoint

        root, meta = checkpoint.find(args.resume)
        grad = grad or meta.get("config", {}).get("grad_compress")
        out = out or str(checkpoint.run_folder(root))
    gspec = parse_spec(grad or "none", "grad")  # for the header: the command line's edge
    warm = gspec.warmup_steps()
    if warm is not None and not under_torchrun():  # the run header: what the first steps do
        print(f"perfsim run: {gspec.name} warm-up {warm} steps (fp32 allreduce, "
              "variance frozen after), then 1-bit momentum", file=sys.stderr)
    bar = None
    progress = None
    if not args.no_progress and not under_torchrun() and sys.stderr.isatty():
        from tqdm import tqdm

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
