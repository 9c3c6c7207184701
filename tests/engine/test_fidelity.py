"""Mechanisms: one transport model, interference, collective algorithms,
multi-GPU nodes and NIC sharing, decode charging, 1-bit optimizers' warm-up."""

import math

import pytest

from perfsim.api import predict
from perfsim.collectives import GroupShape, plan
from perfsim.config import Strategy, System, Workload
from perfsim.engine import simulate
from perfsim.engine.buckets import FALLBACK_MEMORY_BPS, codec_passes
from perfsim.engine.plan import comm_slowdown
from perfsim.errors import ConfigError
from perfsim.fabrics import FABRICS, NIC_KINDS, parse_nic
from perfsim.link import Link, resolve_link
from perfsim.models.specs import LayerSpec
from perfsim.network import Network
from perfsim.profile import Profile

from _helpers import assert_user_error, gloo_group, run_cli, run_ranks, save_rank

EMPTY = Profile()


def _profile(records, backend="gloo"):
    return Profile.from_dict({"format": "perfsim-profile", "version": 1,
                              "metadata": {"backend": backend}, "records": records})


def _shaped(name, alpha, rate_bps, op="p2p", sizes=(1024, 4096, 16384, 262144, 1048576, 4194304)):
    return [{"op": op, "name": name, "size_bytes": s, "world_size": 2, "time_s": alpha + s * 8 / rate_bps}
            for s in sizes]


def toy(layers=1, tf=0.0, tb=1e-9, params=0, shape=(8,)):
    specs = tuple(LayerSpec(f"l{i}", params, shape, 0.0) for i in range(layers))
    return Workload("toy", specs, (tf,) * layers, (tb,) * layers, 1)


# ------------------------------------------------------------------ one transport model
def test_link_constructors_and_one_model_for_predict():
    """Nominal: rate x NIC efficiency. Calibrated: what the profile measured at that
    rate. predict picks the calibrated link by itself (validate passes only the
    profile), and falls back to nominal x efficiency where nothing was measured."""
    nominal = Link.nominal(1e9, 1e-3, efficiency=NIC_KINDS["ethernet"].efficiency)
    assert nominal.rate_bps == pytest.approx(1e9 * 1448 / 1538) and nominal.one_way_s == 1e-3
    assert nominal.time(1e6) == pytest.approx(1e-3 + 8e6 / nominal.rate_bps)
    prof = _profile(_shaped("messenger@100Mbps", 2e-4, 9.4e7))
    cal = Link.calibrated(prof, 1e8, 0.0)
    assert cal.rate_bps == pytest.approx(9.4e7, rel=1e-6) and cal.overhead_s == pytest.approx(2e-4, rel=1e-3)
    assert Link.calibrated(prof, 1e9, 0.0) is None
    with pytest.raises(ConfigError, match="link_model=calibrated"):
        resolve_link(prof, 1e9, 0.0, op="p2p", model="calibrated")
    # the engine uses it: a 2-stage pipeline's message time follows the calibrated link
    wl = Workload("toy", (LayerSpec("a", 0, (250_000,), 0.0), LayerSpec("b", 0, (1,), 0.0)),
                  (1e-9, 1e-9), (1e-9, 1e-9), 1)
    st = Strategy(pp=2, macro_batch=1)
    res = simulate(wl, st, System(bandwidth_bps=1e8), prof)
    assert res.summary["link_source"] == "profile p2p messenger@100Mbps"
    assert res.summary["iteration_s"] == pytest.approx(2 * (2e-4 + 8e6 / 9.4e7), rel=1e-3)
    nom = simulate(wl, st, System(bandwidth_bps=1e8, link_model="nominal", nic_kind="ethernet"), prof)
    assert nom.summary["link_source"] == "nominal"
    assert nom.summary["iteration_s"] == pytest.approx(2 * 8e6 / (1e8 * 1448 / 1538), rel=1e-3)


