"""``directq`` -- direct uniform quantization of activations / gradients.

DirectQ is the baseline of the AQ-SGD paper (Wang et al., "Fine-tuning Language
Models over Slow Networks using Activation Compression with Guarantees",
arXiv:2206.01299, Sec. 4.1,
"DirectQ Evans and Aamodt (2021); Fu et al. (2020): activations and backward
gradients are directly quantized"): a tensor is normalised into [-1, 1] by the
max-abs of each bucket and every value is rounded to one of ``2**b`` uniform
levels (``b`` in 2, 3, 4, 6, 8). The exact float32 recipe, the stochastic
rounding (unbiased up to ~``2**-15`` of a step) and the counter-hash random bits
live in :mod:`perfsim.kernels.quant` and :mod:`perfsim.kernels.rng`.

Spec: ``directq:BITS[:det][:bucket=N]``

* ``BITS``: 2, 3, 4, 6 or 8.
* ``det``: deterministic round-to-nearest instead of stochastic rounding.
* ``bucket=N``: buckets of ``N`` consecutive elements of the flattened tensor
  (the last may be shorter). Default: one bucket per row of the last
  dimension (``x.shape[-1]`` elements; a 0-d tensor is one bucket).

Payload: ``codes`` (``ceil(n * BITS / 8)`` bytes, dense little-endian bit
stream) and ``scales`` (one float32 max-abs per bucket), so
``wire_bytes = ceil(n*BITS/8) + 4 * buckets``. Exact results: an empty tensor
gives an empty payload and decodes to an empty tensor; an all-zero bucket has
scale 0 and decodes to exact zeros. Random bits come from ``(seed, step)``;
the step counter is the compressor's only state.
"""

from __future__ import annotations

from typing import Sequence

from perfsim._lazy import torch

from perfsim.compression.args import SpecArg
from perfsim.compression.base import Compressor, Payload, SeedStepState, check_float, numel_of
from perfsim.compression.registry import register
from perfsim.errors import ConfigError
from perfsim.kernels.packing import packed_nbytes
from perfsim.kernels.quant import QUANT_BITS, num_buckets, quantize_pack, unpack_dequantize
from perfsim.kernels.rng import call_key


def row_bucket(shape: Sequence[int]) -> int:
    """Default bucket: the length of the last dimension (1 for 0-d / empty rows)."""
    return int(shape[-1]) if len(shape) and int(shape[-1]) > 0 else 1


def check_payload_tensors(payload: Payload, names: Sequence[str], who: str) -> None:
    missing = [k for k in names if k not in payload.tensors]
    if missing:
        raise ConfigError(f"{who}: payload lacks {missing} (has {sorted(payload.tensors)})")


@register
class DirectQ(SeedStepState, Compressor):
    """Uniform ``b``-bit quantization after bucket max-abs normalisation."""

    name = "directq"
    example_spec = "directq:4"
    allreduce_compatible = False  # per-worker scales: sums need a shared scale
    refusal_lane = "scales"  # a NaN/Inf input is sent as +Inf scales (Compressor.allreduce_mean)

    spec_args = (
        SpecArg("bits", choices=QUANT_BITS),
        SpecArg("stochastic", default=True, words={"det": False, "stoch": True}),
        SpecArg("bucket", default=None, key=True, low=1, metavar="N"),
    )

    def __init__(self, bits: int, *, stochastic: bool, bucket: int | None, seed: int = 0):
        self.bits = int(bits)
        self.stochastic = bool(stochastic)
        self.bucket = bucket
        self.seed = int(seed)
        self.step = 0
        self.spec = self.canonical_spec()

    # ------------------------------------------------------------- sizes
    def bucket_for(self, shape: Sequence[int]) -> int:
        return self.bucket or row_bucket(shape)

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        n = numel_of(shape)
        return packed_nbytes(n, self.bits) + 4 * num_buckets(n, self.bucket_for(shape))

    # ------------------------------------------------------------- data path
    def current_key(self) -> int | None:
        """The hash key of the next rounding call (from ``seed`` and ``step``)."""
        return call_key(self.seed, self.step) if self.stochastic else None

    def compress(self, x: torch.Tensor, *, key=None) -> Payload:
        check_float(x)  # NaN/Inf: checked on the scales inside quantize_pack
        shape = tuple(x.shape)
        packed, scales = quantize_pack(x, self.bits, bucket=self.bucket_for(shape),
                                       key=self.current_key())
        self.step += 1
        return Payload({"codes": packed, "scales": scales}, shape, x.dtype, {"step": self.step - 1})

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        check_payload_tensors(payload, ("codes", "scales"), self.spec)
        shape = tuple(payload.shape)
        n = numel_of(shape)
        values = unpack_dequantize(payload.tensors["codes"], payload.tensors["scales"], self.bits, n,
                                   bucket=self.bucket_for(shape))
        return values.view(shape).to(payload.dtype)
