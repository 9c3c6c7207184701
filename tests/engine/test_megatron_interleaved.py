"""perfsim's interleaved 1F1B against Megatron-LM's, as its 2021 code runs it: the compute order,
the tensors each blocking exchange moves, and the timing of both ways of waiting, each checked
against an independent implementation of Megatron's rules (tests/engine/megatron_interleaved.py)."""

import random

import pytest

from perfsim.config import Strategy, System, Workload
from perfsim.engine import simulate
from perfsim.errors import ConfigError
from perfsim.models.specs import LayerSpec
from perfsim.profile import Profile
from perfsim.schedules import exchange_rows, held_work, interleaved_1f1b, one_f_one_b

import megatron_interleaved as meg

# (p, m, v): small ones, and the 76.1B-529.6B rows of Megatron-LM's Table 1 (arXiv:2104.04473)
SHAPES = [(4, 8, 3), (3, 6, 2), (5, 10, 3), (4, 12, 2), (4, 28, 3), (8, 48, 2), (16, 144, 2), (35, 280, 3)]


def _tensors(progs, r):
    """Rank ``r``'s program as perfsim writes it: a compute step, or the set of its exchange's
    communication actions ``(kind, stage, micro-batch)``."""
    out = []
    for s in progs[r]:
        if not isinstance(s, meg.Exchange):
            out.append("compute")
            continue
        ex = set()
        if s.send_next:
            ex.add(("SEND_F", s.send_next[1], s.send_next[2]))
        if s.send_prev:
            ex.add(("SEND_B", s.send_prev[1], s.send_prev[2]))
        if s.got_prev:
            ex.add(("RECV_F", s.got_prev[1] + 1, s.got_prev[2]))
        if s.got_next:
            ex.add(("RECV_B", s.got_next[1] - 1, s.got_next[2]))
        out.append(frozenset(ex))
    return out


def _same_as_megatron(table, p, m, v):
    """Megatron's rules deliver every tensor to its consumer (the reference is right), every rank
    computes in ``table``'s order, and each blocking exchange of ``exchange_rows(table)`` moves
    exactly the tensors of Megatron's call at that point, in the same sequence."""
    progs = meg.programs(p, m, v)
    meg.check_deliveries(progs, p, v)
    assert meg.compute_order(progs, p) == [[str(a) for a in row] for row in table]
    rows = exchange_rows(table)
    for r in range(p):
        ours = [frozenset((a.kind, a.stage, a.microbatch) for a in x) if isinstance(x, tuple) else "compute"
                for x in rows[r]]
        assert ours == _tensors(progs, r), f"rank {r}"


@pytest.mark.parametrize("p,m,v", SHAPES)
def test_same_order_and_exchanges_as_megatron(p, m, v):
    """Megatron's rules deliver every tensor to its consumer (the reference is right), every rank
    computes in perfsim's order, and each of perfsim's blocking exchanges moves exactly the tensors
    of Megatron's ``_communicate`` call at that point, in the same sequence."""
    _same_as_megatron(interleaved_1f1b(p, m, v), p, m, v)


def test_warmup_counts_and_chunks_worked_example():
    """p = 4, v = 3, m = 8: (p - rank - 1) * 2 + (v - 1) * p warm-up forwards (14, 12, 10, 8),
    chunks in groups of p micro-batches, forwards chunk 0 -> 2, backwards 2 -> 0."""
    table = interleaved_1f1b(4, 8, 3)
    for d, row in enumerate(table):
        warm = next(i for i, a in enumerate(row) if a.kind == "B") - 1
        assert warm == (4 - d - 1) * 2 + 2 * 4
    assert [str(a) for a in table[0][:14]] == ["0F0", "0F1", "0F2", "0F3", "4F0", "4F1", "4F2", "4F3",
                                               "8F0", "8F1", "8F2", "8F3", "0F4", "0F5"]
    assert [str(a) for a in table[3] if a.kind == "B"][:6] == ["11B0", "11B1", "11B2", "11B3", "7B0", "7B1"]


