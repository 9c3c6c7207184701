"""Bit packing, three faces: the reference (``packing.pack_bits_ref``), a fast
torch path for CPU, and a Triton kernel for CUDA. All produce the byte-exact
format documented in :mod:`perfsim.kernels.packing`.

The fast torch path works on byte columns: codes are viewed as groups of ``G``
codes (``G`` codes of ``b`` bits end on a byte boundary, filling ``GB`` bytes),
and each output byte column is the OR of the (shifted) code columns that
overlap it -- a fixed table of uint8 shifts per bit width, no int32 words, no
per-value loop.
"""

from __future__ import annotations

from functools import lru_cache

from perfsim._lazy import torch

from perfsim.errors import ConfigError
from perfsim.kernels._workspace import workspace
from perfsim.kernels._triton import HAS_TRITON, cdiv, launch_opts, tl, triton, use_triton
from perfsim.kernels.packing import (check_bits, check_packed, group_size, pack_bits_ref,
                                     packed_nbytes, unpack_bits_ref)


@lru_cache(maxsize=None)
def _terms(bits: int) -> tuple[tuple[int, int, int], ...]:
    """(code j, byte k, shift) for every code/byte overlap; shift > 0 is a left
    shift of the code into the byte, < 0 a right shift."""
    g, _ = group_size(bits)
    out = []
    for j in range(g):
        start = j * bits
        for k in range(start // 8, (start + bits - 1) // 8 + 1):
            out.append((j, k, start - 8 * k))
    return tuple(out)


def _check_codes(codes: torch.Tensor) -> torch.Tensor:
    if codes.dtype != torch.uint8:
        raise ConfigError(f"codes: dtype {codes.dtype}, expected torch.uint8")
    return codes.reshape(-1)


#: for b in (1, 2, 4) a group of G = 8/b codes fills one byte; read the G code
#: bytes as one little-endian word v (code j at bit 8j), then the packed byte is
#: the low byte of OR_j (v >> j*(8-b)): every other code lands outside bits 0..7.
_WORD_DTYPE = {1: "int64", 2: "int32", 4: "int16"}  # torch dtype names
_UNPACK_MASK = {1: 0x0101010101010101, 2: 0x03030303, 4: 0x0F0F}
_MASKED_WORD = {3: "int64", 6: "int32"}


def pack_bits_torch(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Fast torch packing (same bytes as :func:`pack_bits_ref`)."""
    check_bits(bits)
    codes = _check_codes(codes)
    n = codes.numel()
    if bits == 8:
        return codes.clone()
    g, gb = group_size(bits)
    pad = (-n) % g
    if pad:
        codes = torch.nn.functional.pad(codes, (0, pad))
    if bits in _WORD_DTYPE and codes.is_contiguous():
        v = codes.view(getattr(torch, _WORD_DTYPE[bits]))
        acc = workspace("pack_acc", v.numel(), v.dtype, v.device).copy_(v)
        t = workspace("pack_t", v.numel(), v.dtype, v.device)
        for j in range(1, g):
            acc |= torch.bitwise_right_shift(v, j * (8 - bits), out=t)
        return acc.to(torch.uint8)[: packed_nbytes(n, bits)]
    if bits in _MASKED_WORD and codes.is_contiguous():
        # b = 3 (6): the G = 8 (4) code bytes as one int64 (int32) word; code j
        # moves from bit 8j to bit bj, masked because other codes would collide;
        # the low GB = 3 bytes of each word are the packed group.
        dt = getattr(torch, _MASKED_WORD[bits])
        v = codes.view(dt)
        acc = workspace("pack_acc", v.numel(), dt, v.device).copy_(v).bitwise_and_((1 << bits) - 1)
        t = workspace("pack_t", v.numel(), dt, v.device)
        for j in range(1, g):
            torch.bitwise_right_shift(v, j * (8 - bits), out=t)
            acc |= t.bitwise_and_(((1 << bits) - 1) << (j * bits))
        wb = torch.empty((), dtype=dt).element_size()
        return acc.view(torch.uint8).view(-1, wb)[:, :gb].reshape(-1)[: packed_nbytes(n, bits)]
    c = codes.view(-1, g)
    out = torch.zeros((c.shape[0], gb), dtype=torch.uint8, device=codes.device)
    for j, k, sh in _terms(bits):
        col = c[:, j]
        if sh > 0:
            col = col << sh  # uint8: high bits fall off, as the format wants
        elif sh < 0:
            col = col >> (-sh)
        out[:, k] |= col
    return out.view(-1)[: packed_nbytes(n, bits)]


def unpack_bits_torch(packed: torch.Tensor, bits: int, n: int, *, scratch: bool = False) -> torch.Tensor:
    """Fast torch unpacking (same codes as :func:`unpack_bits_ref`). ``scratch=True``
    returns a view of a reused buffer (valid until the next call)."""
    packed = check_packed(packed, bits, n)
    if bits == 8:
        return packed.clone()
    g, gb = group_size(bits)
    groups = -(-n // g)
    pad = groups * gb - packed.numel()
    if pad:
        packed = torch.nn.functional.pad(packed, (0, pad))
    if bits in _WORD_DTYPE:
        dt = getattr(torch, _WORD_DTYPE[bits])
        m = packed.numel()
        v = workspace("unpack_v", m, dt, packed.device).copy_(packed)
        acc = workspace("unpack_acc", m, dt, packed.device) if scratch else torch.empty(m, dtype=dt, device=packed.device)
        acc.copy_(v)
        t = workspace("unpack_t", m, dt, packed.device)
        for j in range(1, g):
            acc |= torch.bitwise_left_shift(v, j * (8 - bits), out=t)
        acc &= _UNPACK_MASK[bits]
        return acc.view(torch.uint8)[:n]
    if bits in _MASKED_WORD:
        dt = getattr(torch, _MASKED_WORD[bits])
        wb = torch.empty((), dtype=dt).element_size()
        w = workspace("unpack_w", groups * wb, torch.uint8, packed.device).view(groups, wb)
        w[:, gb:] = 0
        w[:, :gb] = packed.view(groups, gb)
        v = w.view(dt).view(-1)
        acc = workspace("unpack_acc", groups, dt, packed.device) if scratch else \
            torch.empty(groups, dtype=dt, device=packed.device)
        t = workspace("unpack_t", groups, dt, packed.device)
        acc.copy_(v).bitwise_and_((1 << bits) - 1)
        for j in range(1, g):
            torch.bitwise_left_shift(v, j * (8 - bits), out=t)
            acc |= t.bitwise_and_(((1 << bits) - 1) << (8 * j))
        return acc.view(torch.uint8)[:n]
    p = packed.view(-1, gb)
    out = torch.empty((groups, g), dtype=torch.uint8, device=packed.device)
    mask = (1 << bits) - 1
    first = set()
    for j, k, sh in _terms(bits):
        col = p[:, k]
        if sh > 0:
            col = col >> sh
        elif sh < 0:
            col = col << (-sh)
        if j in first:
            out[:, j] |= col
        else:
            out[:, j] = col
            first.add(j)
    if bits != 8:
        out &= mask
    return out.view(-1)[:n]


# ---------------------------------------------------------------- Triton
if HAS_TRITON:
    from perfsim.kernels._tl_words import (codes_word, group_elements, load_word, store_word_bytes,
                                           word_codes)

    @triton.jit
    def _pack_kernel(codes_ptr, out_ptr, n, nbytes, BITS: tl.constexpr, G: tl.constexpr,
                     GB: tl.constexpr, BLOCK: tl.constexpr):
        grp, idx = group_elements(tl.program_id(0), G, BLOCK)
        c = tl.load(codes_ptr + idx, mask=idx < n, other=0).to(tl.int32)
        store_word_bytes(out_ptr, grp, codes_word(c, BITS, G), grp >= 0, nbytes, GB)

    @triton.jit
    def _unpack_kernel(packed_ptr, out_ptr, n, nbytes, BITS: tl.constexpr, G: tl.constexpr,
                       GB: tl.constexpr, BLOCK: tl.constexpr):
        grp, idx = group_elements(tl.program_id(0), G, BLOCK)
        c = word_codes(load_word(packed_ptr, grp, nbytes, GB, BLOCK), BITS, G)
        tl.store(out_ptr + idx, c.to(tl.uint8), mask=idx < n)


def _pack_bits_triton(codes: torch.Tensor, bits: int, block: int = 1024) -> torch.Tensor:
    check_bits(bits)
    codes = _check_codes(codes).contiguous()
    n = codes.numel()
    nbytes = packed_nbytes(n, bits)
    out = torch.empty(nbytes, dtype=torch.uint8, device=codes.device)
    if n == 0:
        return out
    g, gb = group_size(bits)
    grid = (cdiv(-(-n // g), block),)
    _pack_kernel[grid](codes, out, n, nbytes, BITS=bits, G=g, GB=gb, BLOCK=block, **launch_opts())
    return out


def _unpack_bits_triton(packed: torch.Tensor, bits: int, n: int, block: int = 1024) -> torch.Tensor:
    check_bits(bits)
    packed = packed.reshape(-1).contiguous()
    if packed.dtype != torch.uint8 or packed.numel() != packed_nbytes(n, bits):
        return unpack_bits_torch(packed, bits, n)  # raises the ConfigError
    out = torch.empty(n, dtype=torch.uint8, device=packed.device)
    if n == 0:
        return out
    g, gb = group_size(bits)
    grid = (cdiv(-(-n // g), block),)
    _unpack_kernel[grid](packed, out, n, packed.numel(), BITS=bits, G=g, GB=gb, BLOCK=block,
                         **launch_opts())
    return out


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes: Triton for CUDA tensors, the fast torch path otherwise."""
    if use_triton(codes):
        return _pack_bits_triton(codes, bits)
    return pack_bits_torch(codes, bits)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Unpack ``n`` uint8 codes: Triton for CUDA tensors, the fast torch path otherwise."""
    if use_triton(packed):
        return _unpack_bits_triton(packed, bits, n)
    return unpack_bits_torch(packed, bits, n)


__all__ = ["pack_bits", "unpack_bits", "pack_bits_torch", "unpack_bits_torch", "pack_bits_ref",
           "unpack_bits_ref", "_pack_bits_triton", "_unpack_bits_triton"]
