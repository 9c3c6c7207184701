"""1-bit sign packing with error feedback (three faces each).

Format: bit ``i`` of the dense little-endian stream (``packing`` with b = 1)
is 1 when element ``i`` is ``>= 0`` (zero counts as +, like DeepSpeed's
``sign().add_(1).bool()``) and 0 when negative. The decoded value is ``+scale``
for a 1 bit and ``-scale`` for a 0 bit.

Error-compensated compression (1-bit SGD, Seide et al. 2014; 1-bit Adam/LAMB: Li et al.,
"1-bit LAMB: Communication Efficient Large-Scale Large-Batch Training with LAMB's
Convergence Speed", arXiv:2104.06069, Sec. 2.1 and Alg. 1 lines 7 and 10): with error buffer
``e``, compress ``c = x + e``, scale ``= ||c||_2 / sqrt(n)``, send the signs of
``c`` and the scale, and keep ``e <- c - scale * sign(c)``.
"""

from __future__ import annotations

import math

from perfsim._lazy import torch

from perfsim.errors import ConfigError
from perfsim.kernels._triton import HAS_TRITON, cdiv, launch_opts, tl, triton, use_triton
from perfsim.kernels._workspace import workspace
from perfsim.kernels.finite import check_deferred, defer, device_flag
from perfsim.kernels.bitpack import pack_bits_torch, unpack_bits_torch
from perfsim.kernels.packing import packed_nbytes


def _flat32(x: torch.Tensor) -> torch.Tensor:
    xf = x.detach().reshape(-1)
    return (xf if xf.dtype == torch.float32 else xf.float()).contiguous()


# ---------------------------------------------------------------- reference
def sign_pack_ref(x: torch.Tensor) -> torch.Tensor:
    """Packed sign bits of ``x`` (``ceil(n/8)`` bytes)."""
    return pack_bits_torch((_flat32(x) >= 0).view(torch.uint8), 1)


def sign_unpack_ref(packed: torch.Tensor, n: int, scale: float | torch.Tensor) -> torch.Tensor:
    """``n`` float32 values ``+-scale`` from packed sign bits."""
    bits = unpack_bits_torch(packed, 1, n)
    scale = torch.as_tensor(scale, dtype=torch.float32, device=packed.device)
    out = torch.empty(n, dtype=torch.float32, device=packed.device).copy_(bits)
    return out.mul_(2 * scale).sub_(scale)  # 0 or 2*scale (exact), then exactly -+scale


def ef_scale(c: torch.Tensor) -> torch.Tensor:
    """``||c||_2 / sqrt(n)`` (float32, 0-dim); 0 for an empty tensor. Raises
    ConfigError when it is not finite (NaN/Inf in the data -- the norm replaces
    a full ``isfinite`` pass -- or values too large for a float32 norm)."""
    n = c.numel()
    if n == 0:
        return torch.zeros((), dtype=torch.float32, device=c.device)
    scale = torch.linalg.vector_norm(c) / math.sqrt(n)
    if not bool(torch.isfinite(scale)):
        raise ef_scale_error(not bool(torch.isfinite(c).all()))
    return scale


def ef_scale_error(nonfinite_data: bool, what: str = "tensor") -> ConfigError:
    """The one-line refusal of a non-finite error-feedback scale."""
    return ConfigError(f"{what}: contains NaN or Inf; refusing to compress" if nonfinite_data else
                       f"{what}: values too large for a float32 norm; refusing to compress")


def ef_sign_compress_ref(x: torch.Tensor, err: torch.Tensor):
    """Error-compensated sign compression. Returns ``(packed, scale)`` and updates
    ``err`` (flat float32, same numel as ``x``) in place to ``c - scale*sign(c)``."""
    xf = _flat32(x)
    _check_err(xf, err)
    c = torch.add(xf, err, out=workspace("ef_c", xf.numel(), torch.float32, xf.device))
    scale = ef_scale(c)
    bits = (c >= 0).view(torch.uint8)
    packed = pack_bits_torch(bits, 1)
    dec = workspace("ef_d", xf.numel(), torch.float32, xf.device).copy_(bits)
    dec.mul_(2 * scale).sub_(scale)
    torch.sub(c, dec, out=err)
    return packed, scale


def _check_err(xf, err):
    if (err.dtype != torch.float32 or err.dim() != 1 or err.numel() != xf.numel()
            or not err.is_contiguous() or err.device != xf.device):
        raise ConfigError(f"error buffer: need a contiguous 1-D float32 tensor of {xf.numel()} "
                          f"elements on {xf.device}, got {err.dtype} {tuple(err.shape)} on {err.device}")


