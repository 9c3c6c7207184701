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

import functools

from perfsim._lazy import torch

from perfsim.kernels._triton import HAS_TRITON, INTERPRET, cdiv, launch_opts, next_pow2, tl, triton
from perfsim.kernels.packing import group_size, packed_nbytes
from perfsim.kernels.quant import MAX_ABS, levels, num_buckets, round_const, step_const

#: the largest bucket one program holds (elements, padded to a power of two)
MAX_FUSED_BUCKET = 8192
#: elements one program holds at most (R buckets x padded bucket), and its warps
#: (None: Triton's default): the fixed launch shape, taken under the interpreter, when
#: ``AUTOTUNE`` is off, and by benchmarks/tune_kernels.py's sweep
_PROGRAM_ELEMS = 4096
_NUM_WARPS: int | None = None
#: on a GPU the launch shape is chosen by ``triton.autotune`` among ``TUNE_SHAPES``
#: (elements per program, warps), once per (size class, bucket, bits, rounding) and cached
AUTOTUNE = not INTERPRET
TUNE_SHAPES = ((2048, 4), (4096, 4), (4096, 8), (8192, 8))


def fusable(bucket: int, bits: int) -> bool:
    """Whether the single-pass kernels handle this bucket size and width."""
    g, _ = group_size(bits)
    return HAS_TRITON and 1 <= bucket <= MAX_FUSED_BUCKET and bucket % g == 0


