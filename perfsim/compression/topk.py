"""``topk`` -- top-k sparsification followed by quantization of the kept values.

For backward activation gradients in split learning (Wang et al., "Fine-tuning
Language Models over Slow Networks using Activation Compression with Guarantees",
arXiv:2206.01299, App. H.6:
"fw2 bw8[0.2] means that ... for backward pass, we keep only the top 20%
gradients and then perform 8-bit quantization"). Per row of the last dimension
(``C`` elements) keep the ``k = ceil(FRACTION * C)`` entries of largest
magnitude, send their column indices and their values quantized with DirectQ's
quantizer (one max-abs scale per row, stochastic rounding by default;
:mod:`perfsim.kernels.quant`). The receiver scatters them into zeros.

Spec: ``topk:FRACTION:BITS[:det]`` with ``0 < FRACTION <= 1`` and ``BITS`` in
2, 3, 4, 6, 8.

Payload: ``indices`` (``rows * k`` column indices, uint8 when ``C <= 256``,
int16 when ``C <= 32768``, else int32), ``codes`` (``ceil(rows*k*BITS/8)``
bytes) and ``scales`` (``rows`` float32). ``wire_bytes`` is their exact sum;
an empty tensor gives an empty payload.
"""

from __future__ import annotations

import math
from typing import Sequence

from perfsim._lazy import torch

from perfsim.compression.args import SpecArg
from perfsim.compression.base import Compressor, Payload, SeedStepState, check_input, numel_of, passes
from perfsim.compression.directq import check_payload_tensors, row_bucket
from perfsim.compression.registry import register
from perfsim.errors import ConfigError
from perfsim.kernels.packing import packed_nbytes
from perfsim.kernels.quant import QUANT_BITS, quantize_pack, unpack_dequantize
from perfsim.kernels.rng import call_key


def index_itemsize(cols: int) -> int:
    """Bytes of the smallest integer type holding a column index in ``[0, cols)``."""
    return 1 if cols <= 256 else 2 if cols <= 32768 else 4


def index_dtype(cols: int) -> torch.dtype:
    """Smallest dtype holding a column index in ``[0, cols)`` (:func:`index_itemsize` bytes)."""
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32}[index_itemsize(cols)]


@register
class TopK(SeedStepState, Compressor):
    """Per-row top-k by magnitude, kept values quantized to ``BITS`` bits."""

    name = "topk"
    example_spec = "topk:0.2:8"
    allreduce_compatible = False
    refusal_lane = "scales"  # a NaN/Inf input is sent as +Inf scales (Compressor.allreduce_mean)

    spec_args = (
        SpecArg("fraction", float, low=0, high=1, low_open=True),
        SpecArg("bits", choices=QUANT_BITS),
        SpecArg("stochastic", default=True, words={"det": False}),
    )

    def __init__(self, fraction: float, bits: int, *, stochastic: bool, seed: int = 0):
        self.fraction, self.bits, self.stochastic = float(fraction), int(bits), bool(stochastic)
        self.seed, self.step = int(seed), 0
        self.spec = self.canonical_spec()

    # ------------------------------------------------------------- sizes
    def layout(self, shape: Sequence[int]) -> tuple[int, int, int]:
        """(rows, columns, kept per row)."""
        n = numel_of(shape)
        cols = row_bucket(shape)
        rows = n // cols if n else 0
        k = min(cols, max(1, math.ceil(self.fraction * cols - 1e-9)))
        return rows, cols, k

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        rows, cols, k = self.layout(shape)
        kept = rows * k
        isz = index_itemsize(cols)
        return kept * isz + packed_nbytes(kept, self.bits) + 4 * rows

    def codec_traffic(self, shape: Sequence[int]):
        """:meth:`compress`'s kernels: the finiteness check (read 4 n), ``|x|`` (8 n),
        ``torch.topk`` (read 4 n, write ``k`` values and int64 indices: one pass, a lower
        bound of its selection), the gather (12 bytes a kept value), the fused quantizer over
        the kept values, the indices narrowed (int64 to int32, and to int16 for short rows);
        decode: the fused dequantizer, the zeroed output (4 n), the indices widened and the
        scatter."""
        rows, cols, k = self.layout(shape)
        n, kept = rows * cols, rows * k
        isz = index_itemsize(cols)
        payload = packed_nbytes(kept, self.bits) + 4 * rows
        narrow = (12 * kept, 6 * kept) if isz == 2 else (12 * kept,)
        return (passes(4 * n, 8 * n, 4 * n + 12 * kept, 12 * kept, 4 * kept + payload, *narrow),
                passes(payload + 4 * kept, 4 * n, (isz + 8) * kept, 20 * kept))

    # ------------------------------------------------------------- data path
    def compress(self, x: torch.Tensor, *, key=None) -> Payload:
        check_input(x)
        shape = tuple(x.shape)
        rows, cols, k = self.layout(shape)
        xf = x.detach().reshape(rows, cols).float()
        if rows:
            # unsorted: the receiver scatters, so any order works (sorting the
            # indices would cost ~60% of torch.topk itself on a CPU)
            idx = torch.topk(xf.abs(), k, dim=1, sorted=False).indices
            vals = torch.gather(xf, 1, idx)
        else:
            idx = torch.zeros((0, k), dtype=torch.long, device=x.device)
            vals = torch.zeros((0, k), device=x.device)
        rkey = call_key(self.seed, self.step) if self.stochastic else None
        self.step += 1
        codes, scales = quantize_pack(vals, self.bits, bucket=k, key=rkey)
        dt = index_dtype(cols)
        wire_idx = idx.to(torch.int32)
        if dt == torch.int16:
            wire_idx = wire_idx.to(torch.int16)  # cols <= 32768: fits
        else:
            wire_idx = wire_idx.to(dt)
        return Payload({"indices": wire_idx.reshape(-1).contiguous(), "codes": codes, "scales": scales},
                       shape, x.dtype, {"step": self.step - 1})

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        check_payload_tensors(payload, ("indices", "codes", "scales"), self.spec)
        shape = tuple(payload.shape)
        rows, cols, k = self.layout(shape)
        idx = payload.tensors["indices"]
        if idx.numel() != rows * k:
            raise ConfigError(f"{self.spec}: payload has {idx.numel()} indices, expected {rows * k}")
        vals = unpack_dequantize(payload.tensors["codes"], payload.tensors["scales"], self.bits,
                                 rows * k, bucket=k)
        out = torch.zeros((rows, cols), dtype=torch.float32, device=idx.device)
        if rows:
            out.scatter_(1, idx.to(torch.long).view(rows, k), vals.view(rows, k))
        return out.view(shape).to(payload.dtype)
