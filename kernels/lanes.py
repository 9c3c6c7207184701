"""Packed integer lanes whose integer sum is the sum of the lanes (a low-bit allreduce).

Non-negative codes ``c < 2**b`` of ``W`` workers sum to at most ``W (2**b - 1) <
2**L`` with ``L = b + ceil(log2 W)`` bits: the lane width. ``k = 63 // L`` lanes
go into one signed 64-bit word (the sign bit stays clear, so no partial sum is
ever negative or wraps), and adding the words of all workers -- an ordinary
``SUM`` allreduce of int64, which gloo and NCCL both provide -- adds every lane
independently: no carry crosses a lane because no lane sum reaches ``2**L``.

Layout (strided, so packing is ``k`` shifted adds of contiguous slices): the
``n`` codes are zero-padded to ``k * m`` with ``m = ceil(n / k)`` words; code
``i`` sits in word ``i % m``, lane ``i // m`` (bits ``L * (i // m)`` upwards).

This answers the multiscale paper's "Limitations of the framework" (App. A:
2- and 4-bit codes travel as int8 because collectives lack sub-byte types):
the wire carries ``64 / k`` bits per value, e.g. 5.33 for 4-bit codes over 2 or
3 workers, instead of 8 or 16.

Faces: :func:`pack_lanes_ref` / :func:`unpack_lanes_ref` in plain torch (any
device), and Triton kernels (one pass each: a program owns ``BLOCK`` words and
gathers / scatters their ``k`` lanes with strided loads / stores), byte-exact
with the references (``tests/kernels/test_lanes.py``, under ``TRITON_INTERPRET=1``). The
public :func:`pack_lanes` / :func:`unpack_lanes` take the kernel for CUDA
tensors when Triton is available (:func:`perfsim.kernels._triton.use_triton`),
the reference otherwise.
"""

from __future__ import annotations

import math

from perfsim._lazy import torch

from perfsim.kernels._triton import HAS_TRITON, cdiv, launch_opts, require_triton, tl, triton, use_triton

WORD_BITS = 63  # usable bits of a signed int64 word (the sign bit stays 0)


def lane_bits(code_bits: int, world_size: int) -> int:
    """``L = b + ceil(log2 W)``: room for the sum of ``W`` codes of ``b`` bits."""
    if code_bits < 1 or world_size < 1:
        raise ValueError(f"lane_bits({code_bits}, {world_size}): both must be >= 1")
    return int(code_bits) + math.ceil(math.log2(world_size))


def lanes_per_word(code_bits: int, world_size: int) -> int:
    """Lanes in one int64 word (>= 1; 0 means the sum cannot fit in 63 bits)."""
    return WORD_BITS // lane_bits(code_bits, world_size)


