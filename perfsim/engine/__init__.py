"""The SimPy discrete-event engine behind ``perfsim predict``.

Read in this order: :mod:`.plan` (what each stage computes and sends, asked
from the compressors and the profile), :mod:`.sim` (devices replaying the schedule
tables, p2p and data-parallel collectives handed to the network backend,
:mod:`perfsim.network.backend`), :mod:`.replay` (the flow backend's iteration in
closed form when no flows compete), :mod:`.report` (the Result tables).
"""

from __future__ import annotations

from collections import OrderedDict

from perfsim.engine.plan import Plan, build_plan
from perfsim.engine.report import build_result
from perfsim.errors import ConfigError
from perfsim.hardware import get_gpu
from perfsim.memory import GIB, host_memory_per_node, stage_memory
from perfsim.models.moe import check_simulated
from perfsim.network import Network, current_backend


def replica_classes(network: Network, pp: int, dp: int, device=None,
                    hops: list[tuple[int, int]] | None = None) -> list[list[int]]:
    """Group replicas whose pipelines see identical links (rate and latency of
    every hop, both directions, and the NIC rates of their nodes); one
    representative per group is simulated. Without a topology, or with a
    uniform one, there is one group -- unless replicas share a node and a pipeline hop
    leaves it (their messages share the node's NICs): then the replicas sharing nodes are
    simulated together, one such group of each kind (:func:`node_group_classes`). On a
    non-uniform topology whose replicas share nodes, every replica is its own group.
    ``device(r, s)``: GPU index of stage ``s`` of replica ``r`` (default ``r * pp + s``).
    ``hops``: the (device, next device) pairs the schedule sends over (default
    ``d -> d+1``; an interleaved table also goes from the last device to the first)."""
    if dp == 1:
        return [[0]]
    topo = network.topology
    dev = device or (lambda r, s: r * pp + s)
    pairs = hops if hops is not None else [(s, s + 1) for s in range(pp - 1)]
    owner: dict[int, int] = {}
    shared = False
    for r in range(dp):
        for s in range(pp):
            shared |= owner.setdefault(network.node(dev(r, s)), r) != r
    # replicas that share a node share its NICs: when a pipeline hop leaves the node, one
    # representative would load the NIC with its own messages alone and miss the others';
    # the replicas sharing nodes are then simulated together, one such group per class
    if shared and any(network.node(dev(r, a)) != network.node(dev(r, b)) for r in range(dp) for a, b in pairs):
        return node_group_classes(network, pp, dp, dev, pairs)
    if topo is None or topo.is_uniform():
        return [list(range(dp))]
    if shared:
        return [[q] for q in range(dp)]
    groups: dict[tuple, list[int]] = {}
    for r in range(dp):
        key = []
        for s, t in pairs:
            a, b = dev(r, s), dev(r, t)
            fw, bw = network.path(a, b), network.path(b, a)
            key.append((fw.bandwidth_bps, fw.latency_s, bw.bandwidth_bps, bw.latency_s,
                        len(fw.resources)))
        if topo.nic_bps is not None:
            key.append(tuple(topo.nic_bps[network.node(dev(r, s))] for s in range(pp)))
        groups.setdefault(tuple(key), []).append(r)
    return list(groups.values())


#: replica classes already grouped (:func:`strategy_classes`), most recent last; keyed by
#: value on everything they are read from, so never stale; :func:`perfsim.plan.plan`
#: empties it first (:func:`forget_classes`)
_CLASSES: "OrderedDict[tuple, list[list[int]]]" = OrderedDict()
#: how many :data:`_CLASSES` are kept
CLASSES_KEPT = 64


def forget_classes() -> None:
    """Empty :data:`_CLASSES` (one search's memo)."""
    _CLASSES.clear()


def strategy_classes(network: Network, strategy, hops: list[tuple[int, int]]) -> list[list[int]]:
    """:func:`replica_classes` of ``strategy``'s replicas (tensor rank 0, ``hops`` as
    there), memoised on what they depend on: the system and the links the network
    resolved (rates, latencies, NICs, topology), the placement, device order and the
    TP x PP x DP sizes (which give every replica's devices), and the hops. A planner's
    search asks the same grouping for every compression of a job."""
    key = (network.system, network.link, network.collective_link, strategy.placement, strategy.device_order,
           strategy.tp, strategy.pp, strategy.replicas, tuple(hops))
    classes = _CLASSES.get(key)
    if classes is None:
        classes = replica_classes(network, strategy.pp, strategy.replicas, lambda r, s: strategy.device(0, r, s), hops)
        _CLASSES[key] = classes
        while len(_CLASSES) > CLASSES_KEPT:
            _CLASSES.popitem(last=False)
    else:
        _CLASSES.move_to_end(key)
    return [list(c) for c in classes]


