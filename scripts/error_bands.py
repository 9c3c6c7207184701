"""Write perfsim/data/error_bands.json: the validation residuals behind every prediction's
80 % interval (perfsim/engine/uncertainty.py), and measure the interval's coverage on held-out data.

Sources, each split by configuration (never by row), the band from the VALIDATION part, the
coverage from the HELD-OUT part:

* ``gpu:ampere``: ../shared/data/a100-single-node (1440 Megatron-DeepSpeed runs on one
  8 x A100 node), split as scripts/calibrate_a100.py splits it (calibration configurations fit
  the curve; validation -> band; held-out -> coverage, only with ``--held-out``: read once, at
  the end).
* ``gpu:hopper``: whole single-GPU training steps on an H200 and an H100 measured by
  scripts/gpu_step_bench.py (traces/gpu/*-steps-*.csv; eager PyTorch, so predicted with its host
  time per operator, 25 us -- docs/gpu.md), each priced by its own GPU's curve.
* ``profile``: perfsim's CPU validation grids (traces/validation/, stored measurements
  re-predicted by the code as it is, with traces/cpu-2core.json).

Rows of the last two are split by the SHA-256 of their configuration (the grid and the row's
configuration columns): even first byte -> validation, odd -> held out.
* ``transfer``: the largest change of a row's error when an H100 step is priced with the H200's
  curve instead of the H100's own: how much a borrowed curve adds.
* ``fp8``: how much more optimistic the fp8 GEMM rate is than the bf16 one on the H100 GEMMs timed
  in both (traces/gpu/h100-memory-fp8-2026-11-27.json; :func:`fp8_widening`): fp8 predictions rest on
  the bf16 steps' band with their GEMMs priced at an fp8 rate no whole step has checked.
* ``extrapolation``: how a band widens for a job larger than any its curve was fitted to. The
  A100 curve refitted on the 2-GPU and on the 2-4-GPU calibration configurations only
  (:data:`SMALL_FITS`, ``--refit``) prices the validation configurations; candidates (E: the
  refits' band growth per doubling; S: the code curve's band growth with GPU count; P: a 4 % GPU
  speed spread, Sinha et al., arXiv:2208.11035; 0: none) are scored by their coverage of 8-GPU
  validation rows and the rule of docs/validation.md ("An error bar beyond the data's largest
  job", written before any figure) picks one (:func:`extrapolation`).

    python scripts/error_bands.py              # write the file, print bands and validation figures (~20 s)
    python scripts/error_bands.py --check      # print only; exit 1 if the stored file differs
    python scripts/error_bands.py --held-out   # ... and the held-out coverages (once, at the end)
    python scripts/error_bands.py --refit      # recompute SMALL_FITS (three starts each, ~30 minutes)
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
from collections.abc import Sequence
from functools import lru_cache
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


@lru_cache(maxsize=None)
def a100(split: str, fields: tuple[float, ...] | None = None) -> tuple[tuple[int, float], ...]:
    """(GPU count, signed error) of every A100 row of configuration ``split``, priced by the code's
    curve, or by the curve with ``fields`` (calibrate_a100.FIELDS order, fit units) if given."""
    from perfsim.hardware import GPUS

    cal = _script("calibrate_a100")
    rows = [r for r in cal.load_rows(cal.data_path()) if r["split"] == split]
    saved = GPUS[cal.A100]
    try:
        if fields is not None:
            cal.set_curve(fields)
        return tuple(zip((r["gpus"] for r in rows), cal.errors(rows)))
    finally:
        GPUS[cal.A100] = saved


#: the neutral start of the refits below (docs/validation.md, gpuvar: not the code's curve,
#: which has seen 8-GPU jobs), in calibrate_a100.FIELDS order and fit units
NEUTRAL_START = (0.80, 100, 0.70, 10, 20, 20, 0.85)
#: Nelder-Mead from one start stops on different bounds from another (docs/validation.md, "The
#: extrapolation refits from two starts"), so each refit also starts at the middle of every
#: parameter's documented range (perfsim.engine.curve_bounds) and keeps the lower calibration MAPE
SECOND_START = "bounds midpoint"
#: ... and from the stored fit (:data:`SMALL_FITS`, the previous refit): the refits of session 30 stopped
#: above the calibration MAPE the stored fits still gave under the same predictions (docs/validation.md,
#: "The small refits' third start")
THIRD_START = "stored fit"
#: the A100 curve refitted on the calibration configurations of at most N GPUs
#: (``python scripts/error_bands.py --refit`` recomputes and prints them; FIELDS order, fit units)
SMALL_FITS = {
    2: (0.899552, 0.087887, 0.781799, 58.724991, 99.932533, 52.247659, 0.750003),
    4: (0.897145, 0.109467, 0.732225, 58.373228, 98.331475, 56.203402, 0.750024),
}


def refit(max_gpus: int, iters: int = 300) -> tuple[float, ...]:
    """The A100 curve fitted as scripts/calibrate_a100.py fits it (bounded Nelder-Mead on the
    calibration MAPE), on the calibration configurations of at most ``max_gpus`` GPUs only,
    from :data:`NEUTRAL_START`, from the middle of the bounds (:data:`SECOND_START`) and from the
    stored fit (:data:`THIRD_START`): the one with the lowest calibration MAPE (each printed on stderr)."""
    from scipy.optimize import minimize

    from perfsim.hardware import GPUS

    cal = _script("calibrate_a100")
    rows = [r for r in cal.load_rows(cal.data_path()) if r["split"] == "calibration" and r["gpus"] <= max_gpus]
    bounds = cal.fit_bounds()
    starts = {"neutral": [min(hi, max(lo, v)) for v, (lo, hi) in zip(NEUTRAL_START, bounds)],
              SECOND_START: [(lo + hi) / 2 for lo, hi in bounds]}
    if max_gpus in SMALL_FITS:
        starts[THIRD_START] = [min(hi, max(lo, v)) for v, (lo, hi) in zip(SMALL_FITS[max_gpus], bounds)]

    def loss(x):
        cal.set_curve(x)
        return cal.mape(rows)[0]

    saved = GPUS[cal.A100]
    fits = []
    try:
        for name, x0 in starts.items():
            res = minimize(loss, x0, method="Nelder-Mead", bounds=bounds,
                           options=dict(maxiter=iters, xatol=1e-3, fatol=1e-3))
            x = tuple(round(float(v), 6) for v in res.x)
            fits.append((loss(x), name, x))
            print(f"    # {max_gpus} GPUs from the {name} start: calibration MAPE {fits[-1][0]:.3f} %, {x}",
                  file=sys.stderr, flush=True)
    finally:
        GPUS[cal.A100] = saved
    return min(fits)[2]


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


#: the CPU profile band's rows: a profile and the validation grids measured against it (``folder`` and
#: ``grids`` when given; else scripts/repredict_validation.py's STORED and GRIDS; ``drift_checked``:
#: each grid priced with the compute its drift check timed right after it; ``row_drift_checked``: each
#: row with the compute its own check timed right before it, only the rows that held still);
#: docs/validation.md, "The CPU band's basis", "The CPU band priced with each row's own drift check" and
#: "The CPU band as a user meets it" (session 28's sitting: rows priced as calibrated, the rule's premise the
#: profile's own consistency)
CPU_BAND = {"profile": "traces/cpu-2core-s28.json", "folder": "traces/validation/s28",
            "grids": ("gpt2-tiny-pp2", "gpt2-tiny-dp2", "gpt2-tiny-pp2-gpipe", "gpt2-tiny-pp2-schedules",
                      "gpt2-tiny-pp2-tied", "gpt2-tiny-tp2", "gpt2-tiny-tp2-sp"),
            "minutes_after_calibrating": 38}


def cpu_grids(source: dict = CPU_BAND) -> tuple[list[float], list[float]]:
    """(validation, held-out) iteration-time errors of ``source``'s grids, re-predicted with its profile."""
    rp = _script("repredict_validation")
    folder = ROOT / source["folder"] if "folder" in source else rp.STORED
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, g in enumerate(source.get("grids", rp.GRIDS)):
            df = rp.repredict_frame(folder / g, str(ROOT / source["profile"]), Path(tmp) / str(n),
                                    drift_checked=bool(source.get("drift_checked")),
                                    row_drift_checked=bool(source.get("row_drift_checked")))
            if source.get("row_drift_checked"):
                df = df[df.row_held_still.astype(bool)]  # the rule's premise, row by row
            for _, r in df.iterrows():
                key = ",".join(str(r[c]) for c in ("model", "bandwidth_bps", "compress", "grad_compress", "schedule",
                                                   "pp", "dp", "micro_batch"))
                rows.append((f"{g},{key}", r.predicted_iteration_s / r.measured_iteration_s - 1))
    return by_config(rows)


