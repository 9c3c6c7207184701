"""The branch and bound behind :func:`perfsim.plan.plan`.

Search is branch and bound (Land & Doig, "An automatic method of solving discrete
programming problems", Econometrica 1960), exact: nothing pruned can beat what is kept.
Candidates come in **groups** that differ only in compression (pipeline and gradient
specs, per-boundary mixes, placements): a group's lower bound is the compute of its
lossless member (:func:`group_bound`: compression changes the bytes on the wire and adds
encode time, never less compute; with the critical path of its schedule table,
:func:`~perfsim.plan_bounds.table_bound`, computed once per group), and its memory check
holds for all of them (compression only adds memory: AQ-SGD's message buffers). Groups and candidates wait
in one priority queue ordered by their bound x steps ratio; a group is expanded into
its members (each with :func:`plan_bound`: busiest stage or device, one pass through
the pipeline, bytes over the busiest boundary and NICs, each device's gradient sync after
its last weight-gradient action's earliest start) only when its bound could still enter
the top ``top``; members are simulated in bound order, and the search stops when the
next bound cannot beat the ``top``-th best score nor, for the lossless choice, the
best score widened by the model's error band (ties go to the lossless choice).

This module holds the search (:class:`Group`, :func:`search`), the per-search cache of
each group's lossless job (:func:`lossless_job`, :func:`member_plan`) and the bounds of a
candidate, a group and a family read through it (:func:`plan_bound`,
:func:`group_bound`, :func:`family_bound`); the bound formulas over one engine plan are
:mod:`perfsim.plan_bounds`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from perfsim.errors import ConfigError
from perfsim.plan_bounds import (boundary_hops, compute_bound, device_bound, device_codec, iteration_bound,
                                 nic_bound, nic_layout, pass_work, replica_nodes, table_bound)
from perfsim.schedules import VIRTUAL_STAGE_SCHEDULES


def engine_plan(params: dict[str, Any], compute_only: bool = False):
    """The configs, the engine's plan (every per-stage cost, as :func:`perfsim.engine.simulate`
    resolves it: tensor-parallel collectives and host overhead included; ``compute_only``:
    only each stage's compute and parameters, :func:`perfsim.engine.plan.build_plan`) and
    the network."""
    from perfsim.api import build_configs  # lazy: import perfsim does not load perfsim.api
    from perfsim.engine.plan import build_plan  # lazy: import perfsim does not load perfsim.engine.plan
    from perfsim.hardware import get_gpu  # lazy: import perfsim does not load perfsim.hardware
    from perfsim.network import Network  # lazy: import perfsim does not load perfsim.network

    workload, strategy, system, profile = build_configs(**params)
    net = Network(system, strategy.devices, profile)
    gpu = get_gpu(system.gpu) if system.gpu else None
    pl = build_plan(workload, strategy, profile, net, gpu, system.host_overhead_s, compute_only)
    return workload, strategy, system, profile, pl, net


#: the lossless jobs whose compute :func:`plan_bound` reuses, most recent last
_JOBS: "OrderedDict[tuple, tuple]" = OrderedDict()
#: how many :data:`_JOBS` are kept (a group's members are bounded together)
JOBS_KEPT = 32


def forget_jobs() -> None:
    """Empty :data:`_JOBS`: its keys are parameters (a model's or profile's path, not the
    file's content), so it lives for one search only (:func:`perfsim.plan.plan` calls this
    first); a file changed between two plans is read again. Empties the engine's replica
    classes too (:func:`perfsim.engine.forget_classes`)."""
    from perfsim.engine import forget_classes  # lazy: import perfsim does not load perfsim.engine

    _JOBS.clear()
    forget_classes()


def member_plan(params: dict[str, Any]):
    """:func:`engine_plan` of a configuration, resolving each stage's compute once per
    group (:func:`group_key`: what only the compression tells apart): the group's lossless
    job is built once (configs, network, compute-only plan) and each compression's
    strategy is that job's with its specs, its plan built over the same compute
    (:func:`perfsim.engine.plan.build_plan`'s ``compute``), its gradient sync taken from
    the group's first member with the same gradient compression (``sync``). A placement,
    device order or per-boundary compression changes more than the specs: built in full."""
    return _member(params)[:6]


def lossless_job(params: dict[str, Any]):
    """The group's lossless job (:func:`engine_plan` of ``params`` without the compression
    keys, compute only) and its memo, built once per group (:data:`_JOBS`): the group's
    bound (:func:`group_bound`), its members' plans (:func:`member_plan`) and a family's
    bound (:func:`family_bound`) read the same one. Raises its ConfigError."""
    key = group_key(params)
    job = _JOBS.get(key)
    if job is None:
        job = (*engine_plan({k: v for k, v in params.items() if k not in COMPRESSION_KEYS}, compute_only=True), {})
        _JOBS[key] = job
        while len(_JOBS) > JOBS_KEPT:
            _JOBS.popitem(last=False)
    else:
        _JOBS.move_to_end(key)
    return job


def _member(params: dict[str, Any]):
    """:func:`member_plan` and the group's memo (a dict: what the bounds read from where the
    group's ranks sit, which no compression changes; a fresh one outside the cache)."""
    from perfsim.engine.plan import build_plan  # lazy: import perfsim does not load perfsim.engine.plan
    from perfsim.hardware import get_gpu  # lazy: import perfsim does not load perfsim.hardware

    if any(k in params for k in ("placement", "device_order", "boundary_compress")):
        return (*engine_plan(params), {})
    workload, strategy, system, profile, compute, net, memo = lossless_job(params)
    specs = {k: params[k] for k in ("compress", "grad_compress") if k in params}
    if specs:
        strategy = replace(strategy, **specs)
    gpu = get_gpu(system.gpu) if system.gpu else None
    sync = memo.get(("sync", strategy.grad_compress))
    pl = build_plan(workload, strategy, profile, net, gpu, system.host_overhead_s, compute=compute, sync=sync)
    if sync is None:
        memo[("sync", strategy.grad_compress)] = pl
    return workload, strategy, system, profile, pl, net, memo


