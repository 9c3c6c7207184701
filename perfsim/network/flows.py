"""The flow backend: the SimPy flow model of the network (:class:`FlowBackend`).

The one :class:`perfsim.network.backend.NetworkBackend` perfsim ships: messages and
collective phases are fluid flows on the analytical :class:`perfsim.network.Network`'s
links and shared NICs.

Max-min fair flows (:class:`FlowScheduler`). A *flow* moves ``volume`` bytes through
a set of shared resources (a node's sending NIC, a receiving NIC) at most at its own
``cap`` (the pair link's rate). Whenever a flow starts or ends, rates are recomputed by
progressive filling -- the max-min fair allocation (Bertsekas & Gallager, *Data
Networks*, Sec. 6.5.2), which is how long-lived TCP flows sharing a bottleneck behave
to first order. A ring collective is one flow that uses every ring link's resources
and moves at its slowest link's rate (the ring advances in lock step). Rates are
recomputed only inside the *component* of flows that share a resource (transitively)
with the flow that started or ended, and each flow keeps its own completion timer
(re-armed only when its rate changes; a stale timer is ignored: it is not its flow's current one).
Independent pipeline replicas on a heterogeneous network therefore never pay for each
other's flows.

Connections. Messages on one connection (an ordered device pair) are delivered in
order, one at a time (a TCP/NCCL connection is a byte stream); different connections
share NICs max-min fairly. A message arrives ``latency`` after its last byte left.

Token-bucket egress (``Link.burst_bytes`` = b > 0; Linux ``tc tbf``, which is how
execute mode emulates a link, :mod:`perfsim.shaping`): each node's inter-node egress
(:class:`Egress`) holds up to b tokens, refilled at the link rate while no shaped bytes
queue. A message of n bytes leaving with k tokens passes min(n, k) bytes at once and
only the rest through the rate-limited flow: after an idle spell a message <= b
arrives in ``latency`` alone, a long stream runs at the rate (measured by ``perfsim
calibrate``: t(s) = alpha + max(0, s - b) / rate). Collective steps draw on the buckets
of the ranks that send (a rank the run stands for too: the bucket is its node's). An iteration
starts with the buckets the one before left, the steady state (:meth:`FlowBackend.bucket_after`,
:func:`perfsim.engine.steady_buckets`), not full.

Rendezvous p2p (``Link.protocol = "rendezvous"``; gloo's TCP pairs are
receiver-driven): a message's bytes start at max(send time, ready time), where the
ready time is when the receiver posted its receive (:meth:`FlowBackend.post_receive`),
plus the wait for bytes already queued on the receiver's egress (its "ready" notice is
behind them in the shaper's FIFO), plus the control latency (docs/validation.md,
"Mechanisms found by the validation", 2: the execute-mode trace that shows it).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from heapq import heappush
from typing import Any, Callable, Generator, Hashable, Iterable

import simpy
from simpy.events import NORMAL, Timeout

from perfsim.collectives import Collective
from perfsim.network.analytic import Network, Path_
from perfsim.network.backend import MessageHandler
from perfsim.tcp import rto_s


def _timer(env: simpy.Environment, delay: float, value, callback) -> Timeout:
    """``env.timeout(delay, value)`` with ``callback`` as its one callback, made without
    the two calls of SimPy's constructor (the flows' ~1.1 million completion and delivery
    timers of the 131,072-GPU case): the same fields, and the same place in the queue,
    ``(now + delay, NORMAL, next id, event)`` as ``Environment.schedule`` pushes it.
    ``delay`` >= 0 (the constructor's check)."""
    ev = _new_timeout(Timeout)
    ev.env, ev.callbacks, ev._value, ev._delay, ev._ok = env, [callback], value, delay, True
    heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), ev))
    return ev


_new_timeout = object.__new__


def _delivered(timer: Timeout) -> None:
    """A message's delivery timer fired: its handler hears that it arrived."""
    handler, msg, start = timer._value
    handler.message_delivered(msg, start)


