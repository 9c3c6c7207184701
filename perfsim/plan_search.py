"""The branch and bound behind :func:`perfsim.plan.plan`.

Search is branch and bound (Land & Doig, "An automatic method of solving discrete
programming problems", Econometrica 1960), exact: nothing pruned can beat what is kept.
Candidates come in **groups** that differ only in compression (pipeline and gradient
specs, per-boundary mixes, placements): a group's lower bound is the compute of its
lossless member (:func:`group_bound`: compression changes the bytes on the wire and adds
encode time, never less compute; with the critical path of its schedule table,
:func:`table_bound`, computed once per group), and its memory check holds for all of them
(compression only adds memory: AQ-SGD's message buffers). Groups and candidates wait
in one priority queue ordered by their bound x steps ratio; a group is expanded into
its members (each with :func:`plan_bound`: busiest stage or device, one pass through
the pipeline, bytes over the busiest boundary and NICs, each device's gradient sync after
its last weight-gradient action's earliest start) only when its bound could still enter
the top ``top``; members are simulated in bound order, and the search stops when the
next bound cannot beat the ``top``-th best score nor, for the lossless choice, the
best score widened by the model's error band (ties go to the lossless choice).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from perfsim.compression.base import REDUCE_SCATTER
from perfsim.errors import ConfigError
from perfsim.models.moe import expert_dp_replicas
from perfsim.schedules import (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, COMPUTE_KINDS, FORWARD,
                               PLAIN_SCHEDULES, VIRTUAL_STAGE_SCHEDULES)


def iteration_bound(stage_work_s: Sequence[float], boundary_bytes: Sequence[float], m: int,
                    link_bps: float | None, sync_bytes: Sequence[float] = (),
                    boundary_bps: Sequence[float] | None = None,
                    boundary_latency_s: Sequence[float] = (), stage_device: Sequence[int] = (),
                    pass_s: Sequence[float] | None = None) -> float:
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
      computes all of them for every micro-batch: ``m x max_d sum_{s on d} W_s``;
    * ``pass_s[s]``: what of stage ``s`` one micro-batch's pass waits for, when not all
      of ``W_s`` (a zero-bubble schedule's weight gradients are off the pass:
      :func:`pass_work`).
    """
    chain = stage_work_s if pass_s is None else pass_s
    bound = max(m * max(stage_work_s), sum(chain) + 2 * sum(boundary_latency_s))
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


def pass_work(pl, split: bool | None = None) -> list[float]:
    """Per stage, the work one micro-batch's forward and backward pass waits for: the
    forward and the backward with their tensor-parallel collectives, less the
    weight-gradient part where the schedule splits it off (``I`` / ``W``: Qi et al.,
    "Zero Bubble Pipeline Parallelism", arXiv:2401.10241; ``split`` None: read from the
    schedule table; True: whatever the schedule, a bound for every schedule)."""
    if split is None:
        split = any(a.kind == BACKWARD_INPUT for row in pl.table.rows for a in row)
    return [st.fwd_s + st.fwd_tp_s + st.bwd_s + st.bwd_tp_s - (st.wgrad_s if split else 0.0) for st in pl.stages]


