"""The branch and bound behind :func:`perfsim.plan.plan`.

Search is branch and bound (Land & Doig, "An automatic method of solving discrete
programming problems", Econometrica 1960), exact: nothing pruned can beat what is kept.
Candidates come in **groups** that differ only in compression (pipeline and gradient
specs, per-boundary mixes, placements): a group's lower bound is the compute of its
lossless member (:func:`group_bound`: compression changes the bytes on the wire and adds
encode time, never less compute), and its memory check holds for all of them
(compression only adds memory: AQ-SGD's message buffers). Groups and candidates wait
in one priority queue ordered by their bound x steps ratio; a group is expanded into
its members (each with :func:`plan_bound`: busiest stage or device, one pass through
the pipeline, bytes over the busiest boundary) only when its bound could still enter
the top ``top``; members are simulated in bound order, and the search stops when the
next bound cannot beat the ``top``-th best score nor, for the lossless choice, the
best score widened by the model's error band (ties go to the lossless choice).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from perfsim.errors import ConfigError
from perfsim.schedules import PLAIN_SCHEDULES, VIRTUAL_STAGE_SCHEDULES


def iteration_bound(stage_work_s: Sequence[float], boundary_bytes: Sequence[float], m: int,
                    link_bps: float | None, sync_bytes: Sequence[float] = (),
                    boundary_bps: Sequence[float] | None = None,
                    boundary_latency_s: Sequence[float] = (), stage_device: Sequence[int] = ()) -> float:
    """Lower bound of one iteration, whatever the schedule or network contention:

    * the busiest stage computes all ``m`` micro-batches: ``m x max_s W_s``;
    * one micro-batch's forward and backward pass through every stage in turn: ``sum_s W_s``;
    * every micro-batch crosses each pipeline boundary (forward activations one way,
      gradients the other, full duplex): ``m x max_k bytes_k x 8 / B`` at the link's
      nominal rate ``B`` (``None``: no link term);
    * each stage's gradient synchronisation puts ``sync_bytes[s]`` on its busiest link
      once per iteration (however well it overlaps the backward): ``max_s sync_s x 8 / B``;
    * on a heterogeneous topology, ``boundary_bps[k]`` is the rate of the slowest link
      boundary ``k`` crosses: ``m x max_k bytes_k x 8 / B_k``; and one micro-batch's
      pass crosses every boundary forward and back: ``sum_s W_s + 2 sum_k lat_k`` with
      ``boundary_latency_s[k]`` the least one-way latency of boundary ``k``;
    * a device that runs several stages (``stage_device[s]``, interleaved schedules)
      computes all of them for every micro-batch: ``m x max_d sum_{s on d} W_s``.
    """
    bound = max(m * max(stage_work_s), sum(stage_work_s) + 2 * sum(boundary_latency_s))
    if stage_device:
        per: dict[int, float] = {}
        for w, d in zip(stage_work_s, stage_device):
            per[d] = per.get(d, 0.0) + w
        bound = max(bound, m * max(per.values()))
    if link_bps and boundary_bytes:
        bound = max(bound, m * max(boundary_bytes) * 8 / link_bps)
    if boundary_bps and boundary_bytes:
        bound = max(bound, m * max(b * 8 / r for b, r in zip(boundary_bytes, boundary_bps)))
    if link_bps and sync_bytes:
        bound = max(bound, max(sync_bytes) * 8 / link_bps)
    return bound


def engine_plan(params: dict[str, Any]):
    """The configs, the engine's plan (every per-stage cost, as :func:`perfsim.engine.simulate`
    resolves it: tensor-parallel collectives and host overhead included) and the network."""
    from perfsim.api import build_configs  # lazy: import perfsim does not load perfsim.api
    from perfsim.engine.plan import build_plan  # lazy: import perfsim does not load perfsim.engine.plan
    from perfsim.hardware import get_gpu  # lazy: import perfsim does not load perfsim.hardware
    from perfsim.network import Network  # lazy: import perfsim does not load perfsim.network

    workload, strategy, system, profile = build_configs(**params)
    net = Network(system, strategy.devices, profile)
    gpu = get_gpu(system.gpu) if system.gpu else None
    pl = build_plan(workload, strategy, profile, net, gpu, system.host_overhead_s)
    return workload, strategy, system, profile, pl, net


def compute_bound(pl, schedule: str) -> float:
    """Lower bound of an iteration from compute alone: :func:`iteration_bound`'s compute
    terms with each stage's work including its tensor-parallel collectives (serial with
    compute); for every schedule the pipeline fill before each device's work; and for
    GPipe and 1F1B (one whole stage per device; its first action is
    micro-batch 0's forward and its last micro-batch m-1's backward) the pipeline fill
    and drain around the busiest stage: ``max_s sum_{k<s} F_k + m W_s + sum_{k<s} B_k``
    (GPipe: Huang et al. arXiv:1811.06965; 1F1B: Narayanan et al. arXiv:2104.04473)."""
    fwd = [st.fwd_s + st.fwd_tp_s for st in pl.stages]
    bwd = [st.bwd_s + st.bwd_tp_s for st in pl.stages]
    work = [f + b for f, b in zip(fwd, bwd)]
    m = pl.num_microbatches
    where = pl.table.stage_device
    bound = iteration_bound(work, [], m, None, stage_device=where)
    # any schedule: a device's first action is a forward of its first stage, which waits
    # for that micro-batch's forwards on every stage before it; then it computes all
    # its stages for every micro-batch
    first: dict[int, int] = {}
    busy: dict[int, float] = {}
    for s, d in enumerate(where):
        first.setdefault(d, s)
        busy[d] = busy.get(d, 0.0) + m * work[s]
    bound = max(bound, max(sum(fwd[:first[d]]) + busy[d] for d in busy))
    if schedule in PLAIN_SCHEDULES and len(set(where)) == len(pl.stages):
        before = 0.0
        for s, w in enumerate(work):
            bound = max(bound, before + m * w)
            before += w
    return bound


def plan_bound(params: dict[str, Any]) -> float:
    """:func:`iteration_bound` of a configuration, from the engine's own plan (stage
    compute, exact boundary wire bytes) -- no simulation."""
    _, strategy, system, profile, pl, net = engine_plan(params)
    work = [st.fwd_s + st.bwd_s + st.fwd_tp_s + st.bwd_tp_s for st in pl.stages]
    boundary = [max(st.fw_bytes, st.bw_bytes) for st in pl.stages[:-1]]

    where = pl.table.stage_device
    gpn = system.gpus_per_node
    node = lambda r, s: strategy.device(0, r, where[s]) // gpn  # noqa: E731
    link, rates, lats = None, None, ()
    sync = []
    if system.topology is None:
        # a boundary that leaves a node for some replica goes through that node's NICs
        # (their total rate, shared by its GPUs); the others at the intra-node rate
        inter, intra = system.bandwidth_bps, max(system.bandwidth_bps, system.intra_node_bandwidth_bps)
        rates = [inter if any(node(r, k) != node(r, k + 1) for r in range(pl.dp)) else intra
                 for k in range(len(pl.stages) - 1)]
    if system.topology is not None:  # each boundary over the slowest link it crosses
        paths = [[net.path(strategy.device(0, r, where[k]), strategy.device(0, r, where[k + 1]))
                  for r in range(pl.dp)] if where[k] != where[k + 1] else []
                 for k in range(len(pl.stages) - 1)]
        rates = [min((p.bandwidth_bps for p in ps), default=math.inf) for ps in paths]
        lats = [min((p.latency_s for p in ps), default=0.0) for ps in paths]
    nic = nic_bound(pl, strategy, system) if system.topology is None else 0.0
    return max(iteration_bound(work, boundary, pl.num_microbatches, link, sync, rates, lats,
                               stage_device=pl.table.stage_device),
               compute_bound(pl, strategy.schedule), nic)


def nic_bound(pl, strategy, system) -> float:
    """Time the busiest node's NICs (their total rate, each direction on its own) need
    for what must leave or enter the node in one iteration:

    * every pipeline boundary between two nodes: each micro-batch's activations leave
      the sender's node and enter the receiver's, its gradients the other way;
    * a data-parallel sync group spanning ``N`` nodes sends from each of them at least,
      per all-reduce of ``S`` bytes per member, ``2 (N-1)/N S`` (the ring's per-member
      volume, the hierarchical all-reduce's inter-node phase; the tree moves ``2 S``:
      Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
      workstations", JPDC 2009), and receives per all-gather ``(n - k) S`` (the other
      members' parts; ``k`` of its ``n`` members on the node); other kinds nothing.
    Every tensor rank and model chunk syncs its own group; a node adds up its GPUs'."""
    if not system.bandwidth_bps:
        return 0.0

    gpn, where, n, m = system.gpus_per_node, pl.table.stage_device, pl.dp, pl.num_microbatches
    out: dict[int, float] = {}
    into: dict[int, float] = {}
    for t in range(strategy.tp):
        for k, st in enumerate(pl.stages):
            if k + 1 < len(pl.stages):
                for r in range(n):
                    a = strategy.device(t, r, where[k]) // gpn
                    b = strategy.device(t, r, where[k + 1]) // gpn
                    if a != b:
                        out[a] = out.get(a, 0.0) + m * st.fw_bytes / strategy.tp
                        into[b] = into.get(b, 0.0) + m * st.fw_bytes / strategy.tp
                        out[b] = out.get(b, 0.0) + m * st.bw_bytes / strategy.tp
                        into[a] = into.get(a, 0.0) + m * st.bw_bytes / strategy.tp
            if n == 1:
                continue
            nodes = Counter(strategy.device(t, r, where[k]) // gpn for r in range(n))
            N = len(nodes)
            if N < 2:
                continue
            reduce = sum(step.nbytes for b in st.buckets for step in b.steps if step.kind == "allreduce")
            gather = sum(step.nbytes for b in st.buckets for step in b.steps if step.kind == "allgather")
            for node, on in nodes.items():
                out[node] = out.get(node, 0.0) + 2.0 * (N - 1) / N * reduce
                into[node] = into.get(node, 0.0) + (n - on) * gather
    return max([*out.values(), *into.values()], default=0.0) * 8 / system.bandwidth_bps


def _simulate(params: dict[str, Any]) -> tuple[dict | None, list, str | None]:
    from perfsim.api import predict  # lazy: import perfsim does not load perfsim.api

    try:
        res = predict(**params)
    except ConfigError as exc:  # e.g. does not fit in memory, invalid combination
        return None, [], str(exc)
    return res.summary, res.links, None


def _simulate_batch(batch: list[dict[str, Any]]) -> list[tuple[dict | None, list, str | None]]:
    return [_simulate(p) for p in batch]


def group_bound(params: dict[str, Any]) -> tuple[float, str | None]:
    """Compute-only lower bound shared by every compression of ``params`` (its lossless
    member's :func:`compute_bound`) and, when the lossless member is invalid or does not
    fit in memory, why (then no member does)."""
    from perfsim.engine import check_memory  # lazy: import perfsim does not load perfsim.engine

    q = {k: v for k, v in params.items() if k not in COMPRESSION_KEYS}
    try:
        workload, strategy, system, _, pl, _ = engine_plan(q)
        if system.gpu:
            check_memory(workload, strategy, system, pl)
    except ConfigError as exc:
        return math.inf, str(exc)
    return compute_bound(pl, strategy.schedule), None


def family_bound(params: dict[str, Any]) -> float:
    """Compute-only lower bound shared by every group of a family (:func:`family_key`:
    the same stage work, whatever the ZeRO stage or the one-stage-per-device schedule):
    ``max(m x busiest device, one pass)``; 0 when it cannot be built (then each group
    is bounded on its own). The bound is taken without ZeRO (a ZeRO stage only adds
    sharding work), so it holds for every stage a family holds."""
    q = {k: v for k, v in params.items() if k not in COMPRESSION_KEYS and k != "zero"}
    try:
        _, strategy, _, _, pl, _ = engine_plan(q)
    except ConfigError:
        return 0.0
    work = [st.fwd_s + st.bwd_s + st.fwd_tp_s + st.bwd_tp_s for st in pl.stages]
    return iteration_bound(work, [], pl.num_microbatches, None, stage_device=pl.table.stage_device)


#: what a group's members differ in (a compression, and where it applies)
COMPRESSION_KEYS = ("compress", "grad_compress", "boundary_compress", "placement", "device_order")
#: what a family's groups may differ in besides: neither changes any stage's work
#: (ZeRO-1 shards optimizer state; these schedules order the same whole-stage actions)
FAMILY_KEYS = ("zero", "schedule")


def group_key(params: dict[str, Any]) -> tuple:
    return tuple(sorted((k, v) for k, v in params.items() if k not in COMPRESSION_KEYS))


def family_key(params: dict[str, Any]) -> tuple:
    chunks = params.get("schedule") if params.get("schedule") in VIRTUAL_STAGE_SCHEDULES + ("zb-v",) else None
    return (chunks,) + tuple(sorted((k, v) for k, v in params.items()
                                    if k not in COMPRESSION_KEYS and k not in FAMILY_KEYS))


@dataclass
class Group:
    """Candidates (or groups of them): ``key`` bounds every member's key (bound x
    steps ratio); ``bound`` computes a member's bound when the group is expanded."""

    key: float
    members: list
    rejected: str | None = None
    #: the least steps ratio among the candidates inside (1 without curves)
    ratio: float = 1.0

    def size(self) -> int:
        return sum(m.size() if isinstance(m, Group) else 1 for m in self.members)

    def first(self):
        m = self.members[0]
        return m.first() if isinstance(m, Group) else m


def _bound_members(members: list, bound: Callable[[dict], float]) -> tuple[list, list]:
    ok, invalid = [], []
    for c in members:
        if isinstance(c, Group):  # a group of candidates: its compute bound and memory
            b, why = group_bound(c.first().params)
            if why is not None:
                rep = c.first()
                rep.rejected = why
                invalid.append((rep, c.size()))
                continue
            c.key = b * c.ratio
            ok.append(c)
            continue
        try:
            c.bound_s = bound(c.params)
        except ConfigError as exc:  # an invalid combination: rejected without simulating
            c.rejected = str(exc)
            invalid.append((c, 1))
            continue
        ok.append(c)
    return ok, invalid


def search(groups: Sequence[Group], *, top: int = 5, jobs: int = 1, wave: int = 16,
           progress: Callable[[int], None] | None = None, backend: str = "process",
           dask_scheduler: str | None = None, band: float = 0.0,
           lossless: Callable[[Any], bool] = lambda c: False,
           bound: Callable[[dict], float] = plan_bound) -> tuple[list, int, int, list]:
    """Branch and bound over ``groups`` (module docstring). Returns (simulated candidates,
    number pruned, number rejected (by the simulator, the memory check or an invalid
    combination), one rejected candidate per invalid group or candidate, with its
    reason). Waves of ``wave`` candidates per worker run in parallel on ``backend``
    (:class:`perfsim.batch.BatchRunner`, the pool ``perfsim sweep`` uses too)."""
    tie = itertools.count()
    heap = [(g.key, next(tie), g) for g in groups]
    heapq.heapify(heap)
    done: list = []
    invalid_all: list = []
    n_invalid = 0
    best: list[float] = []  # scores of the feasible candidates, ascending
    rejected = 0
    # lazy: import perfsim does not load perfsim.batch
    from perfsim.batch import BatchRunner  # `import perfsim` loads this module: the pool's module on use

    workers = BatchRunner(jobs, backend, dask_scheduler)

    best_lossless = [math.inf]  # the best lossless score found: a tie can only go to a better one

    def limits() -> tuple[float, float]:
        return (best[top - 1] if len(best) >= top else math.inf,
                min(best[0] * (1 + band), best_lossless[0]) if best else math.inf)

    try:
        while heap:
            top_s, band_s = limits()
            if heap[0][0] >= top_s and heap[0][0] >= band_s:
                break
            batch: list = []
            size = max(wave, 2 * workers.jobs) if workers.parallel else 1
            skipped = 0
            while heap and len(batch) < size:
                key, _, item = heap[0]
                if key >= top_s and key >= band_s:
                    break
                heapq.heappop(heap)
                if isinstance(item, Group):
                    if item.rejected is not None:
                        continue
                    ok, invalid = _bound_members(item.members, bound)
                    invalid_all += [c for c, _ in invalid]
                    n_invalid += sum(n for _, n in invalid)
                    skipped += sum(n for _, n in invalid)
                    for c in ok:
                        heapq.heappush(heap, (max(c.key, key), next(tie), c))
                    continue
                if key >= top_s and not lossless(item):
                    skipped += 1  # only the lossless choice can still win a tie
                    continue
                batch.append(item)
            if batch:
                n = workers.jobs
                chunks = [batch[k::n] for k in range(n)] if workers.parallel else [batch]
                chunks = [ch for ch in chunks if ch]
                outs = workers.map(_simulate_batch, [[c.params for c in ch] for ch in chunks])
                results = {id(c): r for ch, out in zip(chunks, outs) for c, r in zip(ch, out)}
                for c in batch:
                    summary, links, err = results[id(c)]
                    if err is None and summary.get("fits") is False:
                        err = "does not fit in memory"
                    if err is not None:
                        c.rejected = err
                        rejected += 1
                    else:
                        c.summary, c.links = summary, links
                        best.append(c.score())
                        best.sort()
                        if lossless(c):
                            best_lossless[0] = min(best_lossless[0], c.score())
                    done.append(c)
            if progress and (batch or skipped):
                progress(len(batch) + skipped)
    finally:
        workers.close()
    total = sum(g.size() for g in groups if g.rejected is None)
    return done, total - len(done) - n_invalid, rejected + n_invalid, invalid_all