def node_group_classes(network: Network, pp: int, dp: int, device, hops: list[tuple[int, int]]) -> list[list[int]]:
    """Replica classes when replicas share nodes: the replicas joined by shared nodes
    form a *group* (they share NICs, so they are simulated together), and groups that
    are the same up to renaming their nodes -- the same layout of (replica, stage) on
    nodes, the same links on every pipeline hop and between the first and the last stage,
    the same NIC rates, and the same data-parallel ring edges entering and leaving them
    (the ring over all ``dp`` replicas, member ``r`` sends to ``r + 1``) -- load their
    NICs alike at every instant; one group of each kind is simulated. Class ``i`` of a
    kind holds the ``i``-th replica of each of its groups (its first is simulated).
    ``device(r, s)`` and ``hops`` as in :func:`replica_classes`."""
    node = lambda r, s: network.node(device(r, s))  # noqa: E731
    parent = list(range(dp))

    def root(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    owner: dict[int, int] = {}
    for r in range(dp):
        for s in range(pp):
            q = owner.setdefault(node(r, s), r)
            a, b = root(q), root(r)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for r in range(dp):
        groups.setdefault(root(r), []).append(r)
    pairs = list(hops) + ([(0, pp - 1)] if pp > 1 else [])
    kinds: dict[tuple, list[list[int]]] = {}
    for group in groups.values():
        label: dict[int, int] = {}
        for r in group:
            for s in range(pp):
                label.setdefault(node(r, s), len(label))
        key: list = [len(group), tuple(label[node(r, s)] for r in group for s in range(pp))]
        for r in group:
            for a, b in pairs:
                fw, bw = network.path(device(r, a), device(r, b)), network.path(device(r, b), device(r, a))
                key.append((fw.bandwidth_bps, fw.latency_s, fw.resources and tuple(label[x[1]] for x in fw.resources),
                            bw.bandwidth_bps, bw.latency_s, bw.resources and tuple(label[x[1]] for x in bw.resources)))
            for s in range(pp):  # the ring edges into and out of this member: NICs they load
                nxt, prv = node((r + 1) % dp, s), node((r - 1) % dp, s)
                key.append((nxt != node(r, s), prv != node(r, s)))
        key.append(tuple((network.capacity(("tx", n)), network.capacity(("rx", n))) for n in label))
        kinds.setdefault(tuple(key), []).append(group)
    classes = []
    for same in kinds.values():
        classes += [[g[i] for g in same] for i in range(len(same[0]))]
    return sorted(classes)


def check_memory(workload, strategy, system, plan, allow_oom: bool = False):
    """Per-stage memory (:mod:`perfsim.memory`) and the GPU's capacity; raises a
    ConfigError naming the stage and the shortfall when it does not fit (unless
    ``allow_oom``). Returns (stage memories, capacity bytes or None)."""
    mem = stage_memory(workload, strategy, plan, plan.table)
    cap = get_gpu(system.gpu).memory_bytes if system.gpu else None
    if cap is not None and not allow_oom:
        worst = max(mem, key=lambda m: m.total)
        if worst.total > cap:
            raise ConfigError(
                f"memory: stage {worst.stage} needs {worst.total / GIB:.1f} GiB per GPU "
                f"({worst.breakdown()}), {system.gpu} has "
                f"{cap / GIB:.1f} GiB: short by {(worst.total - cap) / GIB:.1f} GiB (--allow-oom predicts anyway; "
                f"perfsim memory with the same flags lists what each single change saves)")
    if system.host_memory_bytes and not allow_oom:
        nodes = host_memory_per_node(mem, plan.table, strategy, system.gpus_per_node)
        n = max(range(len(nodes)), key=nodes.__getitem__)
        if nodes[n] > system.host_memory_bytes:
            raise ConfigError(
                f"host memory: node {n} needs {nodes[n] / GIB:.1f} GiB for its GPUs' offloaded optimizer state, "
                f"host_memory is {system.host_memory_bytes / GIB:.1f} GiB: short by "
                f"{(nodes[n] - system.host_memory_bytes) / GIB:.1f} GiB (--allow-oom predicts anyway)")
    return mem, cap


def plan_with_memory(workload, strategy, system, profile, allow_oom: bool = False):
    """The network, the plan (every per-stage cost resolved) and the per-stage memory of one
    job -- what :func:`simulate` starts from, and all ``perfsim memory`` needs."""
    network = Network(system, strategy.devices, profile)
    gpu = get_gpu(system.gpu) if system.gpu else None
    plan = build_plan(workload, strategy, profile, network, gpu, system.host_overhead_s)
    return network, plan, check_memory(workload, strategy, system, plan, allow_oom)


def simulate(workload, strategy, system, profile, *, trace: bool = False, symmetric: bool | None = None,
             allow_oom: bool = False, replay: bool = True):
    """Simulate one steady-state iteration (and the warm-up one when the pipeline
    compressor has a different first-epoch wire size, or a 1-bit optimizer syncs
    uncompressed for its first steps); return a Result.

    ``symmetric``: None groups replicas into classes (:func:`replica_classes`);
    False simulates every replica (the reference for tests); True forces one.
    A GPU preset in ``system.gpu`` checks memory first (:func:`check_memory`).

    ``replay``: evaluate the iteration in closed form when no flows compete
    (:func:`perfsim.engine.replay.replay`, the same result) -- for the flow backend
    only, or another whose factory says ``replayable``; False always runs the event
    loop (the reference for tests). The network backend is the flow model unless
    :func:`perfsim.network.use_backend` chose another."""
    from perfsim.engine.sim import paused_gc  # lazy: perfsim.engine.sim loads simpy

    # The cyclic GC off from the plan to the report (sim.paused_gc): the simulation is freed
    # by reference counting, and the report's rows per device and link are made while the
    # runs' outputs and the network live -- a collection then would only walk them (0.3 s
    # at 131,072 GPUs, nothing freed); it runs again once _simulate has let go of them.
    with paused_gc():
        return _simulate(workload, strategy, system, profile, trace, symmetric, allow_oom, replay)


def _simulate(workload, strategy, system, profile, trace: bool, symmetric: bool | None, allow_oom: bool,
              replay: bool):
    """:func:`simulate`'s body."""
    from perfsim.engine.replay import replay as closed_form  # lazy: perfsim.engine.replay loads simpy
    from perfsim.engine.sim import Simulation  # lazy: perfsim.engine.sim loads simpy

    check_simulated(strategy)  # EP < DP with a per-matrix hook or a 1-bit optimizer: memory only
    network, plan, memory = plan_with_memory(workload, strategy, system, profile, allow_oom)
    dp = strategy.replicas
    if symmetric is None:
        where = plan.table.stage_device
        hops = sorted({(where[k], where[k + 1]) for k in range(len(where) - 1) if where[k] != where[k + 1]})
        classes = strategy_classes(network, strategy, hops)
    else:
        classes = [list(range(dp))] if symmetric else [[r] for r in range(dp)]
    reps = [c[0] for c in classes]
    weights = {c[0]: len(c) for c in classes}
    backend = current_backend()
    replay = replay and (backend is None or getattr(backend, "replayable", False) is True)

    def run(warmup: bool, trace: bool = False):
        out = (closed_form(plan, network, warmup=warmup, replicas=reps, profile=profile)
               if replay and not trace else None)
        if out is not None:
            return out

        def sim_run(history=None, buckets=None):
            sim = Simulation(plan, network, strategy.schedule, warmup=warmup, replicas=reps, trace=trace,
                             profile=profile, backend=backend)
            if history:
                sim.net.history = history
            if buckets:
                sim.net.bucket_start = buckets
            return sim, sim.run()

        sim, out = sim_run()
        # TCP slow start after idle (perfsim.tcp.SlowStart): a connection's first message of the
        # iteration follows its last one of the iteration before; run again from that history
        # (one step toward the steady state) when it finds a connection idle past its RTO
        steady = getattr(sim.net, "steady_history", None) if network.prices_slow_start else None
        seeds = steady(out.iteration_s) if steady is not None else None
        # a token bucket (tc tbf) starts each iteration as the one before left it, not full
        start = steady_buckets(sim, out, lambda b: sim_run(seeds, b))
        if start is not None:
            return sim_run(seeds, start)[1]
        return sim_run(seeds)[1] if seeds else out

    out = run(False, trace)
    warm = run(True) if plan.has_warmup or plan.onebit_warmup_steps else None
    return build_result(out, warm, plan, workload, strategy, system, weights=weights, memory=memory,
                        network=network)


def steady_buckets(sim, out, run, tol: float = 1e-6) -> dict[int, float] | None:
    """The tokens each node's bucket holds as an iteration starts in the steady state, or
    None when it is full (``sim``'s run, ``out``, started full and its buckets refill by
    the next iteration: the answer stands) or the backend has no bucket.

    ``f(T)``, the tokens a run started with ``T`` leaves for the next iteration
    (``bucket_after`` of its period), never falls as ``T`` grows and never grows faster
    than ``T`` (a token spent is one less to keep), so ``g(T) = f(T) - T`` is continuous and
    never rises: the steady state ``g(T) = 0`` is bracketed on each node's ``[0, depth]``
    and found by :class:`_Bracket` (a fixed-point step from above, then regula falsi
    with the Illinois modification -- Dowell & Jarratt, "A modified regula falsi method for
    computing the root of an equation", BIT 11 (1971) -- and bisection when a bracket stops
    halving), one run (``run(buckets) -> (sim, out)``) a
    trial. It stops at a trial where every node's ``|g|`` is within ``tol`` of the depth
    (the answer is that trial) or every bracket is narrower than that (its midpoint).
    Without it every iteration started full and a bucket deeper than a node's bytes per
    iteration let them leave faster than the link rate (qa7)."""
    after = getattr(sim.net, "bucket_after", None)
    full = after(out.iteration_s) if after is not None else {}
    depth = max(sim.net.burst, sim.net.coll_burst) if full else 0.0
    if not full or all(t >= depth * (1 - tol) for t in full.values()):
        return None
    eps = tol * depth
    brackets = {a: _Bracket(depth, full[a] - depth if full[a] < depth - eps else 0.0) for a in full}
    for _ in range(_MAX_TRIALS):
        x = {a: b.next_trial() for a, b in brackets.items()}
        sim, out = run(x)
        nxt = sim.net.bucket_after(out.iteration_s)
        g = {a: nxt.get(a, depth) - x[a] for a in full}
        if all(abs(v) <= eps for v in g.values()):
            return x
        for a, b in brackets.items():
            b.update(x[a], g[a])
        if all(b.hi - b.lo <= eps for b in brackets.values()):
            break
    return {a: (b.lo + b.hi) / 2 for a, b in brackets.items()}


#: a bound on :func:`steady_buckets`' runs (bisection alone needs 20 at tol 1e-6); nodes whose
#: buckets depend on each other could keep a bracket from closing
_MAX_TRIALS = 60


class _Bracket:
    """One node's bracket ``lo <= T* <= hi`` of the steady state of a non-rising continuous
    ``g`` (:func:`steady_buckets`): ``g(lo) >= 0 > g(hi)``, with ``g``'s values where known."""

    __slots__ = ("lo", "g_lo", "hi", "g_hi", "prev", "side", "widths", "from_above")

    #: secant trials from above (no point below yet) before one at the lower end
    FROM_ABOVE = 3

    def __init__(self, depth: float, g_depth: float):
        self.lo, self.g_lo = 0.0, None  # g(0) = f(0) >= 0, its value not yet run
        self.hi, self.g_hi = depth, g_depth
        if g_depth >= 0:  # full in the steady state: f(depth) = depth
            self.lo = depth
        self.prev = None  # the upper end before this one, (T, g)
        self.side = 0  # which end the last update moved (Illinois: the same twice halves the other's g)
        self.widths = [depth, depth]  # the bracket's width before each of the last two updates
        self.from_above = 0

    def next_trial(self) -> float:
        if self.g_hi >= 0:  # full
            return self.hi
        if self.g_lo is None:  # no point below yet
            if self.prev is None:  # a fixed-point step: f(hi) = hi + g(hi) >= f(T*) = T*, still above
                x = self.hi + self.g_hi
            elif self.g_hi > self.prev[1] and self.from_above < self.FROM_ABOVE:  # the secant through the upper points
                t0, g0 = self.prev
                x = self.hi - self.g_hi * (self.hi - t0) / (self.g_hi - g0)
            else:  # g flat above (a bucket that never empties loses the same each period), or no
                x = self.lo  # progress: the bracket's lower end, where g >= 0
        elif self.hi - self.lo > 0.5 * self.widths[0] or self.g_lo == self.g_hi:  # two updates without halving: bisect
            x = (self.lo + self.hi) / 2
        else:  # regula falsi between the ends
            x = self.hi - self.g_hi * (self.hi - self.lo) / (self.g_hi - self.g_lo)
        return min(max(x, self.lo), self.hi)

    def update(self, x: float, g: float) -> None:
        if self.g_hi >= 0:
            return
        self.widths = [self.widths[1], self.hi - self.lo]
        if g >= 0:
            if self.side == -1 and self.g_lo is not None:
                self.g_hi /= 2  # the lower end moved twice in a row: Illinois
            self.lo, self.g_lo, self.side = x, g, -1
        else:
            if self.side == 1 and self.g_lo is not None:
                self.g_lo /= 2
            self.prev = (self.hi, self.g_hi)
            self.hi, self.g_hi, self.side = x, g, 1
            self.from_above += self.g_lo is None


__all__ = ["Plan", "build_plan", "forget_classes", "node_group_classes", "plan_with_memory", "replica_classes", "simulate", "strategy_classes"]