class _Flow:
    __slots__ = ("volume", "left", "resources", "cap", "rate", "last", "version", "event", "start",
                 "stats", "active", "timer", "alone")

    def __init__(self, volume, resources, cap, event, start, stats):
        self.volume = volume
        self.left = volume
        self.resources = resources
        self.cap = cap  # bytes/s
        self.rate = 0.0
        self.last = start
        self.version = 0  # rate settings so far
        self.event = event
        self.start = start
        self.stats = stats
        self.active = True
        self.timer = None  # the completion timer armed at the current rate (None: none)
        self.alone = None  # its rate when it shares no resource (FlowScheduler._alone_rate, once)


#: components of at most this many flows, each on at most SHAPE_RESOURCES resources,
#: have their rates remembered by shape (:meth:`FlowScheduler._shared_rates`)
SHAPE_FLOWS = 8
SHAPE_RESOURCES = 4


class FlowScheduler:
    """Max-min fair sharing of resource capacities among active flows.

    ``capacity(resource) -> bits/s`` gives each resource's rate.
    """

    def __init__(self, env, capacity: Callable[[Any], float]):
        self.env = env
        self._capacity = capacity
        self._cap_cache: dict[Any, float] = {}
        self.users: dict[Any, dict[_Flow, None]] = {}  # resource -> flows (ordered set)
        self._shapes: dict[tuple, list[float]] = {}  # small components' rates (_shared_rates)
        #: id(resources tuple) -> (the tuple, its least capacity): a collective's flows reuse
        #: one tuple of NICs (2,048 of them at 1,024 replicas) phase after phase
        self._least: dict[int, tuple[tuple, float]] = {}
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
        f = _Flow(float(nbytes), tuple(resources), cap_bps / 8.0, ev, self.env._now, stats)
        users, alone = self.users, True
        for r in f.resources:
            on = users.get(r)
            if on is None:
                users[r] = {f: None}
            else:
                if on:
                    alone = False
                on[f] = None
        if alone:  # a flow that shares no resource is a component of its own
            self._start_alone(f)
        else:
            self._rebalance(*self._component([f]))
        return ev

    def _start_alone(self, f: _Flow) -> None:
        """:meth:`_rebalance` of ``[f]``, a new flow that shares no resource (most of a
        pipeline's messages: ~380,000 of the 131,072-GPU case's 490,000), without its lists:
        its first rate is its alone rate; nothing has moved yet, so its bytes left are its
        volume, and its completion timer is armed as :meth:`_rebalance` arms it."""
        rate = f.rate = self._alone_rate(f)
        f.version = 1
        if rate > 0:
            env = self.env
            delay = max(f.left, 0.0) / rate
            timer = f.timer = _new_timeout(Timeout)
            timer.env, timer.callbacks, timer._value, timer._delay, timer._ok = env, [self._on_timer], f, delay, True
            heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), timer))

    def _alone_rate(self, f: _Flow) -> float:
        """``f``'s rate when it shares no resource: its cap or its least capacity (made once per flow)."""
        if f.alone is None:
            res = f.resources
            least = self._least.get(id(res))
            if least is None or least[0] is not res:
                cap = self._cap
                least = self._least[id(res)] = (res, min([cap(r) for r in res], default=math.inf))
            f.alone = min(f.cap, least[1])  # min([f.cap] + capacities): the same value
        return f.alone

    # -------------------------------------------------------------- internals
    def _component(self, seeds: Iterable[_Flow]) -> tuple[list[_Flow], tuple | None]:
        """The active flows that share a resource with ``seeds``, transitively, in the
        order of a depth-first search from the last seed (the order the rates are then
        set in, and so the order of their completion timers), and the component's shape
        key (:meth:`_shape_key`; None when it is too large to be remembered), built in the
        same pass: the search meets the flows, and each flow's resources, in the order the
        key numbers them (one walk over ~220,000 components of the 131,072-GPU case, not two)."""
        users, cached = self.users, self._cap_cache
        seen: dict[_Flow, None] = {}
        number: dict[Any, int] = {}
        shape: list = []
        caps: list[float] = []
        small = True
        stack = list(seeds)  # (every flow on a resource is active: a finished one leaves it)
        pop, extend = stack.pop, stack.extend
        while stack:
            f = pop()
            if f in seen:
                continue
            seen[f] = None
            res = f.resources
            if small and len(res) <= SHAPE_RESOURCES and len(seen) <= SHAPE_FLOWS:
                shape.append(f.cap)  # (the key's entries as _shape_key makes them)
                for r in res:
                    i = number.get(r)
                    if i is None:
                        i = number[r] = len(number)
                        c = cached.get(r)
                        caps.append(self._cap(r) if c is None else c)
                    shape.append(i)
                    extend(users[r])  # (flows seen already are skipped when popped: the same order)
                shape.append(-1)
            else:
                small = False
                for r in res:
                    extend(users[r])
        return list(seen), ((tuple(shape), tuple(caps)) if small else None)

    def _rebalance(self, flows: list[_Flow], key: tuple | None) -> None:
        """Set the rates of the component ``flows`` (shape ``key``, :meth:`_component`),
        re-arming the completion timer of each flow whose rate changed."""
        if not flows:
            return
        if len(flows) == 1:
            rates = [self._alone_rate(flows[0])]
        else:
            rates = self._rates_by_shape(flows, key)
        env = self.env
        now, on_timer, queue, eid = env._now, self._on_timer, env._queue, env._eid
        for f, rate in zip(flows, rates):
            if rate == f.rate and f.version:
                continue
            f.left -= f.rate * (now - f.last)
            f.last = now
            f.rate = rate
            f.version += 1
            if rate > 0:
                # the timer of the previous rate, if any, fires but is ignored (_on_timer)
                # (its value is the flow: no attribute, so no per-timer __dict__);
                # _timer(env, delay, f, on_timer), inlined
                delay = max(f.left, 0.0) / rate
                timer = f.timer = _new_timeout(Timeout)
                timer.env, timer.callbacks, timer._value, timer._delay, timer._ok = env, [on_timer], f, delay, True
                heappush(queue, (now + delay, NORMAL, next(eid), timer))
            else:
                f.timer = None

    def _shared_rates(self, flows: list[_Flow]) -> list[float]:
        """:meth:`_max_min` of ``flows``, remembered by the component's *shape* when it is
        small (:meth:`_shape_key`, :meth:`_rates_by_shape`)."""
        return self._rates_by_shape(flows, self._shape_key(flows))

    def _shape_key(self, flows: list[_Flow]) -> tuple | None:
        """The *shape* of the component ``flows``: the flows' caps and their resources
        numbered in order of first appearance, and those resources' capacities; None when
        it has more than SHAPE_FLOWS flows or a flow more than SHAPE_RESOURCES resources.
        That is all :meth:`_max_min` reads, and it visits resources in that same order, so
        one shape gives the same rates to the last bit; the pipeline's fwd/bwd flows meeting
        on a NIC repeat a few shapes over and over (the 131,072-GPU case: ~170,000
        components, 1.35 s of max-min). :meth:`_component` makes the same key as it searches."""
        if len(flows) > SHAPE_FLOWS:
            return None
        number: dict[Any, int] = {}
        shape: list = []  # per flow its cap, its resources' numbers and -1 (neither a cap nor a number)
        for f in flows:  # (plain loops: a comprehension is one more call, four per message)
            res = f.resources
            if len(res) > SHAPE_RESOURCES:
                return None
            shape.append(f.cap)
            for r in res:
                i = number.get(r)
                if i is None:
                    i = number[r] = len(number)
                shape.append(i)
            shape.append(-1)
        cached, caps = self._cap_cache, []  # (a capacity is cached once asked: _cap)
        for r in number:
            c = cached.get(r)
            caps.append(self._cap(r) if c is None else c)
        return tuple(shape), tuple(caps)

    def _rates_by_shape(self, flows: list[_Flow], key: tuple | None) -> list[float]:
        """:meth:`_max_min` of ``flows``, remembered by their shape ``key`` (None: not remembered)."""
        if key is None:
            return self._max_min(flows)
        rates = self._shapes.get(key)
        if rates is None:
            rates = self._shapes[key] = self._max_min(flows)
        return rates

    def _max_min(self, flows: list[_Flow]) -> list[float]:
        """Progressive filling (Bertsekas & Gallager Sec. 6.5.2) inside one component.

        Each round raises every unfixed flow to the lowest of the resources' fair shares
        (remaining capacity / unfixed flows) and the unfixed flows' caps, and fixes the
        flows of the resources at that level and the flows capped at it (both within a
        relative 1e-12). A round's flows all get the same rate, so the order they are
        fixed in never changes a result; rounds visit only the tight resources' flows."""
        cap_of = self._cap
        remaining: dict[Any, float] = {}
        count: dict[Any, int] = {}  # unfixed flows per resource
        on: dict[Any, list[int]] = {}  # resource -> its flows (indices)
        for i, f in enumerate(flows):
            for r in f.resources:
                c = count.get(r)
                if c is None:
                    remaining[r] = cap_of(r)
                    count[r] = 1
                    on[r] = [i]
                else:
                    count[r] = c + 1
                    on[r].append(i)
        n = len(flows)
        rate = [-1.0] * n
        by_cap = sorted(range(n), key=lambda i: flows[i].cap)
        low = 0  # by_cap[:low] are fixed
        unfixed = n
        while unfixed:
            while rate[by_cap[low]] >= 0.0:
                low += 1
            # each resource's fair share, once a round (the level: the first least of them,
            # as min() takes it; then the tight resources, in the same order)
            shares: list[tuple[float, Any]] = []
            level = None
            for r, c in count.items():
                if c:
                    share = remaining[r] / c
                    shares.append((share, r))
                    if level is None or share < level:
                        level = share
            if level is None:
                level = math.inf
            level = min(level, flows[by_cap[low]].cap)
            if not math.isfinite(level):
                for i in range(n):
                    if rate[i] < 0.0:
                        rate[i] = flows[i].cap
                break
            bound = level * (1 + 1e-12)
            fixed: list[int] = []
            for share, r in shares:
                if share <= bound:
                    fixed += on[r]
            k = low
            while k < n and flows[by_cap[k]].cap <= bound:
                fixed.append(by_cap[k])
                k += 1
            value = max(level, 0.0)
            for i in fixed:
                if rate[i] < 0.0:
                    rate[i] = value
                    unfixed -= 1
                    for r in flows[i].resources:
                        remaining[r] -= value
                        count[r] -= 1
        return rate

    def _on_timer(self, timer) -> None:
        f = timer._value
        if timer is not f.timer or not f.active:
            return  # re-armed after a rate change
        f.timer = None  # (flow <-> timer is a reference cycle: left to the cyclic GC, whole runs' worth)
        f.active = False
        f.left = 0.0
        neighbours: dict[_Flow, None] | None = None  # (made only when it has any: most flows run alone)
        users = self.users
        for r in f.resources:
            on = users[r]
            del on[f]
            if on:  # each of its flows, in order (values None)
                if neighbours is None:
                    neighbours = dict(on)
                else:
                    neighbours.update(on)
        self.flows_done += 1
        if f.stats:
            f.stats(f.start, self.env._now)
        if f.event is not None:
            f.event.succeed()
        if neighbours:
            self._rebalance(*self._component(neighbours))


