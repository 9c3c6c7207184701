"""GlobalRandK-MaxNorm (+ multi-scale) (Vineeth S, "Unbiased Single-scale and
Multi-scale Quantizers for Distributed Optimization", arXiv:2109.12497, Sec. 3.3-3.4)."""

import math

import pytest
import torch

from perfsim.compression import make_compressor
from perfsim.errors import ConfigError

from _helpers import assert_payload_is_wire_size

SPECS = ["randk-maxnorm:0.1:4", "randk-maxnorm:1:2", "randk-maxnorm-multiscale:0.25:4",
         "randk-maxnorm-multiscale:0.05:2:6,8:scaled"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 7), (1001,), (0,)])
def test_wire_bytes_is_payload_size(spec, shape):
    assert_payload_is_wire_size(spec, shape)


def test_k_and_sizes():
    c = make_compressor("randk-maxnorm:0.1:4")
    assert c.k_of(1001) == 101 and c.k_of(10) == 1 and c.k_of(1) == 1 and c.k_of(0) == 0
    assert c.inner.chunk == 52  # ceil(0.1 * 512): as many norms per coordinate as qsgd-maxnorm:4
    assert c.wire_bytes((1001,)) == 4 * 2 + math.ceil(101 * 4 / 8)  # indices never travel
    plan = c.dp_plan((1001,), 8)
    assert [(s.kind, s.reduce, s.nbytes) for s in plan] == [("allreduce", "max", 8), ("allreduce", "sum", 8 * 12)]  # 9 7-bit lanes/word
    assert make_compressor("randk-maxnorm:0.01:4").inner.chunk == 32  # floor: <= 1 bit of norm per value
    assert make_compressor("randk-maxnorm:1:4").inner.chunk == 512  # fraction 1: qsgd-maxnorm:4's chunk
    m = make_compressor("randk-maxnorm-multiscale:0.1:4:8")
    assert [s.reduce for s in m.dp_plan((1001,), 8)] == ["max", "min", "sum"]


@pytest.mark.parametrize("bad", ["randk-maxnorm", "randk-maxnorm:0.1", "randk-maxnorm:0:4", "randk-maxnorm:1.5:4",
                                 "randk-maxnorm:nan:4", "randk-maxnorm:abc:4", "randk-maxnorm:0.1:5",
                                 "randk-maxnorm-multiscale:0.1:4:2", "randk-maxnorm-multiscale:0.1"])
def test_bad_spec(bad):
    with pytest.raises(ConfigError):
        make_compressor(bad)


def test_workers_agree_on_indices_and_decode_off_indices_is_zero():
    a, b = make_compressor("randk-maxnorm:0.2:8", seed=4), make_compressor("randk-maxnorm:0.2:8", seed=4)
    b._salt = 99  # a different rank: different rounding noise, same coordinates
    x = torch.randn(50)
    pa, pb = a.compress(x), b.compress(x + 1)
    ia = a.indices(50, pa.meta["step"])
    assert torch.equal(ia, b.indices(50, pb.meta["step"]))
    assert ia.unique().numel() == ia.numel() == 10
    assert not torch.equal(ia, a.indices(50, 1))  # a new draw per step
    y = a.decompress(pa)
    mask = torch.zeros(50, dtype=torch.bool)
    mask[ia] = True
    assert (y[~mask] == 0).all()
    assert ((y[mask] - x[mask]).abs() <= x[mask].norm() / a.inner.s + 1e-6).all()


def test_sum_in_compressed_domain():
    """Same indices + shared max norm -> the integer codes of all workers add up."""
    torch.manual_seed(0)
    M = 5
    xs = [torch.randn(200) for _ in range(M)]
    comps = [make_compressor("randk-maxnorm-multiscale:0.3:4:8", seed=1) for _ in range(M)]
    idx = comps[0].indices(200, 0)
    subs = [x[idx] for x in xs]
    inner = comps[0].inner
    w = torch.stack([inner.local_norm(s) for s in subs]).max()
    index = torch.stack([inner.local_scale_index(s, w) for s in subs]).min(0).values
    payloads = [c.compress(x, norm=w, scale_index=index) for c, x in zip(comps, xs)]
    total = torch.stack([inner.payload_levels(p.__class__(p.tensors, (p.meta["k"],)))[0] for p in payloads]
                        ).to(torch.int64).sum(0)
    decoded = comps[0]._scatter(inner.decode_levels(total, w, index), (200,), 0, torch.float32)
    torch.testing.assert_close(decoded, torch.stack([comps[0].decompress(p) for p in payloads]).sum(0),
                               rtol=1e-6, atol=1e-6)


