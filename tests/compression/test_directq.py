"""directq: spec parsing, exact wire size, numerics, determinism, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsim.compression import make_compressor, make_pipeline_pair
from perfsim.errors import ConfigError

from _helpers import assert_payload_is_wire_size, assert_resumes_from_state

shapes = st.lists(st.integers(0, 9), min_size=0, max_size=4).map(tuple)


@settings(max_examples=50, deadline=None)
@given(shape=shapes, bits=st.sampled_from([2, 3, 4, 6, 8]),
       opt=st.sampled_from(["", ":det", ":bucket=5", ":det:bucket=1", ":bucket=64"]))
def test_wire_bytes_equals_payload(shape, bits, opt):
    assert_payload_is_wire_size(f"directq:{bits}{opt}", shape)


def test_wire_bytes_formula_gpt2xl_boundary():
    c = make_compressor("directq:4")
    # 1 x 1024 x 1600: 4-bit codes + one fp32 scale per 1600-element row
    assert c.wire_bytes((1, 1024, 1600)) == 1024 * 1600 // 2 + 4 * 1024
    assert make_compressor("directq:3").wire_bytes((1, 1024, 1600)) == 1024 * 1600 * 3 // 8 + 4 * 1024
    assert make_compressor("directq:4:bucket=512").wire_bytes((1000,)) == 500 + 4 * 2


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("seed", [0, 56, 165])
def test_error_bounded_by_one_step(bits, seed):
    x = torch.randn(4, 33, 17, generator=torch.Generator().manual_seed(seed))
    for spec, frac in ((f"directq:{bits}", 1.0), (f"directq:{bits}:det", 0.5)):
        c = make_compressor(spec)
        y = c.decompress(c.compress(x))
        amax = x.abs().amax(-1, keepdim=True)
        step = 2 * amax / (2 ** bits - 1)
        # plus fp32 rounding of values of that magnitude (8 bits, seed 165: 4e-7 over)
        assert torch.all((y - x).abs() <= frac * step + 4 * torch.finfo(torch.float32).eps * amax), spec


def test_stochastic_rounding_unbiased_over_draws():
    x = torch.randn(6, 40)
    c = make_compressor("directq:2", seed=11)
    draws = 600
    mean = sum(c.decompress(c.compress(x)).double() for _ in range(draws)) / draws
    step = 2 * x.abs().amax(-1, keepdim=True).double() / 3
    assert torch.all((mean - x.double()).abs() <= 5 * step / (2 * draws ** 0.5))
    # deterministic rounding of the same data is biased for some elements
    d = make_compressor("directq:2:det")
    assert (d.decompress(d.compress(x)) - x).abs().max() > 0.1


def test_seeded_and_resumable():
    x = torch.randn(3, 50)
    a, b = make_compressor("directq:3", seed=5), make_compressor("directq:3", seed=5)
    assert torch.equal(a.compress(x).tensors["codes"], b.compress(x).tensors["codes"])
    assert_resumes_from_state("directq:3", x, seed=5)
    # different seeds draw different bits
    other = make_compressor("directq:3", seed=6)
    assert not torch.equal(other.compress(x).tensors["codes"], make_compressor("directq:3", seed=5).compress(x).tensors["codes"])
    with pytest.raises(ConfigError):
        a.load_state_dict({"bogus": 1})


def test_exact_results_for_zero_and_empty():
    c = make_compressor("directq:4")
    z = torch.zeros(5, 7)
    assert torch.equal(c.decompress(c.compress(z)), z)
    e = torch.zeros(0, 7)
    p = c.compress(e)
    assert p.nbytes == 0 and c.decompress(p).shape == (0, 7)
    # a row of zeros next to a non-zero row stays exactly zero
    x = torch.randn(2, 7)
    x[0] = 0
    assert torch.equal(c.decompress(c.compress(x))[0], torch.zeros(7))


def test_half_precision_inputs_keep_their_dtype():
    c = make_compressor("directq:8")
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.randn(3, 10, dtype=dt)
        y = c.decompress(c.compress(x))
        assert y.dtype == dt and torch.allclose(y.double(), x.double(), atol=0.05)


@pytest.mark.parametrize("bad", [torch.tensor([1.0, float("nan")]), torch.tensor([float("inf"), 0.0]),
                                 torch.tensor([1, 2, 3]), torch.tensor([True, False])])
def test_bad_tensors_raise(bad):
    with pytest.raises(ConfigError):
        make_compressor("directq:4").compress(bad)


@pytest.mark.parametrize("spec", ["directq", "directq:5", "directq:1", "directq:x", "directq:4:foo",
                                  "directq:4:bucket=0", "directq:4:bucket=x"])
def test_bad_specs_raise(spec):
    with pytest.raises(ConfigError):
        make_compressor(spec)


def test_pipeline_pair_and_payload_checks():
    fw, bw = make_pipeline_pair("directq:fw4bw8")
    assert (fw.spec, bw.spec) == ("directq:4", "directq:8")
    c = make_compressor("directq:4")
    p = c.compress(torch.randn(4, 4))
    p.tensors["codes"] = p.tensors["codes"][:-1]
    with pytest.raises(ConfigError):
        c.decompress(p)
    del p.tensors["scales"]
    with pytest.raises(ConfigError):
        c.decompress(p)