# ---------------------------------------------------------------- Triton
if HAS_TRITON:

    from perfsim.kernels._tl_words import max_nan

    @triton.jit
    def _ef_partials_kernel(x_ptr, e_ptr, ssq_ptr, amax_ptr, n, BLOCK: tl.constexpr):
        """Pass 1 of the error-feedback encode: per program, the sum of ``c^2`` and the max
        ``|c|`` (NaN kept) of ``c = x + e``, without storing ``c``."""
        pid = tl.program_id(0)
        idx = pid * BLOCK + tl.arange(0, BLOCK)
        m = idx < n
        c = tl.load(x_ptr + idx, mask=m, other=0.0) + tl.load(e_ptr + idx, mask=m, other=0.0)
        tl.store(ssq_ptr + pid, tl.sum(c * c, axis=0))
        tl.store(amax_ptr + pid, tl.reduce(tl.abs(c), 0, max_nan))

    @triton.jit
    def _ef_sign_kernel(x_ptr, e_ptr, out_ptr, scale_ptr, flag_ptr, n, nbytes, UPDATE: tl.constexpr,
                        BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        grp = pid * BLOCK + tl.arange(0, BLOCK)
        j = tl.arange(0, 8)
        idx = grp[:, None] * 8 + j[None, :]
        m = idx < n
        c = tl.load(x_ptr + idx, mask=m, other=0.0)
        if UPDATE:
            c = c + tl.load(e_ptr + idx, mask=m, other=0.0)
        bit = tl.where(m & (c >= 0), 1, 0)
        word = tl.sum(bit << j[None, :], axis=1)
        tl.store(out_ptr + grp, word.to(tl.uint8), mask=grp < nbytes)
        if UPDATE:
            scale = tl.zeros_like(c) + tl.load(scale_ptr)
            ok = scale < float("inf")  # NaN or Inf: refused later (kernels.finite), e kept
            tl.store(flag_ptr + idx * 0, tl.full(idx.shape, 1, tl.int32), mask=(idx == 0) & (ok == 0))
            tl.store(e_ptr + idx, tl.where(bit == 1, c - scale, c + scale), mask=m & ok)

    @triton.jit
    def _sign_unpack_kernel(p_ptr, out_ptr, scale, scale_ptr, n, nbytes, FROM_PTR: tl.constexpr,
                            BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        grp = pid * BLOCK + tl.arange(0, BLOCK)
        b = tl.load(p_ptr + grp, mask=grp < nbytes, other=0).to(tl.int32)
        j = tl.arange(0, 8)
        idx = grp[:, None] * 8 + j[None, :]
        bit = (b[:, None] >> j[None, :]) & 1
        if FROM_PTR:
            scale = tl.load(scale_ptr)
        tl.store(out_ptr + idx, tl.where(bit == 1, scale, -scale), mask=idx < n)


#: elements per program of the error-feedback norm pass
_EF_BLOCK = 8192


def _launch_sign(xf, err, scale, flag, block):
    n = xf.numel()
    nbytes = packed_nbytes(n, 1)
    out = torch.empty(nbytes, dtype=torch.uint8, device=xf.device)
    if n:
        grid = (cdiv(nbytes, block),)
        _ef_sign_kernel[grid](xf, xf if err is None else err, out, xf if scale is None else scale,
                              xf if flag is None else flag, n, nbytes, UPDATE=err is not None,
                              BLOCK=block, **launch_opts())
    return out


def _sign_pack_triton(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    return _launch_sign(_flat32(x), None, None, None, block)


def _ef_sign_compress_triton(x: torch.Tensor, err: torch.Tensor, block: int = 1024):
    """Triton, two passes and no host synchronisation: the sum of squares of ``c = x + err``
    per program (``c`` never stored), the scale ``sqrt(sum) / sqrt(n)`` on the device, then
    signs, packing and the error update in one pass that reads the scale from device memory.
    A non-finite scale is refused at :func:`perfsim.kernels.finite.check_deferred` (the error
    buffer is then left as it was). The scale is the norm summed in another order than
    ``torch.linalg.vector_norm`` (equal within float32 rounding); the residual is exact given it."""
    xf = _flat32(x)
    _check_err(xf, err)
    n = xf.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.uint8, device=xf.device), ef_scale(xf)
    progs = cdiv(n, _EF_BLOCK)
    ssq = torch.empty(progs, dtype=torch.float32, device=xf.device)
    amax = torch.empty(progs, dtype=torch.float32, device=xf.device)
    _ef_partials_kernel[(progs,)](xf, err, ssq, amax, n, BLOCK=_EF_BLOCK, **launch_opts())
    scale = ssq.sum().sqrt_().div_(math.sqrt(n))
    flag = device_flag(xf.device)
    packed = _launch_sign(xf, err, scale, flag, block)
    defer(xf.device, "tensor", scale, amax)
    return packed, scale


def _sign_unpack_triton(packed, n, scale, block: int = 1024) -> torch.Tensor:
    if packed.numel() != packed_nbytes(n, 1):
        raise ConfigError(f"packed: {packed.numel()} bytes, expected {packed_nbytes(n, 1)}")
    check_deferred()  # the next natural synchronisation of an encode's deferred check
    out = torch.empty(n, dtype=torch.float32, device=packed.device)
    if n:
        ptr = isinstance(scale, torch.Tensor)  # a device scale is read by the kernel (no sync)
        _sign_unpack_kernel[(cdiv(packed.numel(), block),)](
            packed.contiguous(), out, 0.0 if ptr else float(scale),
            scale.to(device=packed.device, dtype=torch.float32).reshape(1) if ptr else out,
            n, packed.numel(), FROM_PTR=ptr, BLOCK=block, **launch_opts())
    return out


# ---------------------------------------------------------------- public
def sign_pack(x: torch.Tensor) -> torch.Tensor:
    return _sign_pack_triton(x) if use_triton(x) else sign_pack_ref(x)


def sign_unpack(packed: torch.Tensor, n: int, scale) -> torch.Tensor:
    return _sign_unpack_triton(packed, n, scale) if use_triton(packed) else sign_unpack_ref(packed, n, scale)


def ef_sign_compress(x: torch.Tensor, err: torch.Tensor):
    """``(packed, scale)``; updates ``err``. Triton for CUDA tensors."""
    if use_triton(x):
        return _ef_sign_compress_triton(x, err)
    return ef_sign_compress_ref(x, err)