# ------------------------------------------------------------------ interference
def test_interference_slows_compute_only_while_communication_overlaps():
    """Two layers, two buckets, dp=2: bucket 1 (ready at half the backward) is
    all-reduced in C seconds under the remaining backward; with slowdown s the
    backward ends C s / (1 + s) later -- exactly, and nothing else changes."""
    P, bw, tb = 250_000, 1e9, 0.05
    wl = toy(layers=2, tf=0.01, tb=tb, params=P)
    st = Strategy(pp=1, dp=2, macro_batch=1, bucket_bytes=4 * P)

    def run(slowdown):
        return simulate(wl, st, System(bandwidth_bps=bw, collective_algo="ring", comm_slowdown=slowdown), EMPTY)

    base, slow = run(0.0), run(0.25)
    C = 4 * P * 8 / bw  # 2-rank ring allreduce of S bytes: S / B
    assert C < 0.5 * tb
    assert slow.summary["iteration_s"] - base.summary["iteration_s"] == pytest.approx(C * 0.25 / 1.25, rel=1e-9)
    assert slow.summary["interference_s"] == pytest.approx(C * 0.25 / 1.25, rel=1e-9)
    assert base.summary["interference_s"] == 0.0
    # no overlap (sync after the backward): no slowdown at all
    st2 = Strategy(pp=1, dp=2, macro_batch=1, bucket_bytes=4 * P, overlap_grad_sync=False)
    a = simulate(wl, st2, System(bandwidth_bps=bw, comm_slowdown=0.0), EMPTY).summary["iteration_s"]
    b = simulate(wl, st2, System(bandwidth_bps=bw, comm_slowdown=0.25), EMPTY).summary["iteration_s"]
    assert a == pytest.approx(b, rel=1e-12)


def test_interference_measured_by_calibrate_feeds_the_engine():
    recs = [{"op": "interference", "name": "gloo alone", "size_bytes": 1, "time_s": 0.010},
            {"op": "interference", "name": "gloo allreduce", "size_bytes": 1, "time_s": 0.013}]
    assert comm_slowdown(_profile(recs)) == pytest.approx(0.3)
    assert comm_slowdown(EMPTY) == 0.0


def test_interference_of_the_link_the_run_uses():
    """Records measured under traffic over an emulated link win, those of the rate
    nearest the run's link (log scale); the loopback pair is the fallback."""
    def pair(alone, busy, rate=None):
        extra = {"emulated_bandwidth_bps": rate} if rate else {}
        return [{"op": "interference", "name": "gloo alone", "size_bytes": 1, "time_s": alone, **extra},
                {"op": "interference", "name": "gloo allreduce", "size_bytes": 1, "time_s": busy, **extra}]

    prof = _profile(pair(0.010, 0.010) + pair(0.010, 0.011, 1e9) + pair(0.010, 0.012, 1e8))
    assert comm_slowdown(prof, 1e9) == pytest.approx(0.1)
    assert comm_slowdown(prof, 0.9e8) == pytest.approx(0.2)
    assert comm_slowdown(prof, 2e8) == pytest.approx(0.2)  # nearer 100 Mbps than 1 Gbps in log scale
    assert comm_slowdown(_profile(pair(0.010, 0.013)), 1e8) == pytest.approx(0.3)


def test_calibrate_measures_interference_with_real_gloo(interference_records):
    """Two real gloo ranks: compute alone vs under concurrent allreduces."""
    recs = [r for r in interference_records if r.get("op") == "interference"]
    assert {r["name"] for r in recs} == {"gloo alone", "gloo allreduce"}
    assert all(r["time_s"] > 0 for r in recs)
    assert comm_slowdown(_profile(recs)) >= 0.0


# ------------------------------------------------------------------ collective algorithms
def _shape(n, nodes, per_node, b_in=1e12, a_in=1e-6, b_out=1e10, a_out=1e-4):
    return GroupShape(n, nodes, per_node, b_in, a_in, b_out, a_out)


