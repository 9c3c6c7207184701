"""topk: exact wire size, kept entries, quantized values, bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsim.compression import make_compressor
from perfsim.errors import ConfigError

from _helpers import assert_payload_is_wire_size


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(0, 12), min_size=0, max_size=3).map(tuple),
       frac=st.sampled_from(["0.01", "0.2", "0.5", "1"]), bits=st.sampled_from([2, 3, 4, 6, 8]))
def test_wire_bytes_equals_payload(shape, frac, bits):
    assert_payload_is_wire_size(f"topk:{frac}:{bits}", shape)


def test_wire_bytes_formula_and_index_width():
    c = make_compressor("topk:0.2:8")
    rows, cols = 1024, 1600
    k = 320
    assert c.wire_bytes((1, rows, cols)) == rows * k * 2 + rows * k + 4 * rows  # int16 indices
    assert c.wire_bytes((10, 200)) == 10 * 40 * 1 + 10 * 40 + 40                # uint8 indices
    assert c.wire_bytes((2, 40000)) == 2 * 8000 * 4 + 2 * 8000 + 8              # int32 indices
    assert c.wire_bytes((0, 5)) == 0


def test_keeps_the_largest_entries_per_row():
    x = torch.randn(6, 50)
    c = make_compressor("topk:0.1:8:det")
    y = c.decompress(c.compress(x))
    k = 5
    for r in range(6):
        kept = set(torch.nonzero(y[r]).flatten().tolist())
        top = set(torch.topk(x[r].abs(), k).indices.tolist())
        assert kept <= top and len(kept) >= k - 1  # a kept value may round to exactly 0
        step = 2 * x[r].abs().max() / 255
        idx = list(top)
        assert torch.all((y[r, idx] - x[r, idx]).abs() <= step / 2 * 1.0001)
    assert torch.all(y[x.abs() < x.abs().topk(k, dim=1).values[:, -1:]] == 0)


def test_stochastic_values_unbiased_on_support():
    x = torch.randn(4, 20)
    c = make_compressor("topk:0.5:2", seed=3)
    draws = 500
    mean = sum(c.decompress(c.compress(x)).double() for _ in range(draws)) / draws
    mask = mean != 0
    step = 2 * x.abs().amax(1, keepdim=True).double() / 3
    err = (mean - x.double()).abs()
    assert torch.all(err[mask] <= (5 * step / (2 * math.sqrt(draws))).expand_as(err)[mask])


def test_full_fraction_is_directq_with_indices():
    x = torch.randn(3, 9)
    t = make_compressor("topk:1:8:det")
    d = make_compressor("directq:8:det")
    assert torch.equal(t.decompress(t.compress(x)), d.decompress(d.compress(x)))


def test_state_and_bad_input():
    c = make_compressor("topk:0.3:4", seed=2)
    x = torch.randn(5, 10)
    st_ = c.state_dict()
    a = c.compress(x).tensors["codes"]
    c2 = make_compressor("topk:0.3:4", seed=2)
    c2.load_state_dict(st_)
    assert torch.equal(c2.compress(x).tensors["codes"], a)
    for spec in ("topk", "topk:0.2", "topk:0:8", "topk:1.5:8", "topk:x:8", "topk:0.2:5", "topk:0.2:8:q",
                 "topk:nan:8"):
        with pytest.raises(ConfigError):
            make_compressor(spec)
    with pytest.raises(ConfigError):
        c.compress(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ConfigError):
        c.compress(torch.ones(2, 2, dtype=torch.int32))
    z = torch.zeros(2, 10)
    assert torch.equal(c.decompress(c.compress(z)), z)
    p = c.compress(x)
    p.tensors["indices"] = p.tensors["indices"][:-1]
    with pytest.raises(ConfigError):
        c.decompress(p)