# ---------------------------------------------------------------- the backend


class Connection:
    """In-order delivery of messages between two devices (``src -> dst``, over ``path``):
    the queue and whether a message is moving; with slow start after idle, its TCP history:
    when its last byte left (``last``), its window (``cwnd``, segments; None: full) and when
    its first message of the run started (``first``). (It refers to nothing that refers back
    to it: no reference cycle keeps a finished simulation alive for the cyclic GC.)"""

    __slots__ = ("queue", "busy", "waiting", "src", "dst", "path", "last", "cwnd", "first")

    def __init__(self, src: int, dst: int, path: Path_):
        self.queue: deque = deque()
        self.busy = False
        #: rendezvous: the wait for any queued message's receive (a fresh object each wait; None: none)
        self.waiting: object | None = None
        self.src, self.dst, self.path = src, dst, path
        self.last: float | None = None
        self.cwnd: float | None = None
        self.first: float | None = None


class Egress:
    """One node's shaped egress: token bucket (tbf) and the time its queue drains."""

    __slots__ = ("tokens", "t_tokens", "drain_end", "rate_Bps")

    def __init__(self, burst: float):
        self.tokens = burst  # full after idling
        self.t_tokens = 0.0  # tokens counted up to here (>= now while shaped bytes drain)
        self.drain_end = 0.0  # when bytes already handed to the shaper have left (estimate)
        self.rate_Bps = 0.0  # the rate it refills at (its last message's)

    def take(self, now: float, nbytes: float, burst: float, rate_Bps: float) -> float:
        """Send ``nbytes`` at ``now``; returns the bytes that must go through the rate
        limit (the rest pass at once on the bucket's tokens)."""
        self.rate_Bps = rate_Bps
        if burst > 0:
            if now >= self.t_tokens:
                self.tokens = min(burst, self.tokens + (now - self.t_tokens) * rate_Bps)
                self.t_tokens = now
            else:
                self.tokens = 0.0  # shaped bytes still draining use the refill
            free = min(self.tokens, nbytes)
            self.tokens -= free
        else:
            free = 0.0
        shaped = nbytes - free
        if shaped > 0:
            self.drain_end = max(now, self.drain_end) + shaped / rate_Bps
            if burst > 0:
                self.tokens = 0.0
                self.t_tokens = self.drain_end
        return shaped


