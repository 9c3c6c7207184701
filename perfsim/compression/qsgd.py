"""QSGD: stochastic uniform quantization on the L2 norm (Alistarh et al., "QSGD:
Communication-Efficient SGD via Gradient Quantization and Encoding", arXiv:1610.02132).

``qsgd:BITS`` or ``qsgd:s=LEVELS``, optionally ``:bucket=D`` (default
:func:`default_chunk`: 512 for 4 bits, the bucket size of QSGD's experiments;
``bucket=0`` = the whole tensor is one bucket).

Per bucket ``v`` of ``d`` coordinates (QSGD, Sec. 3.1; the same quantizer is
eq. 8 of ECQ-SGD, arXiv:1806.08054, and eq. 7-8 of the multi-scale quantizers paper,
arXiv:2109.12497)::

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

Randomness and the exact float32 recipe (the counter-hash scheme of
:mod:`perfsim.kernels.rng` / :mod:`perfsim.kernels.quant`, no ``torch.rand``):
with ``y = s * v_i / ||v||`` (``|y| <= s``) the sent code is

    c = floor(clamp(fl(fl(y + kc) + r_i * 2**-16), 0, 2s)),   kc = fl32(s + 1/2 + 2**-17)

with ``r_i`` the signed 16-bit hash of element ``i`` under
``key = call_key(seed, step, salt)``, so ``u = (r_i + 32768.5) / 65536`` is
uniform in (0, 1) and ``c - s = floor(y + u)``: ``l + 1`` with probability
``y - l`` (``l = floor(y)``), unbiased up to the 16-bit resolution of ``u`` and the
float32 rounding of ``fl(y + kc)`` (below ``2**-15`` of a step). Rounding the
signed value this way has the same distribution per coordinate as rounding
``|v_i|`` and restoring the sign (QSGD's ``sign(v_i) xi_i``), and needs neither.
``salt`` is the data-parallel rank in :meth:`allreduce_mean` (independent noise
per worker), ``step`` a counter held in the state, so a restored run draws the
same bits; the bits are a pure function of ``(seed, step, salt, i)`` on every device.

The helpers of this module (:func:`stochastic_codes_`, :func:`bucket_norms`, ...) are shared by the max-norm, random-k and ECQ compressors.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from perfsim._lazy import np
from perfsim._lazy import torch

from perfsim.compression.args import SpecArg, complete
from perfsim.compression.base import Compressor, Payload, check_float, check_input, numel_of, passes
from perfsim.compression.registry import register
from perfsim.errors import ConfigError, NonFiniteError
from perfsim.kernels import pack_bits, unpack_bits
from perfsim.kernels._workspace import workspace
from perfsim.kernels.bitpack import unpack_bits_torch
from perfsim.kernels.packing import packed_nbytes
from perfsim.kernels.quant import bucketwise
from perfsim.kernels.rng import call_key, hash_int16_ref

#: bit widths the packer supports that can hold a signed level (1 bit cannot: 2s+1 >= 3)
LEVEL_BITS = (2, 3, 4, 6, 8)
_MASK64 = (1 << 64) - 1
_INV16 = 2.0 ** -16
_F32_MAX = (2 - 2**-23) * 2.0**127  # largest finite IEEE 754 binary32 (np.finfo(np.float32).max)


def mix_seed(*parts: int) -> int:
    """Deterministic 63-bit seed from integers (splitmix64 finaliser per part).

    Seeds the CPU generator of random-k's shared index draws: ``mix_seed(seed, salt, step)``."""
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


# ------------------------------------------------------------ the hot path
def check_finite_norms(norms: torch.Tensor, x: torch.Tensor, who: str) -> None:
    """Raise a ConfigError if a norm is NaN/Inf: NaN/Inf input (named by
    :func:`check_input`), or finite values whose squares overflow float32."""
    if norms.numel() and not bool(torch.isfinite(norms).all()):
        check_input(x)
        raise ConfigError(f"{who}: values too large (the L2 norm overflows float32); refusing to compress")


