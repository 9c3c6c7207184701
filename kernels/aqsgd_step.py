"""The fused AQ-SGD sender step (arXiv:2206.01299 Alg. 1 lines 7-9, App. D Alg. 2):

    delta = a - m                       message error w.r.t. the previous message
    (packed, scales) = Q(delta)         bucketed uniform quantization (kernels.quant)
    m <- m + deq(Q(delta))              the buffer update both ends perform

and the receiver step ``m <- m + deq(packed, scales)``. Three faces: the
``*_ref`` functions in plain torch, private Triton kernels, and public entries
that use Triton for CUDA tensors. The bucket scales (max |delta|) are a
reduction that must finish before any element can be rounded, so the Triton
path computes them first (one torch reduction over ``a - m``) and then does
delta, rounding, packing and the buffer update in ONE pass over ``a`` and ``m``.
Both paths evaluate the same float32 expressions (see :mod:`quant`), so the
bytes and the updated buffer are identical for the same key.
"""

from __future__ import annotations

from perfsim._lazy import torch

from perfsim.errors import ConfigError
from perfsim.kernels._triton import HAS_TRITON, cdiv, launch_opts, tl, triton, use_triton
from perfsim.kernels._workspace import workspace
from perfsim.kernels.bitpack import pack_bits_torch, unpack_bits_torch
from perfsim.kernels.packing import group_size, packed_nbytes
from perfsim.kernels.finite import check_deferred, defer, device_flag, flag_bad_scales
from perfsim.kernels.quant import (MAX_ABS, _check_payload, bucket_absmax, check_finite_scales,
                                   check_quant_bits, decode_step, dequantize_codes_ref, encode_coeffs, levels,
                                   quantize_codes_ref, round_const)


def _check(a: torch.Tensor, m: torch.Tensor, bits: int, bucket: int) -> torch.Tensor:
    check_quant_bits(bits)
    if bucket < 1:
        raise ConfigError(f"bucket={bucket}: must be >= 1")
    if m.dtype != torch.float32 or not m.is_contiguous() or m.numel() != a.numel():
        raise ConfigError(f"message buffer: need contiguous float32 of {a.numel()} elements, "
                          f"got {m.dtype} of {m.numel()}")
    af = a.detach().reshape(-1)
    return (af if af.dtype == torch.float32 else af.float()).contiguous()


# ---------------------------------------------------------------- reference
def aqsgd_step_ref(a: torch.Tensor, m: torch.Tensor, bits: int, *, bucket: int,
                   key: int | None = None):
    """Sender: returns ``(packed, scales)`` of ``Q(a - m)`` and updates ``m`` in place."""
    af = _check(a, m, bits, bucket)
    mf = m.view(-1)
    n = af.numel()
    delta = torch.sub(af, mf, out=workspace("aq_delta", n, torch.float32, af.device))
    s = bucket_absmax(delta, bucket)
    check_finite_scales(s, "activation")
    codes = quantize_codes_ref(delta, bits, bucket, encode_coeffs(s, bits), key)
    packed = pack_bits_torch(codes, bits)
    dq = dequantize_codes_ref(codes, s, bits, bucket, out=delta)  # delta no longer needed
    mf.add_(dq)
    return packed, s


def aqsgd_receive_ref(packed: torch.Tensor, scales: torch.Tensor, m: torch.Tensor, bits: int, *,
                      bucket: int) -> torch.Tensor:
    """Receiver: ``m += deq(packed, scales)`` in place; returns ``m``."""
    check_quant_bits(bits)
    n = m.numel()
    _check_payload(packed, scales, bits, n, bucket)
    codes = unpack_bits_torch(packed, bits, n, scratch=True)
    dq = dequantize_codes_ref(codes, scales, bits, bucket,
                              out=workspace("aq_delta", n, torch.float32, m.device))
    m.view(-1).add_(dq)
    return m