def compute_bound(pl, schedule: str, hops: Sequence[tuple[float, float]] | None = None,
                  codec: dict[int, float] | None = None) -> float:
    """Lower bound of an iteration from compute alone: :func:`iteration_bound`'s compute
    terms with each stage's work including its tensor-parallel collectives (serial with
    compute); for every schedule the pipeline fill before each device's work; and for
    GPipe and 1F1B (one whole stage per device; its first action is
    micro-batch 0's forward and its last micro-batch m-1's backward) the pipeline fill
    and drain around the busiest stage: ``max_s sum_{k<s} F_k + m W_s + sum_{k<s} B_k``
    (GPipe: Huang et al. arXiv:1811.06965; 1F1B: Narayanan et al. arXiv:2104.04473);
    for ZB-H1 the same with the input-gradient pass ``I`` for ``B`` and one
    weight-gradient pass ``W_0`` after stage 0's last ``I`` (Qi et al., "Zero Bubble
    Pipeline Parallelism", arXiv:2401.10241).
    ``hops[k]``: the least seconds one micro-batch's (forward, backward) message over
    boundary ``k`` adds to the fill and the drain, with the decode and the encode of
    them that stage ``k+1``'s device runs (:func:`boundary_hops`); ``codec[d]``:
    the encode and decode seconds device ``d`` runs per iteration (both None: compute
    only)."""
    fwd = [st.fwd_s + st.fwd_tp_s for st in pl.stages]
    bwd = [st.bwd_s + st.bwd_tp_s for st in pl.stages]
    work = [f + b for f, b in zip(fwd, bwd)]
    m = pl.num_microbatches
    where = pl.table.stage_device
    hops = hops or [(0.0, 0.0, 0.0, 0.0)] * (len(work) - 1)
    codec = codec or {}
    bound = iteration_bound(work, [], m, None, stage_device=where, pass_s=pass_work(pl))
    # any schedule: a device's first action is a forward of its first stage, which waits
    # for that micro-batch's forwards on every stage before it (and their messages); then
    # it computes all its stages for every micro-batch
    first: dict[int, int] = {}
    busy: dict[int, float] = {}
    for s, d in enumerate(where):
        first.setdefault(d, s)
        busy[d] = busy.get(d, 0.0) + m * work[s]
    # (the last hop's decode on device d is in codec[d]: counted once)
    bound = max(bound, max(sum(fwd[:f]) + sum(h[0] for h in hops[:f]) - (hops[f - 1][2] if f else 0.0)
                           + busy[d] + codec.get(d, 0.0) for d, f in first.items()))
    split = schedule == "zb-h1"
    if (schedule in PLAIN_SCHEDULES or split) and len(set(where)) == len(pl.stages):
        # the last backward (ZB-H1: input-gradient I) of stage s follows all its forwards
        # and backwards; its gradient then runs back through every earlier stage, and
        # stage 0's last I is followed by at least one weight-gradient W
        wgrad = [st.wgrad_s for st in pl.stages] if split else [0.0] * len(work)
        back = [b - w for b, w in zip(bwd, wgrad)]
        fill = drain = 0.0
        for s in range(len(work)):
            own = hops[s - 1][2] + hops[s - 1][3] if s else 0.0  # stage s's own codec: in codec[where[s]]
            bound = max(bound, fill + m * (fwd[s] + back[s]) + codec.get(where[s], 0.0) - own + drain + wgrad[0])
            if s < len(hops):
                fill += fwd[s] + hops[s][0]
                drain += back[s] + hops[s][1]
    return bound


def boundary_hops(pl, strategy, net) -> list[tuple[float, float, float, float]]:
    """Per pipeline boundary ``k``, the least seconds one micro-batch's forward message
    and its gradient's add on the critical path of replica 0: encode, the path's latency
    and its bytes (beyond a token bucket's burst, :class:`perfsim.link.Link`) at the
    path's rate, decode; then the forward's decode and the gradient's encode alone (the
    part stage ``k+1``'s device runs); nothing for a hand-off inside one device."""
    where = pl.table.stage_device
    burst = getattr(getattr(net, "link", None), "burst_bytes", 0.0) or 0.0
    out = []
    for k, st in enumerate(pl.stages[:-1]):
        if where[k] == where[k + 1]:
            out.append((0.0, 0.0, 0.0, 0.0))
            continue
        a, b = strategy.device(0, 0, where[k]), strategy.device(0, 0, where[k + 1])
        fw, bw = net.path(a, b), net.path(b, a)
        out.append((st.fw_encode_s + fw.latency_s + max(0.0, st.fw_bytes - burst) * 8 / fw.bandwidth_bps
                    + st.fw_decode_s,
                    st.bw_encode_s + bw.latency_s + max(0.0, st.bw_bytes - burst) * 8 / bw.bandwidth_bps
                    + st.bw_decode_s, st.fw_decode_s, st.bw_encode_s))
    return out


def device_codec(pl) -> dict[int, float]:
    """Encode and decode seconds each pipeline device runs per iteration: for every
    micro-batch, the boundaries it sends over and receives from."""
    m, where = pl.num_microbatches, pl.table.stage_device
    codec: dict[int, float] = {}
    for k, st in enumerate(pl.stages[:-1]):
        if where[k + 1] != where[k]:
            codec[where[k]] = codec.get(where[k], 0.0) + m * (st.fw_encode_s + st.bw_decode_s)
            codec[where[k + 1]] = codec.get(where[k + 1], 0.0) + m * (st.fw_decode_s + st.bw_encode_s)
    return codec


