"""Fit the A100 efficiency curve (perfsim.engine.compute.CURVES["ampere"]) on half of
the measured single-node A100 iteration times and report the error on the other half.

Data: ``../shared/data/a100-single-node/ground_truth_single.csv`` (1440 Megatron-DeepSpeed
GPT runs on one 8 x A100 node; how they were made: that folder's README). It is read
in place, never copied.

Split (fixed before any error was looked at): a row belongs to the CALIBRATION half
when the SHA-256 of its configuration text (every column but the time, joined by
commas as in the file) has an even first byte; the rest is HELD OUT. Only the seven
curve parameters (eff_max, knee, mem_eff, kernel_s, p2p_s, collective_s, lm_head_eff) are fitted, by Nelder-Mead on
the mean absolute percentage error of the calibration rows (``--every N``: every Nth
only, for a quicker fit); nothing per row.

Every row is predicted as the runs were made: fp16, full recomputation, 1F1B,
gradient all-reduce after the backward (no overlap) on Megatron's contiguous gradient
buffer (no bucket copies), 8 GPUs per node with the
README's measured NVSwitch all-reduce bus bandwidth (229 GB/s), GPT-2 vocabulary
padded to a multiple of 128 x TP (Megatron's ``--make-vocab-size-divisible-by``).

    python scripts/calibrate_a100.py            # fit, then print held-out MAPE
    python scripts/calibrate_a100.py --check    # only evaluate the curve in the code
    python scripts/calibrate_a100.py --check --table   # ... and per tp / pp bucket
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


def load_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        next(reader)
        for rec in reader:
            cfg = ",".join(rec[:-1])
            g, gb, mb, h, a, L, s, tp, dp, pp = (int(x) for x in rec[:-1])
            rows.append(dict(key=cfg, gpus=g, global_batch=gb, micro_batch=mb, hidden=h, heads=a, layers=L,
                             seq=s, tp=tp, dp=dp, pp=pp, time_s=float(rec[-1]) / 1e3,
                             calib=hashlib.sha256(cfg.encode()).digest()[0] % 2 == 0))
    return rows


def padded_vocab(tp: int, vocab: int = 50257, multiple: int = 128) -> int:
    m = multiple * tp
    return -(-vocab // m) * m


def predict_row(row: dict) -> float:
    from perfsim.api import predict

    model = (f"gpt:layers={row['layers']},hidden={row['hidden']},heads={row['heads']},"
             f"seq={row['seq']},vocab={padded_vocab(row['tp'])}")
    r = predict(model=model, gpu="a100-sxm4-80gb", tp=row["tp"], pp=row["pp"], dp=row["dp"],
                micro_batch=row["micro_batch"], global_batch=row["global_batch"], gpus_per_node=8,
                intra_node_bandwidth="229GB/s", precision="fp16", recompute="full", schedule="1f1b",
                overlap=False, grad_buffer="contiguous", allow_oom=True)
    return r.summary["iteration_s"]


def mape(rows: list[dict]) -> tuple[float, float]:
    errs = [abs(predict_row(r) - r["time_s"]) / r["time_s"] for r in rows]
    return 100 * sum(errs) / len(errs), 100 * max(errs)


def bucket_table(calib: list[dict], held: list[dict]) -> str:
    """Markdown table of MAPE (calibration / held out) per tensor- and pipeline-parallel degree."""
    lines = ["| bucket | rows (cal / held) | MAPE cal | MAPE held out |", "| --- | ---: | ---: | ---: |"]
    for key in ("tp", "pp"):
        for v in sorted({r[key] for r in calib + held}):
            a = [r for r in calib if r[key] == v]
            b = [r for r in held if r[key] == v]
            lines.append(f"| {key} {v} | {len(a)} / {len(b)} | {mape(a)[0]:.2f} % | {mape(b)[0]:.2f} % |")
    return "\n".join(lines)


def set_curve(x) -> None:
    from perfsim.engine import compute

    from dataclasses import replace

    eff, knee, mem, kern, p2p, coll, head = x
    compute.CURVES["ampere"] = replace(compute.CURVES["ampere"], eff_max=min(1.0, max(1e-3, eff)), knee=max(0.0, knee),
                                       mem_eff=min(1.0, max(1e-3, mem)), kernel_s=max(0.0, kern),
                                       p2p_s=max(0.0, p2p), collective_s=max(0.0, coll),
                                       lm_head_eff=min(1.0, max(1e-3, head)), source="fitting")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="evaluate the curve in the code, no fit")
    ap.add_argument("--table", action="store_true", help="also print MAPE per tp and pp bucket")
    ap.add_argument("--iters", type=int, default=120, help="Nelder-Mead iterations")
    ap.add_argument("--every", type=int, default=1, help="fit on every Nth calibration row (default all)")
    ap.add_argument("--start", help="starting point eff_max,knee,mem_eff,kernel_us,p2p_us,collective_us,lm_head_eff "
                                    "(default: the code's)")
    args = ap.parse_args(argv)
    path = data_path()
    if path is None:
        print("a100-single-node data not found (looked in ../shared and /work/shared)", file=sys.stderr)
        return 2
    rows = load_rows(path)
    calib = [r for r in rows if r["calib"]]
    held = [r for r in rows if not r["calib"]]
    print(f"{len(rows)} rows: {len(calib)} calibration, {len(held)} held out ({path})")
    if not args.check:
        from scipy.optimize import minimize

        from perfsim.engine import compute

        c = compute.CURVES["ampere"]
        try:
            x0 = ([float(v) for v in args.start.split(",")] if args.start
                  else [c.eff_max, c.knee, c.mem_eff, c.kernel_s * 1e6, c.p2p_s * 1e6, c.collective_s * 1e6,
                        c.lm_head_eff])
        except ValueError:
            x0 = []
        if len(x0) != 7:
            print(f"--start {args.start!r}: give the seven values "
                  "eff_max,knee,mem_eff,kernel_us,p2p_us,collective_us,lm_head_eff", file=sys.stderr)
            return 2
        fit_rows = calib[::args.every]

        def loss(x):
            set_curve([x[0], x[1], x[2], x[3] * 1e-6, x[4] * 1e-6, x[5] * 1e-6, x[6]])
            return mape(fit_rows)[0]

        res = minimize(loss, x0, method="Nelder-Mead",
                       options=dict(maxiter=args.iters, xatol=1e-3, fatol=1e-3, initial_simplex=None))
        eff, knee, mem, kern, p2p, coll, head = res.x
        set_curve([eff, knee, mem, kern * 1e-6, p2p * 1e-6, coll * 1e-6, head])
        print(f"fitted: eff_max={eff:.4f} knee={knee:.2f} mem_eff={mem:.4f} kernel_s={kern:.3f}e-6 "
              f"p2p_s={p2p:.1f}e-6 collective_s={coll:.2f}e-6 lm_head_eff={head:.4f} "
              f"(calibration MAPE {res.fun:.2f} %, {res.nfev} evaluations)")
    m_cal, w_cal = mape(calib)
    m_held, w_held = mape(held)
    print(f"calibration half: MAPE {m_cal:.2f} % (worst {w_cal:.1f} %)")
    print(f"held-out half:    MAPE {m_held:.2f} % (worst {w_held:.1f} %)")
    if args.table:
        print(bucket_table(calib, held))
    return 0 if math.isfinite(m_held) else 1


if __name__ == "__main__":
    sys.exit(main())
