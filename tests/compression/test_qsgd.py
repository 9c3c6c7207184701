"""QSGD (Alistarh et al. 2017): spec parsing, exact wire size, unbiasedness,
the variance of Lemma 3.1, bad input, checkpointed randomness."""

import math

import pytest
import torch

from perfsim.compression import make_compressor
from perfsim.compression.qsgd import QSGD, mix_seed
from perfsim.errors import ConfigError

from _helpers import assert_payload_is_wire_size, assert_resumes_from_state


@pytest.mark.parametrize("spec,s,bits", [("qsgd:4", 7, 4), ("qsgd:2", 1, 2), ("qsgd:8", 127, 8),
                                         ("qsgd:s=5", 5, 4), ("qsgd:s=1", 1, 2), ("qsgd:s=3", 3, 3),
                                         ("qsgd:3:bucket=0", 3, 3)])
def test_spec(spec, s, bits):
    c = make_compressor(spec)
    assert isinstance(c, QSGD) and (c.s, c.bits) == (s, bits)
    assert make_compressor(c.spec).spec == c.spec


@pytest.mark.parametrize("bad", ["qsgd", "qsgd:5", "qsgd:1", "qsgd:0", "qsgd:x", "qsgd:s=0", "qsgd:s=200",
                                 "qsgd:4:s=3", "qsgd:4:foo=1", "qsgd:4:bucket=-1", "qsgd:s=abc"])
def test_bad_spec(bad):
    with pytest.raises(ConfigError):
        make_compressor(bad)


@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 7), (1000,), (513,), (2, 1, 1025), (0,), (4, 0)])
@pytest.mark.parametrize("spec", ["qsgd:2", "qsgd:3", "qsgd:4:bucket=100", "qsgd:6:bucket=0", "qsgd:8"])
def test_wire_bytes_is_payload_size(spec, shape):
    assert_payload_is_wire_size(spec, shape)


def test_wire_bytes_formula():
    c = make_compressor("qsgd:3:bucket=10")
    # 4 buckets of fp32 norms + ceil(35*3/8) bytes of codes
    assert c.wire_bytes((35,)) == 4 * 4 + math.ceil(35 * 3 / 8)


def _draws(c, x, n):
    return torch.stack([c.decompress(c.compress(x)) for _ in range(n)])


def test_unbiased_and_exact_variance():
    """E[Q(v)] = v; E||Q(v) - v||^2 = sum_i ||v||^2 p_i (1 - p_i) / s^2 <= min(d/s^2, sqrt(d)/s) ||v||^2."""
    torch.manual_seed(0)
    c = make_compressor("qsgd:2:bucket=0", seed=3)  # s = 1: the noisiest quantizer
    x = torch.randn(48)
    n = 3000
    d = _draws(c, x, n)
    norm = x.norm()
    p = (x.abs() / norm * c.s) % 1.0
    var_i = norm ** 2 * p * (1 - p) / c.s ** 2
    # unbiased: each coordinate's mean within 5 standard errors
    se = (var_i / n).sqrt() + 1e-7
    assert ((d.mean(0) - x).abs() <= 5 * se).all()
    # exact expected squared error, and QSGD Lemma 3.1's bound
    err = float(((d - x) ** 2).sum(1).mean())  # approx compares plain floats, never tensors
    assert err == pytest.approx(float(var_i.sum()), rel=0.1)
    assert err <= min(48 / c.s ** 2, math.sqrt(48) / c.s) * float(norm) ** 2


def test_bucketed_variance_bound():
    c = make_compressor("qsgd:3:bucket=16", seed=1)
    x = torch.randn(160)
    err = ((_draws(c, x, 400) - x) ** 2).sum(1).mean()
    assert err <= min(16 / c.s ** 2, 4 / c.s) * x.norm() ** 2


def test_codes_stay_in_range_and_exact_levels():
    c = make_compressor("qsgd:4:bucket=0")
    x = torch.zeros(10)
    x[3] = -2.0
    y = c.decompress(c.compress(x))  # one non-zero: |v|/||v|| = 1 -> exactly level s
    assert torch.equal(y, x)


def test_bad_input():
    c = make_compressor("qsgd:4")
    for bad in (torch.tensor([1.0, float("nan")]), torch.tensor([float("inf")]), torch.arange(4)):
        with pytest.raises(ConfigError):
            c.compress(bad)
    z = torch.zeros(3, 7)
    assert torch.equal(c.decompress(c.compress(z)), z)  # documented: all-zero -> exact zeros
    e = torch.empty(0)
    p = c.compress(e)
    assert p.nbytes == 0 and c.decompress(p).numel() == 0


def test_state_roundtrip_and_seeds():
    x = torch.randn(300)
    state = assert_resumes_from_state("qsgd:3", x, seed=5)
    same, other = make_compressor("qsgd:3", seed=5), make_compressor("qsgd:3", seed=6)
    same.load_state_dict(state)
    other.load_state_dict(state)  # the seed is part of every draw, not only of the state
    assert not torch.equal(other.compress(x).tensors["codes"], same.compress(x).tensors["codes"])
    with pytest.raises(ConfigError):
        same.load_state_dict({"bogus": 1})
    assert mix_seed(1, 2, 3) != mix_seed(1, 2, 4) and mix_seed(1, 2) < 2 ** 63