# ---------------------------------------------------------------- Triton
if HAS_TRITON:
    from perfsim.kernels._tl_words import codes_word, group_elements, round_codes, store_word_bytes

    @triton.jit
    def _aqsgd_step_kernel(a_ptr, m_ptr, ak_ptr, s_ptr, d_ptr, out_ptr, n, nbytes, bucket, key,
                           kc, LF, BITS: tl.constexpr, G: tl.constexpr, GB: tl.constexpr,
                           STOCH: tl.constexpr, BLOCK: tl.constexpr):
        grp, idx = group_elements(tl.program_id(0), G, BLOCK)
        msk = idx < n
        a = tl.load(a_ptr + idx, mask=msk, other=0.0)
        m = tl.load(m_ptr + idx, mask=msk, other=0.0)
        delta = a - m
        bk = idx // bucket
        c = round_codes(delta * tl.load(ak_ptr + bk, mask=msk, other=0.0), idx, msk, key, kc, LF, STOCH)
        store_word_bytes(out_ptr, grp, codes_word(c, BITS, G), grp >= 0, nbytes, GB)
        dq = c.to(tl.float32) * tl.load(d_ptr + bk, mask=msk, other=0.0)
        sk = tl.load(s_ptr + bk, mask=msk, other=0.0)
        dq = dq - sk
        # a bucket with NaN/Inf keeps its buffer rows (refused later: kernels.finite)
        tl.store(m_ptr + idx, m + dq, mask=msk & (sk < float("inf")))


def _aqsgd_step_triton(a: torch.Tensor, m: torch.Tensor, bits: int, *, bucket: int,
                       key: int | None = None, block: int = 512, fused: bool = True):
    from perfsim.kernels.fused import fusable, fused_aqsgd_step

    af = _check(a, m, bits, bucket)
    flag = device_flag(af.device)
    if fused and fusable(bucket, bits):  # one pass over a and m (kernels.fused)
        out, s = fused_aqsgd_step(af, m.view(-1), bits, bucket=bucket, key=key, flag=flag)
        defer(af.device, "activation", s)
        return out, s
    n = af.numel()
    s = bucket_absmax(af - m.view(-1), bucket)
    flag_bad_scales(s, flag, MAX_ABS)
    defer(af.device, "activation", s)
    nbytes = packed_nbytes(n, bits)
    out = torch.empty(nbytes, dtype=torch.uint8, device=af.device)
    if n == 0:
        return out, s
    g, gb = group_size(bits)
    grid = (cdiv(-(-n // g), block),)
    _aqsgd_step_kernel[grid](af, m, encode_coeffs(s, bits), s, decode_step(s, bits), out, n, nbytes,
                             bucket, 0 if key is None else int(key), round_const(bits, key is not None),
                             float(levels(bits)), BITS=bits, G=g, GB=gb, STOCH=key is not None,
                             BLOCK=block, **launch_opts())
    return out, s


# ---------------------------------------------------------------- public
def aqsgd_step(a: torch.Tensor, m: torch.Tensor, bits: int, *, bucket: int, key: int | None = None):
    """Sender step; Triton for CUDA tensors, the reference otherwise."""
    if use_triton(a):
        return _aqsgd_step_triton(a, m, bits, bucket=bucket, key=key)
    return aqsgd_step_ref(a, m, bits, bucket=bucket, key=key)


def aqsgd_receive(packed, scales, m, bits: int, *, bucket: int) -> torch.Tensor:
    """Receiver step: ``m += deq(payload)`` (the reference's torch ops run on any
    device; the dequantize is the same expression as the sender's)."""
    if use_triton(m):
        from perfsim.kernels.quant import _unpack_dequantize_triton

        m.view(-1).add_(_unpack_dequantize_triton(packed, scales, bits, m.numel(), bucket=bucket))
        return m
    return aqsgd_receive_ref(packed, scales, m, bits, bucket=bucket)