def test_m_equal_p_runs_torchs_order_not_megatrons():
    """The one order that differs: with as many micro-batches as stages Megatron-LM runs every
    forward before any backward (``all_warmup_microbatches``); perfsim runs torch's
    ScheduleInterleaved1F1B order (tests/engine/test_schedules.py), whose later ranks start
    their backwards earlier. Megatron also refuses m % p != 0, which torch (and perfsim) run."""
    progs = meg.programs(4, 4, 2)
    meg.check_deliveries(progs, 4, 2)
    ours = [[str(a) for a in row] for row in interleaved_1f1b(4, 4, 2)]
    theirs = meg.compute_order(progs, 4)
    assert [d for d in range(4) if ours[d] != theirs[d]] == [2, 3]
    assert all(row.index(next(a for a in row if "B" in a)) == 8 for row in theirs)
    with pytest.raises(ValueError, match="not divisible"):
        meg.program(4, 6, 2, 0)
    # the same step with even chunks (forward 1 s, backward 2 s, free messages): 33 s both ways;
    # Megatron's ranks hold all m v = 8 chunk activations at once, perfsim's fewer
    wl = _toy([1.0] * 8, [2.0] * 8, 1000)
    st = Strategy(pp=4, micro_batch=1, macro_batch=4, schedule="interleaved-1f1b", virtual_stages=2)
    ours_s = simulate(wl, st, System(bandwidth_bps=1e15, latency_s=0.0), Profile()).summary["iteration_s"]
    assert ours_s == pytest.approx(33.0) == meg.free_running_times(progs, 4, lambda k, mb: 1.0, lambda k, mb: 2.0, 0.0)[0]
    assert [h.activations for h in held_work(interleaved_1f1b(4, 4, 2))] == [8, 8, 7, 5]


@pytest.mark.parametrize("p,m", [(4, 8), (3, 6), (2, 4), (4, 2), (35, 35)])
def test_1f1b_order_and_exchanges_as_megatron(p, m):
    """Non-interleaved 1F1B (``forward_backward_pipelining_without_interleaving``): the same order,
    and the same blocking calls -- ``send_forward_recv_backward`` / ``send_backward_recv_forward`` in
    the steady state, a separate send and receive between two forwards or two backwards."""
    _same_as_megatron(one_f_one_b(p, m), p, m, 1)
    text = " ".join("(" + " ".join(map(str, x)) + ")" if isinstance(x, tuple) else str(x)
                    for x in exchange_rows(one_f_one_b(3, 4))[1])
    assert text == ("(1RECV_F0) 1F0 (1SEND_F0) (1RECV_F1) 1F1 (1SEND_F1 1RECV_B0) 1B0 (1SEND_B0 1RECV_F2) "
                    "1F2 (1SEND_F2 1RECV_B1) 1B1 (1SEND_B1 1RECV_F3) 1F3 (1SEND_F3 1RECV_B2) 1B2 "
                    "(1SEND_B2) (1RECV_B3) 1B3 (1SEND_B3)")


def _toy(costs_f, costs_b, numel):
    layers = tuple(LayerSpec(f"l{i}", 0, (numel,), 0.0) for i in range(len(costs_f)))
    return Workload("toy", layers, tuple(costs_f), tuple(costs_b), 1)