def test_expectation_scaled_and_unscaled():
    """One step: the unscaled sparsifier decodes to (K/n) x in expectation, :scaled to x
    (fresh compressors, so the memory of the unscaled one plays no part)."""
    torch.manual_seed(1)
    x = torch.randn(20)
    n = 3000
    for spec, factor in (("randk-maxnorm:0.25:8", 0.25), ("randk-maxnorm:0.25:8:scaled", 1.0)):
        d = torch.stack([(c := make_compressor(spec, seed=s)).decompress(c.compress(x)) for s in range(n)])
        se = d.std(0) / math.sqrt(n) + 1e-4  # 5 empirical standard errors
        assert ((d.mean(0) - factor * x).abs() <= 5 * se).all(), spec


def test_memory_follows_ecq_recursion():
    """h_{t+1} = h_t + g_t - (g_t + alpha h_t)[S_t] (ECQ-SGD eq. 6-7 on the sparsifier):
    what is selected is g + alpha h, and sent + memory telescopes to the sum of the inputs."""
    c = make_compressor("randk-maxnorm:0.25:8", seed=3)
    a = c.alpha
    assert c.error_feedback and 0 < a < 1
    g = torch.Generator().manual_seed(0)
    h = torch.zeros(40)
    sent_total, input_total = torch.zeros(40), torch.zeros(40)
    for step in range(12):
        x = torch.randn(40, generator=g)
        idx = c.indices(40, step)
        want_sel = (x + a * h)[idx]
        _, sub = c._select(x, "")
        torch.testing.assert_close(sub, want_sel, rtol=1e-6, atol=1e-6)
        sent = torch.zeros(40).index_copy_(0, idx, want_sel)
        h = h + x - sent
        torch.testing.assert_close(c.error(), h, rtol=1e-5, atol=1e-5)
        sent_total += sent
        input_total += x
    torch.testing.assert_close(sent_total + c.error(), input_total, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="name="):
        c._select(torch.randn(41), "")  # another tensor through the same memory
    c._select(torch.randn(41), "other")
    before = c.error()
    c.compress(torch.randn(40))  # the one-payload path (pipeline activations) keeps no memory
    assert torch.equal(c.error(), before)
    s = make_compressor("randk-maxnorm:0.25:8:scaled")
    s._select(torch.randn(40), "")
    assert not s.error_feedback and s.error() is None and s.state_dict()["memory"] == {}
    with pytest.raises(ConfigError, match="memory"):
        s.load_state_dict(c.state_dict())


