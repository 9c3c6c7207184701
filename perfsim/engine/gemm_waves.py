"""GEMM tile and wave quantization: how a GEMM's output tiles fill a GPU's SMs.

NVIDIA's Deep Learning Performance Guide, "Matrix Multiplication Background" (DU-09799-001,
Sec. 2.1 "GPU Implementation", 2.3 "Typical Tile Dimensions In cuBLAS And Performance", 3.1
"Tile Quantization", 3.2 "Wave Quantization"): a GEMM ``C[m, n] = A[m, k] B[k, n]`` is cut into
output tiles ``Tm x Tn``; each thread block computes one tile by stepping through ``k``; the tiles
run over the SMs in waves of (at most) one tile per SM. So

* ``tiles = batch x ceil(m / Tm) x ceil(n / Tn)`` and ``waves = ceil(tiles / SMs)``: a partly
  filled edge tile (tile quantization) and a partly filled last wave (wave quantization) cost as
  much as full ones -- the work thrown away;
* each tile runs ``ceil(k / Tk)`` steps of ``Tk`` (64 bytes of ``k``: 32 fp16 values, CUTLASS's
  Ampere threadblock ``K``), a step costing ``max(2 Tm Tn Tk / P_sm, (Tm + Tn) Tk b / B_sm)``: the
  SM's share of the curve's large-GEMM rate ``P_sm = peak x eff_max / SMs`` or the time to feed
  it the step's operands at its share of the L2 read bandwidth ``B_sm = L2 / SMs`` -- the guide's
  "larger tiles have more data reuse, allowing them to use less bandwidth and be more efficient";
* each tile adds a prologue and an epilogue the ``k`` loop does not amortise: loading its first
  step's operands before the first multiply, and writing its ``Tm x Tn`` outputs, both at ``B_sm``;
* the library runs the candidate tile with the least time (cuBLAS's heuristics choose among
  its kernels): ``min`` over :data:`GEMM_TILES`, the guide's tile set (256x128 and 128x256 most
  efficient, then 128x128, 256x64 and 64x256, 128x64 and 64x128, 64x64 least).

Nothing is fitted: the SM count and L2 bandwidth are the GPU's datasheet figures
(:class:`perfsim.hardware.GPU` ``sms``, ``l2_Bps``), the tiles the guide's. A large GEMM whose
tiles fill their waves runs at ``eff_max`` (less its per-tile prologue/epilogue, < 1 % at
``k`` = 8192); a medium one loses its last wave's idle SMs. :func:`quantized_seconds` replaces the
curve's ``flops / (peak x eff_max)`` in :func:`perfsim.engine.compute.op_time` when the curve's
``gemm_quantization`` is ``waves``; the smooth factor ``g`` (``knee``) still multiplies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfsim.errors import ConfigError

#: cuBLAS's tensor-core tile shapes (Tm, Tn) as the guide lists them (Sec. 2.3), most efficient first
GEMM_TILES = ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64))
#: bytes of ``k`` one main-loop step covers (CUTLASS's Ampere tensor-core threadblock K: 32 fp16 values)
K_STEP_BYTES = 64


@dataclass(frozen=True)
class TilePlan:
    """How one tile shape runs a GEMM: tile counts, waves, ``k`` steps and seconds."""

    #: (Tm, Tn)
    tile: tuple[int, int]
    #: output tiles (``batch x ceil(m/Tm) x ceil(n/Tn)``)
    tiles: int
    #: ``ceil(tiles / SMs)``
    waves: int
    #: main-loop steps per tile (``ceil(k / Tk)``)
    k_steps: int
    #: seconds of one tile (steps, prologue, epilogue)
    tile_s: float

    @property
    def seconds(self) -> float:
        return self.waves * self.tile_s


def check_gpu(gpu) -> None:
    """Refuse a GPU without the SM count and L2 bandwidth the mechanism needs."""
    if not gpu.sms or not gpu.l2_Bps:
        raise ConfigError(f"gemm_quantization=waves: {gpu.name} has no SM count / L2 bandwidth "
                          "(perfsim.hardware GPU.sms, GPU.l2_Bps)")


def plan(m: int, n: int, k: int, batch: int, tile: tuple[int, int], sms: int, sm_flops: float,
         sm_l2_Bps: float, bpv: int) -> TilePlan:
    """:class:`TilePlan` of ``batch`` GEMMs ``m x n x k`` with output tile ``tile`` on ``sms`` SMs, each
    computing at ``sm_flops`` FLOP/s and fed at ``sm_l2_Bps`` (module docstring)."""
    tm, tn = tile
    tk = max(1, K_STEP_BYTES // bpv)
    tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
    feed = (tm + tn) * tk * bpv / sm_l2_Bps
    step = max(2.0 * tm * tn * tk / sm_flops, feed)
    k_steps = math.ceil(k / tk)
    tile_s = k_steps * step + feed + tm * tn * bpv / sm_l2_Bps
    return TilePlan(tile, tiles, math.ceil(tiles / sms), k_steps, tile_s)


def best_plan(m: int, n: int, k: int, batch: int, gpu, rate: float, bpv: int) -> TilePlan:
    """The least-time :class:`TilePlan` over :data:`GEMM_TILES` on ``gpu`` (``gpu.sms`` SMs sharing
    ``rate`` FLOP/s -- the curve's ``peak x eff_max`` -- and ``gpu.l2_Bps``)."""
    check_gpu(gpu)
    return min((plan(m, n, k, batch, t, gpu.sms, rate / gpu.sms, gpu.l2_Bps / gpu.sms, bpv) for t in GEMM_TILES),
               key=lambda p: p.seconds)


def quantized_seconds(m: int, n: int, k: int, batch: int, gpu, rate: float, bpv: int) -> float:
    """Seconds of ``batch`` GEMMs ``m x n x k`` run as tiles in waves (:func:`best_plan`)."""
    return best_plan(m, n, k, batch, gpu, rate, bpv).seconds
