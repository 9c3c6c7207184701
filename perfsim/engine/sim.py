"""The SimPy event loop: devices replay schedule tables over a shared network.

Each simulated device (replica ``r``, pipeline device ``d``; with tensor
parallelism a group of ``tp`` GPUs, represented by its tensor rank 0, whose GPU
index the plan's placement gives) is one SimPy process that walks its row of the
schedule table with explicit communication (:func:`perfsim.schedules.with_comms`,
never re-derived; a device may run several stages, model chunks, and a zero-bubble
backward is ``I`` then a later ``W``, :attr:`StagePlan.wgrad_s`), every cost resolved
once into its program (:mod:`perfsim.engine.programs`). ``kRECV_Fmb``
posts and waits for stage ``k``'s input activation, ``kSEND_Fmb`` sends stage
``k``'s output; ``RECV_B``/``SEND_B`` likewise for gradients:

* forward on ``s > 0`` waits for micro-batch ``mb``'s activation from
  ``s - 1`` and decodes it; forward on ``s < p - 1`` encodes and sends to
  ``s + 1`` without waiting for delivery (asynchronous send, as isend);
* backward mirrors this with activation gradients flowing ``s+1 -> s``.

The network is a :class:`perfsim.network.backend.NetworkBackend` (the flow model of
:mod:`perfsim.network.flows` unless :func:`perfsim.network.use_backend` plugged in
another): the engine hands it each message (``send``; the receiver's ``post_receive``
when it reaches the action that waits for it) and each collective (``collective``
prices it, ``run_collective`` runs it), and is told when bytes start, leave and arrive;
how they share NICs, token buckets and rendezvous are the backend's. The engine's side
of a message (the backend's handler; Megatron-LM's blocking exchanges) is
:mod:`perfsim.engine.messages`.

Data parallelism: during the stage's last backward (when its gradients are
complete), buckets become ready layer by layer from the back; each bucket's
collectives (the grad compressor's ``dp_plan``) run in order on one
communication stream, overlapping the rest of the backward
(:mod:`perfsim.engine.gradient_sync`, with the tied embedding's all-reduce); every
collective runs through :meth:`Simulation.run_collective`.

Interference: while a device has a transfer running, its compute advances at
``1 / (1 + slowdown)`` (``System.comm_slowdown`` or the profile's measured
``interference``), so only the overlapping part of a compute step stretches.

Tensor parallelism: a stage's forward and backward include its layers'
collectives (timed in the plan on the group's links). Its ``tp`` GPUs send
their slices of a boundary activation, and run their data-parallel rings, at the
same time: one flow of ``tp`` lanes carries ``tp`` times the per-GPU bytes at up to
``tp`` times the pair rate, so lanes inside a node each get their own fabric
link while lanes through a NIC share it.

Replica classes: replicas whose pipelines see identical links behave
identically, so only one representative per class is simulated
(:func:`perfsim.engine.replica_classes`; a uniform network has one class; replicas
that share nodes' NICs are simulated together, one group of each kind). A
collective still spans the full ring of all ``dp`` members: its rate is the
slowest ring link's, its per-step delay the largest latency, and it loads the
NICs of the simulated representatives (each stands for its class) -- so a
topology with unequal links keeps every distinct path.
"""

from __future__ import annotations

import contextlib
import gc
from collections import defaultdict
from heapq import heappush

import simpy
from simpy.events import NORMAL, Event

from perfsim.engine.gradient_sync import stage_sync, tied_sync
from perfsim.engine.lanes import independent, run_lanes
from perfsim.engine.messages import PipelineMessages
from perfsim.engine.plan import Plan, system_slowdown
from perfsim.engine.programs import EXCHANGE, device_program
from perfsim.engine.sharding import after_reduce_scatters, sharded_compute
from perfsim.engine.sim_output import DeviceStats, SimOutput
from perfsim.errors import ConfigError
from perfsim.network import Network, current_backend
from perfsim.network.backend import BackendFactory
from perfsim.network.flows import FlowBackend
from perfsim.schedules import FORWARD, RECV_B, RECV_F, SEND_B, SEND_F, deepspeed_rows, exchange_rows


#: an Event without its constructor (``_new_event(Event)``, then its fields): the events
#: made once per message (:meth:`Simulation._at`, a receive's inbox event)
_new_event = object.__new__