def cpu_basis(source: dict = CPU_BAND) -> str:
    """What the CPU band's rows are, in the words a prediction's interval note quotes."""
    folder = source.get("folder", "traces/validation")
    if source.get("row_drift_checked"):
        return ("perfsim run on CPU (gloo) against its calibrated profile, each row's compute as timed right "
                f"before it (the machine's drift between calibration and run left out), validation grids ({folder})")
    if source.get("minutes_after_calibrating"):
        return (f"perfsim run on CPU (gloo) within {source['minutes_after_calibrating']} minutes of calibrating its "
                f"profile, the machine's drift included, validation grids ({folder})")
    return f"perfsim run on CPU (gloo) against its calibrated profile, validation grids ({folder})"


def band(errors: list[float], basis: str, max_gpus: int) -> dict:
    q10, q90 = conformal_bounds(errors)
    return {"q10": round(q10, 4), "q90": round(q90, 4),
            "rows": len(errors), "basis": basis, "max_gpus": max_gpus}


def per_doubling(inside: list[float], outside: list[float], d: float) -> tuple[float, float]:
    """How far the band of ``outside`` (rows ``d`` doublings beyond the fit's largest job) lies
    beyond the band of ``inside``, per doubling: (q10 shift down, q90 shift up), each >= 0."""
    lo_in, hi_in = conformal_bounds(inside)
    lo_out, hi_out = conformal_bounds(outside)
    return max(0.0, (lo_in - lo_out) / d), max(0.0, (hi_out - hi_in) / d)


