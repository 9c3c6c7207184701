"""QSGDMaxNorm and QSGDMaxNormMultiScale (Vineeth S, "Unbiased Single-scale and
Multi-scale Quantizers for Distributed Optimization", arXiv:2109.12497, Sec. 3.1-3.2):
exact wire size, allreduce compatibility in the integer domain, overflow-safe sums,
Lemma 1 / 2, scale sharing, and one real multi-process gloo allreduce."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsim.compression import make_compressor
from perfsim.compression.base import sum_dtype_for
from perfsim.kernels.lanes import pack_lanes, pack_lanes_ref, packed_words, unpack_lanes
from perfsim.errors import ConfigError

from _helpers import assert_payload_is_wire_size, assert_resumes_from_state, spawn_ranks

SPECS = ["qsgd-maxnorm:2", "qsgd-maxnorm:4", "qsgd-maxnorm:8", "qsgd-maxnorm-multiscale:4",
         "qsgd-maxnorm-multiscale:2:6,8", "qsgd-maxnorm-multiscale:3:8:bucket=5"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 7), (1001,), (0,)])
def test_wire_bytes_is_payload_size(spec, shape):
    assert_payload_is_wire_size(spec, shape)


def test_wire_bytes_formula():
    assert make_compressor("qsgd-maxnorm:4").wire_bytes((101,)) == 4 + math.ceil(101 * 4 / 8)
    # 2 scales -> 1 index bit per coordinate; 3 scales -> 2 bits
    assert make_compressor("qsgd-maxnorm-multiscale:4:8").wire_bytes((101,)) == 4 + 51 + 13
    assert make_compressor("qsgd-maxnorm-multiscale:4:6,8").wire_bytes((101,)) == 4 + 51 + 26
    assert make_compressor("qsgd-maxnorm-multiscale:4:8:bucket=10").wire_bytes((101,)) == 4 + 51 + 2


@pytest.mark.parametrize("bad", ["qsgd-maxnorm", "qsgd-maxnorm:5", "qsgd-maxnorm:4:4", "qsgd-maxnorm:x",
                                 "qsgd-maxnorm-multiscale:4:4", "qsgd-maxnorm-multiscale:4:3",
                                 "qsgd-maxnorm-multiscale:4:8,8", "qsgd-maxnorm-multiscale:4:30",
                                 "qsgd-maxnorm-multiscale:4:8:bucket=0", "qsgd-maxnorm-multiscale:4:x"])
def test_bad_spec(bad):
    with pytest.raises(ConfigError):
        make_compressor(bad)


def test_sum_dtype_widens():
    assert sum_dtype_for(127, 1) == torch.int8
    assert sum_dtype_for(7, 18) == torch.int8 and sum_dtype_for(7, 19) == torch.int16
    assert sum_dtype_for(127, 200) == torch.int16 and sum_dtype_for(127, 300) == torch.int32
    assert sum_dtype_for(2 ** 23, 2 ** 10) == torch.int64
    # the collective carries b + ceil(log2 W)-bit lanes, 63 // L of them per int64 word
    plan = make_compressor("qsgd-maxnorm:8").dp_plan((1000,), 200)  # L = 16: 3 lanes per word
    assert [(s.kind, s.reduce) for s in plan] == [("allreduce", "max"), ("allreduce", "sum")]
    assert plan[0].nbytes == 4 and plan[1].nbytes == 8 * 334  # one norm (8-bit chunks: 131072); 334 words
    assert make_compressor("qsgd-maxnorm:8").dp_plan((1000,), 1)[1].nbytes == 8 * 143  # 7 lanes/word
    assert make_compressor("qsgd-maxnorm:4").dp_plan((1200,), 2)[1].nbytes == 8 * 100  # 12 x 5 bits


def lane_sum(levels: torch.Tensor, s: int, bits: int) -> torch.Tensor:
    """Sum over workers (dim 0) of signed levels through packed lanes, as allreduce_mean does."""
    workers, n = levels.shape[0], levels[0].numel()
    words = sum(pack_lanes(lv.reshape(-1) + s, bits, workers) for lv in levels)
    return unpack_lanes(words, n, bits, workers) - workers * s


def _simulate_allreduce(spec, xs, seed=0):
    """Alg. 1/2 in-process: shared max norm, min scale index, integer sum of payload codes."""
    comps = [make_compressor(spec, seed=seed) for _ in xs]
    for m, c in enumerate(comps):
        c._salt = m + 1  # the salt allreduce_mean uses on rank m
    w = torch.stack([c.local_norm(x) for c, x in zip(comps, xs)]).max(0).values
    index = None
    if comps[0].multiscale:
        flat = [x.reshape(-1) for x in xs]
        index = torch.stack([c.local_scale_index(f, w) for c, f in zip(comps, flat)]).min(0).values
    payloads = [c.compress(x, norm=w, scale_index=index) for c, x in zip(comps, xs)]
    return comps[0], payloads, w, index


@pytest.mark.parametrize("spec", SPECS)
def test_sum_of_payloads_decodes_to_sum_of_decodes(spec):
    torch.manual_seed(1)
    xs = [torch.randn(9, 31) * (m + 1) for m in range(4)]
    c, payloads, w, index = _simulate_allreduce(spec, xs)
    levels = [c.payload_levels(p)[0] for p in payloads]
    total = lane_sum(torch.stack(levels), c.s, c.bits)
    exact = torch.stack(levels).to(torch.int64).sum(0)
    assert torch.equal(total, exact)  # no overflow, exact in the integer domain
    decoded_sum = c.decode_levels(total.to(torch.int64), w, index).reshape(xs[0].shape)
    sum_of_decodes = torch.stack([c.decompress(p) for p in payloads]).sum(0)
    torch.testing.assert_close(decoded_sum, sum_of_decodes, rtol=1e-6, atol=1e-6)
    # and it is an unbiased estimate of the true sum, within one grid step per worker
    n = xs[0].numel()
    step = w.reshape(-1).repeat_interleave(c.chunk_of(n))[:n].reshape(xs[0].shape) / c.s  # per chunk
    assert ((decoded_sum - torch.stack(xs).sum(0)).abs() <= len(xs) * step + 1e-5).all()


def test_200_worker_sum_would_overflow_int8():
    """8-bit codes of 200 workers: int8 wraps, the width from sum_dtype_for does not."""
    torch.manual_seed(2)
    M = 200
    base = torch.rand(64) + 1.0  # all positive, similar magnitudes -> large codes
    xs = [base * (1 + 0.01 * torch.randn(64)).abs() for _ in range(M)]
    c, payloads, w, _ = _simulate_allreduce("qsgd-maxnorm:8", xs)
    levels = torch.stack([c.payload_levels(p)[0] for p in payloads])
    exact = levels.to(torch.int64).sum(0)
    assert int(exact.abs().max()) > 127  # int8 would overflow ...
    wrapped = levels.to(torch.int8).sum(0, dtype=torch.int8)
    assert not torch.equal(wrapped.to(torch.int64), exact)  # ... silently
    assert torch.equal(lane_sum(levels, c.s, c.bits), exact)  # 16-bit lanes hold it
    mean = c.decode_levels(exact, w, None) / M
    assert ((mean - torch.stack(xs).mean(0)).abs() <= w / c.s).all()


@pytest.mark.parametrize("spec", ["qsgd-maxnorm:2:chunk=0", "qsgd-maxnorm-multiscale:2:6"])
def test_unbiased_on_shared_norm(spec):
    torch.manual_seed(3)
    x = torch.randn(40)
    w = 1.7 * x.norm()  # another worker had a larger gradient
    c = make_compressor(spec, seed=11)
    index = c.local_scale_index(x, w) if c.multiscale else None
    n = 3000
    d = torch.stack([c.decompress(c.compress(x, norm=w, scale_index=index)) for _ in range(n)])
    s_el = c.levels_per_element(index, 40)
    p = (x.abs() / w * s_el) % 1.0
    se = (w / s_el) * (p * (1 - p) / n).sqrt() + 1e-7
    assert ((d.mean(0) - x).abs() <= 5 * se).all()


def test_lemma_1_and_2_variance_bounds():
    """E||Q(v) - v||^2 <= (1 + min(n/s^2, sqrt(n)/s)) ||w||^2, s = min scale (Lemma 1, 2);
    the multi-scale quantizer's error is below the single-scale one (Sec. 3.2)."""
    torch.manual_seed(4)
    n = 256
    x = torch.randn(n)
    w = 1.3 * x.norm()
    errs = {}
    for spec in ("qsgd-maxnorm:3:chunk=0", "qsgd-maxnorm-multiscale:3:7", "qsgd-maxnorm-multiscale:3:5,7,9"):
        c = make_compressor(spec, seed=2)
        index = c.local_scale_index(x, w) if c.multiscale else None
        d = torch.stack([c.decompress(c.compress(x, norm=w, scale_index=index)) for _ in range(300)])
        errs[spec] = float(((d - x) ** 2).sum(1).mean())
        s = c.s
        assert errs[spec] <= (1 + min(n / s ** 2, math.sqrt(n) / s)) * float(w) ** 2
        # exact expectation: sum_i (w/s_i)^2 p_i (1 - p_i)
        s_el = c.levels_per_element(index, n)
        p = (x.abs() / w * s_el) % 1.0
        assert errs[spec] == pytest.approx(float(((w / s_el) ** 2 * p * (1 - p)).sum()), rel=0.1)
    assert errs["qsgd-maxnorm-multiscale:3:7"] < 0.9 * errs["qsgd-maxnorm:3:chunk=0"]
    assert errs["qsgd-maxnorm-multiscale:3:5,7,9"] <= errs["qsgd-maxnorm-multiscale:3:7"] * 1.05


