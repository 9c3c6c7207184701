"""Engine correctness: closed forms, replayed schedules, exact bytes, determinism."""

import pytest

from perfsim.api import predict
from perfsim.compression import make_compressor, make_pipeline_pair
from perfsim.config import Strategy, System, Workload
from perfsim.engine import simulate
from perfsim.models.specs import LayerSpec
from perfsim.network import Topology
from perfsim.profile import Profile
from perfsim.schedules import get_schedule, max_in_flight

EMPTY = Profile()  # no optimizer / codec costs


def toy(p=4, tf=0.01, tb=0.02, params=0, shape=(8,)):
    layers = tuple(LayerSpec(f"l{i}", params, shape, 0.0) for i in range(p))
    return Workload("toy", layers, (tf,) * p, (tb,) * p, 1)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(4, 8), (3, 5), (1, 4)])
def test_free_communication_closed_form(schedule, p, m):
    """(m + p - 1)(t_f + t_b) with free communication (GPipe paper Sec. 2.3)."""
    tf, tb = 0.01, 0.02
    res = simulate(toy(p, tf, tb), Strategy(pp=p, micro_batch=1, macro_batch=m, schedule=schedule),
                   System(bandwidth_bps=1e18), EMPTY, trace=True)
    assert res.summary["iteration_s"] == pytest.approx((m + p - 1) * (tf + tb), rel=1e-9)
    assert res.summary["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1), rel=1e-6)
    # the whole story: every stage ran exactly its schedule row, in order
    table = get_schedule(schedule)(p, m)
    for s in range(p):
        spans = sorted((e for e in res.trace_events if e.get("cat") == "compute" and e["tid"] == s
                        and e["name"] != "optimizer"), key=lambda e: e["ts"])
        assert [f"{s}{e['name']}" for e in spans] == [str(a) for a in table[s]]


def test_communication_bound_runs_at_slowest_link():
    """Tiny compute, 4 nodes, the link 1<->2 at 10 Mbps, others 1 Gbps: every
    micro-batch crosses the slow link once each way, so an iteration takes
    ~ 2 m S / B_slow."""
    slow, fast = 10e6, 1e9
    bw = [[0 if i == j else fast for j in range(4)] for i in range(4)]
    bw[1][2] = bw[2][1] = slow
    topo = Topology(tuple(map(tuple, bw)), tuple(tuple(0.0 for _ in range(4)) for _ in range(4)))
    m, shape = 64, (1000,)
    res = simulate(toy(4, 1e-6, 1e-6, shape=shape), Strategy(pp=4, macro_batch=m),
                   System(topology=topo), EMPTY)
    per_msg = 4 * 1000 * 8 / slow
    assert res.summary["iteration_s"] == pytest.approx(2 * m * per_msg, rel=0.02)
    links = {(r["src"], r["dst"]): r for r in res.links}
    assert links[(1, 2)]["busy_s"] == pytest.approx(m * per_msg, rel=1e-6)


@pytest.mark.parametrize("n", [2, 4, 7])
@pytest.mark.parametrize("symmetric", [True, False])
def test_ring_allreduce_closed_form(n, symmetric):
    """One fp32 bucket: 2(N-1)/N * S/B + 2(N-1) * latency, plus the bucket's two
    copies (flatten in, copy back) at the fallback memory bandwidth."""
    from perfsim.engine.plan import FALLBACK_MEMORY_BPS

    params, bw, lat = 250_000, 1e9, 1e-3
    wl = toy(1, 0.0, 1e-9, params=params)
    res = simulate(wl, Strategy(pp=1, dp=n, macro_batch=1),
                   System(bandwidth_bps=bw, latency_s=lat, collective_algo="ring"), EMPTY, symmetric=symmetric)
    S = 4 * params
    expect = 2 * (n - 1) / n * S * 8 / bw + 2 * (n - 1) * lat + 2 * (2 * S / FALLBACK_MEMORY_BPS)
    assert res.stages[0]["dp_sync_s"] == pytest.approx(expect, rel=1e-9)
    assert res.summary["dp_bytes"] == pytest.approx(2 * (n - 1) / n * S * n)
    assert res.summary["replicas_simulated"] == (1 if symmetric else n)


@pytest.mark.parametrize("spec", ["fp32", "fp16", "directq:fw4bw8", "aqsgd:fw3bw6"])
def test_pipeline_bytes_are_the_compressors(spec):
    fw, bw = make_pipeline_pair(spec)
    res = predict(compress=spec, pp=4, macro_batch=4, model="gpt2")
    shape = (1, 1024, 768)
    links = {(r["src"], r["dst"]): r["bytes"] for r in res.links}
    assert links[(0, 1)] == 4 * fw.wire_bytes(shape)
    assert links[(1, 0)] == 4 * bw.wire_bytes(shape)
    assert res.summary["pipeline_bytes"] == 3 * 4 * (fw.wire_bytes(shape) + bw.wire_bytes(shape))


def test_allgather_compressor_scales_with_workers():
    """A non-allreduce-compatible compressor allgathers: bytes per rank ~ (N-1) x payload,
    while an allreduce-compatible one stays ~ 2 x payload."""
    per_rank = {}
    for spec in ("qsgd:4", "qsgd-maxnorm:4"):
        comp = make_compressor(spec)
        assert comp.allreduce_compatible == (spec == "qsgd-maxnorm:4")
        for n in (2, 4, 8):
            r = predict(model="gpt2", pp=2, dp=n, macro_batch=2, grad_compress=spec, bandwidth="1Gbps")
            per_rank[spec, n] = r.summary["dp_bytes"] / n
    assert per_rank["qsgd:4", 8] / per_rank["qsgd:4", 2] == pytest.approx(7, rel=0.01)
    # ring allreduce: 2(N-1)/N x payload (1 -> 1.75), and the summed codes' lanes widen with
    # log2 N (b + ceil(log2 N) bits: 12 -> 9 lanes per int64 word, 5.33 -> 7.1 bits per value)
    assert per_rank["qsgd-maxnorm:4", 8] / per_rank["qsgd-maxnorm:4", 2] == pytest.approx(
        1.75 * (64 / 9) / (64 / 12), rel=0.02)


def test_deterministic():
    a = predict(bandwidth="300Mbps", compress="aqsgd:fw3bw6", dp=2, grad_compress="qsgd-maxnorm:4")
    b = predict(bandwidth="300Mbps", compress="aqsgd:fw3bw6", dp=2, grad_compress="qsgd-maxnorm:4")
    assert a.to_json_dict() == b.to_json_dict()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_peak_inflight(schedule):
    p, m = 8, 32
    res = predict(schedule=schedule, macro_batch=m)
    expect = [min(p - s, m) if schedule == "1f1b" else m for s in range(p)]
    assert [row["peak_inflight"] for row in res.stages] == expect
    assert expect == [max_in_flight(row) for row in get_schedule(schedule)(p, m)]


def test_heterogeneous_replicas_simulated_separately():
    """dp=2 x pp=2 on 4 nodes; replica 1's pipeline link is slow: every replica is
    simulated and the slow one sets the iteration time (sync waits for it)."""
    bw = [[0 if i == j else 1e9 for j in range(4)] for i in range(4)]
    bw[2][3] = bw[3][2] = 1e7
    topo = Topology(tuple(map(tuple, bw)), tuple(tuple(0.0 for _ in range(4)) for _ in range(4)))
    wl = toy(2, 1e-3, 2e-3, params=1000, shape=(10_000,))
    het = simulate(wl, Strategy(pp=2, dp=2, macro_batch=4), System(topology=topo), EMPTY)
    assert het.summary["replicas_simulated"] == 2
    fast = simulate(wl, Strategy(pp=2, dp=2, macro_batch=4), System(bandwidth_bps=1e9), EMPTY)
    assert fast.summary["replicas_simulated"] == 1
    assert het.summary["iteration_s"] > 5 * fast.summary["iteration_s"]


def test_headline_shape():
    """Compression should help a lot at 100 Mbps and little at 10 Gbps (mechanism,
    not a tuned number)."""
    def tput(bw, c):
        return predict(bandwidth=bw, compress=c).summary["throughput_samples_per_s"]
    slow = tput("100Mbps", "aqsgd:fw3bw6") / tput("100Mbps", "fp32")
    fast = tput("10Gbps", "aqsgd:fw3bw6") / tput("10Gbps", "fp32")
    assert slow > 3 and 0.95 < fast < 1.1


def test_aqsgd_first_epoch_is_uncompressed():
    r = predict(bandwidth="100Mbps", compress="aqsgd:fw3bw6", epochs=3)
    s = r.summary
    assert s["warmup_iteration_s"] > 2 * s["iteration_s"]
    assert s["total_s"] == pytest.approx(s["iterations_per_epoch"] * (s["warmup_iteration_s"] + 2 * s["iteration_s"]))


def test_overlap_hides_gradient_sync():
    kw = dict(model="gpt2", pp=2, dp=4, macro_batch=4, bandwidth="1Gbps")
    on, off = predict(**kw), predict(**kw, overlap=False)
    assert on.summary["iteration_s"] < off.summary["iteration_s"]


def test_nic_sharing_slows_concurrent_flows():
    kw = dict(schedule="1f1b", bandwidth="200Mbps", macro_batch=16)
    shared, free = predict(**kw), predict(**kw, nic_sharing=False)
    assert shared.summary["iteration_s"] >= free.summary["iteration_s"]


def test_replica_classes_match_full_simulation():
    """Replicas with identical pipeline links are simulated once; the answer equals
    simulating every replica (two regions, a slow pipeline hop in replica 3,
    the data-parallel ring crossing the regions)."""
    n = 8  # 4 replicas x 2 stages, one device per node
    bw = [[0 if i == j else (1e9 if i // 4 == j // 4 else 1e8) for j in range(n)] for i in range(n)]
    lat = [[0 if i == j else (1e-4 if i // 4 == j // 4 else 2e-2) for j in range(n)] for i in range(n)]
    bw[6][7] = bw[7][6] = 2e8
    topo = Topology(tuple(map(tuple, bw)), tuple(map(tuple, lat)))
    wl = toy(2, 1e-3, 2e-3, params=50_000, shape=(20_000,))
    st, sy = Strategy(pp=2, dp=4, macro_batch=8, schedule="1f1b"), System(topology=topo)
    grouped = simulate(wl, st, sy, EMPTY)
    full = simulate(wl, st, sy, EMPTY, symmetric=False)
    assert grouped.summary["replicas_simulated"] == 2 and full.summary["replicas_simulated"] == 4
    for key in ("iteration_s", "bubble_fraction", "dp_bytes", "pipeline_bytes", "comm_s", "idle_s"):
        assert grouped.summary[key] == pytest.approx(full.summary[key], rel=1e-9), key


from hypothesis import given, settings, strategies as hst  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(p=hst.integers(1, 5), m=hst.integers(1, 9), schedule=hst.sampled_from(["gpipe", "1f1b"]),
       rate=hst.sampled_from([1e6, 1e8, 1e10]), lat=hst.sampled_from([0.0, 1e-3]))
def test_iteration_bounds(p, m, schedule, rate, lat):
    """Communication can only add to the free-communication time, and never more than
    running every transfer and every compute one after another."""
    tf, tb, shape = 0.01, 0.02, (2500,)
    res = simulate(toy(p, tf, tb, shape=shape), Strategy(pp=p, macro_batch=m, schedule=schedule),
                   System(bandwidth_bps=rate, latency_s=lat), EMPTY)
    T = res.summary["iteration_s"]
    msg = 4 * 2500 * 8 / rate + lat
    assert T >= (m + p - 1) * (tf + tb) * (1 - 1e-12)
    assert T <= p * m * (tf + tb) + 2 * (p - 1) * m * msg + 1e-9
    assert 0 <= res.summary["bubble_fraction"] < 1


def _two_stage(system, m=1, n=1000, tf=1e-3, tb=2e-3, schedule="gpipe"):
    return simulate(toy(2, tf, tb, shape=(n,)), Strategy(pp=2, micro_batch=1, macro_batch=m,
                                                         schedule=schedule), system, EMPTY)


def test_token_bucket_burst_closed_form():
    """tc tbf: after idling, a message <= burst arrives in latency alone; a long
    stream runs at the rate, the burst saving b / rate once per direction."""
    tf, tb, lat, bw, n = 1e-3, 2e-3, 1e-3, 1e6, 1000  # 4000-byte messages, 32 ms each
    plain = _two_stage(System(bandwidth_bps=bw, latency_s=lat), n=n, tf=tf, tb=tb)
    assert plain.summary["iteration_s"] == pytest.approx(2 * (tf + tb) + 2 * (4000 * 8 / bw + lat), rel=1e-9)
    burst = _two_stage(System(bandwidth_bps=bw, latency_s=lat, link_burst_bytes=4000), n=n, tf=tf, tb=tb)
    assert burst.summary["iteration_s"] == pytest.approx(2 * (tf + tb) + 2 * lat, rel=1e-9)
    # 64 back-to-back messages per direction (GPipe, tiny compute): only the first
    # b bytes of each direction skip the rate
    b, m = 10_000, 64
    long0 = _two_stage(System(bandwidth_bps=bw, latency_s=0.0), m=m, n=n, tf=1e-6, tb=1e-6)
    long1 = _two_stage(System(bandwidth_bps=bw, latency_s=0.0, link_burst_bytes=b), m=m, n=n, tf=1e-6, tb=1e-6)
    saved = long0.summary["iteration_s"] - long1.summary["iteration_s"]
    assert saved == pytest.approx(2 * b * 8 / bw, rel=0.01)
    assert long1.summary["pipeline_bytes"] == long0.summary["pipeline_bytes"]  # bytes still counted


def test_default_system_is_eager_without_burst():
    s = System()
    assert s.link_burst_bytes == 0 and s.p2p_protocol == "eager"
    with pytest.raises(ValueError, match="p2p_protocol"):
        System(p2p_protocol="magic")
    with pytest.raises(ValueError, match="link_burst_bytes"):
        System(link_burst_bytes=-1)


def test_rendezvous_waits_for_receiver_and_reverse_queue():
    """Receiver-driven p2p: stage 1 posts its receive at t=0, its ready notice
    arrives at c, the activation leaves when stage 0 sends it (t0 = 6 ms > c). Stage 0
    then posts its gradient receive, but the notice leaves behind the activation's
    bytes on node 0's egress: the gradient starts at t0 + S/B + c, not when stage 1
    finished its (fast) backward."""
    lat, c, bw = 1e-3, 5e-3, 1e6
    t0, t1 = 6e-3, 1e-4  # stage 0 / stage 1 forward (= backward) time
    layers = tuple(LayerSpec(f"l{i}", 0, (1000,), 0.0) for i in range(2))
    wl = Workload("toy", layers, (t0, t1), (t0, t1), 1)
    S = 4000 * 8 / bw

    def run(**kw):
        return simulate(wl, Strategy(pp=2, micro_batch=1, macro_batch=1, schedule="gpipe"),
                        System(bandwidth_bps=bw, latency_s=lat, **kw), EMPTY).summary["iteration_s"]

    eager = run()
    assert eager == pytest.approx(t0 + 2 * (S + lat) + 2 * t1 + t0, rel=1e-9)
    act_end = t0 + S
    stage1_done = act_end + lat + 2 * t1
    grad_start = act_end + c
    assert grad_start > stage1_done  # the reverse queue matters here
    assert run(p2p_protocol="rendezvous", p2p_control_latency_s=c) == \
        pytest.approx(grad_start + S + lat + t0, rel=1e-9)
    # control latency defaults to the link latency: the notice arrives at act_end + lat,
    # before stage 1 is done, so nothing changes against eager here
    assert run(p2p_protocol="rendezvous") == pytest.approx(eager, rel=1e-9)


def test_predict_accepts_burst_and_protocol():
    base = dict(model="digits-mlp", pp=2, micro_batch=8, macro_batch=32, bandwidth="100Mbps",
                latency="1ms", schedule="1f1b")
    plain = predict(**base).summary["iteration_s"]
    burst = predict(**base, link_burst="50KB").summary["iteration_s"]
    rdv = predict(**base, p2p_protocol="rendezvous").summary["iteration_s"]
    assert burst < plain <= rdv
    with pytest.raises(ValueError, match="p2p_protocol"):
        predict(**base, p2p_protocol="nope")


def test_calibrated_framing_is_serial_host_time_per_message():
    """frame_send / frame_recv (alpha + beta * wire bytes) join each message's encode
    and decode: with 2 stages, 1 micro-batch and free links, the iteration grows by
    exactly one send and one receive framing per direction."""
    n = 1000  # fp32 boundary: 4000 wire bytes
    send, recv = (2e-4, 1e-8), (1e-4, 2e-8)
    framed = Profile.from_dict({"format": "perfsim-profile", "version": 1, "metadata": {}, "records": [
        {"op": "fit_frame_send", "name": "messenger", "alpha_s": send[0], "beta_s_per_byte": send[1]},
        {"op": "fit_frame_recv", "name": "messenger", "alpha_s": recv[0], "beta_s_per_byte": recv[1]}]})
    strategy = Strategy(pp=2, micro_batch=1, macro_batch=1)
    plain = simulate(toy(2, shape=(n,)), strategy, System(bandwidth_bps=1e18), EMPTY)
    res = simulate(toy(2, shape=(n,)), strategy, System(bandwidth_bps=1e18), framed)
    per_direction = send[0] + send[1] * 4 * n + recv[0] + recv[1] * 4 * n
    assert res.summary["iteration_s"] - plain.summary["iteration_s"] == pytest.approx(2 * per_direction, rel=1e-6)
    assert EMPTY.framing_time("send", 4 * n) == 0.0
