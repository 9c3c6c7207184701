"""ECQ-SGD (Wu et al., "Error Compensated Quantized SGD and its Applications to Large-scale
Distributed Optimization", arXiv:1806.08054, eq. 5-9): error recurrence, closed form, state, bad input."""

import math

import pytest
import torch

from perfsim.compression import make_compressor
from perfsim.compression.ecq import ECQ
from perfsim.errors import ConfigError

from _helpers import assert_payload_is_wire_size


def test_spec_defaults_from_paper():
    c = make_compressor("ecq:4")
    assert isinstance(c, ECQ)
    assert (c.s, c.alpha, c.beta, c.bucket) == (7, 0.01, 1.0, 512)  # qsgd.default_chunk(7)
    assert make_compressor("ecq:2").bucket == 16 and make_compressor("ecq:4:bucket=4096").spec == "ecq:4:bucket=4096"
    c = make_compressor("ecq:2:alpha=0.2:beta=0.9:bucket=16")
    assert (c.s, c.alpha, c.beta, c.bucket) == (1, 0.2, 0.9, 16)
    assert make_compressor(c.spec).spec == c.spec
    assert not c.allreduce_compatible and c.dp_plan((100,), 4)[0].kind == "allgather"


def test_alpha_beyond_one_plus_beta_is_refused_with_both_named():
    """Eq. 6-7 with an unbiased Q: E[h_t+1] = (beta - alpha) h_t, so the error grows from alpha > 1 + beta."""
    assert make_compressor("ecq:4:alpha=1.5:beta=0.5").alpha == 1.5  # the edge: |beta - alpha| = 1
    for spec, words in (("ecq:4:alpha=1.2:beta=0.1", ("alpha=1.2", "beta=0.1", "1 + beta")),
                        ("ecq:4:alpha=3", ("alpha=3", "must be in [0, 2]"))):
        with pytest.raises(ConfigError) as e:
            make_compressor(spec)
        assert all(w in str(e.value) for w in words) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("bad", ["ecq", "ecq:5", "ecq:4:alpha=-1", "ecq:4:beta=1.5", "ecq:4:alpha=nan",
                                 "ecq:4:gamma=1", "ecq:4:alpha=x", "ecq:4:bucket=-2", "ecq:4:4"])
def test_bad_spec(bad):
    with pytest.raises(ConfigError):
        make_compressor(bad)


@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 7), (5000,), (0,)])
def test_wire_bytes_is_payload_size(shape):
    assert_payload_is_wire_size("ecq:3:bucket=1000", shape)
    n = math.prod(shape)
    assert make_compressor("ecq:3:bucket=1000").wire_bytes(shape) == 4 * (-(-n // 1000)) + math.ceil(n * 3 / 8)


@pytest.mark.parametrize("alpha,beta", [(0.3, 0.9), (0.01, 1.0), (0.0, 0.5), (1.0, 0.0)])
def test_error_recurrence_matches_closed_form(alpha, beta):
    """h_T = sum_{t<T} beta^(T-1-t) (g_t - g~_t)  (eq. 5), built by eq. 6 step by step."""
    torch.manual_seed(0)
    c = make_compressor(f"ecq:2:alpha={alpha}:beta={beta}:bucket=32", seed=1)
    gs, gts = [], []
    h = torch.zeros(100)
    for t in range(6):
        g = torch.randn(100)
        p = c.compress(g)
        g_tilde = c.decompress(p)
        gs.append(g)
        gts.append(g_tilde)
        h = beta * h + (g - g_tilde)  # eq. 6
        closed = sum(beta ** (t - tp) * (gs[tp] - gts[tp]) for tp in range(t + 1))  # eq. 5
        torch.testing.assert_close(c.error(), closed, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c.error(), h, rtol=1e-5, atol=1e-5)


def test_quantizes_compensated_gradient():
    """g~ = Q(g + alpha h) (eq. 7): its expectation is g + alpha h, not g."""
    c = make_compressor("ecq:2:alpha=0.5:bucket=0", seed=2)
    g0 = torch.randn(16)
    c.compress(g0)  # creates h
    state = c.state_dict()
    g = torch.randn(16)
    target = g + 0.5 * c.error()
    draws = []
    for _ in range(2000):
        c.load_state_dict(state)
        c._step = len(draws) + 1  # fresh rounding noise, same h
        draws.append(c.decompress(c.compress(g)))
    d = torch.stack(draws)
    se = d.std(0) / math.sqrt(len(draws)) + 1e-5
    assert ((d.mean(0) - target).abs() <= 5 * se).all()
    assert ((d.mean(0) - g).abs() > 5 * se).any()


def test_error_feedback_telescopes():
    """With beta = 1: sum_t g~_t = sum_t g_t - h_T exactly (nothing is lost, only delayed)."""
    torch.manual_seed(3)
    c = make_compressor("ecq:3:alpha=0.2:beta=1:bucket=64", seed=4)
    sg, sgt = torch.zeros(300), torch.zeros(300)
    for _ in range(20):
        g = torch.randn(300)
        sg += g
        sgt += c.decompress(c.compress(g))
    torch.testing.assert_close(sgt, sg - c.error(), rtol=1e-4, atol=1e-4)


def test_state_roundtrip_and_names():
    torch.manual_seed(5)
    a = make_compressor("ecq:4:alpha=0.1", seed=6)
    g1, g2 = torch.randn(40), torch.randn(7, 3)
    a.compress(g1, name="w")
    a.compress(g2, name="b")
    st = a.state_dict()
    nxt = a.compress(g1, name="w")
    b = make_compressor("ecq:4:alpha=0.1", seed=6)
    b.load_state_dict(st)
    again = b.compress(g1, name="w")
    assert all(torch.equal(nxt.tensors[k], again.tensors[k]) for k in nxt.tensors)
    assert torch.equal(a.error("w"), b.error("w")) and torch.equal(a.error("b"), b.error("b"))
    with pytest.raises(ConfigError, match="name="):
        a.compress(torch.randn(5), name="w")  # wrong shape for buffer "w"
    with pytest.raises(ConfigError):
        b.load_state_dict({"h": {}, "extra": 1})


def test_bad_input():
    c = make_compressor("ecq:4")
    for bad in (torch.tensor([float("nan")]), torch.tensor([float("inf"), 1.0]), torch.ones(2, dtype=torch.int64)):
        with pytest.raises(ConfigError):
            c.compress(bad)
    z = torch.zeros(6)
    assert torch.equal(c.decompress(c.compress(z, name="z")), z)
    assert torch.equal(c.error("z"), z)


def test_error_is_a_snapshot_and_h_updates_in_place():
    """h is updated in place (no new buffer per step); error() hands out copies."""
    c = make_compressor("ecq:3:alpha=0.2:beta=0.5:bucket=64", seed=2)
    c.compress(torch.randn(200))
    h_live = c.h[""]
    snap = c.error()
    c.compress(torch.randn(200))
    assert c.h[""] is h_live  # same buffer
    assert not torch.equal(c.error(), snap)  # the snapshot did not move with it
