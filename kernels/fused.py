"""Single-pass Triton kernels: bucket max-abs, rounding and packing in one read.

The two-pass encoders (:mod:`quant`, :mod:`aqsgd_step`) first reduce each bucket's
max-abs with torch and then quantize in a second kernel, so the input crosses
memory twice (and AQ-SGD's ``a - m`` a third time). When a bucket fits in one
program (``bucket <= MAX_FUSED_BUCKET``) and packed groups never straddle two
buckets (``bucket % G == 0``, G codes per packed group), one program can hold
``R`` whole buckets in registers: it reduces their scales, rounds, packs and
stores, reading the input exactly once -- the memory-bound minimum.

Every float32 expression is the one of :mod:`quant` (module docstring), in the
same order, with torch's ``a = fl(fl(1/s) * L/2)`` (IEEE ``div_rn`` reciprocal) and fp
contraction disabled at launch, so the bytes, scales and AQ-SGD buffer are
identical to the references for the same key.
"""

from __future__ import annotations

from perfsim._lazy import torch

from perfsim.kernels._triton import HAS_TRITON, launch_opts, tl, triton
from perfsim.kernels.packing import group_size, packed_nbytes
from perfsim.kernels.quant import levels, num_buckets, round_const

#: the largest bucket one program holds (elements, padded to a power of two)
MAX_FUSED_BUCKET = 8192
#: elements one program holds at most (R buckets x padded bucket), and its warps
#: (None: Triton's default); benchmarks/tune_kernels.py sweeps both
_PROGRAM_ELEMS = 4096
_NUM_WARPS: int | None = None


def fusable(bucket: int, bits: int) -> bool:
    """Whether the single-pass kernels handle this bucket size and width."""
    g, _ = group_size(bits)
    return HAS_TRITON and 1 <= bucket <= MAX_FUSED_BUCKET and bucket % g == 0


