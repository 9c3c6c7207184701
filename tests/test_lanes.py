"""Packed integer lanes (kernels/lanes.py): integer addition of packed words adds the lanes."""

from __future__ import annotations

import math

import pytest
import torch

from perfsim.kernels.lanes import (lane_bits, lanes_per_word, pack_lanes, pack_lanes_ref, packed_words,
                                   unpack_lanes, unpack_lanes_ref)


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 8, 9, 64])
@pytest.mark.parametrize("n", [1, 11, 1000])
def test_sum_of_packed_words_is_packed_sum(bits, world, n):
    g = torch.Generator().manual_seed(bits * 100 + world + n)
    codes = [torch.randint(0, 2 ** bits, (n,), generator=g, dtype=torch.int64) for _ in range(world)]
    codes[0][: n // 2] = 2 ** bits - 1  # the largest codes on every worker for some lanes:
    for c in codes[1:]:                   # the lane sum reaches W (2**b - 1), no carry may leak
        c[: n // 2] = 2 ** bits - 1
    words = [pack_lanes(c.to(torch.uint8) if bits <= 8 else c, bits, world) for c in codes]
    assert all(w.dtype == torch.int64 and w.numel() == packed_words(n, bits, world) for w in words)
    assert all(int(w.min()) >= 0 for w in words)
    total = torch.stack(words).sum(0)  # what a SUM allreduce of int64 computes
    assert torch.equal(unpack_lanes(total, n, bits, world), torch.stack(codes).sum(0))
    assert torch.equal(unpack_lanes_ref(words[0], n, bits, world), codes[0])  # one worker round-trips


def test_lane_geometry_is_b_plus_log2_w():
    assert lane_bits(4, 1) == 4 and lane_bits(4, 2) == 5 and lane_bits(4, 3) == 6 and lane_bits(4, 8) == 7
    assert lanes_per_word(4, 2) == 12  # 60 of 63 bits: 5.33 bits per 4-bit code on the wire
    assert 64 / lanes_per_word(2, 2) < 4  # 2-bit codes over 2 workers: 3.05 bits each, not 8
    for b in (2, 4, 8):
        for w in (2, 16, 1000):
            assert lanes_per_word(b, w) * (b + math.ceil(math.log2(w))) <= 63


def test_ref_is_the_public_entry_and_bad_sizes_are_refused():
    c = torch.arange(30) % 16
    assert torch.equal(pack_lanes(c, 4, 2), pack_lanes_ref(c, 4, 2))
    with pytest.raises(ValueError, match="expected 3 int64 words"):
        unpack_lanes(torch.zeros(2, dtype=torch.int64), 30, 4, 2)