def test_default_chunk_bounds_qsgd_variance():
    """One norm per chunk (default: largest power of two <= 16 s^2, QSGD Lemma 3.1 bound
    <= 4): on a long gradient the error is far below one norm for everything."""
    from perfsim.compression.qsgd import default_chunk

    assert [default_chunk(s) for s in (1, 3, 7, 31)] == [16, 128, 512, 8192]
    torch.manual_seed(5)
    x = torch.randn(65536) * torch.rand(65536) ** 4  # heavy-tailed, like gradients
    def err(spec):
        c = make_compressor(spec)
        return float((c.decompress(c.compress(x)) - x).norm())

    for bits in (2, 4):
        e_whole, e_chunk = err(f"qsgd-maxnorm:{bits}:norm=l2:chunk=0"), err(f"qsgd-maxnorm:{bits}:norm=l2")
        assert e_chunk < 0.25 * e_whole and e_chunk <= 2.0 * float(x.norm()), bits
    # the default max-abs norm (maxnorm_chunk: >= 128 values per norm): chunks still help,
    # 4 bits err 3x less than L2 at the same bytes, 2 bits about as much as L2 at 0.65x the bytes
    for bits in (2, 4):
        assert err(f"qsgd-maxnorm:{bits}") < 0.7 * err(f"qsgd-maxnorm:{bits}:chunk=0"), bits
    assert err("qsgd-maxnorm:4") < 0.4 * err("qsgd-maxnorm:4:norm=l2")
    assert err("qsgd-maxnorm:2") < 1.25 * err("qsgd-maxnorm:2:norm=l2") and err("qsgd-maxnorm:2") < 1.25 * float(x.norm())


