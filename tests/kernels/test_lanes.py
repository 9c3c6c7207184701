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


_INTERP_SCRIPT = """
import torch
from perfsim.kernels.lanes import (pack_lanes_ref, pack_lanes_triton, unpack_lanes_ref, unpack_lanes_triton)
g = torch.Generator().manual_seed(0)
for bits, world in ((1, 1), (2, 2), (4, 2), (4, 3), (8, 9), (3, 64)):
    for n in (0, 1, 11, 300):
        for dtype in (torch.uint8, torch.int32, torch.int64):
            codes = torch.randint(0, 2 ** bits, (n,), generator=g).to(dtype)
            codes[: n // 3] = 2 ** bits - 1  # full lanes
            ref, tri = pack_lanes_ref(codes, bits, world), pack_lanes_triton(codes, bits, world, block=16)
            assert tri.dtype == torch.int64 and torch.equal(ref, tri), (bits, world, n, dtype)
        total = sum(pack_lanes_ref(torch.full((n,), 2 ** bits - 1), bits, world) for _ in range(world))
        assert torch.equal(unpack_lanes_ref(total, n, bits, world), unpack_lanes_triton(total, n, bits, world, block=16))
        assert torch.equal(unpack_lanes_triton(total, n, bits, world, block=16),
                           torch.full((n,), world * (2 ** bits - 1)))
try:
    unpack_lanes_triton(torch.zeros(2, dtype=torch.int64), 30, 4, 2)
except ValueError as e:
    assert "expected 3 int64 words" in str(e)
else:
    raise AssertionError("bad size accepted")
print("CHECKED")
"""


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


@pytest.mark.skipif(not _has_triton(), reason="triton is not installed")
def test_triton_lanes_match_reference_under_interpreter():
    """The Triton pack / unpack kernels give the reference's words and lane sums, byte
    for byte (the interpreter runs them on CPU tensors; a subprocess, since
    TRITON_INTERPRET is read when the kernels are decorated)."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _INTERP_SCRIPT], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CHECKED" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not _has_triton(), reason="needs CUDA and triton")
def test_cuda_lanes_take_the_kernel_and_match_cpu():  # pragma: no cover - needs a GPU
    g = torch.Generator().manual_seed(1)
    for bits, world in ((2, 2), (4, 2), (4, 8), (8, 3)):
        codes = [torch.randint(0, 2 ** bits, (100_003,), generator=g) for _ in range(world)]
        words = [pack_lanes(c.cuda(), bits, world) for c in codes]
        assert all(torch.equal(w.cpu(), pack_lanes_ref(c, bits, world)) for w, c in zip(words, codes))
        total = torch.stack(words).sum(0)
        assert torch.equal(unpack_lanes(total, 100_003, bits, world).cpu(), torch.stack(codes).sum(0))
