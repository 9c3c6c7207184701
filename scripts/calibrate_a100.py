"""Fit the A100 efficiency curve (perfsim.hardware.A100_CURVE, the a100-sxm4-80gb preset's) to measured
single-node A100 iteration times, inside the physical ranges of its parameters, and report
the error on configurations the fit never saw.

Data: ``../shared/data/a100-single-node/ground_truth_single.csv`` (1440 Megatron-DeepSpeed
GPT runs on one 8 x A100 node; how they were made: that folder's README). It is read
in place, never copied.

Split by configuration. Rows that differ only in global batch are linear in one another
(the same micro-batch step, repeated), so a row-wise split lets the fit see the held-out
rows' configuration. A CONFIGURATION is every column but the global batch and the time;
the first byte of the SHA-256 of its text decides, for all of its rows together:
0-1 (mod 4) CALIBRATION (the fit), 2 VALIDATION (choosing between model variants),
3 HELD OUT (reported once, at the end: ``--held-out``). The row-wise split of earlier
sessions (a row's own SHA-256, even first byte: calibration) is still printed, marked as
such, for comparison.

Only the seven curve parameters (eff_max, knee, mem_eff, kernel_s, p2p_s, collective_s,
lm_head_eff) are fitted, by bounded Nelder-Mead on the mean absolute percentage error of
the calibration rows, each inside its range (perfsim.engine.curve_bounds.CURVE_BOUNDS);
nothing per row. Errors are signed as (predicted - measured) / measured: negative means
the prediction is too fast.

Every row is predicted as the runs were made: fp16, full recomputation, 1F1B,
gradient all-reduce after the backward (no overlap) on Megatron's contiguous gradient
buffer (no bucket copies), 8 GPUs per node with the
README's measured NVSwitch all-reduce bus bandwidth (229 GB/s), GPT-2 vocabulary
padded to a multiple of 128 x TP (Megatron's ``--make-vocab-size-divisible-by``).

    python scripts/calibrate_a100.py                 # fit (bounded), then the validation split
    python scripts/calibrate_a100.py --check         # evaluate the curve in the code
    python scripts/calibrate_a100.py --check --table # ... and per tp / pp bucket
    python scripts/calibrate_a100.py --check --slopes  # ... and cost per iteration / per micro-batch
    python scripts/calibrate_a100.py --check --held-out   # ... and the held-out split (once)
    python scripts/calibrate_a100.py --straggler-cv 0.02 --every 2   # fit and evaluate with a GPU speed spread
    python scripts/calibrate_a100.py --jitter-cv 0.05 --every 2      # ... with a per-micro-batch jitter

``--straggler-cv X`` predicts every row with ``straggler_cv = X`` (params.PARAMS; the
expected slowest of the row's GPUs, perfsim.engine.sync_wait), in the fit and in the
evaluation; the validation error is also printed by GPU count (2 / 4 / 8).
``--jitter-cv X`` likewise predicts every row with ``jitter_cv = X`` (the per-micro-batch
jitter, averaged over the row's ``m`` micro-batches: ``X / sqrt(m)``, perfsim.engine.sync_wait);
the validation error is also printed by micro-batch count ``m`` (global batch / (micro-batch x dp)).
``--grad-accumulation M`` predicts every row with ``grad_accumulation = M`` (params.PARAMS;
perfsim.models.ops.GradAccumulation: ``fused``, the default, ``main-grad`` or ``autograd`` --
how the runs' DeepSpeed engine accumulated, docs/model.md "Gradient accumulation per
micro-batch"), in the fit and in the evaluation.
``--optimizer-step megatron`` counts every row's optimizer step as Megatron-LM's optimizer makes its
passes (params.PARAMS ``optimizer_step``; perfsim.job.Optimizer.step_bytes), in the fit and in the evaluation.
Every pipeline row's messages go in the order the runs' DeepSpeed pipeline engine issues them, each a
blocking call that NCCL's kernels pair up (``p2p_exchange = deepspeed``, ``p2p_protocol = rendezvous``:
the runs' stack, perfsim.schedules.deepspeed_rows; adopted by the rule of docs/validation.md, "DeepSpeed's
pipeline engine: its message order"); ``--p2p-exchange`` and ``--p2p-protocol`` predict every row
otherwise (``async`` / ``eager``: perfsim's defaults), in the fit and in the evaluation.
``--gemm-quantization waves`` prices every GEMM with the A100 curve's ``gemm_quantization =
waves`` (GEMM tile and wave quantization over the A100's 108 SMs, perfsim.engine.gemm_waves), in
the fit and in the evaluation.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = [Path(os.environ.get("PERFSIM_SHARED", "/work/shared")), ROOT.parent / "shared", ROOT / ".." / "shared"]


def data_path() -> Path | None:
    for base in CANDIDATES:
        p = base / "data" / "a100-single-node" / "ground_truth_single.csv"
        if p.exists():
            return p
    return None


#: configuration split by the first byte of the SHA-256 of a configuration's text, mod 4
SPLITS = {0: "calibration", 1: "calibration", 2: "validation", 3: "held-out"}


def _first_byte(text: str) -> int:
    return hashlib.sha256(text.encode()).digest()[0]


def load_rows(path: Path) -> list[dict]:
    """Every measured row, with its configuration split (``split``) and the old row-wise
    split (``row_calib``: its own text's SHA-256 has an even first byte)."""
    rows = []
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        next(reader)
        for rec in reader:
            text = ",".join(rec[:-1])
            g, gb, mb, h, a, L, s, tp, dp, pp = (int(x) for x in rec[:-1])
            config = ",".join(rec[i] for i in range(len(rec) - 1) if i != 1)  # all but the global batch
            rows.append(dict(key=text, config=config, gpus=g, global_batch=gb, micro_batch=mb, hidden=h, heads=a,
                             layers=L, seq=s, tp=tp, dp=dp, pp=pp, time_s=float(rec[-1]) / 1e3,
                             split=SPLITS[_first_byte(config) % 4], row_calib=_first_byte(text) % 2 == 0))
    return rows


def padded_vocab(tp: int, vocab: int = 50257, multiple: int = 128) -> int:
    m = multiple * tp
    return -(-vocab // m) * m


#: ``straggler_cv`` every row is predicted with (``--straggler-cv``; params.PARAMS's default: 0)
STRAGGLER_CV = 0.0
#: ``jitter_cv`` every row is predicted with (``--jitter-cv``; params.PARAMS's default: 0)
JITTER_CV = 0.0
#: ``grad_accumulation`` every row is predicted with (``--grad-accumulation``; params.PARAMS's default)
GRAD_ACCUMULATION = "fused"
#: ``optimizer_step`` every row is predicted with (``--optimizer-step``; params.PARAMS's default)
OPTIMIZER_STEP = "fused"
#: ``p2p_exchange`` and ``p2p_protocol`` every row is predicted with (``--p2p-exchange``, ``--p2p-protocol``;
#: the runs' DeepSpeed pipeline engine)
P2P_EXCHANGE = "deepspeed"
P2P_PROTOCOL = "rendezvous"
#: the A100 curve's ``gemm_quantization`` in the fit and the evaluation (``--gemm-quantization``;
#: the code's curve's when None)
GEMM_QUANTIZATION: str | None = None
#: the A100 curve's ``host_issue`` in the fit and the evaluation (``--host-issue``; the code's
#: curve's when None)
HOST_ISSUE: str | None = None


def predict_row(row: dict) -> float:
    from perfsim.api import predict

    model = (f"gpt:layers={row['layers']},hidden={row['hidden']},heads={row['heads']},"
             f"seq={row['seq']},vocab={padded_vocab(row['tp'])}")
    # only the switches given: a caller's functools.partial of predict (megatron_open_data.py
    # --single-node --set ...) sets the others
    switched = {k: v for k, v, default in (("straggler_cv", STRAGGLER_CV, 0.0),
                                           ("jitter_cv", JITTER_CV, 0.0),
                                           ("grad_accumulation", GRAD_ACCUMULATION, "fused"),
                                           ("optimizer_step", OPTIMIZER_STEP, "fused"),
                                           ("p2p_exchange", P2P_EXCHANGE, "async"),
                                           ("p2p_protocol", P2P_PROTOCOL, "eager")) if v != default}
    r = predict(model=model, gpu=A100, tp=row["tp"], pp=row["pp"], dp=row["dp"],
                micro_batch=row["micro_batch"], global_batch=row["global_batch"], gpus_per_node=8,
                intra_node_bandwidth="229GB/s", precision="fp16", recompute="full", schedule="1f1b",
                attention="megatron", overlap=False, grad_buffer="contiguous", allow_oom=True, **switched)
    return r.summary["iteration_s"]


def errors(rows: list[dict]) -> list[float]:
    """Signed relative error of each row, (predicted - measured) / measured."""
    return [(predict_row(r) - r["time_s"]) / r["time_s"] for r in rows]


def mape(rows: list[dict]) -> tuple[float, float]:
    errs = [abs(e) for e in errors(rows)]
    return 100 * sum(errs) / len(errs), 100 * max(errs)


def summary(rows: list[dict]) -> str:
    """MAPE, mean signed error, worst row and the share of optimistic rows of ``rows``."""
    e = errors(rows)
    n = len(e)
    return (f"MAPE {100 * sum(map(abs, e)) / n:.2f} %, mean signed {100 * sum(e) / n:+.2f} %, "
            f"worst {100 * max(map(abs, e)):.1f} %, {100 * sum(x < 0 for x in e) / n:.0f} % of rows too fast "
            f"({n} rows, {len({r['config'] for r in rows})} configurations)")


def microbatches(row: dict) -> int:
    """Micro-batches per iteration of ``row`` (each data-parallel rank's gradient accumulation)."""
    return row["global_batch"] // (row["micro_batch"] * row["dp"])


def by_group(rows: list[dict], key, label: str) -> str:
    """MAPE and mean signed error of ``rows`` for each value of ``key(row)``, e.g. the GPU count."""
    parts = []
    for g in sorted({key(r) for r in rows}):
        e = errors([r for r in rows if key(r) == g])
        parts.append(f"{label.format(g)}: MAPE {100 * sum(map(abs, e)) / len(e):.2f} %, "
                     f"mean signed {100 * sum(e) / len(e):+.2f} % ({len(e)} rows)")
    return "; ".join(parts)


def by_gpus(rows: list[dict]) -> str:
    """MAPE and mean signed error of ``rows`` for each GPU count."""
    return by_group(rows, lambda r: r["gpus"], "{} GPUs")


def by_microbatches(rows: list[dict]) -> str:
    """MAPE and mean signed error of ``rows`` for each micro-batch count ``m``."""
    return by_group(rows, microbatches, "m {}")


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ``ys`` against ``xs`` (at least two distinct ``xs``)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def slopes(rows: list[dict]) -> list[dict]:
    """Each configuration of ``rows`` with two or more micro-batch counts ``m``, split into a cost per
    iteration and a cost per micro-batch: the intercept ``A`` and slope ``B`` of ``T = A + B m``
    through its rows, measured (``a_meas``, ``b_meas``) and predicted (``a_pred``, ``b_pred``).
    Rows differing only in global batch differ only in ``m``, so the slope is what one more
    micro-batch costs (a pipeline's steady state, gradient accumulation's step) and the intercept
    the rest (optimizer step, gradient sync, the pipeline's fill and drain)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["config"], []).append(r)
    out = []
    for g in groups.values():
        ms = [microbatches(r) for r in g]
        if len(set(ms)) < 2:
            continue
        a_meas, b_meas = line_fit(ms, [r["time_s"] for r in g])
        a_pred, b_pred = line_fit(ms, [predict_row(r) for r in g])
        out.append(dict(g[0], a_meas=a_meas, b_meas=b_meas, a_pred=a_pred, b_pred=b_pred))
    return out


def slope_table(rows: list[dict]) -> str:
    """Markdown table of :func:`slopes` by pipeline and tensor-parallel degree: the mean signed error
    of the per-micro-batch slope and the mean intercepts, measured and predicted."""
    fits = slopes(rows)
    lines = ["| pp | tp | configurations | per-micro-batch slope: mean signed error | per-iteration intercept, "
             "measured / predicted ms |", "| ---: | ---: | ---: | ---: | ---: |"]
    for pp, tp in sorted({(f["pp"], f["tp"]) for f in fits}):
        cell = [f for f in fits if (f["pp"], f["tp"]) == (pp, tp)]
        err = sum((f["b_pred"] - f["b_meas"]) / f["b_meas"] for f in cell) / len(cell)
        a_meas = 1e3 * sum(f["a_meas"] for f in cell) / len(cell)
        a_pred = 1e3 * sum(f["a_pred"] for f in cell) / len(cell)
        lines.append(f"| {pp} | {tp} | {len(cell)} | {100 * err:+.1f} % | {a_meas:.1f} / {a_pred:.1f} |")
    return "\n".join(lines)


def bucket_table(calib: list[dict], held: list[dict]) -> str:
    """Markdown table of MAPE (calibration / held out) per tensor- and pipeline-parallel degree."""
    lines = ["| bucket | rows (cal / val) | MAPE cal | MAPE validation |", "| --- | ---: | ---: | ---: |"]
    for key in ("tp", "pp"):
        for v in sorted({r[key] for r in calib + held}):
            a = [r for r in calib if r[key] == v]
            b = [r for r in held if r[key] == v]
            lines.append(f"| {key} {v} | {len(a)} / {len(b)} | {mape(a)[0]:.2f} % | {mape(b)[0]:.2f} % |")
    return "\n".join(lines)


#: the GPU preset the data were measured on (its curve is the one fitted)
A100 = "a100-sxm4-80gb"
#: the fitted fields, in the order --start and the fit use; host times in microseconds there
FIELDS = ("eff_max", "knee", "mem_eff", "kernel_s", "p2p_s", "collective_s", "lm_head_eff")
#: the fields a fit and ``--start`` use: :data:`FIELDS`, and ``optimizer_eff`` with ``--optimizer-eff``
FIT_FIELDS = FIELDS
_MICRO = {"kernel_s", "p2p_s", "collective_s"}


def to_fit_units(name: str, value: float) -> float:
    return value * 1e6 if name in _MICRO else value


def set_curve(x) -> None:
    """Make the a100-sxm4-80gb preset's curve the one with fields ``x`` (in :data:`FIT_FIELDS`
    order, fit units; :data:`FIELDS` alone leaves ``optimizer_eff`` as it is)."""
    from dataclasses import replace

    from perfsim.hardware import GPUS

    values = {n: (v * 1e-6 if n in _MICRO else v) for n, v in zip(FIT_FIELDS, x)}
    if GEMM_QUANTIZATION is not None:
        values["gemm_quantization"] = GEMM_QUANTIZATION
    if HOST_ISSUE is not None:
        values["host_issue"] = HOST_ISSUE
    gpu = GPUS[A100]
    GPUS[A100] = replace(gpu, curve=replace(gpu.curve, **values, source="fitting"))


def set_gemm_quantization(mode: str) -> None:
    """Make the a100-sxm4-80gb preset's curve price GEMMs with ``gemm_quantization = mode``
    (perfsim.hardware.GEMM_QUANTIZATION), its fitted fields unchanged; every later
    :func:`set_curve` keeps it."""
    from dataclasses import replace

    from perfsim.hardware import GPUS

    global GEMM_QUANTIZATION
    gpu = GPUS[A100]
    GPUS[A100] = replace(gpu, curve=replace(gpu.curve, gemm_quantization=mode))  # Curve checks mode
    GEMM_QUANTIZATION = mode


def set_host_issue(mode: str) -> None:
    """Make the a100-sxm4-80gb preset's curve meet host and GPU time with ``host_issue = mode``
    (perfsim.hardware.HOST_ISSUE), its fitted fields unchanged; every later :func:`set_curve`
    keeps it."""
    from dataclasses import replace

    from perfsim.hardware import GPUS

    global HOST_ISSUE
    gpu = GPUS[A100]
    GPUS[A100] = replace(gpu, curve=replace(gpu.curve, host_issue=mode))  # Curve checks mode
    HOST_ISSUE = mode


def fit_bounds() -> list[tuple[float, float]]:
    from perfsim.engine.curve_bounds import CURVE_BOUNDS

    return [(to_fit_units(n, CURVE_BOUNDS[n].low), to_fit_units(n, CURVE_BOUNDS[n].high)) for n in FIT_FIELDS]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--check", action="store_true", help="evaluate the curve in the code, no fit")
    ap.add_argument("--table", action="store_true", help="also print MAPE per tp and pp bucket")
    ap.add_argument("--slopes", action="store_true",
                    help="also split each calibration and validation configuration into a cost per iteration "
                         "and per micro-batch (measured vs predicted, by pp and tp)")
    ap.add_argument("--held-out", action="store_true",
                    help="also report the held-out configurations (once, after every variant was chosen)")
    ap.add_argument("--iters", type=int, default=300, help="Nelder-Mead iterations")
    ap.add_argument("--every", type=int, default=1, help="fit on every Nth calibration row (default all)")
    ap.add_argument("--straggler-cv", type=float, default=0.0, metavar="X",
                    help="predict (fit and evaluate) every row with straggler_cv X (default 0: off)")
    ap.add_argument("--jitter-cv", type=float, default=0.0, metavar="X",
                    help="predict (fit and evaluate) every row with jitter_cv X, a per-micro-batch "
                         "compute jitter (default 0: off)")
    ap.add_argument("--optimizer-step", default="fused", metavar="S",
                    help="predict (fit and evaluate) every row with optimizer_step S: fused (default) or megatron")
    ap.add_argument("--p2p-exchange", default="deepspeed", metavar="E",
                    help="predict (fit and evaluate) every row with p2p_exchange E: deepspeed (default: the runs' "
                         "DeepSpeed pipeline engine), async or blocking (Megatron-LM's)")
    ap.add_argument("--p2p-protocol", default="rendezvous", metavar="P",
                    help="predict (fit and evaluate) every row with p2p_protocol P: rendezvous (default: NCCL's "
                         "paired kernels) or eager")
    ap.add_argument("--grad-accumulation", default="fused", metavar="M",
                    help="predict (fit and evaluate) every row with grad_accumulation M: fused (default), "
                         "main-grad or autograd")
    ap.add_argument("--gemm-quantization", default=None, metavar="Q",
                    help="price every GEMM with the A100 curve's gemm_quantization Q (fit and evaluation): "
                         "off or waves (default: the code's curve's)")
    ap.add_argument("--host-issue", default=None, metavar="H",
                    help="meet the host's and the GPU's time with the A100 curve's host_issue H (fit and "
                         "evaluation): per-op or queue (default: the code's curve's)")
    ap.add_argument("--optimizer-eff", action="store_true",
                    help="fit the optimizer step's own share of the memory bandwidth (Curve.optimizer_eff) as an "
                         "eighth parameter, starting at mem_eff where the curve has none")
    ap.add_argument("--start", help="starting point eff_max,knee,mem_eff,kernel_us,p2p_us,collective_us,lm_head_eff "
                                    "[,optimizer_eff with --optimizer-eff] (default: the code's, moved inside the bounds)")
    args = ap.parse_args(argv)
    from perfsim.errors import ConfigError

    global STRAGGLER_CV, JITTER_CV, GRAD_ACCUMULATION, OPTIMIZER_STEP, P2P_EXCHANGE, P2P_PROTOCOL, FIT_FIELDS
    FIT_FIELDS = FIELDS + (("optimizer_eff",) if args.optimizer_eff else ())
    STRAGGLER_CV = args.straggler_cv
    JITTER_CV = args.jitter_cv
    GRAD_ACCUMULATION = args.grad_accumulation
    OPTIMIZER_STEP = args.optimizer_step
    P2P_EXCHANGE, P2P_PROTOCOL = args.p2p_exchange, args.p2p_protocol
    path = data_path()
    if path is None:
        print("a100-single-node data not found (looked in ../shared and /work/shared)", file=sys.stderr)
        return 2
    from perfsim.engine.curve_bounds import violations
    from perfsim.hardware import GPUS

    rows = load_rows(path)
    try:
        if args.gemm_quantization is not None:
            set_gemm_quantization(args.gemm_quantization)
        if args.host_issue is not None:
            set_host_issue(args.host_issue)
        predict_row(rows[0])  # System checks straggler_cv's and jitter_cv's ranges, Strategy grad_accumulation's
    except ConfigError as exc:
        print(f"--straggler-cv / --jitter-cv / --grad-accumulation / --optimizer-step / --p2p-exchange / "
              f"--p2p-protocol / --gemm-quantization / "
              f"--host-issue: {exc}",
              file=sys.stderr)
        return 2
    by = {name: [r for r in rows if r["split"] == name] for name in ("calibration", "validation", "held-out")}
    print(f"{len(rows)} rows in {len({r['config'] for r in rows})} configurations: "
          + ", ".join(f"{len(v)} {k}" for k, v in by.items()) + f" ({path})")
    if not args.check:
        from scipy.optimize import minimize

        c = GPUS[A100].curve
        bounds = fit_bounds()
        try:
            x0 = ([float(v) for v in args.start.split(",")] if args.start
                  else [to_fit_units(n, c.mem_eff if n == "optimizer_eff" and not c.optimizer_eff else getattr(c, n))
                        for n in FIT_FIELDS])
        except ValueError:
            x0 = []
        if len(x0) != len(FIT_FIELDS):
            print(f"--start {args.start!r}: give the {len(FIT_FIELDS)} values {','.join(FIT_FIELDS)} "
                  "(host times in us)", file=sys.stderr)
            return 2
        x0 = [min(hi, max(lo, v)) for v, (lo, hi) in zip(x0, bounds)]
        fit_rows = by["calibration"][::args.every]

        def loss(x):
            set_curve(x)
            return mape(fit_rows)[0]

        res = minimize(loss, x0, method="Nelder-Mead", bounds=bounds,
                       options=dict(maxiter=args.iters, xatol=1e-3, fatol=1e-3))
        set_curve(res.x)
        print("fitted: " + " ".join(f"{n}={v:.4g}{'e-6' if n in _MICRO else ''}" for n, v in zip(FIT_FIELDS, res.x))
              + f" (calibration MAPE {res.fun:.2f} %, {res.nfev} evaluations)")
    bad = violations(GPUS[A100].curve)
    print("parameters: " + ("every one inside its bounds" if not bad else "OUTSIDE their bounds: " + "; ".join(bad)))
    legacy_cal = [r for r in rows if r["row_calib"]]
    legacy_held = [r for r in rows if not r["row_calib"]]
    print(f"row-wise split (earlier sessions; shares configurations): calibration MAPE {mape(legacy_cal)[0]:.2f} %, "
          f"held out {mape(legacy_held)[0]:.2f} %")
    print(f"calibration configurations: {summary(by['calibration'])}")
    print(f"validation configurations:  {summary(by['validation'])}")
    switches = (f"straggler_cv {STRAGGLER_CV:g}, jitter_cv {JITTER_CV:g}, grad_accumulation {GRAD_ACCUMULATION}, "
                f"optimizer_step {OPTIMIZER_STEP}, p2p_exchange {P2P_EXCHANGE}, p2p_protocol {P2P_PROTOCOL}, "
                f"gemm_quantization {GPUS[A100].curve.gemm_quantization}, host_issue {GPUS[A100].curve.host_issue}")
    print(f"validation by GPU count ({switches}): {by_gpus(by['validation'])}")
    print(f"validation by micro-batch count ({switches}): {by_microbatches(by['validation'])}")
    if args.held_out:
        print(f"held-out configurations:    {summary(by['held-out'])}")
    if args.table:
        print(bucket_table(by["calibration"], by["validation"]))
    if args.slopes:
        print(slope_table(by["calibration"] + by["validation"]))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