def plan_bound(params: dict[str, Any]) -> float:
    """:func:`iteration_bound` of a configuration, from the engine's own plan (stage
    compute, exact boundary wire bytes) -- no simulation."""
    _, strategy, system, profile, pl, net, memo = _member(params)
    work = [st.fwd_s + st.bwd_s + st.fwd_tp_s + st.bwd_tp_s for st in pl.stages]
    boundary = [max(st.fw_bytes, st.bw_bytes) for st in pl.stages[:-1]]

    where = pl.table.stage_device
    gpn = system.gpus_per_node
    from perfsim.engine.plan import device_map  # lazy: import perfsim does not load perfsim.engine.plan

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


def _action_s(st, kind: str) -> float:
    """Seconds a compute action of stage plan ``st`` keeps its device busy (as the engine
    runs it: compute and its tensor-parallel collectives, serial)."""
    if kind == FORWARD:
        return st.fwd_s + st.fwd_tp_s
    if kind == BACKWARD:
        return st.bwd_s + st.bwd_tp_s
    if kind == BACKWARD_INPUT:
        return st.bwd_s - st.wgrad_s + st.bwd_tp_s
    return st.wgrad_s


def table_bound(pl, starts: dict | None = None) -> float:
    """Lower bound of an iteration from the schedule table's order alone: each device runs
    its row's compute actions in turn (:func:`_action_s`), and a micro-batch's forward on
    stage ``s`` starts only once its forward on stage ``s-1`` has ended, its backward (or
    input-gradient pass) on stage ``s`` once that on stage ``s+1`` and its own forward
    have -- the dependencies the engine (:mod:`perfsim.engine.sim`) waits for, with every
    message taking no time. The end of the last action: the critical path of the table's
    DAG with compute weights (for a schedule with few micro-batches per round, e.g.
    interleaved 1F1B, Narayanan et al. arXiv:2104.04473, far above ``m x`` the busiest
    device). Compression adds encode time and bytes, never less compute: it bounds every
    compression of a job. ``starts``: filled with each action's earliest start, keyed
    (device, index in its row)."""
    rows = pl.table.rows
    fwd: dict[tuple[int, int], float] = {}
    bwd: dict[tuple[int, int], float] = {}
    last = len(pl.stages) - 1
    free = [0.0] * len(rows)
    at = [0] * len(rows)
    left = sum(len(r) for r in rows)
    while left:
        moved = False
        for d, row in enumerate(rows):
            while at[d] < len(row):
                a = row[at[d]]
                s, mb = a.stage, a.microbatch
                if a.kind == FORWARD:
                    ready = fwd.get((s - 1, mb)) if s else 0.0
                elif a.kind in (BACKWARD, BACKWARD_INPUT):
                    up = bwd.get((s + 1, mb)) if s < last else 0.0
                    own = fwd.get((s, mb))
                    ready = None if up is None or own is None else max(up, own)
                elif a.kind == BACKWARD_WEIGHT:
                    ready = bwd.get((s, mb))
                else:  # a communication action: its wait is not counted
                    ready = 0.0
                if ready is None:
                    break
                start = max(free[d], ready)
                if starts is not None:
                    starts[d, at[d]] = start
                end = start + (_action_s(pl.stages[s], a.kind) if a.kind in COMPUTE_KINDS else 0.0)
                free[d] = end
                if a.kind == FORWARD:
                    fwd[s, mb] = end
                elif a.kind in (BACKWARD, BACKWARD_INPUT):
                    bwd[s, mb] = end
                at[d] += 1
                left -= 1
                moved = True
        if not moved:  # a table whose order cannot run: no bound from it
            return 0.0
    return max(free)


def lossless_table_bound(params: dict[str, Any]) -> float:
    """:func:`table_bound` of the group's lossless job (:func:`lossless_job`), once per
    group (its memo): a bound for every compression of the job."""
    _, _, _, _, pl, _, memo = lossless_job(params)
    if "table" not in memo:
        memo["starts"] = {}
        memo["table"] = table_bound(pl, memo["starts"])
    return memo["table"]