def _where(errs: Sequence[tuple[int, float]], gpus) -> list[float]:
    return [e for g, e in errs if g in gpus]


def _mean(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs)


def extrapolation(code: Sequence[tuple[int, float]], fit_a: Sequence[tuple[int, float]],
                  fit_b: Sequence[tuple[int, float]]) -> tuple[dict, list[str]]:
    """The widening beyond a band's largest job, by the rule of docs/validation.md ("An error bar
    beyond the data's largest job", written before any figure): candidates E, S, P and 0 scored
    on check sets C1, C2 of the A100 validation configurations; the chosen one's production rule.
    ``code``, ``fit_a``, ``fit_b``: (GPU count, error) of the validation rows priced by the code's
    curve, by the curve fitted on 2-GPU and on 2-4-GPU calibration configurations."""
    from perfsim.engine.uncertainty import COVERAGE, extrapolation_widening, widened

    e_rate = per_doubling(_where(fit_a, {2}), _where(fit_a, {4}), 1)
    s_rate = per_doubling(_where(code, {2}), _where(code, {4}), 1)
    variants = {"E": {"kind": "per-doubling", "lo": e_rate[0], "hi": e_rate[1]},
                "S": {"kind": "per-doubling", "lo": s_rate[0], "hi": s_rate[1]},
                "P": {"kind": "speed-spread", "sigma": 0.04},
                "0": {"kind": "none"}}
    checks = {"C1": (_where(fit_b, {2, 4}), _where(fit_b, {8}), 4),
              "C2": (_where(fit_a, {2}), _where(fit_a, {8}), 2)}
    report, scored = [], {}
    for label, errs in (("code's curve", code), ("fit on 2 GPUs (A)", fit_a), ("fit on 2-4 GPUs (B)", fit_b)):
        parts = []
        for gpus in ({2}, {4}, {8}, {2, 4}):
            x = _where(errs, gpus)
            lo, hi = conformal_bounds(x)
            parts.append(f"{'-'.join(map(str, sorted(gpus)))}: {100 * lo:+.1f} / {100 * hi:+.1f} "
                         f"(mean {100 * sum(x) / len(x):+.2f}, {len(x)})")
        report.append(f"A100 validation band q10 / q90 % (mean signed, rows) by GPU count, {label}: "
                      + "; ".join(parts) + f"; all rows MAPE {100 * sum(abs(e) for _, e in errs) / len(errs):.2f} %")
    for label, rate in (("A 2 -> 4", e_rate), ("A 2 -> 8", per_doubling(_where(fit_a, {2}), _where(fit_a, {8}), 2)),
                        ("B 2-4 -> 8", per_doubling(_where(fit_b, {2, 4}), _where(fit_b, {8}), 1)),
                        ("code 2 -> 4", s_rate),
                        ("code 4 -> 8", per_doubling(_where(code, {4}), _where(code, {8}), 1))):
        report.append(f"per doubling, {label}: q10 -{100 * rate[0]:.2f} / q90 +{100 * rate[1]:.2f} points")
    for name, rule in variants.items():
        covs, widths = [], []
        for inside, outside, n_max in checks.values():
            q10, q90 = widened(*conformal_bounds(inside), *extrapolation_widening(8, n_max, rule))
            covs.append(coverage(outside, q10, q90))
            widths.append(1 / (1 + q10) - 1 / (1 + q90))
        score = sum(abs(c - COVERAGE) for c in covs) / len(covs)
        scored[name] = (score, sum(widths) / len(widths))
        report.append(f"extrapolation variant {name} ({_describe(rule)}): coverage C1 {100 * covs[0]:.0f} %, "
                      f"C2 {100 * covs[1]:.0f} % of {len(checks['C1'][1])} / {len(checks['C2'][1])} rows; "
                      f"score {100 * score:.1f} points; mean width {100 * scored[name][1]:.1f} % of T")
    best = min(s for s, _ in scored.values())
    chosen = min((n for n, (s, _) in scored.items() if s <= best + 0.02), key=lambda n: scored[n][1])
    if chosen == "E":
        lo, hi = _mean([e_rate, per_doubling(_where(fit_a, {2}), _where(fit_a, {8}), 2),
                        per_doubling(_where(fit_b, {2, 4}), _where(fit_b, {8}), 1)])
        rule = {"kind": "per-doubling", "lo": lo, "hi": hi}
        basis = "the A100 band's growth per doubling beyond the largest job of curves refitted without the larger jobs"
    elif chosen == "S":
        lo, hi = _mean([s_rate, per_doubling(_where(code, {4}), _where(code, {8}), 1)])
        rule = {"kind": "per-doubling", "lo": lo, "hi": hi}
        basis = "the A100 band's growth from 2- to 4- and 4- to 8-GPU validation jobs, per doubling"
    elif chosen == "P":
        rule, basis = dict(variants["P"]), "a 4 % GPU speed spread (Sinha et al., arXiv:2208.11035)"
    else:
        rule, basis = {"kind": "none"}, "no widening measured"
    rule = {k: round(v, 4) if isinstance(v, float) else v for k, v in rule.items()}
    report.append(f"extrapolation: chose {chosen}: {_describe(rule)}")
    return {**rule, "variant": chosen, "basis": basis + " (docs/validation.md)"}, report


