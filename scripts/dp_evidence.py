"""Evidence: data-parallel gradient compression at an emulated 100 Mbps.

QSGD-MaxNorm 4-bit and 1-bit LAMB against fp32
allreduce, same model, 2 replicas -- speed-up and loss. Every run is a real
``perfsim run`` (``perfsim.runtime.run``): each rank in its own network
namespace, links shaped to the bandwidth with tc (:mod:`perfsim.netem`),
gradients averaged through :mod:`perfsim.ddp` (``CompressionState``) or, for
1-bit LAMB, momentum exchanged by :func:`perfsim.ddp.onebit_optimizer` over the
``onebit`` 3-phase allreduce.

Configurations (same model, seed, data order, steps):

  fp32        ``--grad-compress none``             AdamW
  qsgd4       ``--grad-compress qsgd-maxnorm:4``    AdamW
  qsgd4-multiscale  ``qsgd-maxnorm-multiscale:4``   AdamW (the multi-scale variant, same bits)
  lamb        ``onebit-lamb:warmup=STEPS``          LAMB with fp32 allreduce for the
                                                    whole run (= 1-bit LAMB's warm-up stage)
  onebit-lamb ``onebit-lamb:warmup=W``              1-bit LAMB, W = warm-up fraction x STEPS

``iteration_s`` is the runtime's median step time over the measured steps; for
1-bit LAMB with a warm-up under half the run that is a compression-stage step
(the warm-up stage costs what ``lamb`` costs). The end-to-end time of 1-bit
LAMB is derived from the two measured step times as
``W * t_lamb + (STEPS - W) * t_onebit`` (the paper's 1 / (w + (1-w)/s) form,
1-bit LAMB, arXiv:2104.06069, Sec. 6.3).

Writes ``<out>/dp_summary.csv`` (one row per configuration) and
``<out>/dp_losses.csv`` (config, step, loss). Needs root (namespaces, tc).

    python scripts/dp_evidence.py                       # gpt2-tiny, 200 steps, 100Mbps
    python scripts/dp_evidence.py --model digits-mlp --steps 150 --quick
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def configs(steps: int, warmup: int, lr_adam: float, lr_lamb: float) -> list[dict]:
    return [
        {"config": "fp32", "grad_compress": "none", "lr": lr_adam},
        {"config": "qsgd4", "grad_compress": "qsgd-maxnorm:4", "lr": lr_adam},
        {"config": "qsgd4-multiscale", "grad_compress": "qsgd-maxnorm-multiscale:4", "lr": lr_adam},
        {"config": "lamb", "grad_compress": f"onebit-lamb:warmup={steps}", "lr": lr_lamb},
        {"config": "onebit-lamb", "grad_compress": f"onebit-lamb:warmup={warmup}", "lr": lr_lamb},
    ]


SUMMARY_KEYS = ("iteration_s", "compute_s", "dp_sync_s", "optimizer_s", "dp_bytes",
                "final_loss", "loss_last10", "measured_steps")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup-frac", type=float, default=0.2,
                    help="1-bit LAMB warm-up as a fraction of the steps (paper: 16.7-19.3%%)")
    ap.add_argument("--macro-batch", type=int, default=8, help="samples per replica per step")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--bandwidth", default="100Mbps")
    ap.add_argument("--latency", default="0ms")
    ap.add_argument("--lr-adam", type=float, default=1e-3)
    ap.add_argument("--lr-lamb", type=float, default=2e-2)
    ap.add_argument("--only", default="", help="comma list of configs to run (default all)")
    ap.add_argument("--out", default=str(ROOT / "traces" / "measured"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from perfsim.errors import ConfigError
    from perfsim.result import atomic_write_text
    from perfsim.runtime import run

    if not 0 < args.warmup_frac < 1:
        raise ConfigError(f"--warmup-frac {args.warmup_frac}: must be in (0, 1)")
    warmup = max(1, round(args.warmup_frac * args.steps))
    todo = configs(args.steps, warmup, args.lr_adam, args.lr_lamb)
    if args.only:
        keep = set(args.only.split(","))
        todo = [c for c in todo if c["config"] in keep]
    rows, loss_rows = [], []
    for cfg in todo:
        t0 = time.perf_counter()
        tmp = tempfile.mkdtemp(prefix=f"perfsim-dp-{cfg['config']}-")
        try:
            result = run(model=args.model, pp=1, dp=2, grad_compress=cfg["grad_compress"],
                         lr=cfg["lr"], steps=args.steps, macro_batch=args.macro_batch,
                         micro_batch=args.micro_batch, seed=args.seed,
                         emulate_bandwidth=args.bandwidth, emulate_latency=args.latency,
                         out=tmp)
            with open(Path(tmp) / "losses.csv", newline="") as f:
                for rec in csv.DictReader(f):
                    loss_rows.append({"config": cfg["config"], "step": int(rec["step"]),
                                      "loss": float(rec["loss"])})
        except Exception:
            print(f"{cfg['config']}: run failed; rank logs kept in {tmp}/.ranks", file=sys.stderr)
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        wall = time.perf_counter() - t0
        s = result.summary
        row = {"model": args.model, "bandwidth": args.bandwidth, "latency": args.latency,
               "steps": args.steps, "warmup": warmup if cfg["config"] == "onebit-lamb" else
               (args.steps if cfg["config"] == "lamb" else 0), **cfg,
               **{k: s.get(k) for k in SUMMARY_KEYS}, "wall_s": wall}
        rows.append(row)
        print(f"{cfg['config']:16s} {cfg['grad_compress']:28s} step {s['iteration_s'] * 1e3:7.1f} ms "
              f"(dp sync {s['dp_sync_s'] * 1e3:6.1f} ms, {s['dp_bytes'] / 1e6:6.2f} MB/step)  "
              f"loss last10 {s['loss_last10']:.4f}  wall {wall:5.1f} s", flush=True)

    by = {r["config"]: r for r in rows}
    if "fp32" in by:
        base = by["fp32"]["iteration_s"]
        for r in rows:
            r["speedup_vs_fp32"] = base / r["iteration_s"]
    if "lamb" in by and "onebit-lamb" in by:
        t_w, t_c = by["lamb"]["iteration_s"], by["onebit-lamb"]["iteration_s"]
        e2e = warmup * t_w + (args.steps - warmup) * t_c
        by["onebit-lamb"]["end_to_end_s"] = e2e
        by["lamb"]["end_to_end_s"] = args.steps * t_w
        if "fp32" in by:
            by["onebit-lamb"]["end_to_end_speedup_vs_fp32"] = args.steps * by["fp32"]["iteration_s"] / e2e
        by["onebit-lamb"]["speedup_vs_lamb"] = t_w / t_c
    cols = sorted({k for r in rows for k in r}, key=lambda k: (k not in rows[0], list(rows[0]).index(k)
                                                                if k in rows[0] else 0, k))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "" if args.model == "gpt2-tiny" else f"_{args.model}"
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out / f"dp_summary{tag}.csv", buf.getvalue())
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["config", "step", "loss"])
    w.writeheader()
    w.writerows(loss_rows)
    atomic_write_text(out / f"dp_losses{tag}.csv", buf.getvalue())
    for r in rows:
        extra = "".join(f"  {k}={r[k]:.2f}" for k in ("speedup_vs_fp32", "speedup_vs_lamb",
                                                       "end_to_end_speedup_vs_fp32") if k in r)
        print(f"{r['config']:12s}{extra}")
    print(f"wrote {out / f'dp_summary{tag}.csv'} and {out / f'dp_losses{tag}.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