def test_scale_choice_eq_11():
    c = make_compressor("qsgd-maxnorm-multiscale:4:8")  # s = 7, 127
    x = torch.tensor([1.0, 0.05, 0.0, 7 / 127 + 1e-3, 7 / 127 - 1e-3])
    idx = c.local_scale_index(x, torch.tensor(1.0))
    assert idx.tolist() == [0, 1, 1, 0, 1]


def test_shared_values_checked_and_bad_input():
    c = make_compressor("qsgd-maxnorm-multiscale:4:8")
    x = torch.randn(20)
    with pytest.raises(ConfigError, match="norm"):
        c.compress(x, norm=0.5 * x.norm())
    top = torch.ones(20, dtype=torch.uint8)
    own = c.local_scale_index(x, x.norm())
    if bool((own < 1).any()):
        with pytest.raises(ConfigError, match="scale index"):
            c.compress(x, scale_index=top)
    for bad in (torch.tensor([float("nan")]), torch.tensor([1.0, -float("inf")]), torch.ones(3, dtype=torch.int32)):
        with pytest.raises(ConfigError):
            c.compress(bad)
    z = torch.zeros(5, 3)
    for spec in SPECS:
        cc = make_compressor(spec)
        assert torch.equal(cc.decompress(cc.compress(z)), z)