def test_allreduce_algorithms_closed_forms_and_selection():
    S, g = 64e6, _shape(32, 8, 4)
    ring = plan("allreduce", S, g, "ring")
    assert ring.time() == pytest.approx(2 * 31 / 32 * S * 8 / 1e10 + 2 * 31 * 1e-4)
    tree = plan("allreduce", S, g, "tree")
    assert tree.time() == pytest.approx(2 * S * 8 / (0.92 * 1e10) + 2 * (3 * 1e-4 + 3 * 1e-6))
    hier = plan("allreduce", S, g, "hierarchical")
    expect = 2 * (3 / 4 * S * 8 / 1e12 + 3e-6) + 2 * 7 / 8 * S * 8 / 1e10 + 2 * 7 * 1e-4
    assert hier.time() == pytest.approx(expect)
    # NCCL-like: the least modelled time -- tree for small messages on many nodes,
    # a bandwidth-optimal algorithm for large ones
    many = _shape(256, 256, 1, a_out=1e-5)
    assert plan("allreduce", 4096, many).algo == "tree"
    assert plan("allreduce", 256e6, many).algo == "ring"
    assert plan("allreduce", S, g).time() == min(ring.time(), tree.time(), hier.time())
    with pytest.raises(ConfigError, match="collective_algo"):
        plan("allreduce", S, g, "butterfly")


def test_engine_hierarchical_allreduce_on_multi_gpu_nodes():
    """dp=8 over 2 nodes of 4 GPUs, forced hierarchical: the sync is the closed form."""
    P = 1_000_000
    S = 4 * P
    sysm = System(bandwidth_bps=10e9, gpus_per_node=4, intra_node_bandwidth_bps=8 * 10e9,
                  intra_node_latency_s=0.0, collective_algo="hierarchical")
    res = simulate(toy(params=P), Strategy(pp=1, dp=8, macro_batch=1), sysm, EMPTY)
    expect = 2 * 3 / 4 * S * 8 / 80e9 + 2 * 1 / 2 * S * 8 / 10e9 + 2 * (2 * S / FALLBACK_MEMORY_BPS)
    assert res.stages[0]["dp_sync_s"] == pytest.approx(expect, rel=1e-9)
    assert res.summary["collective_algo"] == "hierarchical"


def test_alltoall_shares_the_nodes_nics():
    """alltoall on 2 nodes x 4 GPUs: a node's NICs carry 4 S (8-4)/8 = 2 S, not the
    (N-1)/N S of one rank."""
    S = 8e6
    net = Network(System(bandwidth_bps=1e10, gpus_per_node=4, intra_node_bandwidth_bps=1e12,
                         intra_node_latency_s=0.0), 8)
    t = net.collective_time("alltoall", S, list(range(8)))
    assert t == pytest.approx(2 * S * 8 / 1e10)
    # one GPU per node: the old per-rank volume
    net1 = Network(System(bandwidth_bps=1e10), 8)
    assert net1.collective_time("alltoall", S, list(range(8))) == pytest.approx(7 / 8 * S * 8 / 1e10)


def test_concurrent_collectives_share_a_nodes_nics():
    """Two pipeline stages on one node each all-reduce over the same two nodes: their
    collectives share the NICs, so the sync takes twice as long as one stage's."""
    P = 1_000_000
    wl = toy(layers=2, params=P)
    st1 = Strategy(pp=1, dp=2, macro_batch=1, bucket_bytes=8 * P)
    st2 = Strategy(pp=2, dp=2, macro_batch=1)
    sysm = System(bandwidth_bps=1e9, gpus_per_node=2, intra_node_bandwidth_bps=1e15, collective_algo="ring")
    one = simulate(toy(params=P), st1, System(bandwidth_bps=1e9, collective_algo="ring"), EMPTY)
    two = simulate(wl, st2, sysm, EMPTY)
    comm = 4 * P * 8 / 1e9
    assert one.stages[0]["dp_sync_s"] == pytest.approx(comm + 4 * 4 * P / FALLBACK_MEMORY_BPS, rel=1e-6)
    assert max(s["dp_sync_s"] for s in two.stages) == pytest.approx(2 * comm + 4 * 4 * P / FALLBACK_MEMORY_BPS,
                                                                    rel=1e-3)


