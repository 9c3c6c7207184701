"""Fit a GPU's efficiency curve (:class:`perfsim.hardware.Curve`) to measured kernel times.

``perfsim calibrate --efficiency`` on a GPU writes records of GEMMs by shape, fused
attention, and memory-bound kernels; :func:`fit_curve` turns them into the curve's
device side, as ``hardware.H200_CURVE`` and ``hardware.H100_CURVE``
were (``scripts/fit_gpu_curve.py``; docs/gpu.md). The A100 curve is fitted to whole
iteration times instead (``scripts/calibrate_a100.py``).
"""

from __future__ import annotations

import math
import statistics

from perfsim.engine.compute import MeasuredRates, gemm_dims, op_time
from perfsim.errors import ConfigError
from perfsim.hardware import BYTES_PER_VALUE, FLASH_REF, GPU, Curve
from perfsim.models.ops import Op


def fit_curve(profile, gpu: GPU, precision: str, host: Curve, source: str, min_time_s: float = 20e-6) -> Curve:
    """The device side of a :class:`Curve` (``eff_max``, ``knee``, ``mem_eff``,
    ``misaligned_eff``, the flash fields) fitted to a profile's ``perfsim calibrate
    --efficiency`` records of ``precision`` on ``gpu``; the
    host side (``kernel_s``, ``p2p_s``, ``collective_s``: the framework's, not the GPU's)
    taken from ``host``. Those records are kernel times (``triton.testing.do_bench``:
    launches queued back to back), so calls shorter than ``min_time_s``, bounded by the
    launch rather than by the roofline, are left out. ``mem_eff`` is the median achieved
    fraction of the memory bandwidth of the memory-bound records; ``knee`` (a grid over
    0-1024) and ``eff_max`` (the median achieved fraction at that knee) minimise the
    aligned GEMMs' mean absolute log error under :func:`op_time`; ``misaligned_eff`` is the
    median of the misaligned GEMMs' time under that curve over their measured time (1
    without such records); the flash-attention fields from the fused attention records
    (:func:`_fit_flash`; 0 without them)."""
    rates = MeasuredRates(profile, precision)
    gemm = [p for p in rates.gemm if p[2] >= min_time_s]
    memory = [p for p in rates.memory if p[2] >= min_time_s]
    if not gemm or not memory:
        raise ConfigError(f"profile: no {precision} GEMM and memory-bound efficiency records of at least "
                          f"{min_time_s * 1e6:.0f} us (perfsim calibrate --efficiency)")
    bw, bpv = gpu.memory_bandwidth_Bps, BYTES_PER_VALUE[precision]
    mem_eff = min(1.0, statistics.median(b / t / bw for _, b, t, _ in memory))
    shapes = [(gemm_dims(name), t) for _, _, t, name in gemm]
    best = None
    for knee in range(0, 1025, 8):
        def g(m, n, k):
            return (m / (m + knee)) * (n / (n + knee)) * (k / (k + knee))
        eff = min(1.0, statistics.median(2.0 * m * n * k / (t * gpu.peak(precision) * g(m, n, k))
                                         for (m, n, k), t in shapes))
        trial = Curve(eff_max=eff, knee=float(knee), mem_eff=mem_eff, kernel_s=0.0, source="fit")
        err = statistics.fmean(abs(math.log(op_time(Op("gemm", m=m, n=n, k=k), gpu, precision, trial, bpv) / t))
                               for (m, n, k), t in shapes)
        if best is None or err < best[0]:
            best = (err, eff, float(knee))
    _, eff, knee = best
    aligned = Curve(eff_max=eff, knee=knee, mem_eff=mem_eff, kernel_s=0.0, source="fit")
    slow = [(gemm_dims(name), t) for _, _, t, name in rates.misaligned if t >= min_time_s]
    mis = (min(1.0, statistics.median(op_time(Op("gemm", m=m, n=n, k=k), gpu, precision, aligned, bpv) / t
                                      for (m, n, k), t in slow)) if slow else 1.0)
    flash = {}
    for backward, prefix in ((False, "flash_"), (True, "flash_bwd_")):
        e, ks, kd = _fit_flash(rates.attention, gpu.peak(precision), backward) if rates.attention else (0.0, 0.0, 0.0)
        flash.update({prefix + "eff": e, prefix + "knee_s": ks, prefix + "knee_d": kd})
    return Curve(eff_max=round(eff, 4), knee=knee, mem_eff=round(mem_eff, 4), kernel_s=host.kernel_s,
                 source=source, p2p_s=host.p2p_s, collective_s=host.collective_s, misaligned_eff=round(mis, 4),
                 **flash, fitted_on=gpu.name)


def _fit_flash(rates: dict, peak: float, backward: bool) -> tuple[float, float, float]:
    """(eff at FLASH_REF, sequence knee, head-dim knee) of :func:`flash_time` fitted to
    measured fused-attention rates: knees on a grid, the efficiency their median ratio,
    minimising the mean absolute log error."""
    s0, d0 = FLASH_REF
    pts = [(s, d, r[1 if backward else 0] / peak) for (s, d), r in rates.items()]
    best = None
    for ks in range(0, 4097, 32):
        for kd in range(0, 513, 4):
            ref = (s0 / (s0 + ks)) * (d0 / (d0 + kd))
            shapes = [((s / (s + ks)) * (d / (d + kd)) / ref, y) for s, d, y in pts]
            e = math.exp(statistics.median(math.log(y / f) for f, y in shapes))
            err = statistics.fmean(abs(math.log(e * f / y)) for f, y in shapes)
            if best is None or err < best[0]:
                best = (err, min(1.0, e), float(ks), float(kd))
    return round(best[1], 4), best[2], best[3]