def safe_norms(flat: torch.Tensor, chunk: int, who: str, ord: float = 2) -> torch.Tensor:
    """L2 (``ord=inf``: max-abs) norm of every ``chunk`` of a flat float32 tensor, robust
    near the float32 limit.

    Overflow rule (documented in docs/ddp.md): squares of values above
    ~1.8e19 overflow float32, so a non-finite float32 norm of finite input is
    recomputed in float64; if the norm itself exceeds the float32 maximum
    (~3.4e38) the tensor is refused with one line -- never an Inf norm on the wire.
    NaN/Inf input is refused by :func:`check_input`."""
    norms = bucket_norms(flat, chunk, ord)
    if norms.numel() and not bool(torch.isfinite(norms).all()):
        check_input(flat)
        wide = bucket_norms(flat.double(), chunk, ord) if flat.numel() else norms.double()
        if not bool((wide <= _F32_MAX).all()):
            raise ConfigError(f"{who}: a chunk's L2 norm exceeds the float32 maximum 3.4e38 "
                              "(values of ~1e38 and above); refusing to compress")
        norms = wide.to(torch.float32)
    return norms


def to_dtype_saturating(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast a decoded float32 result to the caller's dtype, saturating at that dtype's
    largest finite value instead of producing Inf (fp16 overflows at 65504: a
    gradient mean of 7e4 becomes 65504, not Inf): the documented rule (docs/ddp.md)."""
    if dtype in (torch.float16, torch.bfloat16) and x.dtype == torch.float32 and x.numel():
        big = float(torch.finfo(dtype).max)
        if float(x.abs().max()) > big:
            x = x.clamp(-big, big)
    return x.to(dtype)


def flat_f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a flat contiguous float32 tensor (no copy for contiguous fp32)."""
    return x.detach().reshape(-1).to(torch.float32).contiguous()


def bucket_norms(flat: torch.Tensor, bucket: int, ord: float = 2) -> torch.Tensor:
    """L2 norm (``ord=inf``: max-abs) of every bucket of ``bucket`` consecutive values
    (the last may be shorter), a fresh float32 tensor; no padded copy of the input."""
    n = flat.numel()
    nfull = n // bucket
    full = nfull * bucket
    out = torch.empty(-(-n // bucket), dtype=flat.dtype if flat.dtype == torch.float64 else torch.float32,
                      device=flat.device)
    if nfull:
        torch.linalg.vector_norm(flat[:full].view(nfull, bucket), ord, dim=1, out=out[:nfull])
    if full < n:
        out[nfull] = torch.linalg.vector_norm(flat[full:], ord)
    return out


def round_const(s: int) -> float:
    """``kc = fl32(s + 1/2 + 2**-17)``: the code offset ``s`` plus the mean of the
    uniform (exact in float32 for every ``s <= 127``)."""
    return float(np.float32(s + 0.5 + 2.0 ** -17))


def stochastic_codes_(y: torch.Tensor, s: int, key: int) -> torch.Tensor:
    """Unbiased stochastic rounding of ``y`` (flat float32 scratch holding
    ``s v / scale``, ``|y| <= s`` up to rounding; consumed in place) to offset
    codes ``c = s + floor(y + u)`` in ``[0, 2s]``, uint8 (fresh).

    ``E[c - s] = y`` (QSGD Sec. 3.1; multiscale paper eq. 8; ECQ eq. 9): the
    recipe of the module docstring, in four float passes + two conversions;
    ``u`` from the counter hash (:func:`perfsim.kernels.rng.hash_int16_ref`).
    The clamp only guards float rounding at the ends of the grid."""
    n = y.numel()
    y.add_(round_const(s))
    y.add_(hash_int16_ref(n, key, y.device, scratch=True), alpha=_INV16)  # s16 * 2**-16: exact
    y.clamp_(0, 2 * s)
    ci = workspace("sr_codes_i32", n, torch.int32, y.device).copy_(y)  # y >= 0: truncation = floor
    return ci.to(torch.uint8)  # float -> int32 -> uint8 beats float -> uint8 on CPU


def stochastic_passes(n: int) -> tuple[float, ...]:
    """Bytes read + written by each float pass of ``y = x * s/norm`` (:func:`scale_into`)
    and :func:`stochastic_codes_` over ``n`` values, as torch runs them on a GPU: the
    scaling (8 n), the rounding constant (8 n), the int16 hash (2 n written), its
    addition (10 n), the clamp (8 n), the int32 and uint8 conversions (8 n, 5 n)."""
    return (8 * n, 8 * n, 2 * n, 10 * n, 8 * n, 8 * n, 5 * n)


def decode_passes(n: int, wire: int) -> tuple[float, ...]:
    """Bytes of each pass of a QSGD-family decode of ``n`` values from ``wire`` payload
    bytes: unpack the codes (payload read, uint8 written), ``c - s`` as float32 (a
    conversion, 5 n; a subtraction, 8 n), the scaling (8 n)."""
    return (wire + n, 5 * n, 8 * n, 8 * n)


def coefficients(levels, norms: torch.Tensor) -> torch.Tensor:
    """``levels / norms`` in float64 (broadcast), 0 where the norm is 0."""
    return torch.where(norms > 0, levels / norms.double(), 0.0)


def scale_into(y: torch.Tensor, flat: torch.Tensor, a64: torch.Tensor, bucket: int) -> torch.Tensor:
    """``y <- flat * a[i // bucket]`` (float32 out). One float32 pass; a norm
    below ~1e-36 overflows the float32 coefficient, then (never in practice)
    the product is formed in float64."""
    if a64.numel() == 0 or float(a64.max()) <= _F32_MAX:
        return bucketwise(torch.mul, flat, a64.to(torch.float32), bucket, y)
    n = flat.numel()
    per = a64 if a64.numel() == 1 else a64.repeat_interleave(bucket)[:n]
    return y.copy_(flat.double() * per)


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """uint8 codes of a payload: a reused scratch buffer on the CPU (valid until
    the next unpack), the Triton kernel on CUDA."""
    if packed.is_cuda:
        return unpack_bits(packed, bits, n)
    return unpack_bits_torch(packed, bits, n, scratch=True)


def levels_from_codes(codes: torch.Tensor, s: int, out: torch.Tensor) -> torch.Tensor:
    """``out <- c - s`` as float32 (exact)."""
    return out.copy_(codes).sub_(s)


def default_chunk(s: int) -> int:
    """Values per norm by default (QSGD buckets, ECQ buckets, QSGD-MaxNorm chunks):
    the largest power of two ``d <= 16 s**2``, so QSGD's variance bound
    ``min(d/s**2, sqrt(d)/s) ||v||**2`` (Alistarh et al. 2017, arXiv:1610.02132,
    Lemma 3.1; arXiv:2109.12497 Lemma 1 for a shared norm) stays
    <= 4: 512 for 4 bits (QSGD's own bucket size), 16 for 2 bits, 128 for 3 bits.
    A norm over a whole DDP bucket of millions of values leaves almost every code
    at 0 (the bound grows with ``sqrt(n)``); docs/ddp.md has the convergence runs."""
    return 1 << int(math.floor(math.log2(16 * s * s)))


def chunk_for_bits(values) -> int:
    """:func:`default_chunk` of a spec's ``bits`` (the default of the ``bucket`` /
    ``chunk`` arguments of the QSGD family)."""
    return default_chunk(levels_for_bits(values["bits"]))


def levels_for_bits(bits: int) -> int:
    """Largest ``s`` whose signed levels ``[-s, s]`` fit in ``bits`` bits."""
    return 2 ** (bits - 1) - 1


def bits_for_levels(s: int) -> int:
    """Smallest supported packing width holding ``2s + 1`` values."""
    for b in LEVEL_BITS:
        if 2 * s + 1 <= 2 ** b:
            return b
    raise ConfigError(f"s={s}: too many levels (at most {levels_for_bits(8)} in 8 bits)")


#: the ``BITS`` argument of the QSGD family's specs
BITS_ARG = SpecArg("bits", choices=LEVEL_BITS)


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

    def bucket_of(self, n: int) -> int:
        return max(n, 1) if self.bucket == 0 else self.bucket

    def wire_bytes(self, n: int) -> int:
        """One fp32 norm per bucket + ``n`` packed codes."""
        return 4 * self.nbuckets(n) + packed_nbytes(n, self.bits)

    def encode(self, flat: torch.Tensor, key: int, who: str = "qsgd", *,
               out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norms fp32 [nb], offset codes uint8 [n] in ``[0, 2s]``) of a flat fp32 vector.

        Passes over the data: the bucket norms, ``y = x * s/||v||``, then
        :func:`stochastic_codes_`; NaN/Inf are caught on the norms. ``out``: the
        float32 scratch for ``y`` (may be ``flat`` itself when the caller owns it;
        its contents are destroyed), default a reused buffer."""
        n = flat.numel()
        d = self.bucket_of(n)
        norms = safe_norms(flat, d, who)
        y = workspace("sr_y", n, torch.float32, flat.device) if out is None else out
        scale_into(y, flat, coefficients(float(self.s), norms), d)
        return norms, stochastic_codes_(y, self.s, key)

    def decode(self, codes: torch.Tensor, norms: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out <- (c - s) * (||v|| / s)`` per bucket (float32)."""
        n = codes.numel()
        levels_from_codes(codes, self.s, out)
        return bucketwise(torch.mul, out, norms.to(torch.float32) / self.s, self.bucket_of(n), out)

    def pack(self, norms: torch.Tensor, codes: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"norms": norms, "codes": pack_bits(codes, self.bits)}

    def refusal(self, n: int, device=None) -> dict[str, torch.Tensor]:
        """The payload a rank sends instead of its own when its input is NaN/Inf (or a norm
        overflows): the payload's exact tensors and sizes, every norm +Inf, the codes zero."""
        return {"norms": torch.full((self.nbuckets(n),), float("inf"), dtype=torch.float32, device=device),
                "codes": pack_bits(torch.zeros(n, dtype=torch.uint8, device=device), self.bits)}

    def allgather(self, tensors: dict[str, torch.Tensor], group, who: str,
                  refused: bool = False) -> list[dict[str, torch.Tensor]]:
        """Every rank's payload (norms, codes), in rank order: one all-gather per tensor,
        the exchange of ``qsgd`` and ``ecq``. A rank's non-finite norms are its refusal
        (:meth:`refusal`): then every rank raises :class:`perfsim.errors.NonFiniteError`
        here, with nothing decoded (``refused``: this rank's own input was refused)."""
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

        world = dist.get_world_size(group)
        gathered: dict[str, list[torch.Tensor]] = {}
        for key, t in tensors.items():
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous(), group=group)
            gathered[key] = parts
        if refused or not all(bool(torch.isfinite(norms).all()) for norms in gathered["norms"]):
            raise NonFiniteError(f"{who}: NaN/Inf or too large values on a rank; nothing exchanged",
                                 local=refused)
        return [{k: v[r] for k, v in gathered.items()} for r in range(world)]

    def unpack(self, tensors: dict[str, torch.Tensor], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(norms, codes); the codes may be a scratch buffer (see :func:`unpack_codes`)."""
        for k in ("norms", "codes"):
            if k not in tensors:
                raise ConfigError(f"payload: missing tensor {k!r}")
        norms = tensors["norms"]
        if norms.numel() != self.nbuckets(n):
            raise ConfigError(f"payload: {norms.numel()} norms, expected {self.nbuckets(n)} for {n} values")
        return norms, unpack_codes(tensors["codes"], self.bits, n)

    def decompress(self, tensors: dict[str, torch.Tensor], n: int, device) -> torch.Tensor:
        """Flat float32 values of a payload (a fresh tensor)."""
        norms, codes = self.unpack(tensors, n)
        return self.decode(codes, norms, torch.empty(n, dtype=torch.float32, device=device))


class _SeededCompressor(Compressor):
    """Holds ``seed``, the per-call ``step`` counter and the rank ``salt``.

    :meth:`allreduce_mean` sets the salt from the data-parallel rank, so workers
    built with the same seed still draw independent rounding noise. Code that
    calls :meth:`compress` on several workers itself should give each worker a
    distinct ``seed`` (or set ``_salt``), or their rounding errors correlate."""

    seed: int = 0
    _step: int = 0
    _salt: int = 0

    def _next_key(self) -> int:
        """The hash key of this call, ``call_key(seed, step, salt)``; advances the step."""
        key = call_key(self.seed, self._step, self._salt)
        self._step += 1
        return key

    def _set_rank_salt(self, group) -> None:
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

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

    spec_args = (
        SpecArg("bits", default=None, choices=LEVEL_BITS),
        SpecArg("s", key=True, default=None, low=1, high=levels_for_bits(LEVEL_BITS[-1]),
                note="levels per sign", metavar="LEVELS"),
        SpecArg("bucket", key=True, default=None, low=0, note="0 = whole tensor", metavar="D"),
    )

    def __init__(self, bits: int | None, s: int | None, bucket: int | None, seed: int = 0):
        """Exactly one of ``bits`` (``s = 2**(bits-1) - 1``) and ``s`` (``bits``: the
        narrowest width holding ``2s + 1`` codes); ``bucket=None``: :func:`default_chunk`."""
        if (bits is None) == (s is None):
            raise ConfigError("expected qsgd:BITS or qsgd:s=LEVELS")
        complete(self.spec_args, {"bits": bits, "s": s, "bucket": bucket})  # each in range
        self.s = levels_for_bits(bits) if s is None else int(s)
        self.bits = bits_for_levels(self.s) if bits is None else int(bits)
        self.bucket = default_chunk(self.s) if bucket is None else int(bucket)
        self.seed = int(seed)
        self._step, self._salt = 0, 0
        self.spec = self.canonical_spec()
        self.q = BucketQuantizer(self.s, self.bits, self.bucket)

    def spec_values(self) -> dict:
        """``bits`` when ``s`` is the most its width holds, else ``s``; ``bucket``
        when it is not the default."""
        by_bits = self.s == levels_for_bits(self.bits)
        return {"bits": self.bits if by_bits else None, "s": None if by_bits else self.s,
                "bucket": None if self.bucket == default_chunk(self.s) else self.bucket}

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        return self.q.wire_bytes(numel_of(shape))

    def codec_traffic(self, shape: Sequence[int]):
        """QSGD (Alistarh et al., arXiv:1610.02132, Sec. 3.1) as :meth:`BucketQuantizer.encode`
        runs it: the bucket norms (read 4 n), :func:`stochastic_passes`, the bit packing
        (codes read, payload written); decode: :func:`decode_passes`."""
        n, wire = numel_of(shape), self.wire_bytes(shape)
        return passes(4 * n, *stochastic_passes(n), n + wire), passes(*decode_passes(n, wire))

    def compress(self, x: torch.Tensor, *, key=None) -> Payload:
        check_float(x)
        norms, codes = self.q.encode(flat_f32(x), self._next_key(), self.spec)
        return Payload(self.q.pack(norms, codes), tuple(x.shape), x.dtype)

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        n = numel_of(payload.shape)
        device = payload.tensors["codes"].device if "codes" in payload.tensors else None
        out = self.q.decompress(payload.tensors, n, device)
        return to_dtype_saturating(out.reshape(payload.shape), payload.dtype)

    def allreduce_mean(self, x: torch.Tensor, group=None) -> torch.Tensor:
        """Allgather of the payloads (norms differ per worker), then M decodes. A rank
        whose input is NaN/Inf sends :meth:`BucketQuantizer.refusal` (Inf norms): every
        rank raises :class:`perfsim.errors.NonFiniteError`, the step counter unchanged."""
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

        self._set_rank_salt(group)
        check_float(x)
        if x.numel() == 0:
            return super().allreduce_mean(x, group)
        world = dist.get_world_size(group)
        step = self._step
        flat = flat_f32(x)
        try:
            tensors, refused = self.q.pack(*self.q.encode(flat, self._next_key(), self.spec)), False
        except ConfigError:  # NaN/Inf or a norm beyond float32: the Inf norms tell every rank
            tensors, refused = self.q.refusal(flat.numel(), flat.device), True
        try:
            every = self.q.allgather(tensors, group, self.spec, refused)
        except NonFiniteError:
            self._step = step
            raise
        total = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        for tensors in every:
            total += self.decompress(Payload(tensors, tuple(x.shape), x.dtype))
        return total / world
