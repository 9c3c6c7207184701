"""Triton helpers shared by every packing kernel: one group of codes <-> its bytes,
and the stochastic rounding that produces the codes.

A group is the smallest run of ``G`` codes of ``BITS`` bits that ends on a byte
boundary (``GB`` bytes, :func:`perfsim.kernels.packing.group_size`); kernels hold
it as one int32 word, lowest code in the lowest bits (the wire format of
:mod:`perfsim.kernels.packing`).
"""

from __future__ import annotations

from perfsim.kernels._triton import HAS_TRITON, tl, triton

if HAS_TRITON:
    from perfsim.kernels.rng import hash_int16_tl

    @triton.jit
    def max_nan(a, b):
        """max that keeps NaN, so a NaN anywhere makes a reduced max NaN (as ``amax``)."""
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def group_elements(pid, G: tl.constexpr, BLOCK: tl.constexpr):
        """The ``[BLOCK]`` group ids of program ``pid`` and the ``[BLOCK, G]`` flat
        indices of their codes."""
        grp = pid * BLOCK + tl.arange(0, BLOCK)
        j = tl.arange(0, G)
        return grp, grp[:, None] * G + j[None, :]

    @triton.jit
    def codes_word(c, BITS: tl.constexpr, G: tl.constexpr):
        """The int32 word of each row of ``[BLOCK, G]`` int32 codes (inverse of :func:`word_codes`)."""
        j = tl.arange(0, G)
        return tl.sum(c << (j[None, :] * BITS), axis=1)

    @triton.jit
    def store_word_bytes(out_ptr, grp, word, valid, nbytes, GB: tl.constexpr):
        """Store byte ``k`` of each ``valid`` group's ``word`` at ``out_ptr[grp * GB + k]``
        (bytes past ``nbytes`` are not written: the last group may be partial)."""
        for k in tl.static_range(GB):
            o = grp * GB + k
            tl.store(out_ptr + o, ((word >> (8 * k)) & 0xFF).to(tl.uint8), mask=valid & (o < nbytes))

    @triton.jit
    def load_word(p_ptr, grp, nbytes, GB: tl.constexpr, BLOCK: tl.constexpr):
        """The int32 word of each group ``grp`` (bytes past ``nbytes`` read as 0)."""
        word = tl.zeros([BLOCK], dtype=tl.int32)
        for k in tl.static_range(GB):
            o = grp * GB + k
            b = tl.load(p_ptr + o, mask=o < nbytes, other=0).to(tl.int32)
            word = word | (b << (8 * k))
        return word

    @triton.jit
    def word_codes(word, BITS: tl.constexpr, G: tl.constexpr):
        """``[BLOCK, G]`` codes of ``[BLOCK]`` words."""
        j = tl.arange(0, G)
        return (word[:, None] >> (j[None, :] * BITS)) & ((1 << BITS) - 1)

    @triton.jit
    def round_codes(y, idx, valid, key, kc, LF, STOCH: tl.constexpr):
        """int32 codes ``floor(clamp(fl(y + kc) [+ s16 * 2**-16], 0, L))`` of the scaled
        values ``y`` (the float32 recipe of :mod:`perfsim.kernels.quant`; ``s16`` the
        hash of element ``idx`` under ``key``), 0 where not ``valid``."""
        y = y + kc
        if STOCH:
            y = y + hash_int16_tl(idx, key).to(tl.float32) * 0.0000152587890625
        y = tl.minimum(tl.maximum(y, 0.0), LF)
        return tl.where(valid, y.to(tl.int32), 0)
