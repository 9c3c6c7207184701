"""Replica lanes: the event loop's independent stretch run one replica at a time.

Replicas that share no node (so no NIC: their pipeline flows never meet) and no
collective other than the data-parallel gradient sync are independent until the
first sync starts: stage ``s``'s bucket 0 collective starts when *every* simulated
replica has bucket 0 ready, at ``T_s = max_r ready(r, s)``; nothing crosses replicas
before ``T_c = min_s T_s`` (the sync's collectives and everything after it are one
component again). Before ``T_c`` each replica's events form an independent
discrete-event system, so processing them replica by replica ("lanes", the
conservative synchronisation of parallel discrete-event simulation: Chandy & Misra,
*Distributed Simulation: A Case Study in Design and Verification of Distributed
Programs*, IEEE TSE 1979) instead of in one global time order yields the same
events at the same times, with a small working set (one replica's processes and
flows, a heap of a few entries instead of one per device of the job).

``T_c`` is not known in advance; it is bounded from below as the lanes advance
(:func:`horizon`): a replica that has not yet made stage ``s``'s bucket 0 ready
will do so no earlier than its next pending event. Round 0 runs each lane until its
first bucket 0 is ready (each is <= ``T_c``); later rounds run every lane up to the
bound, until it stops rising; then the lanes' pending events are merged into the one
SimPy queue and the event loop goes on in global time order. Within a lane the
events are processed in SimPy's own order (time, priority, creation); events of
different lanes at one instant may be taken in another order than the global loop
would, which changes no time (they do not interact before ``T_c``, and the flow
scheduler's rates do not depend on the order flows start at one instant).
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from perfsim.network.flows import FlowBackend

if TYPE_CHECKING:
    from perfsim.engine.sim import Simulation


def independent(sim: Simulation) -> bool:
    """True when the simulated replicas can run as lanes: more than one, the flow
    backend (another backend may couple anything), no ZeRO-2/3 units (their collectives
    rendezvous across replicas), no trace (its spans would be listed in another order)
    and no node hosting devices of two simulated replicas."""
    if len(sim.replicas) < 2 or sim.want_trace or type(sim.net) is not FlowBackend:
        return False
    if any(sp.units for sp in sim.plan.stages):
        return False
    owner: dict[int, int] = {}
    node = sim.net.node
    for r in sim.replicas:
        for s in range(sim.plan.pp):
            if owner.setdefault(node(sim.dev(r, s)), r) != r:
                return False
    return True


def horizon(ready: dict[int, dict[int, float]], nxt: dict[int, float]) -> float:
    """A lower bound of the first sync's start ``T_c``: per stage with a sync, the latest
    of the replicas' bucket 0 ready times known (``ready[s][r]``) and, for the others,
    their next pending event (``nxt[r]``, inf when none); the least over stages."""
    bound = math.inf
    for s, known in ready.items():
        b = max(known.values(), default=-math.inf)
        for r, t in nxt.items():
            if r not in known and t > b:
                b = t
        bound = min(bound, b)
    return bound


def run_lanes(sim: Simulation, heaps: dict[int, list]) -> int:
    """Run each replica's lane (``heaps[r]``: its part of SimPy's queue) as far as it is
    independent (module docstring), then merge the lanes into the environment's queue.
    Returns the events processed."""
    env = sim.env
    queue, step, events = env._queue, env.step, 0
    ready, fired = sim.lane_ready, sim.lane_fired  # stage -> replica -> when its bucket 0 was ready
    while queue and queue[0][0] <= env._now:  # the syncs' processes start (they wait for every lane)
        step()
        events += 1
    clock = {r: env._now for r in heaps}

    pop = heapq.heappop

    def advance(r: int, until: float, first: bool) -> int:
        # SimPy's Environment.step, inlined (the lanes' ~1.6 million events of the
        # 131,072-GPU case: one call less each); a failed event is left to SimPy's step
        env._queue, env._now = heaps[r], clock[r]
        heap, n = heaps[r], 0
        while heap and (r not in fired if first else heap[0][0] < until):  # round 0: up to its first bucket 0
            if not heap[0][3]._ok:
                step()
                n += 1
                continue
            env._now, _, _, event = pop(heap)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            n += 1
        clock[r] = env._now
        return n

    try:
        for r in heaps:
            events += advance(r, math.inf, True)
        bound = -math.inf
        while True:
            nxt = {r: (h[0][0] if h else math.inf) for r, h in heaps.items()}
            new = horizon(ready, nxt)
            if not new > bound:
                break
            bound = new
            moved = sum(advance(r, bound, False) for r in heaps)
            events += moved
            if not moved:
                break
    finally:
        for h in heaps.values():
            queue.extend(h)
            h.clear()
        heapq.heapify(queue)
        env._queue = queue
        env._now = queue[0][0] if queue else max(clock.values(), default=env._now)
    return events