def test_state_roundtrip():
    assert_resumes_from_state("qsgd-maxnorm-multiscale:2:6", torch.randn(50), seed=9)


# ------------------------------------------------------------------ real gloo
DIST_SPECS = ["qsgd-maxnorm:4", "qsgd-maxnorm:8", "qsgd-maxnorm-multiscale:4:8", "qsgd-maxnorm-multiscale:2:6,8",
              "randk-maxnorm:0.3:8", "randk-maxnorm-multiscale:0.5:4:8", "qsgd:6", "ecq:6"]


def _dist_worker(rank, _port, world, init_file, out_dir):  # rendezvous: a file
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(100 + rank)
        x = torch.randn(37, 11) * (rank + 1)
        calls, real = {}, dist.all_reduce
        ops = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min",
               dist.ReduceOp.BAND: "min"}  # AND of thermometer bits = min of indices

        def recording(t, op=dist.ReduceOp.SUM, **kw):
            log.append(("allreduce", t.numel() * t.element_size(), ops[op]))
            return real(t, op=op, **kw)

        res = {}
        dist.all_reduce = recording
        try:
            for spec in DIST_SPECS:
                log = calls[spec] = []
                res[spec] = make_compressor(spec, seed=7).allreduce_mean(x.clone())
        finally:
            dist.all_reduce = real
        torch.save({"x": x, "res": res, "calls": calls}, f"{out_dir}/{rank}.pt")
        dist.barrier()  # no rank tears gloo down while its peer is mid-collective
    finally:
        dist.destroy_process_group()


def test_gloo_allreduce_mean(tmp_path):
    world = 3
    spawn_ranks(_dist_worker, world, str(tmp_path / "rdv"), str(tmp_path), world=world)
    outs = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    xs = [o["x"] for o in outs]
    mean = torch.stack(xs).mean(0)
    for spec in DIST_SPECS:
        c = make_compressor(spec, seed=7)
        if c.allreduce_compatible:  # allreduce_mean performs exactly dp_plan's collectives
            plan = [(s.kind, s.nbytes, s.reduce) for s in c.dp_plan(mean.shape, world)]
            assert outs[0]["calls"][spec] == plan, spec
        got = [o["res"][spec] for o in outs]
        for g in got[1:]:
            assert torch.equal(g, got[0]), spec  # every rank holds the same average
        if spec.startswith("randk"):
            idx = c.indices(mean.numel(), 0)
            sel = torch.zeros(mean.numel(), dtype=torch.bool)
            sel[idx] = True
            flat = got[0].reshape(-1)
            assert (flat[~sel] == 0).all(), spec
            w = max(float(x.reshape(-1)[idx].norm()) for x in xs)
            assert ((flat[sel] - mean.reshape(-1)[sel]).abs() <= w / c.inner.s + 1e-5).all(), spec
            continue
        if spec.startswith(("qsgd:", "ecq:")):
            bound = max(float(x.norm()) for x in xs) / c.s  # per-worker L2 scale, one grid step
        else:
            bound = max(float(x.norm()) for x in xs) / c.s
        assert ((got[0] - mean).abs() <= bound + 1e-5).all(), spec
        if spec.startswith("qsgd-maxnorm"):
            # identical to the in-process simulation of Alg. 1/2 with the same seeds
            cc, payloads, w, index = _simulate_allreduce(spec, xs, seed=7)
            total = torch.stack([cc.payload_levels(p)[0] for p in payloads]).to(torch.int64).sum(0)
            sim = (cc.decode_levels(total, w, index) / world).reshape(mean.shape)
            torch.testing.assert_close(got[0], sim, rtol=1e-6, atol=1e-6)