def test_memory_time_average_reaches_the_gradient():
    """Repeating one gradient: without memory what is sent averages to (K/n) x; with it, to x."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(2))
    for name, want in ((None, 0.25 * x), ("g", x)):
        c = make_compressor("randk-maxnorm:0.25:8", seed=5)
        sent = []
        for _ in range(2000):  # selection noise ~0.04 of 0.25 x; memory left ~30 x / 2000
            idx, sub = c._select(x, name)
            sent.append(torch.zeros(64).index_copy_(0, idx, sub))
        mean = torch.stack(sent).mean(0)
        assert float((mean - want).norm() / want.norm()) < 0.1, name


def test_bad_input_and_state():
    c = make_compressor("randk-maxnorm:0.5:4", seed=3)
    with pytest.raises(ConfigError):
        c.compress(torch.tensor([1.0, float("nan")]))
    z = torch.zeros(4, 4)
    assert torch.equal(c.decompress(c.compress(z)), z)
    x = torch.randn(64)
    c.compress(x)
    c._select(torch.randn(64), "x")  # the data-parallel path's memory (allreduce_mean)
    st = c.state_dict()
    assert set(st["memory"]) == {"x"}  # compress keeps none
    p1 = c.compress(x)
    d = make_compressor("randk-maxnorm:0.5:4", seed=3)
    d.load_state_dict(st)
    p2 = d.compress(x)
    assert torch.equal(c.error("x"), d.error("x"))
    y = torch.randn(64)
    assert all(torch.equal(a, b) for a, b in zip(c._select(y, "x"), d._select(y, "x")))
    assert torch.equal(c.error("x"), d.error("x"))
    assert p1.meta == p2.meta and all(torch.equal(p1.tensors[k], p2.tensors[k]) for k in p1.tensors)
    assert torch.equal(c.decompress(p1), d.decompress(p2))
    with pytest.raises(ConfigError):
        d.load_state_dict({"nope": 0})


def test_small_k_indices_are_uniform_and_distinct():
    c = make_compressor("randk-maxnorm:0.05:4", seed=8)  # k = 3 of 60: the draw-until-distinct path
    counts = torch.zeros(60)
    for step in range(2000):
        idx = c.indices(60, step)
        assert idx.numel() == 3 and idx.unique().numel() == 3
        counts[idx] += 1
    expected = 2000 * 3 / 60
    # chi-square with 59 degrees of freedom: mean 59, sd ~11; 120 is far in the tail
    assert float(((counts - expected) ** 2 / expected).sum()) < 120
    # decode after other calls still re-derives the right indices (cache keyed by step)
    c._step = 0
    x0 = torch.randn(60)
    p0 = c.compress(x0)
    c.compress(torch.randn(60))  # replaces the cached indices
    idx0 = c.indices(60, 0)
    y0 = c.decompress(p0)
    assert set(y0.nonzero().reshape(-1).tolist()) <= set(idx0.tolist())
    assert ((y0[idx0] - x0[idx0]).abs() <= x0[idx0].norm() / c.inner.s + 1e-6).all()


def test_first_occurrences_matches_python_and_resets():
    from perfsim.compression.randk import first_occurrences

    g = torch.Generator().manual_seed(0)
    for n, m in ((10, 40), (1000, 300), (7, 7)):
        for _ in range(3):  # the kept table must be clean again after every call
            draws = torch.randint(n, (m,), generator=g)
            seen, want = set(), []
            for v in draws.tolist():
                if v not in seen:
                    seen.add(v)
                    want.append(v)
            assert first_occurrences(draws, n).tolist() == want


def test_indices_deterministic_and_large_k_path():
    c = make_compressor("randk-maxnorm:0.3:4", seed=5)  # 4k >= n: randperm path
    d = make_compressor("randk-maxnorm:0.3:4", seed=5)
    a, b = c.indices(1000, 7), d.indices(1000, 7)
    assert torch.equal(a, b) and a.unique().numel() == 300
    e = make_compressor("randk-maxnorm:0.01:4", seed=5)  # first-occurrence path
    i1 = e.indices(100000, 3)
    e._cache = None
    assert torch.equal(e.indices(100000, 3), i1) and i1.unique().numel() == 1000


@pytest.mark.parametrize("spec", ["randk-maxnorm:0.1:4", "randk-maxnorm-multiscale:0.1:4:8"])
def test_dp_codec_is_the_allreduce_path_without_its_collective(spec):
    """dp_codec: select + the inner quantizer's lanes, then its decode scattered back:
    zeros off the selection, within one quantization step of x on it (world_size copies
    of x average to x)."""
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    c = make_compressor(spec, seed=0)
    encode, decode = c.dp_codec(x, 3)
    words = encode()
    assert words.dtype == torch.int64 and 0 < words.numel() < x.numel()
    out = decode()
    idx = c.indices(x.numel(), 0)
    off = torch.ones(x.numel(), dtype=torch.bool)
    off[idx] = False
    assert out.shape == x.shape and not out[off].any()
    sub = x[idx]
    step = float(c.inner.local_norm(sub).max()) / c.inner.s
    assert float((out[idx] - sub).abs().max()) <= step * (1 + 1e-5)