def _layout(n: int, bucket: int) -> tuple[int, int, int]:
    """(padded bucket BP, buckets per program R, programs) of the fixed launch shape."""
    bp = next_pow2(bucket)
    r = max(1, _PROGRAM_ELEMS // bp)
    nb = num_buckets(n, bucket)
    r = min(r, next_pow2(nb))
    return bp, r, cdiv(nb, r)


def size_class(n: int) -> int:
    """The autotuning key of an input size: its power of two (one tuning per octave)."""
    return max(int(n) - 1, 0).bit_length()


def _prune(configs, nargs, **kwargs):
    """The tuning shapes that fit this bucket (``R * BP`` elements, ``R`` whole buckets, no
    more buckets than the input has); the fixed shape of :func:`_layout` when none does."""
    bp = kwargs.get("BP", nargs.get("BP"))
    nb = nargs["nbuckets"]
    most = next_pow2(nb)
    fit = [c for c in configs if (c.kwargs["R"] * bp, c.num_warps) in TUNE_SHAPES and c.kwargs["R"] <= most]
    if fit:
        return fit
    r = min(max(1, _PROGRAM_ELEMS // bp), most)  # the fixed shape (_layout)
    return [c for c in configs if c.kwargs["R"] == r][:1]


if HAS_TRITON:
    from perfsim.kernels._tl_words import max_nan, round_codes, store_word_bytes

    @triton.jit
    def _round_pack_store(v, s, rows, cols, idx, valid, out_ptr, n, nbytes, bucket, key,
                          KC: tl.constexpr, HALF: tl.constexpr, LF: tl.constexpr,
                          BITS: tl.constexpr, G: tl.constexpr, GB: tl.constexpr,
                          STOCH: tl.constexpr, R: tl.constexpr, BP: tl.constexpr):
        """Codes of ``v`` ([R, BP], scales ``s`` [R]) packed and stored; returns the codes."""
        # torch evaluates ``(L/2) / s`` as ``fl(fl(1/s) * L/2)`` (Tensor.__rtruediv__ is
        # reciprocal-then-multiply): the same two roundings, IEEE reciprocal
        r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), tl.maximum(s, 1.1754943508222875e-38))
        a = tl.where(s > 0, r * HALF, 0.0)
        c = round_codes(v * a[:, None], idx, valid, key, KC, LF, STOCH)
        j = tl.arange(0, G)
        c3 = tl.reshape(c, (R, BP // G, G))
        word = tl.sum(c3 << (j[None, None, :] * BITS), axis=2)
        gcol = tl.arange(0, BP // G)
        grp = (rows[:, None] * bucket) // G + gcol[None, :]
        gvalid = (gcol[None, :] * G < bucket) & (grp * G < n)
        store_word_bytes(out_ptr, grp, word, gvalid, nbytes, GB)
        return c

    @triton.jit
    def _flag_bad(s, flag_ptr, MAXABS: tl.constexpr):
        """Set the device flag (kernels.finite) when a scale is NaN, Inf or above ``MAXABS``."""
        bad = tl.max(tl.where(s <= MAXABS, 0, 1), axis=0)
        tl.store(flag_ptr, bad, mask=bad > 0)

    @triton.jit
    def _fused_quant_pack_kernel(x_ptr, s_ptr, out_ptr, flag_ptr, n, nbytes, nbuckets, bucket, key,
                                 KC: tl.constexpr, HALF: tl.constexpr, LF: tl.constexpr,
                                 MAXABS: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
                                 GB: tl.constexpr, STOCH: tl.constexpr, R: tl.constexpr,
                                 BP: tl.constexpr):
        rows = tl.program_id(0) * R + tl.arange(0, R)
        cols = tl.arange(0, BP)
        idx = rows[:, None] * bucket + cols[None, :]
        valid = (cols[None, :] < bucket) & (idx < n)
        x = tl.load(x_ptr + idx, mask=valid, other=0.0)
        s = tl.reduce(tl.abs(x), 1, max_nan)
        tl.store(s_ptr + rows, s, mask=rows < nbuckets)
        _flag_bad(s, flag_ptr, MAXABS)
        _round_pack_store(x, s, rows, cols, idx, valid, out_ptr, n, nbytes, bucket, key, KC,
                          HALF, LF, BITS, G, GB, STOCH, R, BP)

    @triton.jit
    def _fused_aqsgd_step_kernel(a_ptr, m_ptr, s_ptr, out_ptr, flag_ptr, n, nbytes, nbuckets,
                                 bucket, key, KC: tl.constexpr, HALF: tl.constexpr, LF: tl.constexpr,
                                 MAXABS: tl.constexpr, STEP: tl.constexpr, BITS: tl.constexpr,
                                 G: tl.constexpr, GB: tl.constexpr, STOCH: tl.constexpr,
                                 R: tl.constexpr, BP: tl.constexpr):
        rows = tl.program_id(0) * R + tl.arange(0, R)
        cols = tl.arange(0, BP)
        idx = rows[:, None] * bucket + cols[None, :]
        valid = (cols[None, :] < bucket) & (idx < n)
        a = tl.load(a_ptr + idx, mask=valid, other=0.0)
        m = tl.load(m_ptr + idx, mask=valid, other=0.0)
        delta = a - m
        s = tl.reduce(tl.abs(delta), 1, max_nan)
        tl.store(s_ptr + rows, s, mask=rows < nbuckets)
        _flag_bad(s, flag_ptr, MAXABS)
        c = _round_pack_store(delta, s, rows, cols, idx, valid, out_ptr, n, nbytes, bucket, key,
                              KC, HALF, LF, BITS, G, GB, STOCH, R, BP)
        d = s * STEP  # decode_step: fl(s * fl32(2/L))
        dq = c.to(tl.float32) * d[:, None]
        dq = dq - s[:, None]
        # a bucket with NaN/Inf keeps its buffer rows (the caller raises): never store them
        tl.store(m_ptr + idx, m + dq, mask=valid & (s < float("inf"))[:, None])


    def _tuned(kernel, restore=()):
        """``kernel`` under ``triton.autotune`` over :data:`TUNE_SHAPES` (results cached on disk
        where this Triton can). :func:`_launch` calls it only when :data:`_BEST` has no shape
        for the input's size class, so the tuning runs once per size class."""
        configs = [triton.Config({"R": 1 << i}, num_warps=w) for i in range(13)
                   for w in sorted({w for _, w in TUNE_SHAPES})]
        opts = dict(key=["n", "bucket", "BITS", "STOCH", "BP"], restore_value=list(restore),
                    prune_configs_by={"early_config_prune": _prune})
        try:
            return triton.autotune(configs, cache_results=True, **opts)(kernel)
        except TypeError:  # a Triton without cache_results: cached per process
            return triton.autotune(configs, **opts)(kernel)

    _TUNED = {_fused_quant_pack_kernel: _tuned(_fused_quant_pack_kernel),
              _fused_aqsgd_step_kernel: _tuned(_fused_aqsgd_step_kernel, ["m_ptr"])}

#: the tuned launch shape of each (kernel, size class, bucket, bits, rounding): after the first
#: call a launch skips triton.autotune's dispatch (tens of microseconds of Python per call,
#: which starves the GPU below ~16 MB)
_BEST: dict[tuple, dict] = {}


@functools.lru_cache(maxsize=256)
def _consts(bits: int, stoch: bool, bucket: int) -> dict:
    """The constexprs of one (width, rounding, bucket): one dict, built once (a launch's Python
    time matters below ~16 MB, where the host, not the GPU, bounds an encode)."""
    g, gb = group_size(bits)
    L = levels(bits)
    return dict(KC=round_const(bits, stoch), HALF=L / 2, LF=float(L), MAXABS=MAX_ABS,
                BITS=bits, G=g, GB=gb, STOCH=stoch, BP=next_pow2(bucket), **launch_opts())


def _launch(kernel, tensors, n: int, bits: int, bucket: int, key: int | None, flag, extra=None):
    nbytes = packed_nbytes(n, bits)
    dev = tensors[0].device
    nb = num_buckets(n, bucket)
    s = torch.empty(nb, dtype=torch.float32, device=dev)
    out = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    if n == 0:
        return out, s
    stoch = key is not None
    args = (*tensors, s, out, flag, n, nbytes, nb, bucket, int(key) if stoch else 0)
    consts = _consts(bits, stoch, bucket)
    if extra:
        consts = dict(consts, **extra)
    if AUTOTUNE:
        k = (id(kernel), size_class(n), bucket, bits, stoch, dev)
        best = _BEST.get(k)
        if best is None:
            tuned = _TUNED[kernel]
            tuned[lambda meta: (cdiv(nb, meta["R"]),)](*args, **consts)
            c = tuned.best_config
            _BEST[k] = best = dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
        else:
            kernel[(cdiv(nb, best["R"]),)](*args, **best, **consts)
    else:
        _, r, progs = _layout(n, bucket)
        kernel[(progs,)](*args, R=r, **consts, **({"num_warps": _NUM_WARPS} if _NUM_WARPS else {}))
    return out, s


def fused_quantize_pack(xf: torch.Tensor, bits: int, *, bucket: int, key: int | None = None,
                        flag: torch.Tensor):
    """``(packed, scales)`` of a flat contiguous float32 tensor, in one pass; sets ``flag``
    (int32 on the device, :mod:`perfsim.kernels.finite`) when a scale is refused."""
    return _launch(_fused_quant_pack_kernel, (xf,), xf.numel(), bits, bucket, key, flag)


def fused_aqsgd_step(af: torch.Tensor, mf: torch.Tensor, bits: int, *, bucket: int,
                     key: int | None = None, flag: torch.Tensor):
    """AQ-SGD sender step in one pass: ``(packed, scales)`` of ``Q(a - m)``; ``m`` updated."""
    return _launch(_fused_aqsgd_step_kernel, (af, mf), af.numel(), bits, bucket, key, flag,
                   {"STEP": step_const(bits)})
