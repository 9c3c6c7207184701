"""Triton helpers shared by every packing kernel: one group of codes <-> its bytes.

A group is the smallest run of ``G`` codes of ``BITS`` bits that ends on a byte
boundary (``GB`` bytes, :func:`perfsim.kernels.packing.group_size`); kernels hold
it as one int32 word, lowest code in the lowest bits (the wire format of
:mod:`perfsim.kernels.packing`).
"""

from __future__ import annotations

from perfsim.kernels._triton import HAS_TRITON, tl, triton

if HAS_TRITON:

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
