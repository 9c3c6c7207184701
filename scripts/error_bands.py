"""Write perfsim/data/error_bands.json: the validation residuals behind every prediction's
80 % interval (perfsim/engine/uncertainty.py), and measure the interval's coverage on held-out data.

Sources, each split by configuration (never by row), the band from the VALIDATION part, the
coverage from the HELD-OUT part:

* ``gpu:ampere``: ../shared/data/a100-single-node (1440 Megatron-DeepSpeed runs on one
  8 x A100 node), split as scripts/calibrate_a100.py splits it (calibration configurations fit
  the curve; validation -> band; held-out -> coverage).
* ``gpu:hopper``: whole single-GPU training steps on an H200 and an H100 measured by
  scripts/gpu_step_bench.py (traces/gpu/*-steps-*.csv; eager PyTorch, so predicted with its host
  time per operator, 25 us -- docs/gpu.md), each priced by its own GPU's curve.
* ``profile``: perfsim's CPU validation grids (traces/validation/, stored measurements
  re-predicted by the code as it is, with traces/cpu-2core.json).

Rows of the last two are split by the SHA-256 of their configuration (the grid and the row's
configuration columns): even first byte -> validation, odd -> held out.
* ``transfer``: the largest change of a row's error when an H100 step is priced with the H200's
  curve instead of the H100's own: how much a borrowed curve adds.

    python scripts/error_bands.py           # write the file, print bands and coverage
    python scripts/error_bands.py --check   # print only; exit 1 if the stored file differs
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "perfsim" / "data" / "error_bands.json"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def conformal_bounds(xs: list[float], coverage: float = 0.8) -> tuple[float, float]:
    """The lower and upper order statistics of ``xs`` that bracket a new row's error with
    probability >= ``coverage``, split-conformal style (Angelopoulos and Bates,
    arXiv:2107.07511, section 1: the ceil((n+1)(1-a))-th smallest of n scores; here for each
    tail a/2): the (k_lo)-th and (k_hi)-th smallest, k_hi = ceil((n+1)(1-a/2)) capped at n,
    k_lo = floor((n+1) a/2) at least 1."""
    xs = sorted(xs)
    n, tail = len(xs), (1 - coverage) / 2
    k_hi = min(n, math.ceil((n + 1) * (1 - tail)))
    k_lo = max(1, math.floor((n + 1) * tail))
    return xs[k_lo - 1], xs[k_hi - 1]


def coverage(errors: list[float], q10: float, q90: float) -> float:
    """Share of rows whose measured time lies in [T/(1+q90), T/(1+q10)], i.e. q10 <= e <= q90."""
    return sum(q10 <= e <= q90 for e in errors) / len(errors)


def a100() -> tuple[list[float], list[float]]:
    cal = _script("calibrate_a100")
    rows = cal.load_rows(cal.data_path())
    return (cal.errors([r for r in rows if r["split"] == "validation"]),
            cal.errors([r for r in rows if r["split"] == "held-out"]))


def steps(files: list[str], gpu: str) -> list[tuple[str, float]]:
    """(configuration, signed error) of every stored whole-step row of ``files``."""
    from perfsim.api import predict

    out = []
    for name in files:
        for r in csv.DictReader((ROOT / "traces" / "gpu" / name).open()):
            mb = int(r["micro_batch"])
            attention = "flash" if "flash" in r["attention"] else "megatron"
            if r["attention"] not in ("megatron", "megatron-flash"):
                continue  # execute mode's own block through SDPA: not the operators the model prices
            p = predict(model=f"gpt:layers={r['layers']},hidden={r['hidden']},heads={r['heads']},"
                              f"seq={r['seq']},vocab={r['vocab']}", gpu=gpu, pp=1, micro_batch=mb,
                        global_batch=mb, precision="bf16", recompute="none", attention=attention,
                        host_overhead="25us", allow_oom=True)
            key = ",".join(r[k] for k in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch", "attention"))
            out.append((key, p.summary["iteration_s"] / float(r["step_s"]) - 1))
    return out


def by_config(rows: list[tuple[str, float]]) -> tuple[list[float], list[float]]:
    """(validation, held-out) errors: a configuration's SHA-256 first byte even -> validation."""
    val = [e for k, e in rows if hashlib.sha256(k.encode()).digest()[0] % 2 == 0]
    held = [e for k, e in rows if hashlib.sha256(k.encode()).digest()[0] % 2 == 1]
    return val, held