def plan_bound(params: dict[str, Any]) -> float:
    """:func:`~perfsim.plan_bounds.iteration_bound` of a configuration, from the engine's own plan (stage
    compute, exact boundary wire bytes) -- no simulation."""
    _, strategy, system, profile, pl, net, memo = _member(params)
    work = [st.fwd_s + st.bwd_s + st.fwd_tp_min + st.bwd_tp_min for st in pl.stages]
    boundary = [max(st.fw_bytes, st.bw_bytes) for st in pl.stages[:-1]]

    where = pl.table.stage_device
    gpn = system.gpus_per_node
    from perfsim.engine.group_times import device_map  # lazy: import perfsim does not load perfsim.engine

    dev = device_map(strategy)
    node = lambda r, s: dev(0, r, where[s]) // gpn  # noqa: E731
    link = None
    sync = []
    if "links" in memo:  # where the group's ranks sit: the same for every compression
        rates, lats = memo["links"]
    elif system.topology is None:
        # a boundary that leaves a node for some replica goes through that node's NICs
        # (their total rate, shared by its GPUs); the others at the intra-node rate
        inter, intra = system.bandwidth_bps, max(system.bandwidth_bps, system.intra_node_bandwidth_bps)
        rates = [inter if any(node(r, k) != node(r, k + 1) for r in range(pl.dp)) else intra
                 for k in range(len(pl.stages) - 1)]
        lats = ()
    else:  # each boundary over the slowest link it crosses
        paths = [[net.path(dev(0, r, where[k]), dev(0, r, where[k + 1]))
                  for r in range(pl.dp)] if where[k] != where[k + 1] else []
                 for k in range(len(pl.stages) - 1)]
        rates = [min((p.bandwidth_bps for p in ps), default=math.inf) for ps in paths]
        lats = [min((p.latency_s for p in ps), default=0.0) for ps in paths]
    memo["links"] = rates, lats
    nic = 0.0
    if system.topology is None:
        if "nic" not in memo:
            memo["nic"] = nic_layout(pl, strategy, system)
        nic = nic_bound(pl, strategy, system, memo["nic"])
    if "nodes" not in memo:
        memo["nodes"] = replica_nodes(pl, strategy, system)
    placed = any(k in params for k in ("placement", "device_order", "boundary_compress"))
    table = table_bound(pl) if placed else lossless_table_bound(params)  # (fills memo["starts"])
    return max(table, iteration_bound(work, boundary, pl.num_microbatches, link, sync, rates, lats,
                               stage_device=pl.table.stage_device, pass_s=pass_work(pl)),
               compute_bound(pl, strategy.schedule, boundary_hops(pl, strategy, net), device_codec(pl)), nic,
               device_bound(pl, strategy, net, memo["nodes"], memo.get("starts")))


