"""Fluid flows on shared capacities, max-min fair, on a SimPy clock.

A *flow* moves ``volume`` bytes through a set of shared resources (a node's
sending NIC, a receiving NIC) at most at its own ``cap`` (the pair link's
rate). Whenever a flow starts or ends, rates are recomputed by progressive
filling -- the max-min fair allocation (Bertsekas & Gallager, *Data Networks*,
Sec. 6.5.2), which is how long-lived TCP flows sharing a bottleneck behave to
first order. A ring collective is one flow that uses every ring link's
resources and moves at its slowest link's rate (the ring advances in lock step).

Rates are recomputed only inside the *component* of flows that share a
resource (transitively) with the flow that started or ended, and each flow
keeps its own completion timer (re-armed only when its rate changes; stale
timers are ignored by a version counter). Independent pipeline replicas on a
heterogeneous network therefore never pay for each other's flows.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable


class _Flow:
    __slots__ = ("volume", "left", "resources", "cap", "rate", "last", "version", "event", "start",
                 "stats", "active")

    def __init__(self, volume, resources, cap, event, start, stats):
        self.volume = volume
        self.left = volume
        self.resources = resources
        self.cap = cap  # bytes/s
        self.rate = 0.0
        self.last = start
        self.version = 0
        self.event = event
        self.start = start
        self.stats = stats
        self.active = True


class FlowScheduler:
    """Max-min fair sharing of resource capacities among active flows.

    ``capacity(resource) -> bits/s`` gives each resource's rate.
    """

    def __init__(self, env, capacity: Callable[[Any], float]):
        self.env = env
        self._capacity = capacity
        self._cap_cache: dict[Any, float] = {}
        self.users: dict[Any, dict[_Flow, None]] = {}  # resource -> flows (ordered set)
        self.flows_done = 0

    def _cap(self, res) -> float:
        c = self._cap_cache.get(res)
        if c is None:
            c = self._capacity(res) / 8.0
            self._cap_cache[res] = c
        return c

    def transfer(self, nbytes: float, resources: Iterable[Any], cap_bps: float, stats=None, event: bool = True):
        """An event that succeeds when ``nbytes`` have moved (latency not included).
        ``stats`` (optional) is called as ``stats(start, end)`` on completion;
        ``event=False``: no event (None), for callers that only need ``stats``."""
        ev = self.env.event() if event else None
        if nbytes <= 0:
            if ev is not None:
                ev.succeed()
            if stats:
                stats(self.env.now, self.env.now)
            return ev
        f = _Flow(float(nbytes), tuple(resources), cap_bps / 8.0, ev, self.env.now, stats)
        for r in f.resources:
            self.users.setdefault(r, {})[f] = None
        self._rebalance(self._component([f]))
        return ev

    # -------------------------------------------------------------- internals
    def _component(self, seeds: Iterable[_Flow]) -> list[_Flow]:
        seen: dict[_Flow, None] = {}
        stack = [f for f in seeds if f.active]
        while stack:
            f = stack.pop()
            if f in seen:
                continue
            seen[f] = None
            for r in f.resources:
                for g in self.users[r]:
                    if g not in seen:
                        stack.append(g)
        return list(seen)

    def _rebalance(self, flows: list[_Flow]) -> None:
        if not flows:
            return
        if len(flows) == 1:
            f = flows[0]
            rates = [min([f.cap] + [self._cap(r) for r in f.resources])]
        else:
            rates = self._max_min(flows)
        now = self.env.now
        for f, rate in zip(flows, rates):
            if rate == f.rate and f.version:
                continue
            f.left -= f.rate * (now - f.last)
            f.last = now
            f.rate = rate
            f.version += 1
            if rate > 0:
                timer = self.env.timeout(max(f.left, 0.0) / rate)
                timer.callbacks.append(lambda _ev, f=f, v=f.version: self._on_timer(f, v))

    def _max_min(self, flows: list[_Flow]) -> list[float]:
        """Progressive filling (Bertsekas & Gallager Sec. 6.5.2) inside one component."""
        remaining: dict[Any, float] = {}
        count: dict[Any, int] = {}
        for f in flows:
            for r in f.resources:
                if r not in remaining:
                    remaining[r] = self._cap(r)
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

    def _on_timer(self, f: _Flow, version: int) -> None:
        if version != f.version or not f.active:
            return  # re-armed after a rate change
        f.active = False
        f.left = 0.0
        neighbours: dict[_Flow, None] = {}
        for r in f.resources:
            users = self.users[r]
            del users[f]
            for g in users:
                neighbours[g] = None
        self.flows_done += 1
        if f.stats:
            f.stats(f.start, self.env.now)
        if f.event is not None:
            f.event.succeed()
        self._rebalance(self._component(neighbours))