def test_payload_bytes_are_the_reference_packing():
    """The codes use the documented dense format (kernels/packing.py reference), byte for byte."""
    from perfsim.kernels.packing import pack_bits_ref

    c = make_compressor("qsgd-maxnorm-multiscale:3:8", seed=1)
    x = torch.randn(101)
    p = c.compress(x)
    lv, w, index = c.payload_levels(p)
    assert torch.equal(p.tensors["codes"], pack_bits_ref((lv + c.s).to(torch.uint8), 3))
    assert torch.equal(p.tensors["scale_index"], pack_bits_ref(index, 1))
    assert float(w) == pytest.approx(float(x.norm()))


def test_nccl_plan_uses_uint8_min():
    c = make_compressor("qsgd-maxnorm-multiscale:4:8")
    gloo = c.dp_plan((1000,), 4)
    nccl = c.dp_plan((1000,), 4, backend="nccl")
    assert gloo[1].nbytes == 125 and nccl[1].nbytes == 1000
    assert [s.nbytes for s in gloo[::2]] == [s.nbytes for s in nccl[::2]]


def test_thermometer_and_is_min():
    c = make_compressor("qsgd-maxnorm-multiscale:2:4,6,8")  # 4 scales -> 3 thermometer bits
    idx = [torch.randint(0, 4, (37,), dtype=torch.uint8) for _ in range(3)]
    packed = [c._thermometer(i) for i in idx]
    anded = packed[0] & packed[1] & packed[2]
    assert torch.equal(c._from_thermometer(anded, 37), torch.stack(idx).min(0).values)


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       spec=st.sampled_from(SPECS + ["randk-maxnorm:0.3:3", "randk-maxnorm-multiscale:0.7:2:4,8", "qsgd:3",
                                     "ecq:2:bucket=7"]),
       workers=st.integers(1, 6), scale=st.floats(1e-6, 1e3))
def test_property_wire_size_and_compressed_sum(shape, spec, workers, scale):
    g = torch.Generator().manual_seed(len(shape) * 1000 + workers)
    xs = [torch.randn(shape, generator=g) * scale for _ in range(workers)]
    c = make_compressor(spec)
    p = c.compress(xs[0])
    assert p.nbytes == c.wire_bytes(tuple(shape))
    if not spec.startswith("qsgd-maxnorm"):
        return
    cc, payloads, w, index = _simulate_allreduce(spec, xs)
    levels = torch.stack([cc.payload_levels(q)[0] for q in payloads])
    assert int(levels.abs().max()) <= cc.s
    total = lane_sum(levels, cc.s, cc.bits)
    assert torch.equal(total, levels.to(torch.int64).sum(0))
    dec = cc.decode_levels(total, w, index)
    ref = torch.stack([cc.decompress(q).reshape(-1) for q in payloads]).sum(0)
    torch.testing.assert_close(dec, ref, rtol=1e-5, atol=1e-6 * float(w.max()))


def test_thresholds_reproduce_eq_11_in_float32_exactly():
    """|v| <= t_j is exactly the float32 test fl(|v| * s_j) <= fl(W * s_min), also at the
    float32 neighbours of every threshold."""
    import numpy as np

    c = make_compressor("qsgd-maxnorm-multiscale:3:5,7,12")
    for w in (1.0, 0.3, 123.456, 1e-20, 7e33):
        ts = c.thresholds(torch.tensor(w))
        limit = np.float32(np.float32(w) * np.float32(c.s))
        for t, s_j in zip(ts, c.scales[1:].tolist()):
            t32 = np.float32(t)
            near = [t32, np.nextafter(t32, np.float32(0)), np.nextafter(t32, np.float32(np.inf))]
            for v in near + [np.float32(w) * np.float32(r) for r in (0.01, 0.3, 1.0)]:
                direct = bool(np.float32(np.float32(v) * np.float32(s_j)) <= limit)
                assert (np.float32(v) <= t32) == direct, (w, s_j, v)
    # and the index agrees with the old direct formula on random data
    x = torch.randn(5000) * torch.rand(5000) ** 4
    w = x.norm()
    old = torch.zeros(5000, dtype=torch.uint8)
    for s_j in c.scales[1:].tolist():
        old += (x.abs() * s_j <= float(w) * c.s).to(torch.uint8)
    assert torch.equal(c.local_scale_index(x, w), old)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1001])
