"""Bucketed uniform quantization + bit packing, and the inverse (three faces each).

Scheme (AQ-SGD, Wang et al., "Fine-tuning Language Models over Slow Networks
using Activation Compression with Guarantees", arXiv:2206.01299, Sec. 4.1 "we use a simple, uniform quantization scheme,
which first normalizes a given vector into [-1, 1] and quantize each number
into a b-bit integer by uniformly partitioning the range"): a flat tensor is
cut into buckets of ``bucket`` consecutive elements (the last may be shorter);
bucket ``k`` has scale ``s_k = max |x|`` over the bucket. With ``L = 2**b - 1``
the ``2**b`` levels are ``-s + c * (2 s / L)`` for codes ``c = 0..L`` (both
ends of ``[-s, s]`` exact). Encoding, in float32 with exactly these roundings:

    a_k = (L/2) / s_k            (0 when s_k == 0)
    y   = fl(fl(x * a_k) + kc)   kc = L/2 + 1/2 (deterministic: round to nearest)
                                 kc = fl32(L/2 + 1/2 + 2**-17) (stochastic)
    y   = fl(y + s16 * 2**-16)   stochastic only; s16 from :mod:`rng`
    c   = floor(clamp(y, 0, L))

so stochastic rounding adds ``u = (s16 + 32768.5) / 65536`` in (0, 1) before
the floor, so ``E[c] = x*a + L/2`` up to the 16-bit resolution of ``u`` and the float32
rounding of ``y`` (together below ``2**-15`` of a step; for b = 8, ``kc`` itself
rounds to 128).
Decoding: ``x_hat = fl(fl(c * d_k) - s_k)`` with ``d_k = fl(s_k * fl32(2/L))``.
An all-zero bucket has ``s = 0`` and decodes to exact zeros.

Payload: ``packed`` (``ceil(n b / 8)`` bytes, format of :mod:`packing`) and
``scales`` (one float32 per bucket). The Triton kernels evaluate the same
float32 expression with fp contraction disabled, so they are byte-identical to
the reference for the same ``(key)``; the per-bucket scales are computed by
the same torch code on every path.
"""

from __future__ import annotations

import math

from perfsim._lazy import np
from perfsim._lazy import torch

from perfsim.errors import ConfigError
from perfsim.kernels._workspace import workspace
from perfsim.kernels._triton import HAS_TRITON, cdiv, launch_opts, tl, triton, use_triton
from perfsim.kernels.finite import check_deferred, defer, device_flag, flag_bad_scales
from perfsim.kernels.bitpack import pack_bits_torch, unpack_bits_torch
from perfsim.kernels.packing import group_size, packed_nbytes
from perfsim.kernels.rng import hash_int16_ref

QUANT_BITS = (2, 3, 4, 6, 8)
_INV16 = 2.0 ** -16


def check_quant_bits(bits: int) -> int:
    if bits not in QUANT_BITS:
        raise ConfigError(f"bits={bits}: unsupported (choose from {', '.join(map(str, QUANT_BITS))})")
    return bits


def levels(bits: int) -> int:
    """``L = 2**bits - 1``: the largest code."""
    return (1 << bits) - 1


def round_const(bits: int, stochastic: bool) -> float:
    """The float32 constant ``kc`` added before the floor (see module doc)."""
    L = levels(bits)
    if stochastic:
        return float(np.float32(L / 2 + 0.5 + 2.0 ** -17))
    return float(L / 2 + 0.5)