def packed_words(n: int, code_bits: int, world_size: int) -> int:
    """int64 words carrying ``n`` codes: ``ceil(n / k)``."""
    k = lanes_per_word(code_bits, world_size)
    if k < 1:
        raise ValueError(f"{code_bits}-bit codes over {world_size} workers do not fit a 63-bit word")
    return -(-int(n) // k)


def pack_lanes_ref(codes: torch.Tensor, code_bits: int, world_size: int) -> torch.Tensor:
    """Pack non-negative integer ``codes`` (any integer dtype, each ``< 2**code_bits``)
    into int64 words with lanes wide enough for a ``world_size``-worker sum."""
    n = codes.numel()
    k = lanes_per_word(code_bits, world_size)
    m = packed_words(n, code_bits, world_size)
    width = lane_bits(code_bits, world_size)
    padded = torch.zeros(k * m, dtype=torch.int64, device=codes.device)
    padded[:n] = codes.reshape(-1)
    rows = padded.view(k, m)
    out = rows[0].clone()
    for j in range(1, k):
        out.add_(rows[j] << (width * j))
    return out


def unpack_lanes_ref(words: torch.Tensor, n: int, code_bits: int, world_size: int) -> torch.Tensor:
    """The ``n`` lane values (int64) of words packed by :func:`pack_lanes_ref`,
    or of their sum over up to ``world_size`` workers."""
    k = lanes_per_word(code_bits, world_size)
    m = packed_words(n, code_bits, world_size)
    _check_words(words, n, m)
    width = lane_bits(code_bits, world_size)
    mask = (1 << width) - 1
    out = torch.empty((k, m), dtype=torch.int64, device=words.device)
    for j in range(k):
        torch.bitwise_and(words >> (width * j), mask, out=out[j])
    return out.view(-1)[:n]


def _check_words(words: torch.Tensor, n: int, m: int) -> None:
    if words.numel() != m or words.dtype != torch.int64:
        raise ValueError(f"unpack_lanes: expected {m} int64 words for {n} codes, got "
                         f"{words.numel()} {words.dtype}")


# ---------------------------------------------------------------- Triton
if HAS_TRITON:

    @triton.jit
    def _pack_lanes_kernel(c_ptr, out_ptr, n, m, K: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
        w = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = w < m
        acc = tl.zeros([BLOCK], dtype=tl.int64)
        for j in tl.static_range(K):  # code j*m + w is lane j of word w
            i = j * m + w
            c = tl.load(c_ptr + i, mask=live & (i < n), other=0).to(tl.int64)
            acc += c << (WIDTH * j)  # an add, as the reference (lanes never overlap)
        tl.store(out_ptr + w, acc, mask=live)

    @triton.jit
    def _unpack_lanes_kernel(w_ptr, out_ptr, n, m, K: tl.constexpr, WIDTH: tl.constexpr,
                             BLOCK: tl.constexpr):
        w = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = w < m
        word = tl.load(w_ptr + w, mask=live, other=0)
        mask = (tl.full([BLOCK], 1, tl.int64) << WIDTH) - 1
        for j in tl.static_range(K):
            i = j * m + w
            tl.store(out_ptr + i, (word >> (WIDTH * j)) & mask, mask=live & (i < n))


def pack_lanes_triton(codes: torch.Tensor, code_bits: int, world_size: int, block: int = 1024) -> torch.Tensor:
    """Triton face of :func:`pack_lanes_ref` (same words, one pass)."""
    require_triton()
    n = codes.numel()
    k, m = lanes_per_word(code_bits, world_size), packed_words(n, code_bits, world_size)
    flat = codes.reshape(-1)
    flat = (flat.to(torch.uint8) if flat.dtype == torch.bool else flat).contiguous()
    out = torch.empty(m, dtype=torch.int64, device=codes.device)
    if m:
        _pack_lanes_kernel[(cdiv(m, block),)](flat, out, n, m, K=k, WIDTH=lane_bits(code_bits, world_size),
                                                     BLOCK=block, **launch_opts())
    return out


def unpack_lanes_triton(words: torch.Tensor, n: int, code_bits: int, world_size: int,
                        block: int = 1024) -> torch.Tensor:
    """Triton face of :func:`unpack_lanes_ref` (same values, one pass)."""
    require_triton()
    k, m = lanes_per_word(code_bits, world_size), packed_words(n, code_bits, world_size)
    _check_words(words, n, m)
    out = torch.empty(n, dtype=torch.int64, device=words.device)
    if m:
        _unpack_lanes_kernel[(cdiv(m, block),)](words.contiguous(), out, n, m, K=k,
                                                       WIDTH=lane_bits(code_bits, world_size), BLOCK=block,
                                                       **launch_opts())
    return out


# ---------------------------------------------------------------- public
def pack_lanes(codes: torch.Tensor, code_bits: int, world_size: int) -> torch.Tensor:
    """Pack ``codes`` into summable int64 words: the Triton kernel for CUDA
    tensors (when available), else :func:`pack_lanes_ref` -- the same words."""
    if use_triton(codes):
        return pack_lanes_triton(codes, code_bits, world_size)
    return pack_lanes_ref(codes, code_bits, world_size)


def unpack_lanes(words: torch.Tensor, n: int, code_bits: int, world_size: int) -> torch.Tensor:
    """The ``n`` lane values of (summed) packed words: the Triton kernel for CUDA
    tensors (when available), else :func:`unpack_lanes_ref`."""
    if use_triton(words):
        return unpack_lanes_triton(words, n, code_bits, world_size)
    return unpack_lanes_ref(words, n, code_bits, world_size)