def test_index_bits_and_lookups_are_exact(n):
    """The numpy 1-bit index packing equals the reference format; the two-entry table
    lookups (fused add or int32 bit patterns) equal a gather, for uint8 and float indices."""
    from perfsim.compression.maxnorm import pack_index_bits, unpack_index_bits
    from perfsim.kernels.packing import pack_bits_ref

    idx = torch.randint(0, 2, (n,), dtype=torch.uint8)
    packed = pack_index_bits(idx, 1)
    assert torch.equal(packed, pack_bits_ref(idx, 1))
    assert torch.equal(pack_index_bits(idx.float(), 1), packed)
    assert torch.equal(unpack_index_bits(packed, 1, n), idx)
    c = make_compressor("qsgd-maxnorm-multiscale:4:8")
    for w in (182.87, 0.3, 1e-3, 5e4, 0.0):
        for table in (w / c.scales, (c.scales.double() / max(w, 1e-30)).float()):
            for index in (idx, idx.float()):
                out = torch.empty(n)
                assert torch.equal(c._lookup(table, index, out), table[idx.long()]), (w, index.dtype)


def test_tiny_shared_norm_uses_the_float64_path():
    """A shared norm so small that s*/W overflows float32 still encodes (no NaN/Inf)."""
    c = make_compressor("qsgd-maxnorm-multiscale:4:8", seed=1)
    x = torch.tensor([0.0, 1e-38, -5e-39])
    w = torch.tensor(2e-38)  # local norm underflows to 0 in float32; the shared one is larger
    y = c.decompress(c.compress(x, norm=w))
    assert bool(torch.isfinite(y).all())
    assert ((y - x).abs() <= float(w) / 7 + 1e-45).all()


def test_shared_index_validation_is_elementwise():
    c = make_compressor("qsgd-maxnorm-multiscale:2:6")
    x = torch.randn(300)
    own = c.local_scale_index(x, x.norm())
    assert bool((own == 1).any()) and bool((own == 0).any())
    lower = own.clone()
    lower[own == 1] = 0  # always allowed: a smaller (coarser) scale
    c.compress(x, scale_index=lower)
    higher = own.clone()
    higher[int((own == 0).nonzero()[0])] = 1  # one entry above this worker's own
    with pytest.raises(ConfigError, match="scale index"):
        c.compress(x, scale_index=higher)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_payload_bytes_equal_cpu():  # pragma: no cover - needs a GPU
    """Given the same shared norm the rounding bits and the float32 arithmetic are the
    same on every device, so the payload bytes are too."""
    x = torch.randn(4, 1000)
    for spec in ("qsgd-maxnorm:4", "qsgd-maxnorm-multiscale:4:8", "qsgd-maxnorm-multiscale:2:4,6,8"):
        cpu, gpu = make_compressor(spec, seed=3), make_compressor(spec, seed=3)
        w = 1.01 * cpu.local_norm(x)  # the shared norms: one per chunk, above each worker's own
        pc, pg = cpu.compress(x, norm=w), gpu.compress(x.cuda(), norm=w.cuda())
        for k in pc.tensors:
            assert torch.equal(pc.tensors[k], pg.tensors[k].cpu()), (spec, k)
        torch.testing.assert_close(gpu.decompress(pg).cpu(), cpu.decompress(pc))


@pytest.mark.parametrize("spec", ["qsgd-maxnorm:4", "qsgd-maxnorm-multiscale:4:8"])
def test_dp_codec_is_the_allreduce_path_without_its_collectives(spec):
    """dp_codec's encode packs this worker's codes into the lanes allreduce_mean sums;
    its decode turns world_size such sums back into the mean (here: of world_size
    copies of x, so within one quantization step of x)."""
    from perfsim.kernels.lanes import lanes_per_word

    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    c = make_compressor(spec, seed=0)
    encode, decode = c.dp_codec(x, 3)
    words = encode()
    assert words.dtype == torch.int64 and words.numel() == -(-x.numel() // lanes_per_word(4, 3))
    out = decode()
    norms = c.local_norm(x)
    step = float(norms.max()) / c.s
    assert out.shape == x.shape and float((out - x).abs().max()) <= step * (1 + 1e-5)
    assert make_compressor("directq:4").dp_codec(x, 3) is None