def extrapolation_coverage(rule: dict, split: str) -> list[str]:
    """The coverage of the widened interval on the 8-GPU rows of configuration ``split``, for each
    refit: its band from its in-range VALIDATION rows, widened by ``rule`` for 8 GPUs. With
    ``split="held-out"`` (``--held-out``, once, at the end) these rows took no part in the choice."""
    from perfsim.engine.uncertainty import extrapolation_widening, widened

    lines = []
    for n_max, inside in ((4, {2, 4}), (2, {2})):
        band_rows = _where(a100("validation", SMALL_FITS[n_max]), inside)
        out = _where(a100(split, SMALL_FITS[n_max]), {8})
        q10, q90 = widened(*conformal_bounds(band_rows), *extrapolation_widening(8, n_max, rule))
        lines.append(f"extrapolated coverage, curve fitted on {n_max} GPUs at most, 8-GPU {split} rows: "
                     f"{100 * coverage(out, q10, q90):.0f} % of {len(out)} (band q10 {100 * q10:+.1f} / "
                     f"q90 {100 * q90:+.1f} %)")
    return lines


def _describe(rule: dict) -> str:
    if rule["kind"] == "per-doubling":
        return f"q10 -{100 * rule['lo']:.2f} / q90 +{100 * rule['hi']:.2f} points per doubling"
    if rule["kind"] == "speed-spread":
        return f"speed spread sigma {rule['sigma']:.0%}"
    return "none"


