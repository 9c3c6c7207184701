"""Fluid flows on shared capacities, max-min fair, on a SimPy clock.

A *flow* moves ``volume`` bytes through a set of shared resources (a node's
sending NIC, a receiving NIC) at most at its own ``cap`` (the pair link's
rate). Whenever a flow starts or ends, rates are recomputed by progressive
filling -- the max-min fair allocation (Bertsekas & Gallager, *Data Networks*,
Sec. 6.5.2), which is how long-lived TCP flows sharing a bottleneck behave to
first order. A ring collective is one flow that uses every ring link's
resources and moves at its slowest link's rate (the ring advances in lock step).

Only two SimPy events per flow change are scheduled (a timeout to the next
completion, superseded ones are ignored by a version counter), so cost is
O(flows x concurrent flows), not O(bytes).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

_EPS = 1e-9  # bytes: a flow with less left is done


class _Flow:
    __slots__ = ("volume", "left", "resources", "cap", "rate", "event", "start", "stats")

    def __init__(self, volume, resources, cap, event, start, stats):
        self.volume = volume
        self.left = volume
        self.resources = resources
        self.cap = cap  # bytes/s
        self.rate = 0.0
        self.event = event
        self.start = start
        self.stats = stats


class FlowScheduler:
    """Max-min fair sharing of resource capacities among active flows.

    ``capacity(resource) -> bits/s`` gives each resource's rate.
    """

    def __init__(self, env, capacity: Callable[[Any], float]):
        self.env = env
        self._capacity = capacity
        self._cap_cache: dict[Any, float] = {}
        self.active: list[_Flow] = []
        self._last = 0.0
        self._version = 0
        self.flows_done = 0

    def _cap(self, res) -> float:
        c = self._cap_cache.get(res)
        if c is None:
            c = self._capacity(res) / 8.0
            self._cap_cache[res] = c
        return c

    def transfer(self, nbytes: float, resources: Iterable[Any], cap_bps: float, stats=None):
        """An event that succeeds when ``nbytes`` have moved (latency not included).
        ``stats`` (optional) is called as ``stats(start, end)`` on completion."""
        ev = self.env.event()
        if nbytes <= 0:
            ev.succeed()
            if stats:
                stats(self.env.now, self.env.now)
            return ev
        self._advance()
        self.active.append(_Flow(float(nbytes), tuple(resources), cap_bps / 8.0, ev, self.env.now, stats))
        self._reallocate()
        return ev

    # -------------------------------------------------------------- internals
    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0:
            for f in self.active:
                f.left -= f.rate * dt
        self._last = now

    def _reallocate(self) -> None:
        flows = self.active
        if len(flows) == 1:  # fast path: a lone flow gets min(cap, resources)
            f = flows[0]
            f.rate = min([f.cap] + [self._cap(r) for r in f.resources])
        else:
            self._progressive_filling(flows)
        self._version += 1
        version = self._version
        horizon = min((f.left / f.rate if f.rate > 0 else math.inf) for f in flows) if flows else math.inf
        if math.isfinite(horizon):
            t = self.env.timeout(max(horizon, 0.0))
            t.callbacks.append(lambda _ev, v=version: self._on_timer(v))

    def _progressive_filling(self, flows: list[_Flow]) -> None:
        remaining = {}
        users: dict[Any, list[_Flow]] = {}
        for f in flows:
            f.rate = -1.0
            for r in f.resources:
                if r not in remaining:
                    remaining[r] = self._cap(r)
                    users[r] = []
                users[r].append(f)
        unfrozen = set(range(len(flows)))
        index = {id(f): i for i, f in enumerate(flows)}
        while unfrozen:
            # the tightest constraint: a resource's equal share or a flow's own cap
            share, limiting = math.inf, None
            for r, us in users.items():
                n = sum(1 for f in us if f.rate < 0)
                if n:
                    s = remaining[r] / n
                    if s < share:
                        share, limiting = s, ("res", r)
            for i in unfrozen:
                if flows[i].cap < share:
                    share, limiting = flows[i].cap, ("flow", i)
            if limiting is None or not math.isfinite(share):
                for i in unfrozen:
                    flows[i].rate = flows[i].cap
                break
            if limiting[0] == "flow":
                frozen = [flows[limiting[1]]]
            else:
                frozen = [f for f in users[limiting[1]] if f.rate < 0]
            for f in frozen:
                f.rate = max(share, 0.0)
                unfrozen.discard(index[id(f)])
                for r in f.resources:
                    remaining[r] -= f.rate

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a later start/end
        self._advance()
        done = [f for f in self.active if f.left <= _EPS * max(1.0, f.volume)]
        if not done:  # numerical slack: finish the nearest one
            done = [min(self.active, key=lambda f: f.left / f.rate if f.rate > 0 else math.inf)]
        self.active = [f for f in self.active if f not in done]
        now = self.env.now
        for f in done:
            self.flows_done += 1
            if f.stats:
                f.stats(f.start, now)
            f.event.succeed()
        self._reallocate()
