"""Lower bounds of one training iteration, read from the engine's plan of a configuration
(:func:`perfsim.engine.plan.build_plan`: every per-stage cost resolved once) and its
network -- no simulation. :mod:`perfsim.plan_search` takes the largest of them as a
candidate's bound in its branch and bound; each is a bound for every schedule and
network contention the engine (:mod:`perfsim.engine.sim`) would run:

* :func:`iteration_bound`: the busiest stage or device, one micro-batch's pass, the bytes
  over the busiest boundary and link;
* :func:`compute_bound`: compute alone, with the pipeline fill and drain (GPipe: Huang et
  al. arXiv:1811.06965; 1F1B: Narayanan et al. arXiv:2104.04473; ZB-H1: Qi et al., "Zero
  Bubble Pipeline Parallelism", arXiv:2401.10241) and each boundary's least message time
  (:func:`boundary_hops`, :func:`device_codec`);
* :func:`table_bound`: the critical path of the schedule table's DAG with compute weights;
* :func:`device_bound`: what each device does in turn, its gradient sync after its last
  weight-gradient action;
* :func:`nic_bound`: the busiest node's NICs (pipeline boundaries between nodes and the
  data-parallel sync groups spanning nodes: Patarasuk & Yuan, "Bandwidth optimal
  all-reduce algorithms for clusters of workstations", JPDC 2009).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from perfsim.compression.base import REDUCE_SCATTER
from perfsim.models.moe import expert_dp_replicas
from perfsim.schedules import (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, COMPUTE_KINDS, FORWARD,
                               PLAIN_SCHEDULES)



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


def pass_work(pl, split: bool | None = None) -> list[float]:
    """Per stage, the work one micro-batch's forward and backward pass waits for: the
    forward and the backward with their tensor-parallel collectives, less the
    weight-gradient part where the schedule splits it off (``I`` / ``W``: Qi et al.,
    "Zero Bubble Pipeline Parallelism", arXiv:2401.10241; ``split`` None: read from the
    schedule table; True: whatever the schedule, a bound for every schedule)."""
    if split is None:
        split = any(a.kind == BACKWARD_INPUT for row in pl.table.rows for a in row)
    return [st.fwd_s + st.fwd_tp_min + st.bwd_s + st.bwd_tp_min - (st.wgrad_s if split else 0.0) for st in pl.stages]


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
    fwd = [st.fwd_s + st.fwd_tp_min for st in pl.stages]
    bwd = [st.bwd_s + st.bwd_tp_min for st in pl.stages]
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


def _action_s(st, kind: str) -> float:
    """Seconds a compute action of stage plan ``st`` keeps its device busy (as the engine
    runs it: compute and its tensor-parallel collectives, serial)."""
    if kind == FORWARD:
        return st.fwd_s + st.fwd_tp_min
    if kind == BACKWARD:
        return st.bwd_s + st.bwd_tp_min
    if kind == BACKWARD_INPUT:
        return st.bwd_s - st.wgrad_s + st.bwd_tp_min
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
    from perfsim.engine.group_times import device_map  # lazy: import perfsim does not load perfsim.engine

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
    from perfsim.engine.group_times import device_map  # lazy: import perfsim does not load perfsim.engine

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
    from perfsim.engine.group_times import device_map  # lazy: import perfsim does not load perfsim.engine

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
    from perfsim.engine.group_times import device_map  # lazy: import perfsim does not load perfsim.engine

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
    groups, :func:`perfsim.engine.buckets.expert_buckets`)."""
    steps = [step for b in st.buckets if b.stride == stride for step in b.steps]
    reduce = sum(step.nbytes for step in steps if step.kind == "allreduce")
    scatter = sum(step.nbytes for step in steps if step.kind == REDUCE_SCATTER)  # ZeRO-1's
    gather = sum(step.nbytes for step in steps if step.kind == "allgather")
    for members in groups:
        nodes = Counter(members)
        N = len(nodes)
        if N < 2:
            continue
        for node, on in nodes.items():  # each node's own members, as the dense buckets' bound counts them
            out[node] = out.get(node, 0.0) + 2.0 * (N - 1) / N * reduce + (len(members) - on) / len(members) * scatter
            into[node] = into.get(node, 0.0) + (len(members) - on) * gather