def _sync_bytes(bucket, strategy, system, nodes: Counter) -> float:
    """Bytes that must leave or enter the busiest node for one bucket's collectives
    among the replicas of a pipeline device that sync it (tensor rank 0; ``nodes``: how many on
    each node), as :func:`nic_bound`
    counts them: per all-reduce of ``S`` bytes over ``N`` nodes ``2 (N-1)/N S`` out of
    each node, per reduce-scatter ``(n - k)/n S`` out of and per all-gather ``(n - k) S``
    into a node holding ``k`` of the ``n`` members; other kinds, and a topology, count
    nothing."""
    if system.topology is not None or not system.bandwidth_bps:
        return 0.0
    n = sum(nodes.values())
    N = len(nodes)
    if N < 2:
        return 0.0
    out = into = 0.0
    for step in bucket.steps:
        if step.kind == "allreduce":
            out += 2.0 * (N - 1) / N * step.nbytes
        elif step.kind == REDUCE_SCATTER:  # the other members' parts of the sum leave the node
            out += (n - min(nodes.values())) / n * step.nbytes
        elif step.kind == "allgather":
            into += (n - min(nodes.values())) * step.nbytes
    return max(out, into)


def replica_nodes(pl, strategy, system) -> list[Counter]:
    """Per pipeline device ``d``: how many of its replicas (tensor rank 0) sit on each node."""
    from perfsim.engine.plan import device_map  # lazy: import perfsim does not load perfsim.engine.plan

    dev = device_map(strategy)
    return [Counter(dev(0, r, d) // system.gpus_per_node for r in range(pl.dp)) for d in range(pl.pp)]


def device_bound(pl, strategy, net, nodes: list[Counter] | None = None, starts: dict | None = None) -> float:
    """Lower bound of an iteration from what each device does in turn, as the engine
    (:mod:`perfsim.engine.sim`) runs it: every action of its schedule row (compute,
    tensor-parallel collectives, and for each micro-batch the encode and decode of the
    boundaries it sends and receives), then, once its stages' gradients are synced, its
    optimizer steps. A stage's gradient buckets are synced in order on one stream, each
    once ready: bucket ``j`` is ready ``f_j`` (``Bucket.ready_fraction``; 1 without
    overlap) into the stage's last weight-gradient action, which starts only after every
    action before it in the device's row; it then takes at least its copies, codec and
    the bytes its collectives must move through a node's NICs (:func:`_sync_bytes`) at
    their fastest rate. So
    the device ends no earlier than ``max_j (ready_j + sum_{i >= j} sync_i) + optimizer``.
    ZeRO-2/3 stages (per-unit collectives) count their compute only. ``nodes``:
    :func:`replica_nodes` (None: counted here). ``starts``: the earliest start of each
    action (:func:`table_bound`'s, of this plan or of one with no more compute per
    action: the group's lossless job), which the last weight-gradient action starts no
    earlier than (rather than after the sum of the actions before it)."""
    from perfsim.engine.plan import device_map  # lazy: import perfsim does not load perfsim.engine.plan

    where = pl.table.stage_device
    n = len(pl.stages)
    codec = device_codec(pl)
    system = net.system
    # the fastest a node's NICs move bytes: nominal, or a calibrated rate above it
    rate = max(system.bandwidth_bps, net.link.rate_bps, net.collective_link.rate_bps)
    nodes = nodes or replica_nodes(pl, strategy, system)
    bound = 0.0
    for d in range(pl.pp):
        row = pl.table[d]
        mine = [k for k in range(n) if where[k] == d]
        opt = sum(pl.stages[k].optimizer_s for k in mine)
        busy = sum(_action_s(pl.stages[a.stage], a.kind) for a in row if a.kind in COMPUTE_KINDS)
        end = busy + codec.get(d, 0.0)
        last = {a.stage: i for i, a in enumerate(row) if a.kind in (BACKWARD, BACKWARD_WEIGHT)}
        for k in mine:
            st = pl.stages[k]
            if not st.buckets or st.units or k not in last or pl.dp == 1:
                continue
            before = sum(_action_s(pl.stages[a.stage], a.kind) for a in row[:last[k]] if a.kind in COMPUTE_KINDS)
            if starts:
                before = max(before, starts.get((d, last[k]), 0.0))
            length = _action_s(st, row[last[k]].kind)
            groups = {j: nodes[d] if j == 1 else  # all replicas; an expert group (stride ep)
                      Counter(device_map(strategy)(0, r, d) // system.gpus_per_node
                              for r in expert_dp_replicas(pl.dp, j, 0))
                      for j in {b.stride for b in st.buckets}}
            times = [b.copy_s + b.encode_s + b.decode_s + _sync_bytes(b, strategy, system, groups[b.stride]) * 8 / rate
                     for b in st.buckets]
            after = 0.0
            for b, t in zip(reversed(st.buckets), reversed(times)):
                after += t
                frac = b.ready_fraction if pl.overlap else 1.0
                end = max(end, before + frac * length + after)
        bound = max(bound, end + opt)
    return bound


def nic_bound(pl, strategy, system, layout=None) -> float:
    """Time the busiest node's NICs (their total rate, each direction on its own) need
    for what must leave or enter the node in one iteration:

    * every pipeline boundary between two nodes: each micro-batch's activations leave
      the sender's node and enter the receiver's, its gradients the other way;
    * a data-parallel sync group spanning ``N`` nodes sends from each of them at least,
      per all-reduce of ``S`` bytes per member, ``2 (N-1)/N S`` (the ring's per-member
      volume, the hierarchical all-reduce's inter-node phase; the tree moves ``2 S``:
      Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
      workstations", JPDC 2009), and receives per all-gather ``(n - k) S`` (the other
      members' parts; ``k`` of its ``n`` members on the node) -- under ZeRO-3 also per
      micro-batch each unit's shards (twice when resharded after the forward,
      :mod:`perfsim.engine.sharding`), and sends per reduce-scatter of ``S`` bytes per
      member (ZeRO-2/3: each unit's gradient, every micro-batch) the other members'
      ``(n - k)/n S`` (so does a bucket's reduce-scatter, ZeRO-1's); other kinds nothing.
    Every tensor rank and model chunk syncs its own group; a node adds up its GPUs'.
    ``layout``: :func:`nic_layout` (None: read here)."""
    from perfsim.engine.plan import device_map  # lazy: import perfsim does not load perfsim.engine.plan

    if not system.bandwidth_bps:
        return 0.0
    cross, spans, spanning = layout or nic_layout(pl, strategy, system)
    n, m, tp = pl.dp, pl.num_microbatches, strategy.tp
    gpn, where = system.gpus_per_node, pl.table.stage_device
    out: dict[int, float] = {}
    into: dict[int, float] = {}
    for k, st in enumerate(pl.stages):
        fw, bw = m * st.fw_bytes / tp, m * st.bw_bytes / tp
        for (a, b), c in cross[k].items():
            out[a] = out.get(a, 0.0) + c * fw
            into[b] = into.get(b, 0.0) + c * fw
            out[b] = out.get(b, 0.0) + c * bw
            into[a] = into.get(a, 0.0) + c * bw
        if not spans[k]:
            continue
        dense = [step for b in st.buckets if b.stride == 1 for step in b.steps]  # (expert groups: below)
        reduce = sum(step.nbytes for step in dense if step.kind == "allreduce")
        gather = sum(step.nbytes for step in dense if step.kind == "allgather")
        # ZeRO-3: every micro-batch gathers each unit's shards before its forward (and
        # again before its backward when resharded), :mod:`perfsim.engine.sharding`
        shards = sum(u.gather_bytes for u in st.units)
        gather += m * (2 if pl.reshard_after_forward else 1) * shards if shards else 0.0
        # ZeRO-2/3: every micro-batch reduce-scatters each unit's gradient
        scatter = m * sum(step.nbytes for u in st.units for step in u.rs_steps if step.kind == REDUCE_SCATTER)
        scatter += sum(step.nbytes for step in dense if step.kind == REDUCE_SCATTER)
        for node, (ring, outside) in spans[k].items():
            out[node] = out.get(node, 0.0) + ring * reduce + outside / n * scatter
            into[node] = into.get(node, 0.0) + outside * gather
        for stride in {b.stride for b in st.buckets} - {1}:  # expert-data-parallel groups, each its own ring
            dev = device_map(strategy)
            for t in spanning[k]:
                _expert_nic_bytes(st, stride, [[dev(t, r, where[k]) // gpn for r in expert_dp_replicas(n, stride, j)]
                                               for j in range(stride)], out, into)
    return max([*out.values(), *into.values()], default=0.0) * 8 / system.bandwidth_bps


def nic_layout(pl, strategy, system) -> tuple[list[Counter], list[dict], list[list[int]]]:
    """What :func:`nic_bound` reads from where the ranks sit (the same for every
    compression of a job): per stage ``k``, how many tensor ranks' messages over
    boundary ``k`` go from node ``a`` to node ``b`` (every replica's); per node the
    sums over the tensor ranks whose sync group spans ``N >= 2`` nodes of ``2 (N-1)/N``
    and of ``n - on`` (``on`` of the group's ``n`` members on the node); and those
    tensor ranks."""
    from perfsim.engine.plan import device_map  # lazy: import perfsim does not load perfsim.engine.plan

    gpn, where, n = system.gpus_per_node, pl.table.stage_device, pl.dp
    dev = device_map(strategy)
    cross: list[Counter] = [Counter() for _ in pl.stages]
    spans: list[dict] = [{} for _ in pl.stages]
    spanning: list[list[int]] = [[] for _ in pl.stages]
    for t in range(strategy.tp):
        for k in range(len(pl.stages)):
            if k + 1 < len(pl.stages):
                for r in range(n):
                    a = dev(t, r, where[k]) // gpn
                    b = dev(t, r, where[k + 1]) // gpn
                    if a != b:
                        cross[k][a, b] += 1
            if n == 1:
                continue
            nodes = Counter(dev(t, r, where[k]) // gpn for r in range(n))
            N = len(nodes)
            if N < 2:
                continue
            spanning[k].append(t)
            for node, on in nodes.items():
                ring, outside = spans[k].get(node, (0.0, 0))
                spans[k][node] = (ring + 2.0 * (N - 1) / N, outside + n - on)
    return cross, spans, spanning


def _expert_nic_bytes(st, stride: int, groups: list[list[int]], out: dict, into: dict) -> None:
    """Add to ``out`` / ``into`` (bytes per node) what stage ``st``'s buckets synced within
    groups of replicas ``stride`` apart move through the NICs, as :func:`nic_bound` counts a
    group (``groups``: each group's members' nodes; the routed experts' expert-data-parallel
    groups, :func:`perfsim.engine.plan.expert_buckets`)."""
    reduce = sum(step.nbytes for b in st.buckets if b.stride == stride for step in b.steps if step.kind == "allreduce")
    gather = sum(step.nbytes for b in st.buckets if b.stride == stride for step in b.steps if step.kind == "allgather")
    for members in groups:
        nodes = Counter(members)
        N = len(nodes)
        if N < 2:
            continue
        for node, on in nodes.items():
            out[node] = out.get(node, 0.0) + 2.0 * (N - 1) / N * reduce
            into[node] = into.get(node, 0.0) + (len(members) - on) * gather


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
    fit in memory (:func:`check_fits`: per stage and per device), why (then no member
    does: compression only adds memory)."""
    try:
        workload, strategy, system, _, pl, _, _ = lossless_job(params)
        check_fits(workload, strategy, system, pl)
    except ConfigError as exc:
        return math.inf, str(exc)
    return max(compute_bound(pl, strategy.schedule), lossless_table_bound(params)), None


def check_fits(workload, strategy, system, pl) -> None:
    """With a GPU preset, raise the ConfigError of a job that does not fit: a stage over the
    GPU's memory (:func:`perfsim.engine.check_memory`, as predict raises it) or a device
    whose stages (an interleaved schedule's chunks) add up over it
    (:func:`perfsim.memory.device_memory`: predict's ``fits`` False, which the search
    rejects after simulating)."""
    from perfsim.engine import check_memory  # lazy: import perfsim does not load perfsim.engine
    from perfsim.memory import GIB, device_memory  # lazy: import perfsim does not load perfsim.memory

    if not system.gpu:
        return
    mem, cap = check_memory(workload, strategy, system, pl)
    need = device_memory(mem, pl.table)
    d = max(range(len(need)), key=need.__getitem__)
    if need[d] > cap:
        raise ConfigError(f"memory: device {d} holds stages {pl.table.stages_of(d)}, "
                          f"{need[d] / GIB:.1f} GiB per GPU; {system.gpu} has {cap / GIB:.1f} GiB")


def member_bound(params: dict[str, Any]) -> float:
    """:func:`plan_bound` of a candidate that fits in memory (:func:`check_fits` on its own
    plan: a compression can add memory, AQ-SGD's message buffers, so the group's check
    does not clear every member); one that does not raises the ConfigError that
    predict, or the search after simulating it, would."""
    workload, strategy, system, _, pl, _ = member_plan(params)
    check_fits(workload, strategy, system, pl)
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
    work = [st.fwd_s + st.bwd_s + st.fwd_tp_s + st.bwd_tp_s for st in pl.stages]
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