# ------------------------------------------------------------------ fabrics and NICs
def test_fabric_presets_and_nic_spec():
    for f in FABRICS.values():
        assert f.bandwidth_bps > 0 and ("nccl" in f.source.lower() or "datasheet" in f.source.lower())
    assert FABRICS["pcie3"].bandwidth_bps < FABRICS["nvlink2"].bandwidth_bps < FABRICS["nvlink4"].bandwidth_bps
    nic = parse_nic("4x200Gbps:infiniband")
    assert (nic.count, nic.rate_bps, nic.kind, nic.total_bps) == (4, 200e9, "infiniband", 800e9)
    assert parse_nic("40Gbps").kind == "ethernet"
    with pytest.raises(ConfigError, match="nic"):
        parse_nic("4x200Gbps:carrier-pigeon")
    base = dict(model="gpt2-xl", pp=1, dp=8, gpus_per_node=4, macro_batch=8)
    pcie = predict(**base, intra_node_fabric="pcie3", nic="40Gbps").summary["iteration_s"]
    nvl = predict(**base, intra_node_fabric="nvlink3", nic="40Gbps").summary["iteration_s"]
    fat = predict(**base, intra_node_fabric="nvlink3", nic="4x100Gbps:infiniband").summary["iteration_s"]
    assert pcie > nvl > fat


@pytest.mark.parametrize("flags,culprit", [
    (["--intra-node-fabric", "nvlink9"], "intra-node-fabric"),
    (["--nic", "4xfast"], "nic"),
    (["--collective-algo", "magic"], "collective-algo"),
])
def test_new_flags_reject_bad_input(flags, culprit):
    r = run_cli("predict", *flags)
    assert_user_error(r.returncode, r.stderr, culprit)


# ------------------------------------------------------------------ decode charging
CODEC_SPECS = ["qsgd:4", "onebit", "qsgd-maxnorm:4"]


def _count_codec_work(rank, port, world, specs, numel, out_dir):  # runs in a subprocess
    with gloo_group(rank, world, port):
        counts = {spec: _count_one_allreduce(spec, numel) for spec in specs}  # one after the other
    save_rank(out_dir, rank, counts)


def _count_one_allreduce(spec, numel):
    """(values encoded, values decoded) per input value by one ``allreduce_mean`` of
    ``spec``'s compressor; the counting wrappers are removed again before it returns."""
    import torch

    from perfsim.compression import make_compressor
    from perfsim.compression import onebit as ob

    comp = make_compressor(spec)
    cls, absent = type(comp), object()
    own = {name: cls.__dict__.get(name, absent) for name in ("decompress", "compress", "decode_levels")}
    work = {"decoded": 0, "encoded": 0}
    dec, enc = cls.decompress, cls.compress

    def decompress(self, payload, **kw):
        out = dec(self, payload, **kw)
        work["decoded"] += out.numel()
        return out

    def compress(self, x, **kw):
        work["encoded"] += x.numel()
        return enc(self, x, **kw)

    cls.decompress, cls.compress = decompress, compress
    if hasattr(comp, "decode_levels"):  # MaxNorm family: one decode of the summed codes
        levels = cls.decode_levels

        def decode_levels(self, *a, **kw):
            out = levels(self, *a, **kw)
            work["decoded"] += out.numel()
            return out

        cls.decode_levels = decode_levels
    chunks, efc = ob.decode_chunks, ob.ef_sign_compress

    def decode_chunks(buf, chunk):
        out = chunks(buf, chunk)
        work["decoded"] += out.numel()
        return out

    def ef_sign_compress(x, err):
        work["encoded"] += x.numel()
        return efc(x, err)

    ob.decode_chunks, ob.ef_sign_compress = decode_chunks, ef_sign_compress
    try:
        comp.allreduce_mean(torch.randn(numel), None)
    finally:  # the next spec counts from the classes and functions as they were
        ob.decode_chunks, ob.ef_sign_compress = chunks, efc
        for name, fn in own.items():
            if fn is not absent:
                setattr(cls, name, fn)
            elif name in cls.__dict__:
                delattr(cls, name)
    return work["encoded"] / numel, work["decoded"] / numel