def lossless_table_bound(params: dict[str, Any]) -> float:
    """:func:`~perfsim.plan_bounds.table_bound` of the group's lossless job (:func:`lossless_job`), once per
    group (its memo): a bound for every compression of the job."""
    _, _, _, _, pl, _, memo = lossless_job(params)
    if "table" not in memo:
        memo["starts"] = {}
        memo["table"] = table_bound(pl, memo["starts"])
    return memo["table"]


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
    member's :func:`~perfsim.plan_bounds.compute_bound`) and, when the lossless member is invalid or does not
    fit in memory (:func:`check_fits`: per stage and per device), why (then no member
    does: compression only adds memory)."""
    try:
        workload, strategy, system, profile, pl, _, _ = lossless_job(params)
        check_fits(workload, strategy, system, pl, profile)
    except ConfigError as exc:
        return math.inf, str(exc)
    return max(compute_bound(pl, strategy.schedule), lossless_table_bound(params)), None


def check_fits(workload, strategy, system, pl, profile=None) -> None:
    """With a GPU preset, raise the ConfigError of a job that does not fit: a stage over the
    GPU's memory (:func:`perfsim.engine.check_memory`, as predict raises it) or a device
    whose stages (an interleaved schedule's chunks) add up over it
    (:func:`perfsim.memory.device_memory`: predict's ``fits`` False, which the search
    rejects after simulating). Without one, the GPU the profile was measured on, where it
    names a preset (the default's V100 16 GB: what predict warns about and ``perfsim memory``
    compares with): a plan never recommends a job its own profile's GPU cannot hold."""
    from perfsim.engine import check_memory  # lazy: import perfsim does not load perfsim.engine
    from perfsim.hardware import profile_gpu  # lazy: import perfsim does not load perfsim.hardware
    from perfsim.memory import GIB, device_memory  # lazy: import perfsim does not load perfsim.memory

    if system.gpu:
        mem, cap = check_memory(workload, strategy, system, pl)
        name = system.gpu
    else:
        measured_on = profile_gpu(profile) if profile is not None else None
        if measured_on is None:
            return
        mem, _ = check_memory(workload, strategy, system, pl, allow_oom=True)
        cap, name = measured_on.memory_bytes, f"{measured_on.name} (the profile's GPU)"
    need = device_memory(mem, pl.table)
    d = max(range(len(need)), key=need.__getitem__)
    if need[d] > cap:
        raise ConfigError(f"memory: device {d} holds stages {pl.table.stages_of(d)}, "
                          f"{need[d] / GIB:.1f} GiB per GPU; {name} has {cap / GIB:.1f} GiB")


def member_bound(params: dict[str, Any]) -> float:
    """:func:`plan_bound` of a candidate that fits in memory (:func:`check_fits` on its own
    plan: a compression can add memory, AQ-SGD's message buffers, so the group's check
    does not clear every member); one that does not raises the ConfigError that
    predict, or the search after simulating it, would."""
    workload, strategy, system, profile, pl, _ = member_plan(params)
    check_fits(workload, strategy, system, pl, profile)
    return plan_bound(params)


def family_bound(params: dict[str, Any]) -> float:
    """Compute-only lower bound shared by every group of a family (:func:`family_key`:
    the same stage work, whatever the ZeRO stage or the one-stage-per-device schedule):
    ``max(m x busiest device, one pass)``; 0 when it cannot be built (then each group
    is bounded on its own). The bound is taken without ZeRO (a ZeRO stage only adds
    sharding work), so it holds for every stage a family holds."""
    q = {k: v for k, v in params.items() if k not in COMPRESSION_KEYS and k != "zero"}
    try:
        _, strategy, _, _, pl, _ = engine_plan(q, compute_only=True)
    except ConfigError:
        return 0.0
    work = [st.fwd_s + st.bwd_s + st.fwd_tp_min + st.bwd_tp_min for st in pl.stages]
    # the groups may differ in schedule: the pass without weight gradients holds for all
    return iteration_bound(work, [], pl.num_microbatches, None, stage_device=pl.table.stage_device,
                           pass_s=pass_work(pl, split=True))


#: what a group's members differ in (a compression, and where it applies)
COMPRESSION_KEYS = ("compress", "grad_compress", "boundary_compress", "placement", "device_order")
_COMPRESSION = frozenset(COMPRESSION_KEYS)
#: what a family's groups may differ in besides: neither changes any stage's work
#: (ZeRO-1 shards optimizer state; these schedules order the same whole-stage actions)
FAMILY_KEYS = ("zero", "schedule")


def group_key(params: dict[str, Any]) -> tuple:
    """What a group's members share: every parameter but the compression ones, in the
    parameters' order (the candidates list them in one order, :mod:`perfsim.search_space`)."""
    return tuple(kv for kv in params.items() if kv[0] not in _COMPRESSION)


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
           bound: Callable[[dict], float] = member_bound) -> tuple[list, int, int, list]:
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
