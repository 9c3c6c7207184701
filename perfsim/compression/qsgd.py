"""QSGD: stochastic uniform quantization on the L2 norm (Alistarh et al. 2017).

``qsgd:BITS`` or ``qsgd:s=LEVELS``, optionally ``:bucket=D`` (default 512, the
bucket size of QSGD's experiments; ``bucket=0`` = the whole tensor is one bucket).

Per bucket ``v`` of ``d`` coordinates (QSGD, Sec. 3.1; the same quantizer is
eq. 8 of ecq-sgd-paper.txt and eq. 7-8 of multiscale-quantizers-paper.txt)::

    Q_s(v_i) = ||v||_2 * sign(v_i) * xi_i / s
    xi_i = l + 1 with probability s*|v_i|/||v|| - l, else l,  l = floor(s*|v_i|/||v||)

so ``E[Q_s(v)] = v`` (unbiased) and ``E||Q_s(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2``
(QSGD Lemma 3.1). Each coordinate is a signed integer level in ``[-s, s]``; we
send it offset to ``[0, 2s]`` in ``bits`` bits, ``2s + 1 <= 2**bits`` (the
ECQ paper's ``r = ceil(log2(2s+1))``), densely packed with
:func:`perfsim.kernels.pack_bits` (byte-exact with the reference :func:`perfsim.kernels.packing.pack_bits_ref`), plus one fp32 norm per bucket.
``qsgd:BITS`` uses the largest ``s`` that fits: ``s = 2**(BITS-1) - 1``.

Not allreduce-compatible: every worker (and bucket) has its own norm, so codes
of different workers cannot be added; the data-parallel exchange is an
allgather of the payloads followed by ``M`` decodes (the default
:meth:`Compressor.allreduce_mean`).

Randomness: stochastic rounding draws from a ``torch.Generator`` seeded with
``mix(seed, salt, step)`` -- ``salt`` is the data-parallel rank in
:meth:`allreduce_mean` (independent noise per worker), ``step`` a counter held
in the state, so a restored run draws the same bits.

The helpers of this module (:func:`stochastic_round_`, :func:`mix_seed`,
:func:`parse_options`) are shared by the max-norm, random-k and ECQ compressors.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from perfsim.compression.base import Compressor, Payload, check_input, numel_of
from perfsim.compression.registry import register
from perfsim.errors import ConfigError
from perfsim.kernels import pack_bits, unpack_bits
from perfsim.kernels.packing import packed_nbytes

#: bit widths the packer supports that can hold a signed level (1 bit cannot: 2s+1 >= 3)
LEVEL_BITS = (2, 3, 4, 6, 8)
_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """Deterministic 63-bit seed from integers (splitmix64 finaliser per part).

    Used for counter-based randomness: ``mix_seed(seed, salt, step)``."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h & ((1 << 63) - 1)


def generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded from ``mix_seed(*parts)``."""
    g = torch.Generator()
    g.manual_seed(mix_seed(*parts))
    return g


def stochastic_round_(x: torch.Tensor, gen: torch.Generator, upper: float) -> torch.Tensor:
    """In place, unbiased stochastic rounding of ``x >= 0``: ``x <- floor(x + u)``, ``u ~ U[0, 1)``.

    With ``l = floor(x)`` this is ``l + 1`` with probability ``x - l`` and ``l``
    otherwise (QSGD Sec. 3.1; multiscale paper eq. 8; ECQ eq. 9), so ``E = x``.
    The result (float, integral values) is clamped to ``upper`` -- a no-op except
    for float rounding at the top level. Returns ``x``.
    """
    # CPU generator on every device: the same bits on CPU and GPU, so results do not
    # depend on where a worker runs (costs a host-to-device copy on GPUs).
    u = torch.rand(x.shape, generator=gen, dtype=x.dtype).to(x.device)
    return x.add_(u).floor_().clamp_(max=upper)


def levels_for_bits(bits: int) -> int:
    """Largest ``s`` whose signed levels ``[-s, s]`` fit in ``bits`` bits."""
    return 2 ** (bits - 1) - 1


def bits_for_levels(s: int) -> int:
    """Smallest supported packing width holding ``2s + 1`` values."""
    for b in LEVEL_BITS:
        if 2 * s + 1 <= 2 ** b:
            return b
    raise ConfigError(f"s={s}: too many levels (at most {levels_for_bits(8)} in 8 bits)")


def parse_options(args: list[str], allowed: dict[str, type]) -> tuple[list[str], dict[str, Any]]:
    """Split ``['4', 'bucket=512']`` into positional args and typed ``key=value`` options.

    Unknown keys and unparsable values raise ConfigError naming them."""
    pos, opts = [], {}
    for a in args:
        if "=" in a:
            k, v = a.split("=", 1)
            k = k.strip().lower()
            if k not in allowed:
                raise ConfigError(f"unknown option {k!r} (known: {', '.join(sorted(allowed)) or 'none'})")
            try:
                opts[k] = allowed[k](v)
            except ValueError:
                raise ConfigError(f"option {k}={v!r}: not a valid {allowed[k].__name__}") from None
            if allowed[k] is float and not math.isfinite(opts[k]):
                raise ConfigError(f"option {k}={v!r}: not finite")
        else:
            pos.append(a)
    return pos, opts


def parse_level_bits(text: str, what: str = "bits") -> int:
    try:
        bits = int(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} {text!r}: not an integer") from None
    if bits not in LEVEL_BITS:
        raise ConfigError(f"{what}={bits}: unsupported (choose from {', '.join(map(str, LEVEL_BITS))})")
    return bits


class BucketQuantizer:
    """QSGD's per-bucket L2-norm quantizer: the data path shared by ``qsgd`` and ``ecq``.

    ``bucket=0`` means one bucket for the whole tensor.
    """

    def __init__(self, s: int, bits: int, bucket: int):
        self.s, self.bits, self.bucket = int(s), int(bits), int(bucket)

    def nbuckets(self, n: int) -> int:
        if n == 0:
            return 0
        return 1 if self.bucket == 0 else -(-n // self.bucket)

    def wire_bytes(self, n: int) -> int:
        """One fp32 norm per bucket + ``n`` packed codes."""
        return 4 * self.nbuckets(n) + packed_nbytes(n, self.bits)

    def _view(self, flat: torch.Tensor) -> torch.Tensor:
        n = flat.numel()
        d = n if self.bucket == 0 else self.bucket
        nb = self.nbuckets(n)
        return torch.nn.functional.pad(flat, (0, nb * d - n)).view(nb, d)

    def quantize(self, flat: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(norms fp32 [nb], signed levels [n] as integral fp32) of a flat fp32 vector."""
        n = flat.numel()
        v = self._view(flat)
        norms = torch.linalg.vector_norm(v, dim=1)
        safe = torch.where(norms > 0, norms, torch.ones_like(norms))
        lv = stochastic_round_(v.abs().mul_((self.s / safe)[:, None]), gen, float(self.s))
        return norms, lv.copysign_(v).reshape(-1)[:n]

    def dequantize(self, norms: torch.Tensor, lv: torch.Tensor) -> torch.Tensor:
        n = lv.numel()
        v = self._view(lv.to(torch.float32))
        return (v * (norms[:, None] / self.s)).reshape(-1)[:n]

    def pack(self, norms: torch.Tensor, lv: torch.Tensor) -> dict[str, torch.Tensor]:
        codes = (lv + self.s).to(torch.uint8)  # offset to [0, 2s]
        return {"norms": norms.to(torch.float32).contiguous(), "codes": pack_bits(codes, self.bits)}

    def unpack(self, tensors: dict[str, torch.Tensor], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        lv = unpack_bits(tensors["codes"], self.bits, n).to(torch.int32) - self.s
        return tensors["norms"], lv


class _SeededCompressor(Compressor):
    """Holds ``seed``, the per-call ``step`` counter and the rank ``salt``.

    :meth:`allreduce_mean` sets the salt from the data-parallel rank, so workers
    built with the same seed still draw independent rounding noise. Code that
    calls :meth:`compress` on several workers itself should give each worker a
    distinct ``seed`` (or set ``_salt``), or their rounding errors correlate."""

    seed: int = 0
    _step: int = 0
    _salt: int = 0

    def _next_generator(self, *extra: int) -> torch.Generator:
        g = generator(self.seed, self._salt, self._step, *extra)
        self._step += 1
        return g

    def _set_rank_salt(self, group) -> None:
        import torch.distributed as dist

        self._salt = int(dist.get_rank(group)) + 1

    def state_dict(self) -> dict[str, Any]:
        return {"step": self._step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        extra = set(state) - {"step"}
        if extra:
            raise ConfigError(f"{self.spec}: unexpected state keys {sorted(extra)}")
        self._step = int(state.get("step", 0))


@register
class QSGD(_SeededCompressor):
    """QSGD (Alistarh et al. 2017): per-bucket L2 norm, ``s`` levels, stochastic rounding."""

    name = "qsgd"
    spec_syntax = "qsgd:BITS[:bucket=D] | qsgd:s=LEVELS[:bucket=D]"
    example_spec = "qsgd:4"
    allreduce_compatible = False
    stateful = True  # only the random step counter

    def __init__(self, s: int, bits: int, bucket: int = 512, seed: int = 0):
        if s < 1:
            raise ConfigError(f"s={s}: need at least 1 level")
        if bucket < 0:
            raise ConfigError(f"bucket={bucket}: must be >= 0 (0 = whole tensor)")
        self.q = BucketQuantizer(s, bits, bucket)
        self.s, self.bits, self.bucket, self.seed = s, bits, bucket, int(seed)
        self._step, self._salt = 0, 0
        self.spec = f"qsgd:{bits}" if s == levels_for_bits(bits) else f"qsgd:s={s}"
        if bucket != 512:
            self.spec += f":bucket={bucket}"

    @classmethod
    def from_args(cls, args: list[str], seed: int = 0, **_):
        pos, opts = parse_options(args, {"s": int, "bucket": int})
        if len(pos) > 1 or (pos and "s" in opts) or (not pos and "s" not in opts):
            raise ConfigError("expected qsgd:BITS or qsgd:s=LEVELS")
        if pos:
            bits = parse_level_bits(pos[0])
            s = levels_for_bits(bits)
        else:
            s = opts["s"]
            if s < 1:
                raise ConfigError(f"s={s}: need at least 1 level")
            bits = bits_for_levels(s)
        return cls(s, bits, opts.get("bucket", 512), seed=seed)

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        return self.q.wire_bytes(numel_of(shape))

    def compress(self, x: torch.Tensor, *, key=None) -> Payload:
        check_input(x)
        flat = x.detach().reshape(-1).to(torch.float32)
        norms, lv = self.q.quantize(flat, self._next_generator())
        return Payload(self.q.pack(norms, lv), tuple(x.shape), x.dtype)

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        n = numel_of(payload.shape)
        norms, lv = self.q.unpack(payload.tensors, n)
        return self.q.dequantize(norms, lv).reshape(payload.shape).to(payload.dtype)

    def allreduce_mean(self, x: torch.Tensor, group=None) -> torch.Tensor:
        """Allgather of the payloads (norms differ per worker), then M decodes."""
        self._set_rank_salt(group)
        return super().allreduce_mean(x, group)