@pytest.mark.parametrize("p,m,v,seed", [(4, 8, 3, 3), (3, 6, 2, 5)])
def test_engine_times_equal_the_reference(p, m, v, seed):
    """Uneven chunks (each its own forward and backward time), one message ``x`` seconds: the
    event loop's iteration equals the reference's to the last bit -- asynchronous sends as a
    free-running replay, blocking rendezvous exchanges as Megatron's ``_communicate`` waits --
    and blocking is the slower."""
    rng = random.Random(seed)
    tf = [rng.uniform(0.5, 1.5) * 1e-2 for _ in range(p * v)]
    tb = [2 * f * rng.uniform(0.8, 1.2) for f in tf]
    numel, bw = 25_000, 1e9
    x = 4 * numel * 8 / bw  # fp32 boundary over one link
    wl = _toy(tf, tb, numel)
    st = Strategy(pp=p, micro_batch=1, macro_batch=m, schedule="interleaved-1f1b", virtual_stages=v)
    common = dict(bandwidth_bps=bw, latency_s=0.0, nic_sharing=False, p2p_control_latency_s=0.0)
    free = simulate(wl, st, System(**common), Profile(), replay=False).summary
    system = System(**common, p2p_protocol="rendezvous", p2p_exchange="blocking")
    blocking = simulate(wl, st, system, Profile()).summary
    traced = simulate(wl, st, system, Profile(), trace=True)  # step by step, not chained: the same times
    assert traced.summary["iteration_s"] == blocking["iteration_s"]
    assert sum(e.get("cat") == "compute" and e["name"] != "optimizer" for e in traced.trace_events) == 2 * m * p * v
    progs = meg.programs(p, m, v)
    fwd, bwd = (lambda k, mb: tf[k]), (lambda k, mb: tb[k])
    ref_free = meg.free_running_times(progs, p, fwd, bwd, x)
    ref_block = meg.blocking_times(progs, p, fwd, bwd, x)
    assert free["iteration_s"] == pytest.approx(ref_free[0], rel=1e-12)
    assert blocking["iteration_s"] == pytest.approx(ref_block[0], rel=1e-12)
    assert blocking["engine"] == "event loop" and blocking["iteration_s"] > free["iteration_s"]
    assert blocking["compute_s"] == pytest.approx(free["compute_s"])


def test_blocking_1f1b_runs_and_bad_value_is_named():
    """Every schedule replays with blocking exchanges; a bad value is a one-line ConfigError."""
    wl = _toy([0.01] * 4, [0.02] * 4, 1000)
    for name in ("gpipe", "1f1b", "zb-h1", "zb-v"):
        st = Strategy(pp=2 if name == "zb-v" else 4, micro_batch=1, macro_batch=4, schedule=name)
        a = simulate(wl, st, System(bandwidth_bps=1e9), Profile()).summary["iteration_s"]
        b = simulate(wl, st, System(bandwidth_bps=1e9, p2p_exchange="blocking"), Profile()).summary["iteration_s"]
        assert b >= a - 1e-12, name
    with pytest.raises(ConfigError, match="p2p_exchange='later'"):
        System(p2p_exchange="later")


@pytest.mark.parametrize("schedule,exchange", [("interleaved-1f1b", "blocking"), ("1f1b", "blocking"),
                                               ("1f1b", "deepspeed")])
def test_blocking_replicas_in_lanes_step_by_step_and_all_agree(schedule, exchange):
    """Three replicas over uneven links with gradient buckets: run as lanes (the default), step by
    step (a trace) and every replica simulated, blocking exchanges (Megatron-LM's, DeepSpeed's) give
    one iteration time, slower than asynchronous sends."""
    from perfsim.network import Topology

    rng = random.Random(5)
    n = 12
    bw = tuple(tuple(0.0 if i == j else rng.choice((1e8, 3e8, 1e9)) for j in range(n)) for i in range(n))
    lat = tuple(tuple(0.0 if i == j else rng.uniform(1e-4, 1e-3) for j in range(n)) for i in range(n))
    layers = tuple(LayerSpec(f"l{i}", 20_000, (5_000,), 0.0) for i in range(8))
    wl = Workload("toy", layers, tuple(rng.uniform(1e-3, 2e-3) for _ in range(8)),
                  tuple(rng.uniform(2e-3, 4e-3) for _ in range(8)), 1)
    st = Strategy(pp=4, dp=3, macro_batch=8, schedule=schedule, bucket_bytes=100_000)
    sy = System(topology=Topology(bw, lat, (1e10,) * n), p2p_exchange=exchange, p2p_protocol="rendezvous")
    times = {simulate(wl, st, sy, Profile(), **kw).summary["iteration_s"]
             for kw in ({}, {"trace": True}, {"symmetric": False})}
    assert len(times) == 1
    assert times.pop() > simulate(wl, st, System(topology=Topology(bw, lat, (1e10,) * n)), Profile()).summary["iteration_s"]