def num_buckets(n: int, bucket: int) -> int:
    return -(-n // bucket) if n else 0


def bucket_absmax(xf: torch.Tensor, bucket: int) -> torch.Tensor:
    """Max-abs of each bucket of a flat float32 tensor (float32, one per bucket)."""
    n = xf.numel()
    nfull = n // bucket
    full = nfull * bucket
    s = torch.empty(num_buckets(n, bucket), dtype=torch.float32, device=xf.device)
    if nfull and xf.is_cuda:  # one read, no temporary (max |x| is exact either way)
        torch.linalg.vector_norm(xf[:full].view(nfull, bucket), float("inf"), dim=1, out=s[:nfull])
    elif nfull:
        ab = torch.abs(xf[:full], out=workspace("abs", full, xf.dtype, xf.device))
        torch.amax(ab.view(nfull, bucket), dim=1, out=s[:nfull])
    if full < n:
        s[nfull] = xf[full:].abs().amax()
    return s


#: largest |value| a quantizer accepts: decoding computes ``c * d <= 2 s`` and
#: AQ-SGD adds that to its buffer (``|m| <= s``), which stays below fp32's
#: max (2^128) only for ``s <= 2^126`` (~8.5e37); larger values are refused,
#: never turned into Inf (the README's overflow rule)
MAX_ABS = 2.0 ** 126


def check_finite_scales(s: torch.Tensor, what: str = "tensor") -> None:
    """NaN/Inf anywhere in a bucket makes its max-abs NaN/Inf (``amax``
    propagates NaN), so checking the few scales replaces a full ``isfinite``
    pass over the data (which costs more than the whole quantizer on a CPU).
    Scales above :data:`MAX_ABS` are refused too (they would decode to Inf)."""
    if s.numel():
        top = float(s.max()) if bool(torch.isfinite(s).all()) else math.inf
        if not top <= MAX_ABS:
            if math.isfinite(top):
                raise ConfigError(f"{what}: |value| {top:.3g} exceeds {MAX_ABS:.3g}, the largest a "
                                  "quantizer decodes without fp32 overflow; refusing to compress")
            raise ConfigError(f"{what}: contains NaN or Inf; refusing to compress")


def encode_coeffs(s: torch.Tensor, bits: int) -> torch.Tensor:
    """``a = (L/2) / s`` per bucket, 0 for all-zero buckets. torch evaluates a scalar
    divided by a tensor as ``fl(fl(1/s) * L/2)`` (two roundings); the Triton kernels
    reproduce exactly that."""
    half = levels(bits) / 2
    return torch.where(s > 0, half / s.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(s))


def step_const(bits: int) -> float:
    """``fl32(2/L)``: the float32 factor of :func:`decode_step`."""
    return float(np.float32(2.0 / levels(bits)))


def decode_step(s: torch.Tensor, bits: int) -> torch.Tensor:
    """``d = fl(s * fl32(2/L))``: the value of one code step per bucket."""
    return s * step_const(bits)


def bucketwise(op, src: torch.Tensor, coef: torch.Tensor, bucket: int, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = op(src[i], coef[i // bucket])`` for flat tensors, without
    materialising a per-element coefficient (full buckets as a 2-D view, then
    the short tail); returns ``out``."""
    n = src.numel()
    nfull = n // bucket
    full = nfull * bucket
    if nfull:
        op(src[:full].view(nfull, bucket), coef[:nfull, None], out=out[:full].view(nfull, bucket))
    if full < n:
        op(src[full:], coef[nfull], out=out[full:])
    return out


# ---------------------------------------------------------------- reference
def quantize_codes_ref(xf: torch.Tensor, bits: int, bucket: int, a: torch.Tensor,
                       key: int | None) -> torch.Tensor:
    """uint8 codes of a flat float32 tensor (``key=None``: deterministic)."""
    n = xf.numel()
    y = workspace("y", n, torch.float32, xf.device)
    bucketwise(torch.mul, xf, a, bucket, y)
    y.add_(round_const(bits, key is not None))
    if key is not None:
        y.add_(hash_int16_ref(n, key, xf.device, scratch=True), alpha=_INV16)  # exact product
    y.clamp_(0, levels(bits))
    ci = workspace("ci", n, torch.int32, xf.device).copy_(y)  # float->int32->uint8 is
    return ci.to(torch.uint8)                                 # 2x faster than float->uint8


def dequantize_codes_ref(codes: torch.Tensor, s: torch.Tensor, bits: int, bucket: int,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """float32 values of flat uint8 codes: ``fl(fl(c * d) - s)`` per bucket."""
    n = codes.numel()
    if out is None:
        out = torch.empty(n, dtype=torch.float32, device=codes.device)
    out.copy_(codes)  # exact; a mixed uint8*float op would allocate a float temporary
    bucketwise(torch.mul, out, decode_step(s, bits), bucket, out)
    bucketwise(torch.sub, out, s, bucket, out)
    return out


def _prepare(x: torch.Tensor, bits: int, bucket: int):
    check_quant_bits(bits)
    if bucket < 1:
        raise ConfigError(f"bucket={bucket}: must be >= 1")
    xf = x.detach().reshape(-1)
    if xf.dtype != torch.float32:
        xf = xf.float()
    return xf.contiguous()


def quantize_pack_ref(x: torch.Tensor, bits: int, *, bucket: int, key: int | None = None):
    """Reference: ``(packed uint8, scales float32)`` of ``x`` (any shape, flattened)."""
    xf = _prepare(x, bits, bucket)
    s = bucket_absmax(xf, bucket)
    check_finite_scales(s)
    codes = quantize_codes_ref(xf, bits, bucket, encode_coeffs(s, bits), key)
    return pack_bits_torch(codes, bits), s


def unpack_dequantize_ref(packed: torch.Tensor, scales: torch.Tensor, bits: int, n: int, *,
                          bucket: int) -> torch.Tensor:
    """Reference inverse: flat float32 tensor of ``n`` values."""
    check_quant_bits(bits)
    _check_payload(packed, scales, bits, n, bucket)
    return dequantize_codes_ref(unpack_bits_torch(packed, bits, n, scratch=True), scales, bits, bucket)


def _check_payload(packed, scales, bits, n, bucket):
    if packed.numel() != packed_nbytes(n, bits):
        raise ConfigError(f"packed: {packed.numel()} bytes, expected {packed_nbytes(n, bits)}")
    if scales.numel() != num_buckets(n, bucket):
        raise ConfigError(f"scales: {scales.numel()} values, expected {num_buckets(n, bucket)}")


# ---------------------------------------------------------------- Triton
if HAS_TRITON:
    from perfsim.kernels._tl_words import (codes_word, group_elements, load_word, round_codes,
                                           store_word_bytes, word_codes)

    @triton.jit
    def _quant_pack_kernel(x_ptr, a_ptr, out_ptr, n, nbytes, bucket, key, kc, LF,
                           BITS: tl.constexpr, G: tl.constexpr, GB: tl.constexpr,
                           STOCH: tl.constexpr, BLOCK: tl.constexpr):
        grp, idx = group_elements(tl.program_id(0), G, BLOCK)
        m = idx < n
        x = tl.load(x_ptr + idx, mask=m, other=0.0)
        a = tl.load(a_ptr + idx // bucket, mask=m, other=0.0)
        c = round_codes(x * a, idx, m, key, kc, LF, STOCH)
        store_word_bytes(out_ptr, grp, codes_word(c, BITS, G), grp >= 0, nbytes, GB)

    @triton.jit
    def _unpack_dequant_kernel(p_ptr, s_ptr, out_ptr, n, nbytes, bucket, STEP,
                               BITS: tl.constexpr, G: tl.constexpr, GB: tl.constexpr,
                               BLOCK: tl.constexpr):
        grp, idx = group_elements(tl.program_id(0), G, BLOCK)
        m = idx < n
        c = word_codes(load_word(p_ptr, grp, nbytes, GB, BLOCK), BITS, G)
        s = tl.load(s_ptr + idx // bucket, mask=m, other=0.0)
        d = s * STEP  # decode_step: fl(s * fl32(2/L)), as torch computes it
        v = c.to(tl.float32) * d
        v = v - s
        tl.store(out_ptr + idx, v, mask=m)


def _grid(n: int, bits: int, block: int):
    g, gb = group_size(bits)
    return (max(1, cdiv(-(-n // g), block)),), g, gb


def _quantize_pack_triton(x: torch.Tensor, bits: int, *, bucket: int, key: int | None = None,
                          block: int = 512, fused: bool = True):
    """Triton: same bytes as :func:`quantize_pack_ref` (CUDA, or CPU under
    ``TRITON_INTERPRET=1``). Buckets that fit one program take the single-pass
    kernel of :mod:`fused`; others reduce the scales first, then round and pack.
    NaN/Inf and ``|x| > MAX_ABS`` are refused later, at :func:`perfsim.kernels.finite.check_deferred`
    (no host synchronisation here)."""
    from perfsim.kernels.fused import fusable, fused_quantize_pack

    xf = _prepare(x, bits, bucket)
    flag = device_flag(xf.device)
    if fused and fusable(bucket, bits):
        out, s = fused_quantize_pack(xf, bits, bucket=bucket, key=key, flag=flag)
        defer(xf.device, "tensor", s)
        return out, s
    n = xf.numel()
    s = bucket_absmax(xf, bucket)
    flag_bad_scales(s, flag, MAX_ABS)
    defer(xf.device, "tensor", s)
    a = encode_coeffs(s, bits)
    nbytes = packed_nbytes(n, bits)
    out = torch.empty(nbytes, dtype=torch.uint8, device=xf.device)
    if n == 0:
        return out, s
    grid, g, gb = _grid(n, bits, block)
    _quant_pack_kernel[grid](xf, a, out, n, nbytes, bucket, 0 if key is None else int(key),
                             round_const(bits, key is not None), float(levels(bits)),
                             BITS=bits, G=g, GB=gb, STOCH=key is not None, BLOCK=block,
                             **launch_opts())
    return out, s


def _unpack_dequantize_triton(packed: torch.Tensor, scales: torch.Tensor, bits: int, n: int, *,
                              bucket: int, block: int = 512) -> torch.Tensor:
    check_quant_bits(bits)
    _check_payload(packed, scales, bits, n, bucket)
    check_deferred()  # the next natural synchronisation of an encode's deferred check
    out = torch.empty(n, dtype=torch.float32, device=packed.device)
    if n == 0:
        return out
    s = scales.float().contiguous()
    grid, g, gb = _grid(n, bits, block)
    _unpack_dequant_kernel[grid](packed.contiguous(), s, out, n, packed.numel(), bucket,
                                 step_const(bits), BITS=bits, G=g, GB=gb, BLOCK=block, **launch_opts())
    return out


# ---------------------------------------------------------------- public
def quantize_pack(x: torch.Tensor, bits: int, *, bucket: int, key: int | None = None):
    """``(packed, scales)`` of ``x``; Triton for CUDA tensors, the reference otherwise."""
    if use_triton(x):
        return _quantize_pack_triton(x, bits, bucket=bucket, key=key)
    return quantize_pack_ref(x, bits, bucket=bucket, key=key)


def unpack_dequantize(packed: torch.Tensor, scales: torch.Tensor, bits: int, n: int, *,
                      bucket: int) -> torch.Tensor:
    """Flat float32 values of a payload; Triton for CUDA tensors, the reference otherwise."""
    if use_triton(packed):
        return _unpack_dequantize_triton(packed, scales, bits, n, bucket=bucket)
    return unpack_dequantize_ref(packed, scales, bits, n, bucket=bucket)