def test_not_allreduce_compatible_plan():
    c = make_compressor("qsgd:4")
    plan = c.dp_plan((1000,), 8)
    assert [s.kind for s in plan] == ["allgather"] and plan[0].nbytes == c.wire_bytes((1000,))


def test_codes_follow_the_documented_counter_hash_recipe():
    """The sent codes are exactly the module docstring's recipe on the kernels'
    counter hash: c = floor(clamp(fl(fl(y + kc) + r_i 2**-16), 0, 2s)), y = x * fl32(s/||v||),
    key = call_key(seed, step, salt) -- recomputed here element by element in numpy."""
    import numpy as np

    from perfsim.kernels.packing import unpack_bits_ref
    from perfsim.kernels.rng import call_key, hash_int16_ref

    x = torch.randn(1000)
    for salt in (0, 3):
        c = make_compressor("qsgd:4:bucket=300", seed=11)
        c._salt = salt
        c.compress(x)  # step 0
        p = c.compress(x)  # step 1
        got = unpack_bits_ref(p.tensors["codes"], 4, 1000).numpy().astype(np.int64)
        r = hash_int16_ref(1000, call_key(11, 1, salt)).numpy().astype(np.float32)
        xs = x.numpy()
        kc = np.float32(7 + 0.5 + 2.0 ** -17)
        want = np.empty(1000, dtype=np.int64)
        for b in range(0, 1000, 300):
            v = xs[b:b + 300]
            norm = p.tensors["norms"][b // 300].item()
            assert norm == pytest.approx(float(np.linalg.norm(v.astype(np.float64))), rel=1e-5)
            a = np.float32(7 / np.float64(np.float32(norm)))
            y = (v * a).astype(np.float32)
            y = (y + kc).astype(np.float32)
            y = (y + r[b:b + 300] * np.float32(2.0 ** -16)).astype(np.float32)
            want[b:b + 300] = np.floor(np.clip(y, 0, 14))
        assert np.array_equal(got, want), salt


def test_rounding_noise_is_a_function_of_seed_step_and_salt():
    x = torch.randn(2000)
    a, b = make_compressor("qsgd:3", seed=5), make_compressor("qsgd:3", seed=5)
    assert torch.equal(a.compress(x).tensors["codes"], b.compress(x).tensors["codes"])  # same (seed, step)
    b._salt = 2  # another rank
    pa, pb = a.compress(x), b.compress(x)
    assert not torch.equal(pa.tensors["codes"], pb.tensors["codes"])
    assert torch.equal(pa.tensors["norms"], pb.tensors["norms"])  # only the noise differs


def test_max_abs_norm_cannot_overflow():
    """qsgd-maxnorm's default max-abs norm of finite values is finite: 3e38 compresses."""
    x = torch.full((10,), 3e38)
    out = make_compressor("qsgd-maxnorm:2").decompress(make_compressor("qsgd-maxnorm:2").compress(x))
    assert torch.isfinite(out).all()
    with pytest.raises(ConfigError, match="NaN or Inf"):
        make_compressor("qsgd-maxnorm:2").compress(torch.tensor([1.0] * 600 + [float("nan")]))


@pytest.mark.parametrize("spec", ["qsgd:4", "ecq:4", "qsgd-maxnorm:2:norm=l2", "qsgd-maxnorm-multiscale:4"])
def test_overflowing_norm_is_a_clear_error(spec):
    """The rule: squares of finite values overflow float32 (3e30**2): the norm is
    taken in float64 and the tensor compresses; a norm above the float32 maximum is
    refused with one line, never an Inf on the wire (NaN/Inf input named as such)."""
    c = make_compressor(spec)
    x = torch.full((10,), 3e30)
    out = c.decompress(c.compress(x))
    assert torch.isfinite(out).all() and float(out.abs().max()) <= 2 * float(x.norm())
    with pytest.raises(ConfigError, match="float32 maximum"):
        make_compressor(spec).compress(torch.full((10,), 3e38))
    with pytest.raises(ConfigError, match="NaN or Inf"):
        make_compressor(spec).compress(torch.tensor([1.0] * 600 + [float("nan")]))  # second bucket


@pytest.mark.parametrize("spec", ["qsgd:4", "ecq:4", "qsgd-maxnorm:4", "qsgd-maxnorm-multiscale:4"])
def test_fp16_results_saturate_instead_of_inf(spec):
    """fp16 gradients near 6e4: a decoded value beyond 65504 saturates there."""
    c = make_compressor(spec)
    x = torch.full((64,), 65000.0, dtype=torch.float16)
    x[0] = -65504.0
    out = c.decompress(c.compress(x))
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert float(out.float().abs().max()) <= 65504.0