def _layout(n: int, bucket: int) -> tuple[int, int, int]:
    """(padded bucket BP, buckets per program R, programs)."""
    bp = triton.next_power_of_2(bucket)
    r = max(1, _PROGRAM_ELEMS // bp)
    nb = num_buckets(n, bucket)
    r = min(r, triton.next_power_of_2(nb))
    return bp, r, triton.cdiv(nb, r)


if HAS_TRITON:
    from perfsim.kernels._tl_words import round_codes, store_word_bytes

    @triton.jit
    def _max_nan(a, b):
        """max that keeps NaN, so a NaN anywhere in a bucket makes its scale NaN (as amax)."""
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _round_pack_store(v, s, rows, cols, idx, valid, out_ptr, n, nbytes, bucket, key, kc,
                          HALF, LF, BITS: tl.constexpr, G: tl.constexpr, GB: tl.constexpr,
                          STOCH: tl.constexpr, R: tl.constexpr, BP: tl.constexpr):
        """Codes of ``v`` ([R, BP], scales ``s`` [R]) packed and stored; returns the codes."""
        # torch evaluates ``(L/2) / s`` as ``fl(fl(1/s) * L/2)`` (Tensor.__rtruediv__ is
        # reciprocal-then-multiply): the same two roundings, IEEE reciprocal
        r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), tl.maximum(s, 1.1754943508222875e-38))
        a = tl.where(s > 0, r * HALF, 0.0)
        c = round_codes(v * a[:, None], idx, valid, key, kc, LF, STOCH)
        j = tl.arange(0, G)
        c3 = tl.reshape(c, (R, BP // G, G))
        word = tl.sum(c3 << (j[None, None, :] * BITS), axis=2)
        gcol = tl.arange(0, BP // G)
        grp = (rows[:, None] * bucket) // G + gcol[None, :]
        gvalid = (gcol[None, :] * G < bucket) & (grp * G < n)
        store_word_bytes(out_ptr, grp, word, gvalid, nbytes, GB)
        return c

    @triton.jit
    def _fused_quant_pack_kernel(x_ptr, s_ptr, out_ptr, n, nbytes, nbuckets, bucket, key, kc,
                                 HALF, LF, BITS: tl.constexpr, G: tl.constexpr, GB: tl.constexpr,
                                 STOCH: tl.constexpr, R: tl.constexpr, BP: tl.constexpr):
        rows = tl.program_id(0) * R + tl.arange(0, R)
        cols = tl.arange(0, BP)
        idx = rows[:, None] * bucket + cols[None, :]
        valid = (cols[None, :] < bucket) & (idx < n)
        x = tl.load(x_ptr + idx, mask=valid, other=0.0)
        s = tl.reduce(tl.abs(x), 1, _max_nan)
        tl.store(s_ptr + rows, s, mask=rows < nbuckets)
        _round_pack_store(x, s, rows, cols, idx, valid, out_ptr, n, nbytes, bucket, key, kc,
                          HALF, LF, BITS, G, GB, STOCH, R, BP)

    @triton.jit
    def _fused_aqsgd_step_kernel(a_ptr, m_ptr, s_ptr, out_ptr, n, nbytes, nbuckets, bucket, key,
                                 kc, HALF, LF, STEP, BITS: tl.constexpr, G: tl.constexpr,
                                 GB: tl.constexpr, STOCH: tl.constexpr, R: tl.constexpr,
                                 BP: tl.constexpr):
        rows = tl.program_id(0) * R + tl.arange(0, R)
        cols = tl.arange(0, BP)
        idx = rows[:, None] * bucket + cols[None, :]
        valid = (cols[None, :] < bucket) & (idx < n)
        a = tl.load(a_ptr + idx, mask=valid, other=0.0)
        m = tl.load(m_ptr + idx, mask=valid, other=0.0)
        delta = a - m
        s = tl.reduce(tl.abs(delta), 1, _max_nan)
        tl.store(s_ptr + rows, s, mask=rows < nbuckets)
        c = _round_pack_store(delta, s, rows, cols, idx, valid, out_ptr, n, nbytes, bucket, key,
                              kc, HALF, LF, BITS, G, GB, STOCH, R, BP)
        d = s * STEP  # decode_step: fl(s * fl32(2/L))
        dq = c.to(tl.float32) * d[:, None]
        dq = dq - s[:, None]
        # a bucket with NaN/Inf keeps its buffer rows (the caller raises): never store them
        tl.store(m_ptr + idx, m + dq, mask=valid & (s < float("inf"))[:, None])


def _launch(kernel, tensors, n: int, bits: int, bucket: int, key: int | None, extra=()):
    g, gb = group_size(bits)
    bp, r, progs = _layout(n, bucket)
    nbytes = packed_nbytes(n, bits)
    dev = tensors[0].device
    s = torch.empty(num_buckets(n, bucket), dtype=torch.float32, device=dev)
    out = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if n == 0:
        return out, s
    L = levels(bits)
    kernel[(progs,)](*tensors, s, out, n, nbytes, s.numel(), bucket, 0 if key is None else int(key),
                     round_const(bits, key is not None), L / 2, float(L), *extra,
                     BITS=bits, G=g, GB=gb, STOCH=key is not None, R=r, BP=bp, **launch_opts(),
                     **({"num_warps": _NUM_WARPS} if _NUM_WARPS else {}))
    return out, s


def fused_quantize_pack(xf: torch.Tensor, bits: int, *, bucket: int, key: int | None = None):
    """``(packed, scales)`` of a flat contiguous float32 tensor, in one pass."""
    return _launch(_fused_quant_pack_kernel, (xf,), xf.numel(), bits, bucket, key)


def fused_aqsgd_step(af: torch.Tensor, mf: torch.Tensor, bits: int, *, bucket: int,
                     key: int | None = None):
    """AQ-SGD sender step in one pass: ``(packed, scales)`` of ``Q(a - m)``; ``m`` updated."""
    import numpy as np

    step = float(np.float32(2.0 / levels(bits)))
    return _launch(_fused_aqsgd_step_kernel, (af, mf), af.numel(), bits, bucket, key, (step,))