#: the H100 GEMMs timed in bf16 and in fp8 (torch._scaled_mm, e4m3; docs/model.md "fp8 on Hopper")
FP8_GEMMS_FILE = ROOT / "traces" / "gpu" / "h100-memory-fp8-2026-11-27.json"


def fp8_widening() -> tuple[float, list[str]]:
    """The largest extra optimism of perfsim's fp8 GEMM time over its bf16 one on the same shape:
    ``max(e_bf16 - e_fp8)`` over the timed GEMMs, ``e = model time / measured time - 1``, skipping
    the vocabulary projection (perfsim runs the LM head in bf16 under fp8). >= 0."""
    from perfsim.engine.compute import op_time
    from perfsim.hardware import curve_for, get_gpu
    from perfsim.models.ops import Op

    gpu = get_gpu("h100-sxm5-80gb")
    curve = curve_for(gpu)[0]
    worst, lines = 0.0, []
    for r in json.loads(FP8_GEMMS_FILE.read_text())["gemms"]:
        if r["n"] > 32768:  # the LM head's vocabulary: bf16 under fp8 (models.ops.FP8_GEMMS)
            continue
        op, flops = Op("qkv", m=r["m"], n=r["n"], k=r["k"]), 2.0 * r["m"] * r["n"] * r["k"]
        err = {p: op_time(op, gpu, p, curve, 2) / (flops / (r[f"{p}_tflops"] * 1e12)) - 1 for p in ("bf16", "fp8")}
        worst = max(worst, err["bf16"] - err["fp8"])
        lines.append(f"  {r['m']}x{r['n']}x{r['k']}: bf16 {100 * err['bf16']:+.1f} %, fp8 {100 * err['fp8']:+.1f} %")
    return worst, lines


def build(held_out: bool = False) -> tuple[dict, list[str]]:
    from dataclasses import replace

    from perfsim.hardware import GPUS

    report = []
    sources = {}

    def add(key, val, held, basis, max_gpus):
        sources[key] = band(val, basis, max_gpus)
        b = sources[key]
        cov = (f"held-out coverage {100 * coverage(held, b['q10'], b['q90']):.0f} % of {len(held)} rows"
               if held else "held-out not evaluated: --held-out")
        report.append(f"{key:22s} q10 {100 * b['q10']:+6.1f} %  q90 {100 * b['q90']:+6.1f} %  "
                      f"({b['rows']} validation rows; {cov})")

    code = a100("validation")
    h = [e for _, e in a100("held-out")] if held_out else []
    add("gpu:ampere", [e for _, e in code], h, "Megatron-DeepSpeed GPT on one 8 x A100 node, validation configurations "
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
    fp8, lines = fp8_widening()
    report.append(f"fp8: the fp8 GEMM time is up to {100 * fp8:.1f} points more optimistic than the bf16 one "
                  "on the H100 GEMMs timed in both")
    report += lines
    v, h = cpu_grids()
    add("profile", v, h, cpu_basis(), 2)
    rule, lines = extrapolation(code, a100("validation", SMALL_FITS[2]), a100("validation", SMALL_FITS[4]))
    report += lines
    if held_out:
        report += extrapolation_coverage(rule, "held-out")
    data = {"coverage": 0.8, "sources": sources, "extrapolation": rule,
            "transfer": {"error": round(widen, 4),
                         "basis": "H100 steps priced with the H200 curve instead of the H100's own"},
            "fp8": {"error": round(fp8, 4),
                    "basis": "H100 GEMMs timed in bf16 and fp8: the fp8 rate's largest extra optimism "
                             "(traces/gpu/h100-memory-fp8-2026-11-27.json)"},
            "made_by": "python scripts/error_bands.py"}
    return data, report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--check", action="store_true", help="print only; exit 1 if the stored file differs")
    ap.add_argument("--held-out", action="store_true",
                    help="also measure the A100 band's and the extrapolation's coverage on the held-out "
                         "configurations (once, at the end)")
    ap.add_argument("--refit", action="store_true",
                    help="refit the A100 curve on the 2- and on the 2-4-GPU calibration configurations "
                         "and print SMALL_FITS (minutes)")
    args = ap.parse_args(argv)
    if args.refit:
        for n in sorted(SMALL_FITS):
            print(f"    {n}: {refit(n)},", flush=True)
        return 0
    data, report = build(args.held_out)
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