@pytest.fixture(scope="module")
def codec_work(tmp_path_factory):
    """``{spec: [(rank, encoded, decoded) per input value]}`` of every spec of
    :data:`CODEC_SPECS`: one job of 3 real gloo ranks runs each spec's allreduce_mean."""
    world, numel = 3, 3 * 8 * 1000
    got = run_ranks(_count_codec_work, tmp_path_factory.mktemp("codec_work"), world, CODEC_SPECS, numel,
                    world=world)
    return world, numel, {spec: [(rank, *counts[spec]) for rank, counts in enumerate(got)] for spec in CODEC_SPECS}


@pytest.mark.parametrize("spec", CODEC_SPECS)
def test_decodes_charged_are_what_the_runtime_performs(codec_work, spec):
    """Count the elements the runtime's allreduce_mean encodes and decodes (3 real
    gloo ranks) and compare with the plan's codec passes."""
    from perfsim.compression import make_compressor

    world, numel, work = codec_work
    enc, dec = codec_passes(make_compressor(spec).dp_plan((numel,), world), world)
    assert sorted(rank for rank, _, _ in work[spec]) == list(range(world))
    for _, e, d in work[spec]:
        assert d == pytest.approx(dec, rel=0.01)
        if spec == "onebit":
            assert e == pytest.approx(enc, rel=0.01)


# ------------------------------------------------------------------ 1-bit optimizers, warm-up
def test_onebit_adam_predicts_warmup_then_compressed_allreduce():
    base = dict(pp=1, dp=4, macro_batch=8, dataset_samples=320, epochs=1, bandwidth="1Gbps")
    r = predict(**base, grad_compress="onebit-adam:warmup=3").summary
    plain = predict(**base, grad_compress="none").summary
    iters = math.ceil(320 / 32)
    assert r["warmup_iterations"] == 3
    assert r["warmup_iteration_s"] == pytest.approx(plain["iteration_s"], rel=0.05)  # fp32 allreduce
    assert r["iteration_s"] < r["warmup_iteration_s"]  # 1 bit per value afterwards
    assert r["warmup_s"] == pytest.approx(3 * r["warmup_iteration_s"])
    assert r["total_s"] == pytest.approx(r["warmup_s"] + (iters - 3) * r["iteration_s"])
    assert r["collective_algo"] == "pairwise,ring"  # alltoall then allgather (3-phase)
    from perfsim.ddp import DEFAULT_WARMUP

    lamb = predict(**base, grad_compress="onebit-lamb").summary  # default: the runtime's, in steps
    assert lamb["warmup_iterations"] == min(iters, DEFAULT_WARMUP)


def test_aqsgd_first_epoch_is_its_own_warmup_column():
    r = predict(compress="aqsgd:fw3bw6", bandwidth="100Mbps", epochs=2).summary
    iters = r["iterations_per_epoch"]
    assert r["warmup_s"] == pytest.approx(iters * r["warmup_iteration_s"])
    assert r["total_s"] == pytest.approx(r["warmup_s"] + r["epoch_s"])
    assert r["warmup_iteration_s"] > r["iteration_s"]