def cpu_grids() -> tuple[list[float], list[float]]:
    rp = _script("repredict_validation")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, g in enumerate(rp.GRIDS):
            df = rp.repredict_frame(rp.STORED / g, str(ROOT / "traces" / "cpu-2core.json"), Path(tmp) / str(n))
            for _, r in df.iterrows():
                key = ",".join(str(r[c]) for c in ("model", "bandwidth_bps", "compress", "grad_compress", "schedule",
                                                   "pp", "dp", "micro_batch"))
                rows.append((f"{g},{key}", r.predicted_iteration_s / r.measured_iteration_s - 1))
    return by_config(rows)


def band(errors: list[float], basis: str, max_gpus: int) -> dict:
    q10, q90 = conformal_bounds(errors)
    return {"q10": round(q10, 4), "q90": round(q90, 4),
            "rows": len(errors), "basis": basis, "max_gpus": max_gpus}


def build() -> tuple[dict, list[str]]:
    from dataclasses import replace

    from perfsim.hardware import GPUS

    report = []
    sources = {}

    def add(key, val, held, basis, max_gpus):
        sources[key] = band(val, basis, max_gpus)
        b = sources[key]
        cov = coverage(held, b["q10"], b["q90"]) if held else float("nan")
        report.append(f"{key:22s} q10 {100 * b['q10']:+6.1f} %  q90 {100 * b['q90']:+6.1f} %  "
                      f"({b['rows']} validation rows; held-out coverage {100 * cov:.0f} % of {len(held)} rows)")

    v, h = a100()
    add("gpu:ampere", v, h, "Megatron-DeepSpeed GPT on one 8 x A100 node, validation configurations "
        "(scripts/calibrate_a100.py)", 8)
    h200 = steps(["h200-steps-megatron-2026-11-26.csv", "h200-steps-flash-2026-11-26.csv"], "h200")
    h100 = steps(["h100-steps-2026-11-26.csv"], "h100")
    v, h = by_config(h200 + h100)
    add("gpu:hopper", v, h, "whole eager-PyTorch GPT steps on one H200 and one H100 (traces/gpu), "
        "25 us per operator", 1)
    own = GPUS["h100-sxm5-80gb"]
    GPUS[own.name] = replace(own, curve=GPUS["h200-sxm-141gb"].curve)  # the H200's, as before its own fit
    try:
        borrowed = steps(["h100-steps-2026-11-26.csv"], "h100")
    finally:
        GPUS[own.name] = own
    widen = max(abs(b - o) for (_, b), (_, o) in zip(borrowed, h100))
    report.append(f"transfer: an H100 step priced with the H200's curve moves by up to {100 * widen:.1f} points")
    v, h = cpu_grids()
    add("profile", v, h, "perfsim run on CPU (gloo) against its calibrated profile, validation grids "
        "(traces/validation)", 2)
    data = {"coverage": 0.8, "sources": sources,
            "transfer": {"error": round(widen, 4),
                         "basis": "H100 steps priced with the H200 curve instead of the H100's own"},
            "made_by": "python scripts/error_bands.py"}
    return data, report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--check", action="store_true", help="print only; exit 1 if the stored file differs")
    args = ap.parse_args(argv)
    data, report = build()
    print("\n".join(report))
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print("stored file " + ("matches" if same else "DIFFERS"))
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