class FlowBackend:
    """The SimPy flow model of ``network`` on ``env`` (module docstring): satisfies
    :class:`perfsim.network.backend.NetworkBackend`. Its prices and paths are the
    analytical network's; its messages and collective phases are max-min fair flows on
    the network's shared NICs, through token-bucket egresses, with rendezvous when the
    link's protocol is receiver-driven."""

    #: the engine may evaluate an iteration in closed form instead
    #: (:mod:`perfsim.engine.replay`: these flows, when none compete)
    replayable = True

    def __init__(self, env: simpy.Environment, network: Network):
        self.env, self.network = env, network
        self.flows = FlowScheduler(env, network.capacity)
        self.conns: dict[tuple[int, int], Connection] = {}
        link, coll = network.link, network.collective_link
        self.burst, self.coll_burst = link.burst_bytes, coll.burst_bytes
        self.rendezvous = link.protocol == "rendezvous"
        #: whether :meth:`post_receive` does anything (the engine skips the calls when not)
        self.receives_posted = self.rendezvous
        self.control_latency = link.control_latency_s
        self.egress: dict[int, Egress] = {}
        #: node -> the tokens its bucket holds as the iteration starts (a steady state's,
        #: :meth:`bucket_after`); a node not in it starts full, as after a long idle spell
        self.bucket_start: dict[int, float] = {}
        self.ready_at: dict[Hashable, float] = {}  # rendezvous: key -> ready notice at sender
        self.posted: dict[Hashable, simpy.Event] = {}
        self._groups: dict[tuple, tuple] = {}  # members -> (NICs, ring edges, shaped edges)
        #: slow start after idle (perfsim.tcp.SlowStart), priced on paths with a round trip
        self.slow_start = network.slow_start if network.slow_start.on else None
        #: (src, dst) -> (when its last byte left, its window): a previous iteration's history
        self.history: dict[tuple[int, int], tuple[float, float]] = {}

    # ------------------------------------------------------------ the description
    def node(self, device: int) -> int:
        return self.network.node(device)

    def path(self, src: int, dst: int) -> Path_:
        return self.network.path(src, dst)

    def capacity(self, resource) -> float:
        return self.network.capacity(resource)

    def collective(self, kind: str, nbytes: float, members, call: str | None = None) -> Collective:
        return self.network.collective(kind, nbytes, members, lockstep=call is not None, call=call)

    # ------------------------------------------------------------ shaping
    def _shaped(self, src: int, dst: int, nbytes: float, rate_bps: float, burst: float | None = None) -> float:
        """Bytes of a message src -> dst that go through the rate limit (token bucket)."""
        net = self.network
        a, b = net.node(src), net.node(dst)
        if a == b:  # intra-node fabric: not shaped
            return nbytes
        burst = self.burst if burst is None else burst
        eg = self.egress.get(a)
        if eg is None:
            eg = self.egress[a] = Egress(self.bucket_start.get(a, burst))
        return eg.take(self.env.now, nbytes, burst, rate_bps / 8.0)

    # ------------------------------------------------------------ p2p
    def post_receive(self, key: Hashable, dst: int, src: int) -> None:
        """Rendezvous: device ``dst`` posts its receive of ``key`` (from ``src``) now;
        its ready notice leaves behind the bytes queued on its egress and reaches the
        sender. Nothing for an eager link."""
        if not self.rendezvous:
            return
        net = self.network
        now = self.env.now
        lat = self.control_latency
        if net.node(dst) == net.node(src):
            depart, lat = now, net.path(dst, src).latency_s
        else:
            eg = self.egress.get(net.node(dst))
            depart = max(now, eg.drain_end) if eg is not None else now
            if lat is None:
                lat = net.path(dst, src).latency_s
        self.ready_at[key] = depart + lat
        ev = self.posted.get(key)
        if ev is None:
            ev = self.posted[key] = self.env.event()
        ev.succeed()

    def send(self, src: int, dst: int, nbytes: float, key: Hashable, lanes: int, handler: MessageHandler,
             msg: Any) -> None:
        """Queue ``nbytes`` (times ``lanes``: side-by-side tensor-parallel lanes at up to
        ``lanes`` times the pair rate) on the connection ``src -> dst``; ``handler`` hears
        of ``msg`` when its bytes start, when the last left and when it arrives."""
        conn = self.conns.get((src, dst))
        if conn is None:
            conn = self.conns[(src, dst)] = Connection(src, dst, self.network.path(src, dst))
        if not conn.busy and not self.rendezvous:
            # an idle eager connection has nothing queued: the message starts now, as
            # _next would start it, without passing through the queue
            conn.busy = True
            self._begin(src, dst, conn, nbytes, lanes, handler, msg)
            return
        conn.queue.append((key, nbytes, lanes, handler, msg))
        if not conn.busy:  # (rendezvous: once its receive is posted)
            self._next(src, dst, conn)
        elif conn.waiting is not None:  # no queued receive posted yet: this one may be
            self._wake_on(key, src, dst, conn, conn.waiting)

    def _posted(self, key: Hashable) -> simpy.Event:
        ev = self.posted.get(key)
        if ev is None:
            ev = self.posted[key] = self.env.event()
        return ev

    def _wake_on(self, key: Hashable, src: int, dst: int, conn: Connection, token: object) -> None:
        """Rendezvous: run :meth:`_next` of ``conn`` once ``key``'s receive is posted, if the
        connection still waits (``token``) then."""
        def wake(_e):
            if conn.waiting is token:
                conn.waiting = None
                self._next(src, dst, conn)

        ev = self._posted(key)
        if ev.callbacks is None:  # posted and processed already
            wake(ev)
        else:
            ev.callbacks.append(wake)

    def _next(self, src: int, dst: int, conn: Connection):
        if not conn.queue:
            conn.busy = False
            return
        conn.busy = True
        if self.rendezvous:
            # gloo's pairs are receiver-driven per receive: the first queued message whose
            # receive is posted goes, not only the oldest one (qa7: ZB-V receives B0 before F2
            # where its peer sends F2 first; a FIFO pair stopped every device)
            queue = conn.queue
            first = next((i for i, item in enumerate(queue) if self._posted(item[0]).triggered), None)
            if first is None:
                conn.waiting = token = object()
                for item in queue:
                    self._wake_on(item[0], src, dst, conn, token)
                return
            if first:
                item = queue[first]
                del queue[first]
                queue.appendleft(item)
            key = queue[0][0]
            wait = self.ready_at[key] - self.env.now
            if wait > 0:
                self.env.timeout(wait).callbacks.append(lambda _e: self._start(src, dst, conn))
                return
        self._start(src, dst, conn)

    def _start(self, src: int, dst: int, conn: Connection):
        """The first message queued on ``conn`` starts."""
        _, nbytes, lanes, handler, msg = conn.queue.popleft()
        self._begin(src, dst, conn, nbytes, lanes, handler, msg)

    def _begin(self, src: int, dst: int, conn: Connection, nbytes: float, lanes: int, handler: MessageHandler,
               msg: Any) -> None:
        """The message ``msg`` (``nbytes`` per lane) starts on ``conn``: its bytes move now, or
        after slow start's rounds (:meth:`_restart`)."""
        if conn.path.rtt_s > 0 and self.slow_start is not None:
            self._restart(src, dst, conn, nbytes, lanes, handler, msg)
            return
        handler.message_started(msg)
        self._transfer(src, dst, conn, nbytes * lanes, lanes, functools.partial(self._finished, conn, handler, msg))

    def _restart(self, src: int, dst: int, conn: Connection, nbytes: float, lanes: int, handler: MessageHandler,
                 msg: Any) -> None:
        """:meth:`_begin` on a TCP path with slow start after idle: the message's bytes start
        once the rounds of a restarted window have passed (:meth:`perfsim.tcp.SlowStart.delay`,
        from the connection's last send and window; the link carries the rest at its rate)."""
        path, now = conn.path, self.env.now
        handler.message_started(msg)
        if conn.first is None:
            conn.first = now
            seed = self.history.get((src, dst))
            if seed is not None:
                conn.last, conn.cwnd = seed
        idle = None if conn.last is None else now - conn.last
        delay, conn.cwnd = self.slow_start.delay(nbytes, path.bandwidth_bps, path.rtt_s, conn.cwnd, idle)
        done = lambda _start, end: self._finished(conn, handler, msg, now, end)  # noqa: E731
        if delay <= 0:
            self._transfer(src, dst, conn, nbytes * lanes, lanes, done)
        else:
            self.env.timeout(delay).callbacks.append(
                lambda _e: self._transfer(src, dst, conn, nbytes * lanes, lanes, done))

    def _transfer(self, src: int, dst: int, conn: Connection, nbytes: float, lanes: int, done) -> None:
        """``nbytes`` (all lanes) of a message move on ``conn``'s path; ``done(start, end)`` hears
        when its last byte left. Without a bucket or rendezvous the egress only counts (its
        drain time is read by post_receive alone): every byte goes through the flow."""
        rate = conn.path.bandwidth_bps * lanes
        shaped = self._shaped(src, dst, nbytes, rate) if self.burst > 0 or self.rendezvous else nbytes
        self.flows.transfer(shaped, conn.path.resources, rate, done, False)

    def tcp_history(self) -> dict[tuple[int, int], tuple[float, float, float]]:
        """Per connection that priced slow start: (its first message's start, its last byte's
        departure, its window after): what the next iteration inherits (:meth:`history`)."""
        return {k: (c.first, c.last, c.cwnd) for k, c in self.conns.items()
                if c.first is not None and c.last is not None and c.cwnd is not None}

    def steady_history(self, period: float) -> dict[tuple[int, int], tuple[float, float]]:
        """The history each connection inherits from the iteration before, in a steady state of
        ``period`` seconds per iteration: its last send ``period`` earlier and its window then --
        for the connections whose first message of the run would find them idle for longer
        than their RTO (the only ones it changes); empty when none would."""
        out = {}
        for (src, dst), (first, last, cwnd) in self.tcp_history().items():
            if first + period - last > rto_s(self.network.path(src, dst).rtt_s):
                out[(src, dst)] = (last - period, cwnd)
        return out

    def bucket_after(self, period: float) -> dict[int, float]:
        """The tokens each node's bucket holds ``period`` seconds after the iteration began
        (as the next iteration starts): its tokens when its egress last drained, refilled at
        the link rate from then on, up to its depth. Empty without a bucket. The engine looks
        for the steady state with it (:func:`perfsim.engine.simulate`)."""
        burst = max(self.burst, self.coll_burst)
        if not burst > 0:
            return {}
        return {a: min(burst, eg.tokens + max(0.0, period - eg.t_tokens) * eg.rate_Bps)
                for a, eg in self.egress.items()}

    def _finished(self, conn: Connection, handler: MessageHandler, msg: Any, start: float, end: float) -> None:
        """The last byte of ``msg`` on ``conn`` left at ``end`` (its flow's stats callback):
        the handler hears of it, the message arrives ``latency`` later, and the connection
        moves on to its next message."""
        handler.message_sent(msg, start, end)
        conn.last = end
        _timer(self.env, conn.path.latency_s, (handler, msg, start), _delivered)
        if conn.queue:  # the connection is free once the last byte left
            self._next(conn.src, conn.dst, conn)
        else:
            conn.busy = False

    # ------------------------------------------------------------ collectives
    def run_collective(self, coll: Collective, members, simulated, lanes: int = 1
                       ) -> Generator[simpy.Event, Any, list[tuple[int, int]]]:
        """SimPy process body: the phases of ``coll`` (planned by :meth:`collective` on
        ``members``) as flows on the shared NICs of the ``simulated`` members (the others
        are represented by them); ``lanes`` identical groups side by side share the NICs
        while each has its own intra-node link. Returns the ring links (src, dst) the
        simulated members sent on."""
        env, net = self.env, self.network
        key = tuple(members)
        geo = self._groups.get(key)
        if geo is None:
            sim_nodes = {net.node(d) for d in simulated}
            ring = net.ring_paths(members, net.collective_link)
            nics = tuple(dict.fromkeys(res for pth in ring for res in pth.resources if res[1] in sim_nodes))
            n = len(members)
            edges = [(members[i], members[(i + 1) % n]) for i in range(n) if members[i] in simulated]
            # every edge that leaves a simulated node draws on its bucket, a sender this run does
            # not simulate (a replica it stands for) too: the bucket is the node's (qa7)
            pairs = [(members[i], members[(i + 1) % n]) for i in range(n)]
            shaped = [(a, b) for a, b in pairs if net.node(a) in sim_nodes and net.node(a) != net.node(b)]
            geo = self._groups[key] = (nics, edges, shaped)
        nics, edges, shaped_edges = geo
        shaping = self.coll_burst > 0 or self.rendezvous
        for group in coll.phases:
            events, lat = [], 0.0
            for ph in group:
                volume, rate = ph.volume_bytes * lanes, ph.rate_bps * lanes
                if ph.inter_node and shaping and shaped_edges:
                    # each simulated sender draws on its own bucket; the ring moves
                    # in lock step, so the phase's shaped bytes are the largest
                    volume = max(self._shaped(a, b, volume, rate, self.coll_burst)
                                 for a, b in shaped_edges)
                events.append(self.flows.transfer(volume, nics if ph.inter_node else (), rate))
                lat = max(lat, ph.latency_s)
            yield events[0] if len(events) == 1 else simpy.AllOf(env, events)
            if lat > 0:
                yield env.timeout(lat)
        return edges
