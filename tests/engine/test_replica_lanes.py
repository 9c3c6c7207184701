"""Replica lanes (perfsim.engine.lanes): replicas run one at a time until the first
gradient sync gives the event loop's answer to the last bit."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

import perfsim.engine.sim as sim
from perfsim.config import Strategy, System, Workload
from perfsim.engine import simulate
from perfsim.engine.lanes import horizon
from perfsim.models.specs import LayerSpec
from perfsim.network import Topology
from perfsim.profile import Profile

EMPTY = Profile()


def toy(p=4, tf=1e-3, tb=2e-3, params=20_000, shape=(5_000,)):
    layers = tuple(LayerSpec(f"l{i}", params, shape, 0.0) for i in range(p))
    return Workload("toy", layers, (tf,) * p, (tb,) * p, 1)


def distinct(nodes, seed, rates=(1e8, 2e8, 3e8, 1e9)):
    """Every pair of nodes its own rate and latency; each NIC as fast as its fastest
    link, so a stage's forward and backward sends compete (the event loop runs)."""
    rng = random.Random(seed)
    bw = tuple(tuple(0.0 if i == j else rng.choice(rates) for j in range(nodes)) for i in range(nodes))
    lat = tuple(tuple(0.0 if i == j else rng.uniform(1e-4, 2e-2) for j in range(nodes)) for i in range(nodes))
    return Topology(bw, lat)


def same(a, b):
    """Two results agree to the last bit (every summary value, stage, micro-batch and link row)."""
    assert {k: repr(v) for k, v in a.summary.items()} == {k: repr(v) for k, v in b.summary.items()}
    for table in ("stages", "microbatches", "links"):
        assert repr(getattr(a, table)) == repr(getattr(b, table)), table


def both(monkeypatch, wl, st, sy):
    """(with lanes, in one time order, events the lanes ran)."""
    ran = []
    real = sim.run_lanes

    def counted(s, heaps):
        ran.append(real(s, heaps))
        return ran[-1]

    monkeypatch.setattr(sim, "run_lanes", counted)
    fast = simulate(wl, st, sy, EMPTY, replay=False, symmetric=False)
    monkeypatch.setattr(sim, "independent", lambda s: False)
    ref = simulate(wl, st, sy, EMPTY, replay=False, symmetric=False)
    return fast, ref, sum(ran)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"])
@pytest.mark.parametrize("grad", ["none", "qsgd-maxnorm:4"])
def test_lanes_equal_one_time_order(monkeypatch, schedule, grad):
    """Three replicas on distinct links whose flows compete: the same result to the
    last bit, with most events run in lanes (before the first sync starts)."""
    wl = toy(8)
    st = Strategy(pp=4, dp=3, macro_batch=6, schedule=schedule, grad_compress=grad, bucket_bytes=100_000)
    fast, ref, ran = both(monkeypatch, wl, st, System(topology=distinct(12, seed=3)))
    same(fast, ref)
    assert fast.summary["replicas_simulated"] == 3
    assert ran > fast.summary["events"] / 2


@pytest.mark.parametrize("system", [dict(comm_slowdown=0.3), dict(link_burst_bytes=20_000.0),
                                    dict(p2p_protocol="rendezvous")])
def test_lanes_with_interference_token_buckets_and_rendezvous(monkeypatch, system):
    """Compute slowed by communication, token-bucket egress, receiver-driven messages:
    their state is per device or per node, so lanes still give the same answer."""
    wl = toy(4)
    st = Strategy(pp=4, dp=2, macro_batch=4, schedule="1f1b", grad_compress="qsgd-maxnorm:4", bucket_bytes=60_000)
    fast, ref, ran = both(monkeypatch, wl, st, System(topology=distinct(8, seed=11), **system))
    same(fast, ref)
    assert ran > 0


def test_without_gradient_sync_lanes_run_everything(monkeypatch):
    """No parameters, no sync: nothing couples the replicas, every event runs in a lane."""
    wl = toy(4, params=0)
    st = Strategy(pp=4, dp=2, macro_batch=4, schedule="1f1b")
    fast, ref, ran = both(monkeypatch, wl, st, System(topology=distinct(8, seed=5)))
    same(fast, ref)
    assert ran == fast.summary["events"]


def test_replicas_sharing_a_node_run_in_one_time_order(monkeypatch):
    """Two GPUs per node, replicas placed side by side: their flows share NICs, no lanes."""
    wl = toy(4)
    st = Strategy(pp=2, dp=2, macro_batch=4, schedule="1f1b", placement="tp,dp,pp")
    fast, ref, ran = both(monkeypatch, wl, st, System(topology=distinct(2, seed=1), gpus_per_node=2))
    same(fast, ref)
    assert ran == 0


def test_horizon_is_the_latest_known_or_pending():
    """Per stage: the latest bucket 0 ready time known, or a pending replica's next
    event when later; the least over stages; a stage nobody can reach bounds nothing."""
    assert horizon({0: {0: 1.0, 1: 3.0}, 1: {0: 2.0}}, {0: 2.5, 1: 4.0}) == 3.0
    assert horizon({0: {0: 1.0}, 1: {}}, {0: 2.0, 1: 0.5}) == 1.0
    assert horizon({0: {}}, {0: float("inf")}) == float("inf")
    assert horizon({}, {0: 1.0}) == float("inf")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=hst.integers(0, 10**6), schedule=hst.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]),
       dp=hst.integers(2, 4), m=hst.sampled_from([1, 2, 4, 6]), overlap=hst.booleans(),
       grad=hst.sampled_from(["none", "qsgd-maxnorm:4", "powersgd:2"]))
def test_lanes_agree_on_random_topologies(seed, schedule, dp, m, overlap, grad):
    """Random distinct topologies: lanes or one time order, the same answer to the last bit."""
    wl = toy(4, params=20_000, shape=(4_000,))
    st = Strategy(pp=2, dp=dp, macro_batch=m, schedule=schedule, grad_compress=grad, bucket_bytes=60_000,
                  overlap_grad_sync=overlap)
    sy = System(topology=distinct(2 * dp, seed))
    with pytest.MonkeyPatch.context() as mp:
        fast, ref, _ = both(mp, wl, st, sy)
    same(fast, ref)


def test_a_finished_simulation_is_freed_without_the_cyclic_gc(monkeypatch):
    """No reference cycle keeps a run alive: with the cyclic GC off, the simulation and its
    network backend are freed as soon as simulate() lets go of them (a cycle per
    connection once left the 131,072-GPU case's 348k objects to a 0.6 s collection,
    sim.paused_gc). (SimPy's Environment is a cycle of its own: its bound constructors.)"""
    import gc
    import weakref

    made = []
    real = sim.Simulation.run

    def run(self):
        made.extend(weakref.ref(x) for x in (self, self.net))
        return real(self)

    monkeypatch.setattr(sim.Simulation, "run", run)
    wl, st = toy(), Strategy(pp=4, dp=2, macro_batch=8, schedule="1f1b")
    was = gc.isenabled()
    gc.disable()
    try:
        simulate(wl, st, System(topology=distinct(8, seed=5)), EMPTY, replay=False, symmetric=False)
        assert len(made) == 2 and [ref() for ref in made] == [None] * 2
    finally:
        if was:
            gc.enable()
