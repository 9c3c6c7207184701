"""The error bar of a prediction: an 80 % interval from the validation residuals of what priced it.

A prediction is priced either by a measured profile (``perfsim calibrate``) or by a GPU's
efficiency curve (:func:`perfsim.hardware.curve_for`). For each, perfsim keeps the
signed relative errors e = (predicted - measured) / measured of its validation rows --
configurations the fit never saw, split by configuration, never by row
(``scripts/error_bands.py`` writes them into ``perfsim/data/error_bands.json`` and measures the
coverage on a further held-out split). With e's 10th and 90th percentiles q10 and q90, the
measured iteration time of a new configuration lies in

    [T / (1 + q90), T / (1 + q10)]

with about 80 % probability, if the new configuration is like the validation ones. Where it
is not, the interval says so (``interval_note``) and widens only by what was measured:

* a curve borrowed from another GPU: by the largest error measured when a curve was moved
  from one GPU to another (``transfer`` in the bands file: the H200 curve on an H100); the same
  for FlashAttention's rates alone, when a prediction runs ``attention="flash"`` on a curve whose
  flash fit comes from another architecture (:func:`perfsim.hardware.flash_borrowed`: the A100's);
* fp8 (``--precision fp8``): the band's rows ran bf16, and no whole fp8 step was timed; the fp8
  GEMM rate is an assumption that GEMMs timed in both precisions found optimistic, so the slow
  side (q10) moves by the largest extra optimism measured there (``fp8`` in the bands file);
* more GPUs than the data's largest job (more than one node for the A100 data): widened by the
  rule stored as ``extrapolation`` in the bands file (:func:`extrapolation_widening`), chosen by
  ``scripts/error_bands.py`` on the A100 data's validation configurations: how a band grows
  when the fitted curve prices jobs larger than any it was fitted to (docs/validation.md, "An
  error bar beyond the data's largest job"), capped at :data:`Q10_FLOOR` / :data:`Q90_CEIL`.

This follows the usual split-conformal construction (Vovk, Gammerman, Shafer, "Algorithmic
Learning in a Random World", 2005; Angelopoulos and Bates, "A Gentle Introduction to Conformal
Prediction", arXiv:2107.07511) on the relative error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from perfsim.engine.sync_wait import expected_max_normal
from perfsim.hardware import curve_borrowed, curve_family, flash_borrowed, get_gpu

#: the interval's nominal coverage
COVERAGE = 0.80
#: the extrapolation widening never takes the quantiles past these: an interval never wider
#: than [T / 2, 2 T] for its extrapolation (a sanity bound, not evidence)
Q10_FLOOR, Q90_CEIL = -0.5, 1.0


@dataclass(frozen=True)
class ErrorBand:
    """Quantiles of the signed relative error of one pricing source on its validation rows."""

    #: 10th percentile of (predicted - measured) / measured
    q10: float
    #: 90th percentile
    q90: float
    #: validation rows behind the quantiles
    rows: int
    #: what was measured, where, and how the rows were split
    basis: str
    #: the largest number of GPUs in one measured job (beyond it the interval is extrapolated)
    max_gpus: int = 0


@lru_cache(maxsize=1)
def bands() -> dict:
    """The stored bands: ``{"sources": {key: ErrorBand fields}, "transfer": float, ...}``."""
    text = resources.files("perfsim").joinpath("data/error_bands.json").read_text()
    return json.loads(text)


def band(key: str) -> ErrorBand | None:
    raw = bands()["sources"].get(key)
    return ErrorBand(**raw) if raw else None


def source_key(summary: dict) -> tuple[str, bool]:
    """Which stored band priced a prediction (``summary`` of a Result), and whether the
    band is borrowed from another GPU than the prediction's (the whole curve, or the
    FlashAttention rates a flash prediction runs on)."""
    if not str(summary.get("compute_model", "")).startswith("roofline") or not summary.get("gpu"):
        return "profile", False  # measured records priced (some of) the layers
    gpu = get_gpu(summary["gpu"])
    flash = summary.get("attention") == "flash" and flash_borrowed(gpu)
    return f"gpu:{curve_family(gpu)}", curve_borrowed(gpu) or flash


def extrapolation_widening(gpus: int, max_gpus: int, rule: dict) -> tuple[float, float]:
    """How far a band's (q10, q90) move apart for a job of ``gpus`` GPUs when the data's largest
    job had ``max_gpus``: ``(w_lo, w_hi)``, both >= 0, zero inside the data's range. ``rule``:

    * ``{"kind": "per-doubling", "lo": a, "hi": b}``: ``(a d, b d)``, d = log2(gpus / max_gpus);
    * ``{"kind": "speed-spread", "sigma": s}``: ``(s (E[Z_(gpus)] - E[Z_(max_gpus)]), 0)``, the
      expected slowest of ``gpus`` GPUs of relative speed spread s beyond the slowest of
      ``max_gpus`` (:func:`perfsim.engine.sync_wait.expected_max_normal`; Sinha et al., SC22,
      arXiv:2208.11035): it only slows;
    * ``{"kind": "none"}``: no widening."""
    if not max_gpus or gpus <= max_gpus:
        return 0.0, 0.0
    kind = rule["kind"]
    if kind == "per-doubling":
        d = math.log2(gpus / max_gpus)
        return max(0.0, rule["lo"]) * d, max(0.0, rule["hi"]) * d
    if kind == "speed-spread":
        return max(0.0, rule["sigma"]) * (expected_max_normal(gpus) - expected_max_normal(max_gpus)), 0.0
    if kind == "none":
        return 0.0, 0.0
    raise ValueError(f"extrapolation rule kind {kind!r}: expected per-doubling, speed-spread or none")


def widened(q10: float, q90: float, w_lo: float, w_hi: float) -> tuple[float, float]:
    """(q10, q90) moved apart by (w_lo, w_hi), never past :data:`Q10_FLOOR` / :data:`Q90_CEIL`
    (nor narrowed where a band already lies beyond them)."""
    return min(q10, max(Q10_FLOOR, q10 - w_lo)), max(q90, min(Q90_CEIL, q90 + w_hi))


def interval(summary: dict) -> dict:
    """The 80 % interval of ``summary["iteration_s"]`` and what it rests on, as summary columns:
    ``iteration_s_low``, ``iteration_s_high`` (None where no band applies), ``interval_note``."""
    T = summary["iteration_s"]
    key, borrowed = source_key(summary)
    b = band(key)
    if b is None:
        return {"iteration_s_low": None, "iteration_s_high": None,
                "interval_note": f"no validation data for {key}: no interval"}
    q10, q90 = b.q10, b.q90
    notes = [f"{COVERAGE:.0%} interval from {b.rows} validation rows ({b.basis})"]
    if borrowed:
        widen = bands()["transfer"]["error"]
        q10, q90 = q10 - widen, q90 + widen
        what = "curve" if curve_borrowed(get_gpu(summary["gpu"])) else "FlashAttention rates"
        notes.append(f"{what} borrowed from another GPU: widened by {widen:.0%} "
                     f"({bands()['transfer']['basis']})")
    fp8 = bands().get("fp8")
    if fp8 and summary.get("precision") == "fp8":
        q10 -= fp8["error"]
        notes.append(f"fp8 GEMM rate unchecked by a whole step: the slow side widened by {fp8['error']:.0%} "
                     f"({fp8['basis']})")
    gpus = int(summary.get("gpus") or 0)
    if b.max_gpus and gpus > b.max_gpus:
        rule = bands()["extrapolation"]
        new10, new90 = widened(q10, q90, *extrapolation_widening(gpus, b.max_gpus, rule))
        capped = " (capped)" if new10 == Q10_FLOOR or new90 == Q90_CEIL else ""
        notes.append(f"extrapolated: {gpus} GPUs, {math.log2(gpus / b.max_gpus):.1f} doublings beyond the "
                     f"data's largest job ({b.max_gpus}): error quantiles moved by -{100 * (q10 - new10):.1f} / "
                     f"+{100 * (new90 - q90):.1f} points{capped} ({rule['basis']})")
        q10, q90 = new10, new90
    return {"iteration_s_low": T / (1 + q90), "iteration_s_high": T / (1 + q10) if q10 > -1 else None,
            "interval_note": "; ".join(notes)}
