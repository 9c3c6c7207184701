"""``directq`` -- direct uniform quantization of activations / gradients.

DirectQ is the baseline of the AQ-SGD paper (aq-sgd-paper.txt Sec. 4.1,
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

from perfsim.compression.base import Compressor, Payload, SeedStepState, numel_of
from perfsim.compression.registry import parse_bits, register
from perfsim.errors import ConfigError
from perfsim.kernels.packing import packed_nbytes
from perfsim.kernels.quant import QUANT_BITS, num_buckets, quantize_pack, unpack_dequantize
from perfsim.kernels.rng import call_key


def parse_bucket(text: str, what: str) -> int:
    """``bucket=N`` -> N (a positive integer)."""
    try:
        n = int(text.split("=", 1)[1])
    except (IndexError, ValueError):
        raise ConfigError(f"{what} {text!r}: expected bucket=N with an integer N") from None
    if n < 1:
        raise ConfigError(f"{what} {text!r}: bucket must be >= 1")
    return n


def row_bucket(shape: Sequence[int]) -> int:
    """Default bucket: the length of the last dimension (1 for 0-d / empty rows)."""
    return int(shape[-1]) if len(shape) and int(shape[-1]) > 0 else 1


def check_float(x, name: str = "tensor") -> None:
    """The cheap half of :func:`check_input` (type and dtype). The NaN/Inf half
    is done by the kernels on the bucket scales (``amax`` propagates NaN/Inf),
    which is free, where a full ``isfinite(x).all()`` pass costs more than the
    whole 4-bit quantizer on one CPU core (measured: ~2-10 ms for 6.5 MB)."""
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ConfigError(f"{name}: dtype {x.dtype} is not floating point")


def check_payload_tensors(payload: Payload, names: Sequence[str], who: str) -> None:
    missing = [k for k in names if k not in payload.tensors]
    if missing:
        raise ConfigError(f"{who}: payload lacks {missing} (has {sorted(payload.tensors)})")


@register
class DirectQ(SeedStepState, Compressor):
    """Uniform ``b``-bit quantization after bucket max-abs normalisation."""

    name = "directq"
    spec_syntax = "directq:BITS[:det][:bucket=N]"
    example_spec = "directq:4"
    allreduce_compatible = False  # per-worker scales: sums need a shared scale

    def __init__(self, bits: int, *, stochastic: bool = True, bucket: int | None = None,
                 seed: int = 0):
        if bits not in QUANT_BITS:
            raise ConfigError(f"bits={bits}: unsupported (choose from {', '.join(map(str, QUANT_BITS))})")
        if bucket is not None and bucket < 1:
            raise ConfigError(f"bucket={bucket}: must be >= 1")
        self.bits = int(bits)
        self.stochastic = bool(stochastic)
        self.bucket = bucket
        self.seed = int(seed)
        self.step = 0
        parts = [self.name, str(bits)] + ([] if stochastic else ["det"])
        parts += [f"bucket={bucket}"] if bucket else []
        self.spec = ":".join(parts)

    @classmethod
    def from_args(cls, args: list[str], *, seed: int = 0, **_):
        if not args:
            raise ConfigError("directq needs a bit width, e.g. directq:4")
        bits = parse_bits(args[0], QUANT_BITS)
        stochastic, bucket = True, None
        for a in args[1:]:
            if a.lower() == "det":
                stochastic = False
            elif a.lower() == "stoch":
                stochastic = True
            elif a.lower().startswith("bucket="):
                bucket = parse_bucket(a, "directq option")
            else:
                raise ConfigError(f"directq option {a!r}: expected det or bucket=N")
        return cls(bits, stochastic=stochastic, bucket=bucket, seed=seed)

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
