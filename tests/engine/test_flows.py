"""The flow scheduler's max-min fair sharing (perfsim.network.flows.FlowScheduler)."""

from __future__ import annotations

import math
import random

import simpy

from perfsim.network.flows import SHAPE_FLOWS, FlowScheduler, _Flow


def reference_max_min(flows, cap_of) -> list[float]:
    """Progressive filling as first written (Bertsekas & Gallager, *Data Networks*,
    Sec. 6.5.2): every round scans every resource and every unfixed flow."""
    remaining, count = {}, {}
    for f in flows:
        for r in f.resources:
            if r not in remaining:
                remaining[r] = cap_of(r)
                count[r] = 0
            count[r] += 1
    rate = [-1.0] * len(flows)
    left = list(range(len(flows)))
    while left:
        level = min((remaining[r] / n for r, n in count.items() if n), default=math.inf)
        level = min([level] + [flows[i].cap for i in left])
        if not math.isfinite(level):
            for i in left:
                rate[i] = flows[i].cap
            break
        tight = {r for r, n in count.items() if n and remaining[r] / n <= level * (1 + 1e-12)}
        keep = []
        for i in left:
            f = flows[i]
            if f.cap <= level * (1 + 1e-12) or any(r in tight for r in f.resources):
                rate[i] = max(level, 0.0)
                for r in f.resources:
                    remaining[r] -= rate[i]
                    count[r] -= 1
            else:
                keep.append(i)
        left = keep
    return rate


def test_max_min_is_the_reference_bit_for_bit():
    """Random components (NICs of a few nodes, caps drawn from a few link rates so that
    ties, near-ties within 1e-12 and just outside it occur, and a ring flow over every NIC): the
    scheduler's rates are exactly the reference's."""
    rng = random.Random(7)
    for trial in range(300):
        nodes = rng.randint(1, 6)
        caps = {("tx", n): rng.choice([1e9, 1e10, 2.5e9, 1e9 * (1 + 1e-13), 1e9 * (1 + 5e-12)]) for n in range(nodes)}
        caps.update({("rx", n): rng.choice([1e9, 1e10, 4e9]) for n in range(nodes)})
        sched = FlowScheduler(simpy.Environment(), lambda r: caps[r])
        flows = []
        for _ in range(rng.randint(1, 40)):
            kind = rng.random()
            if kind < 0.1:  # a ring collective over every NIC
                res = tuple(caps)
            elif kind < 0.2:  # intra-node: no shared resource
                res = ()
            else:
                a, b = rng.randrange(nodes), rng.randrange(nodes)
                res = (("tx", a), ("rx", b))
            cap = rng.choice([1e8, 1e9, 3e9, 1e10, 1e9 / 3, 1e9 * (1 - 5e-12), math.inf if not res else 2e9]) / 8
            flows.append(_Flow(1.0, res, cap, None, 0.0, None))
        got = sched._max_min(flows)
        want = reference_max_min(flows, sched._cap)
        assert got == want, (trial, got, want)
        assert all(r >= 0 for r in got)


def test_flows_sharing_a_nic_split_it_and_finish_in_turn():
    """Three flows on one sending NIC of 8 bits/s (1 byte/s): each gets a third until the
    smallest ends, then a half; the end times follow (1, 2 and 3 bytes)."""
    env = simpy.Environment()
    sched = FlowScheduler(env, lambda r: 8.0)
    ends = []
    for n in (1.0, 2.0, 3.0):
        sched.transfer(n, [("tx", 0)], 1e9, stats=lambda s, e: ends.append(e), event=False)
    env.run()
    assert ends == [3.0, 5.0, 6.0]
    assert sched.flows_done == 3 and not any(sched.users.values())


def test_finished_flows_leave_no_reference_cycles():
    """A finished flow drops its timer (flow <-> timer was a cycle per message, left to
    the cyclic GC: ~2.5 CPU-s of collection after a 131,072-GPU run): the cyclic garbage
    a run leaves does not grow with its flows."""
    import gc

    def garbage(n: int) -> int:
        def run():
            env = simpy.Environment()
            fs = FlowScheduler(env, lambda r: 8e9)
            for i in range(n):  # sharing one NIC: every start and end re-arms the others' timers
                fs.transfer(1e6 * (i + 1), ["nic"], 8e9)
            env.run()

        gc.collect()
        was = gc.isenabled()
        gc.disable()
        try:
            run()
            return gc.collect()
        finally:
            if was:
                gc.enable()

    assert garbage(3) == garbage(30) == garbage(0)


def test_rates_remembered_by_shape_are_max_min_bit_for_bit():
    """Small random components, each also asked again on other nodes (the same shape under
    other resource names): the rates remembered by shape are exactly _max_min's."""
    rng = random.Random(11)
    caps = {(k, n): rng.choice([1e9, 1e10, 2.5e9, 4e9, 1e9 * (1 + 5e-12)]) for n in range(6) for k in ("tx", "rx")}
    caps.update({(k, n + 6): caps[(k, n)] for k, n in list(caps)})  # nodes 6.. : a copy of nodes 0..
    sched = FlowScheduler(simpy.Environment(), lambda r: caps[r])
    small = 0  # components small enough to be remembered
    for trial in range(300):
        nodes = rng.randint(1, 3)
        size = rng.randint(2, 9)
        links = [(rng.randrange(nodes), rng.randrange(nodes)) for _ in range(size)]
        fcaps = [rng.choice([1e8, 1e9, 3e9, 1e9 * (1 + 5e-12), math.inf]) / 8 for _ in range(size)]
        for base in (0, 3, 6):  # nodes 0.., 3.. (other capacities: another shape), 6.. (the same as 0..)
            flows = [_Flow(1.0, (("tx", base + a), ("rx", base + b)), c, None, 0.0, None)
                     for (a, b), c in zip(links, fcaps)]
            got = sched._shared_rates(flows)
            assert got == sched._max_min(flows) == reference_max_min(flows, sched._cap), trial
        small += size <= SHAPE_FLOWS
    assert 0 < len(sched._shapes) <= 2 * small  # nodes 6.. were answered by nodes 0..'s shapes