@contextlib.contextmanager
def paused_gc():
    """The cyclic GC off inside (as it was outside afterwards). It would rescan the many
    live generators and events of a run again and again (docs/validation.md,
    "Measurement notes"); reference counting still frees them. A caller that lets go of
    what it made inside it (:func:`perfsim.engine.simulate`: the network, the plan, the
    simulation and its output) has them freed before the collector looks at the objects
    made meanwhile (the 131,072-GPU case: 0.3-0.6 s of collections that free nothing)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Events(dict):
    """Events of ``env`` by key, each made on first use (a missing key is a new event)."""

    def __init__(self, env: simpy.Environment):
        super().__init__()
        self.env = env

    def __missing__(self, key) -> simpy.Event:
        ev = self[key] = self.env.event()
        return ev


class Simulation(PipelineMessages):
    """One iteration of a job on the event loop (module docstring); its pipeline messages'
    side, the network backend's handler, is :class:`perfsim.engine.messages.PipelineMessages`."""

    def __init__(self, plan: Plan, network: Network, schedule: str, *, warmup: bool = False,
                 replicas: list[int] | None = None, trace: bool = False, profile=None,
                 backend: BackendFactory | None = None):
        self.plan = plan
        if schedule.lower() != plan.table.name:
            raise ValueError(f"schedule {schedule!r}: the plan was built for {plan.table.name!r}")
        self.table = plan.table
        #: blocking exchanges, Megatron-LM's (perfsim.schedules.exchange_rows) or DeepSpeed's
        #: (deepspeed_rows), else each message on its own
        self.exchange = getattr(network.system, "p2p_exchange", "async")
        self.blocking = self.exchange != "async"
        if self.exchange == "blocking":
            self.rows = exchange_rows(plan.table)
        elif self.exchange == "deepspeed":
            self.rows = deepspeed_rows(plan.table)
        else:
            self.rows = plan.comm_rows
        #: blocking exchanges: inbox key -> the event its sender waits on until delivery
        self.acks: dict[tuple, simpy.Event] = {}
        self.where = self.table.stage_device
        self.warmup = warmup
        self.replicas = sorted(replicas) if replicas is not None else list(range(plan.dp))
        self.want_trace = trace
        self.env = simpy.Environment()
        #: the network, spoken to only through the NetworkBackend protocol
        self.net = (backend or current_backend() or FlowBackend)(self.env, network)
        self.inbox: dict[tuple, simpy.Event] = {}
        self.stats = {(r, s): DeviceStats() for r in self.replicas for s in range(plan.pp)}
        self.micro: dict[tuple[int, int, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.links: dict[tuple[int, int, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        # a 1-bit optimizer's warm-up steps sync uncompressed (Plan.warmup_buckets)
        self.buckets = (plan.warmup_buckets if warmup and plan.warmup_buckets
                        else [sp.buckets for sp in plan.stages])
        # (replica, stage, bucket) / (replica, stage): made on first use (115k up front at 131,072 GPUs)
        self.bucket_ready: dict[tuple, simpy.Event] = _Events(self.env)
        self.sync_done: dict[tuple, simpy.Event] = _Events(self.env)
        # Megatron's tied-embedding all-reduce: the devices of the first and the last
        # stage, once their own gradients are synced (Plan.tied_sync_bytes)
        last = len(plan.stages) - 1
        self.tied_devices = (self.where[0], self.where[last]) if plan.tied_sync_bytes else ()
        self.grads_synced = {(r, d): self.env.event() for r in self.replicas for d in self.tied_devices}
        self.tied_done = {r: self.env.event() for r in self.replicas} if self.tied_devices else {}
        self.dp_bytes_per_rank: dict[int, float] = defaultdict(float)
        self.trace: list[dict] = []
        self._scratch: dict[str, float] = defaultdict(float)
        self.slowdown = system_slowdown(network.system, profile)
        self.comm_active: dict[int, int] = defaultdict(int)  # device -> transfers running
        self.comm_change: dict[int, simpy.Event] = {}
        self.algos: dict[str, None] = {}  # collective algorithms used, in order
        place = plan.device or (lambda t, r, s: r * plan.pp + s)
        self._dev = {(r, s): place(0, r, s) for r in range(plan.dp) for s in range(plan.pp)}
        self.lanes = plan.tp
        # ZeRO-2/3 (perfsim.engine.sharding): collectives waiting for replicas to join,
        # and per (replica, device) the last reduce-scatter queued and all of them
        self.shard_rdv: dict[tuple, list] = {}
        self._programs: dict[int, list[tuple]] = {}  # device -> its resolved row (_program)
        self.rs_tail: dict[tuple[int, int], simpy.Event] = {}
        self.rs_all: dict[tuple[int, int], list] = {}
        # replica lanes (perfsim.engine.lanes): stage -> replica -> when its bucket 0 was
        # ready, and the replicas with any; None when the replicas run in one time order
        self.lane_ready: dict[int, dict[int, float]] | None = None
        self.lane_fired: set[int] = set()

    # ------------------------------------------------------------ helpers
    def dev(self, r: int, s: int) -> int:
        """GPU index of (replica, stage) (its tensor rank 0)."""
        return self._dev[(r, s)]

    def _at(self, t: float) -> simpy.Event:
        """An event processed at the absolute time ``t`` (>= now): the end of a chain of
        local steps a device ran without waiting between them (:meth:`device`). Its time is
        the one the chain of timeouts reached (``((now + a) + b) + c``, each step added as
        SimPy adds a delay), not ``now + (t - now)``, which may round differently; it sits
        in SimPy 4's queue as a Timeout does: ``(time, priority, event id, event)``."""
        env = self.env
        ev = _new_event(Event)  # Event.__init__'s two fields, set here
        ev.env, ev.callbacks, ev._ok, ev._value = env, [], True, None
        heappush(env._queue, (t, NORMAL, next(env._eid), ev))
        return ev

    def _span(self, name, cat, pid, tid, start, end, args=None):
        if self.want_trace and end > start:
            ev = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                  "ts": start * 1e6, "dur": (end - start) * 1e6}
            if args:
                ev["args"] = args
            self.trace.append(ev)

    # ------------------------------------------------------------ interference
    def _comm(self, devices, delta: int) -> None:
        """``devices`` start (+1) or end (-1) a transfer; wakes their running compute."""
        if not self.slowdown:
            return
        for d in devices:
            self.comm_active[d] += delta
            ev = self.comm_change.pop(d, None)
            if ev is not None:
                ev.succeed()

    def _work(self, st, dev: int, seconds: float):
        """``seconds`` of compute on ``dev``, at 1 / (1 + slowdown) of its speed while
        communication runs on it (the calibrated interference); the stretch is
        added to ``st.interference_s``."""
        env = self.env
        if not self.slowdown or seconds <= 0:
            if seconds > 0:
                yield env.timeout(seconds)
            return
        left, t_start = seconds, env.now
        while left > 1e-12:
            speed = 1.0 / (1.0 + self.slowdown) if self.comm_active[dev] > 0 else 1.0
            change = self.comm_change.get(dev)
            if change is None:
                change = self.comm_change[dev] = env.event()
            t0 = env.now
            done = env.timeout(left / speed)
            yield done | change
            left -= (env.now - t0) * speed
            if done.processed:  # (a Timeout is 'triggered' from creation)
                break
        st.interference_s += max(0.0, env.now - t_start - seconds)

    # ------------------------------------------------------------ devices
    def _program(self, d: int) -> list[tuple]:
        """Device ``d``'s program (:func:`perfsim.engine.programs.device_program`), made once."""
        prog = self._programs.get(d)
        if prog is None:
            prog = self._programs[d] = device_program(self.plan, d, self.rows[d], self.buckets, self.warmup)
        return prog

    def device(self, r: int, d: int):
        """Device ``d`` of replica ``r`` walks its row. Without interference or a trace,
        the local steps between two waits (a decode, the compute, its tensor-parallel
        collectives, an encode) are one chain: their end ``t`` is accumulated as the
        timeouts would have reached it and the device waits once, at ``t``
        (:meth:`_at`), before it hands a message to the network or waits for one --
        the only moments another process can see; the same times, fewer events."""
        env, plan, net = self.env, self.plan, self.net
        timeout, inbox, devs = env.timeout, self.inbox, self._dev
        st, me = self.stats[(r, d)], devs[(r, d)]
        cells = self.micro if r == self.replicas[0] else None
        scratch, slow, tracing, lanes = self._scratch, self.slowdown, self.want_trace, self.lanes
        chain = not slow and not tracing
        posts = getattr(net, "receives_posted", True)  # False: post_receive would do nothing
        eid = env._eid  # (the events of _at, made inline: one per message sent; env._queue is a lane's own queue)
        t = None  # chain: when the local steps run since the last wait end (None: nothing pending)
        cell = scratch  # the other replicas' cells: a sink (the breakdown reports the first replica)
        for op in self._program(d):
            kind = op[0]
            if kind == EXCHANGE:  # a blocking batch: post all, wait for all (System.p2p_exchange)
                t = yield from self._exchange(op, r, d, st, cells, chain, t)
                continue
            if kind == RECV_F or kind == RECV_B:
                _, a, k, mb, peer, tag, decode, what = op
                if cells is not None:
                    cell = cells[(r, d, mb)]
                if t is not None:
                    yield self._at(t)
                    t = None
                key = (r, k, tag, mb)
                if posts:
                    net.post_receive(key, me, devs[(r, peer)])  # the backend's rendezvous
                box = inbox.get(key)
                if box is None:
                    box = inbox[key] = _new_event(Event)  # env.event(), without its two calls
                    box.env, box.callbacks = env, []
                yield box
                del inbox[key]  # delivered and received: each key is used once
                if decode > 0:
                    if chain:
                        t = env._now + decode
                        st.codec_s += decode
                        cell["encode_s"] += decode
                    else:
                        yield from self._codec(st, cell, r, d, decode, what, k, mb)
            elif kind == SEND_F or kind == SEND_B:
                _, a, k, mb, peer, k2, tag, encode, nbytes, mkind, what = op
                if cells is not None:
                    cell = cells[(r, d, mb)]
                if encode > 0:
                    if chain:
                        t = (env._now if t is None else t) + encode
                        st.codec_s += encode
                        cell["encode_s"] += encode
                    else:
                        yield from self._codec(st, cell, r, d, encode, what, k, mb)
                if t is not None:
                    ev = _new_event(Event)  # self._at(t), inlined
                    ev.env, ev.callbacks, ev._ok, ev._value = env, [], True, None
                    heappush(env._queue, (t, NORMAL, next(eid), ev))
                    yield ev
                    t = None
                # handed to the network; delivered into inbox[key] (the ``message_*``
                # methods are the backend's handler, called with this message)
                key, dst = (r, k2, tag, mb), devs[(r, peer)]
                net.send(me, dst, nbytes, key, lanes, self, (key, nbytes, mb, mkind, r, d, me, dst, st))
            else:
                _, a, k, mb, seconds, tp_s, sharded, last, column = op
                if chain and not sharded and not last:
                    if seconds > 0:
                        t = (env._now if t is None else t) + seconds
                    if tp_s > 0:
                        t = (env._now if t is None else t) + tp_s
                    st.compute_s += seconds
                    st.tp_comm_s += tp_s
                    if cells is not None:  # (the other replicas' cells are a sink: not written)
                        cells[(r, d, mb)][column] += seconds
                    continue
                if cells is not None:
                    cell = cells[(r, d, mb)]
                if t is not None:
                    yield self._at(t)
                    t = None
                t0 = env.now
                if sharded:
                    yield from sharded_compute(self, r, d, k, mb, kind == FORWARD, seconds)
                    if tp_s > 0:
                        yield timeout(tp_s)
                    if last:
                        env.process(after_reduce_scatters(self, r, d, [
                            self.bucket_ready[(r, k, i)] for i in range(len(self.buckets[k]))]))
                elif last:
                    yield from self._last_backward(r, d, k, seconds + tp_s)
                else:
                    if slow:
                        yield from self._work(st, me, seconds)
                    elif seconds > 0:
                        yield timeout(seconds)
                    if tp_s > 0:
                        yield timeout(tp_s)
                st.compute_s += seconds
                st.tp_comm_s += tp_s
                cell[column] += seconds
                if tracing:
                    self._span(str(a), "compute", r, d, t0, env.now)
        if t is not None:
            yield self._at(t)
        st.last_backward_end = env.now
        mine = self.table.stages_of(d)
        syncs = [self.sync_done[(r, k)] for k in mine if self.buckets[k]]
        if syncs:
            yield simpy.AllOf(env, syncs)
        if self.rs_all.get((r, d)):  # ZeRO-2/3: the optimizer steps on the reduced shards
            t0 = env.now
            yield simpy.AllOf(env, self.rs_all[(r, d)])
            st.dp_sync_s += env.now - t0
        if d in self.tied_devices:
            self.grads_synced[(r, d)].succeed()
            yield self.tied_done[r]
        t0 = env.now
        opt = sum(plan.stages[k].optimizer_s for k in mine)
        yield env.timeout(opt)
        st.optimizer_s += opt
        self._span("optimizer", "compute", r, d, t0, env.now)
        st.end = env.now

    def _codec(self, st, cell, r, s, seconds, what, k, mb):
        """``seconds`` of encode/decode on device ``s`` (``what`` of stage ``k``'s micro-batch ``mb``)."""
        if seconds > 0:
            t0 = self.env.now
            yield self.env.timeout(seconds)
            st.codec_s += seconds
            cell["encode_s"] += seconds
            if self.want_trace:
                self._span(f"{what} {k} mb{mb}", "codec", r, s, t0, self.env.now)

    def _last_backward(self, r, d, s, total):
        """The last B or W of stage ``s`` on device ``d`` (``total`` seconds), cut where
        each gradient bucket is complete."""
        done = 0.0
        st, me = self.stats[(r, d)], self.dev(r, d)
        for k, bucket in enumerate(self.buckets[s]):
            target = bucket.ready_fraction * total if self.plan.overlap else total
            if target > done:
                yield from self._work(st, me, target - done)
                done = target
            self.bucket_ready[(r, s, k)].succeed()
            if k == 0 and self.lane_ready is not None:
                self.lane_ready[s][r] = self.env.now
                self.lane_fired.add(r)
        if total > done:
            yield from self._work(st, me, total - done)

    # ------------------------------------------------------------ collectives
    def run_collective(self, kind: str, nbytes: float, members: list[int], simulated: set[int],
                       lanes: int = 1, call: str | None = None):
        """Run one collective of ``kind`` (per-rank buffer ``nbytes``) over the devices
        ``members`` on the network backend; ``simulated``: the members this
        simulation runs (their nodes' NICs are loaded; the others are represented by
        them). Planned by the backend's ``collective`` (algorithm, phases), run by its
        ``run_collective``; the one engine entry point for any group's collective (data-parallel
        gradients, :mod:`perfsim.engine.gradient_sync`; ZeRO-2/3's per unit,
        :mod:`perfsim.engine.sharding`; tensor-parallel groups call it the same way). ``lanes``: that many
        identical groups (the TP ranks' rings) run side by side, sharing the NICs while
        each has its own intra-node link. ``call``: the torch.distributed call that issues
        it, every rank in step (priced as the profile timed that call, when it did). Returns the plan."""
        env = self.env
        coll = self.net.collective(kind, nbytes, members, call) if call else self.net.collective(kind, nbytes, members)
        self.algos[coll.algo] = None
        start = env.now
        self._comm(simulated, +1)
        edges = yield from self.net.run_collective(coll, members, simulated, lanes)
        self._comm(simulated, -1)
        links, wire, busy = self.links, coll.wire_bytes, env.now - start  # (one value for every edge)
        for src, dst in edges:
            link = links[(src, dst, kind)]
            link[0] += wire
            link[1] += busy
        return coll

    # ------------------------------------------------------------ run
    def run(self) -> SimOutput:
        plan, env = self.plan, self.env
        heaps: dict[int, list] = {}
        if independent(self):  # each replica's processes start in its own lane
            self.lane_ready = {s: {} for s in range(len(plan.stages)) if self.buckets[s]}
            queue, procs = env._queue, []
            for r in self.replicas:
                env._queue = heaps[r] = []
                procs += [env.process(self.device(r, s)) for s in range(plan.pp)]
            env._queue = queue
        else:
            procs = [env.process(self.device(r, s)) for r in self.replicas for s in range(plan.pp)]
        for s in range(len(plan.stages)):
            if self.buckets[s]:
                self.env.process(stage_sync(self, s))
        for r in self.tied_done:
            self.env.process(tied_sync(self, r))
        done, events = simpy.AllOf(env, procs), 0
        step = env.step
        try:
            with paused_gc():
                if heaps:
                    events += run_lanes(self, heaps)
                while done.callbacks is not None:  # (not done.processed)
                    step()
                    events += 1
        except simpy.core.EmptySchedule:
            why = (f"schedule {self.table.name!r}: the devices wait for each other "
                   f"(no event left at t = {env.now:g} s)")
            if self.blocking and getattr(self.net, "rendezvous", False):  # the job's, not the engine's
                raise ConfigError(f"{why}: with p2p_exchange {self.exchange} each exchange waits for its sends' "
                                  f"receives (p2p_protocol rendezvous), which a peer posts only in a later "
                                  f"exchange of its own; use p2p_exchange async or p2p_protocol eager") from None
            raise RuntimeError(why) from None
        devs = self.stats
        return SimOutput(
            iteration_s=max(d.end for d in devs.values()),
            pipeline_s=max(d.last_backward_end for d in devs.values()),
            devices=devs, micro={k: dict(v) for k, v in self.micro.items()}, links=dict(self.links),
            replicas=self.replicas, dp_bytes_per_rank=dict(self.dp_bytes_per_rank), events=events,
            trace=self.trace, collective_algos=tuple(self.algos))
