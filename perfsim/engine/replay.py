"""Uncontended replay: the event loop's outcome in closed form when no flows compete.

The event loop (:mod:`perfsim.engine.sim`) shares each NIC max-min fairly among
the flows active on it. When, at every instant, a NIC carries one flow, or
flows whose own rates add up to less than its capacity, max-min gives every
flow its own rate (the least of its link's and its NICs') and the order of
events no longer matters: an action starts when its device is free and its
input has arrived; a message leaves when it was sent and its connection is
free, ends ``bytes / rate`` later and arrives ``latency`` after that; a
bucket's collective starts when every replica has the bucket ready and the
stage's communication stream is free. That recurrence (max and + over the
schedule table) is evaluated here for all replicas at once -- one numpy array
over the replicas per quantity, in the same floating-point operations as the
event loop -- and the premise is then checked on its result
(:func:`uncontended`, :mod:`perfsim.engine.contention`). A timeline in which no
flows compete is the one the event loop produces: by induction over time, the
same flows are active at each instant, so max-min gives them the same rates.

With many replicas (:data:`PROBE_FROM`) the first replica's pipeline is replayed and
checked alone first: messages that already compete there send the iteration to the
event loop at once. :func:`replay` returns None when the premise fails, when the event loop
models what the recurrence does not (token buckets, rendezvous, blocking exchanges,
compute slowed by communication, TCP slow start after idle, a trace), or for a single simulated replica (predictions of
one replica stay free of numpy); the caller then runs the event loop.
``tests/engine/test_engine.py`` compares both on every schedule.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

from perfsim.compression.base import ALLREDUCE
from perfsim.engine.contention import _chains, _Flows, uncontended
from perfsim.engine.ep_overlap import shortened
from perfsim.engine.plan import Plan, system_slowdown
from perfsim.engine.sim_output import DeviceStats, SimOutput
from perfsim.network import Network
from perfsim.schedules import (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, RECV_B, RECV_F,
                               SEND_B, SEND_F)

if TYPE_CHECKING:
    import numpy as np


def _order(rows) -> list[tuple[int, object]] | None:
    """All devices' actions in one order in which every receive follows its send
    (the dependencies are the same for every replica); None if the rows deadlock."""
    ptr = [0] * len(rows)
    sent: set[tuple] = set()
    order = []
    progress = True
    while progress:
        progress = False
        for d, row in enumerate(rows):
            i = ptr[d]
            while i < len(row):
                a = row[i]
                if a.kind in (RECV_F, RECV_B) and (a.stage, a.kind, a.microbatch) not in sent:
                    break
                if a.kind == SEND_F:
                    sent.add((a.stage + 1, RECV_F, a.microbatch))
                elif a.kind == SEND_B:
                    sent.add((a.stage - 1, RECV_B, a.microbatch))
                order.append((d, a))
                i += 1
            progress |= i > ptr[d]
            ptr[d] = i
    return order if all(p == len(row) for p, row in zip(ptr, rows)) else None



#: from this many simulated replicas on, :func:`replay` first replays the first replica's
#: pipeline alone and checks the premise on its messages: each replica's pipeline values
#: are its own (:func:`_pipeline`), and a premise that fails on some of the flows fails
#: on all of them (the flows active on a resource at an instant only grow, and so do the
#: rates compared), so contention is told for a fraction of the cost (the 131,072-GPU case
#: of issue 33: 0.03 s instead of 0.6 s of a replay that would decline after all). The probe
#: costs what a replay's numpy steps cost, per step whatever the replicas (13 ms for PP 16,
#: 16 micro-batches; the replay of 512 replicas: 90 ms), so below this many it would cost a
#: replay that goes through more than it could save
PROBE_FROM = 64


def _numbering():
    """A dict numbering resources in order of first use, and the function that numbers one."""
    index: dict = {}

    def rid(res) -> int:
        i = index.get(res)
        if i is None:
            i = index[res] = len(index)
        return i

    return index, rid


def _pipeline(plan: Plan, network: Network, reps: list[int], order, buckets, warmup: bool, flows: _Flows,
              rid) -> SimpleNamespace:
    """The schedule tables of replicas ``reps`` replayed up to the data-parallel sync, one
    numpy array over the replicas per quantity (each replica's values do not depend on
    the others'): per device its end ``t``, per (stage, bucket) when it is ``ready``, the
    connections ``conns`` with their messages, and the sums the output reports. ``flows``
    learns the links' rates; ``rid`` numbers the resources."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    nrep, pp, lanes, table = len(reps), plan.pp, plan.tp, plan.table
    where, place = table.stage_device, plan.device or (lambda t, r, s: r * plan.pp + s)
    mx = np.maximum

    # ---------------------------------------------------------------- connections
    conns: dict[tuple[int, int], dict] = {}

    def conn(d: int, d2: int) -> dict:
        c = conns.get((d, d2))
        if c is None:
            paths = [network.path(place(0, r, d), place(0, r, d2)) for r in reps]
            cap = [p.bandwidth_bps * lanes / 8.0 for p in paths]
            rate = [min([c8] + [flows.cap8(x) for x in p.resources]) for c8, p in zip(cap, paths)]
            flows.rates.update(cap)
            flows.rates.update(rate)
            c = conns[(d, d2)] = {"rate": np.array(rate), "lat": np.array([p.latency_s for p in paths]),
                                  "res": np.array([[rid(x) for x in p.resources] + [-1] * (2 - len(p.resources))
                                                   for p in paths], np.int64).reshape(len(paths), -1),
                                  "free": None, "msgs": []}
        return c

    # ---------------------------------------------------------------- pipeline
    t = [np.zeros(nrep) for _ in range(pp)]
    arrive: dict[tuple, np.ndarray] = {}
    ready: dict[tuple[int, int], np.ndarray] = {}
    compute = [0.0] * pp
    tp_comm = [0.0] * pp
    codec = [0.0] * pp
    sent_bytes = [0.0] * pp
    cells: dict[tuple[int, int], dict[str, float]] = {}
    sent: list[list] = [[] for _ in range(pp)]  # per device: (mb, kind, start, deliver)
    last_grad: list[dict] = []
    for d in range(pp):
        last = {}
        for a in table.rows[d]:
            if a.kind in (BACKWARD, BACKWARD_WEIGHT):
                last[a.stage] = a
        last_grad.append(last)
    events = 0

    def spend(d: int, cell: dict, seconds: float) -> None:  # a codec step
        nonlocal events
        if seconds > 0:
            t[d] = t[d] + seconds
            codec[d] += seconds
            cell["encode_s"] = cell.get("encode_s", 0.0) + seconds
            events += 1

    def send(d: int, d2: int, key: tuple, nbytes: int, mb: int, kind: str) -> None:
        nonlocal events
        c = conn(d, d2)
        start = t[d] if c["free"] is None else mx(t[d], c["free"])
        vol = nbytes * lanes
        end = start + float(vol) / c["rate"] if vol > 0 else start
        c["free"] = end
        c["msgs"].append((start, end, nbytes))
        arrive[key] = deliver = end + c["lat"]
        sent[d].append((mb, kind, start, deliver))
        sent_bytes[d] += nbytes
        events += 2

    for d, a in order:
        k, mb, kind = a.stage, a.microbatch, a.kind
        sp = plan.stages[k]
        cell = cells.setdefault((d, mb), {})
        if kind == RECV_F:
            t[d] = mx(t[d], arrive.pop((k, "F", mb)))
            spend(d, cell, plan.stages[k - 1].fw_decode_s)
        elif kind == RECV_B:
            t[d] = mx(t[d], arrive.pop((k, "B", mb)))
            spend(d, cell, sp.bw_decode_s)
        elif kind == SEND_F:
            spend(d, cell, sp.fw_encode_s)
            send(d, where[k + 1], (k + 1, "F", mb), sp.fw_bytes_warmup if warmup else sp.fw_bytes, mb, FORWARD)
        elif kind == SEND_B:
            prev = plan.stages[k - 1]
            spend(d, cell, prev.bw_encode_s)
            send(d, where[k - 1], (k - 1, "B", mb), prev.bw_bytes, mb, BACKWARD)
        else:
            seconds = {FORWARD: sp.fwd_s, BACKWARD: sp.bwd_s, BACKWARD_INPUT: sp.bwd_s - sp.wgrad_s,
                       BACKWARD_WEIGHT: sp.wgrad_s}[kind]
            tp_s = sp.fwd_tp_s if kind == FORWARD else 0.0 if kind == BACKWARD_WEIGHT else sp.bwd_tp_s
            seconds, tp_s = shortened(seconds, tp_s, plan.ep_savings.get((k, mb, kind), 0.0))  # --ep-overlap
            if a is last_grad[d].get(k) and buckets[k]:
                total, done = seconds + tp_s, 0.0
                for b, bucket in enumerate(buckets[k]):
                    target = bucket.ready_fraction * total if plan.overlap else total
                    if target > done:
                        t[d] = t[d] + (target - done)
                        done = target
                        events += 1
                    ready[(k, b)] = t[d]
                if total > done:
                    t[d] = t[d] + (total - done)
                    events += 1
            else:
                if seconds > 0:
                    t[d] = t[d] + seconds
                    events += 1
                if tp_s > 0:
                    t[d] = t[d] + tp_s
                    events += 1
            compute[d] += seconds
            tp_comm[d] += tp_s
            key = "fwd_compute_s" if kind == FORWARD else "bwd_compute_s"
            cell[key] = cell.get(key, 0.0) + seconds
    return SimpleNamespace(t=t, ready=ready, conns=conns, compute=compute, tp_comm=tp_comm, codec=codec,
                           sent_bytes=sent_bytes, cells=cells, sent=sent, events=events * nrep)


def _conn_flows(conns: dict, flows: _Flows, lanes: int, nrep: int) -> None:
    """Add the connections' messages to ``flows`` for the premise check: per connection
    its touching messages merged into intervals (:func:`_chains`), on its sending and
    its receiving NIC."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    for c in conns.values():
        moved = [m for m in c["msgs"] if m[2] * lanes > 0]
        if not moved or not c["res"].size:
            continue
        st, en = (np.array([m[i] for m in moved], float).reshape(len(moved), nrep) for i in (0, 1))
        cs, ce, cr, col = _chains(st, en, np.broadcast_to(c["rate"], st.shape))
        for ids in c["res"].T:  # the sending NIC, the receiving NIC
            ids = ids[col]
            used = ids >= 0
            flows.add(ids[used], cs[used], ce[used], cr[used])


def replay(plan: Plan, network: Network, *, warmup: bool = False, replicas: list[int] | None = None,
           profile=None) -> SimOutput | None:
    """One iteration as :class:`perfsim.engine.sim.Simulation` would simulate it
    (same arguments), or None when the replay does not apply (module docstring)."""
    link, coll_link, sysm = network.link, network.collective_link, network.system
    slowdown = system_slowdown(sysm, profile)
    if slowdown or link.burst_bytes > 0 or coll_link.burst_bytes > 0 or link.protocol == "rendezvous":
        return None
    if getattr(sysm, "p2p_exchange", "async") != "async":  # senders wait for delivery: the event loop
        return None
    if network.prices_slow_start:  # each connection's send history (perfsim.tcp.SlowStart): the event loop
        return None
    if any(sp.units for sp in plan.stages):  # ZeRO-2/3's per-unit collectives: the event loop
        return None
    if any(b.stride > 1 for sp in plan.stages for b in sp.buckets):  # expert-data-parallel groups: the event loop
        return None
    reps = sorted(replicas) if replicas is not None else list(range(plan.dp))
    if len(reps) < 2:  # one replica: the event loop, so that such predictions never import numpy
        return None
    table = plan.table
    order = _order(plan.comm_rows)
    if order is None:
        return None
    nrep, pp, lanes, where = len(reps), plan.pp, plan.tp, table.stage_device
    place = plan.device or (lambda t, r, s: r * pp + s)
    buckets = plan.warmup_buckets if warmup and plan.warmup_buckets else [sp.buckets for sp in plan.stages]
    # lazy: numpy is heavy, needed only here
    import numpy as np  # here: predictions that never replay do not import numpy

    if nrep >= PROBE_FROM:  # the first replica's messages alone compete: so do all replicas' (PROBE_FROM)
        probe, (probe_index, probe_rid) = _Flows(network), _numbering()
        _conn_flows(_pipeline(plan, network, reps[:1], order, buckets, warmup, probe, probe_rid).conns, probe,
                    lanes, 1)
        if not uncontended(probe, np.array([probe.cap8(x) for x in probe_index]) if probe_index else np.zeros(0)):
            return None
    flows = _Flows(network)
    res_index, rid = _numbering()
    pipe = _pipeline(plan, network, reps, order, buckets, warmup, flows, rid)
    t, ready, conns, events = pipe.t, pipe.ready, pipe.conns, pipe.events
    pipe_end = t

    # ---------------------------------------------------------------- data parallel
    sync_done: dict[int, float] = {}
    dp_log: list[tuple] = []  # (time, stage, device, what, value)
    algo_log: list[tuple] = []
    dp_links: list[tuple] = []  # (edges, kind, wire_bytes, busy)
    stream_flows = []  # per stage: lists of (resources, start, end, rate) in stream order
    for s in range(len(plan.stages)):
        if not buckets[s]:
            continue
        d = where[s]
        members = [place(0, r, d) for r in range(plan.dp)]
        simulated = {place(0, r, d) for r in reps}
        sim_nodes = {network.node(x) for x in simulated}
        ring = network.ring_paths(members, network.collective_link)
        nics = tuple(dict.fromkeys(x for p in ring for x in p.resources if x[1] in sim_nodes))
        nic_ids = [rid(x) for x in nics]
        n = len(members)
        edges = [(members[i], members[(i + 1) % n]) for i in range(n) if members[i] in simulated]
        mine = []
        now = 0.0
        for b, bucket in enumerate(buckets[s]):
            now = max(now, float(np.max(ready[(s, b)])))
            t0 = now
            events += 1
            host = bucket.copy_s / 2 + bucket.encode_s
            if host > 0:
                now = now + host
                events += 1
            for step in bucket.steps:
                coll = network.collective(step.kind, step.nbytes, members)
                algo_log.append((now, s, coll.algo))
                start = now
                now, steps = _phases(coll, now, lanes, nics, flows, mine)
                events += steps
                dp_log.append((now, s, d, "bytes", coll.wire_bytes))
                dp_links.append((now, s, edges, step.kind, coll.wire_bytes, now - start))
            host = bucket.decode_s + bucket.copy_s / 2
            if host > 0:
                now = now + host
                events += 1
            dp_log.append((now, s, d, "sync", now - t0))
        sync_done[s] = now
        if mine:
            stream_flows.append((nic_ids, mine))

    # ---------------------------------------------------------------- tied embedding
    tied = _tied_sync(plan, network, reps, place, pipe_end, sync_done, flows, rid, algo_log, dp_links,
                      stream_flows) if plan.tied_sync_bytes else None

    # ---------------------------------------------------------------- premise
    _conn_flows(conns, flows, lanes, nrep)
    for nic_ids, mine in stream_flows:
        cs, ce, cr, _ = _chains(*(np.array([[f[i]] for f in mine]) for i in range(3)))
        if nic_ids:  # every NIC carries the stream's intervals, NIC after NIC
            k = len(nic_ids)
            flows.add(np.repeat(np.array(nic_ids, np.int64), cs.size), np.tile(cs, k), np.tile(ce, k),
                      np.tile(cr, k))
    res_cap = np.array([flows.cap8(x) for x in res_index]) if res_index else np.zeros(0)
    if not uncontended(flows, res_cap):
        return None

    # ---------------------------------------------------------------- outputs
    return _output(plan, network, reps, place, t, pipe_end, sync_done, pipe.compute, pipe.tp_comm, pipe.codec,
                   pipe.sent_bytes, pipe.cells, pipe.sent, conns, dp_log, algo_log, dp_links, events, tied)


def _phases(coll, now: float, lanes: int, nics: tuple, flows: _Flows, mine: list) -> tuple[float, int]:
    """Run the phases of collective ``coll`` from ``now`` uncontended, as
    :meth:`perfsim.engine.sim.Simulation.run_collective` does: each phase's volume at
    its rate (capped by the NICs when it crosses nodes), then its latency. Appends the
    NIC flows (start, end, rate) to ``mine``; returns the end and the steps taken."""
    steps = 0
    for group in coll.phases:
        ends, lat = [], 0.0
        for ph in group:
            volume, cap = ph.volume_bytes * lanes, ph.rate_bps * lanes / 8.0
            inter = ph.inter_node and nics
            rate = min(cap, flows.least(nics)) if inter else cap
            end = now + float(volume) / rate if volume > 0 else now
            if inter and volume > 0:
                flows.rates.update((cap, rate))
                mine.append((now, end, rate))
            ends.append(end)
            lat = max(lat, ph.latency_s)
            steps += 1
        now = max(ends)
        if lat > 0:
            now = now + lat
            steps += 1
    return now, steps


def _grads_synced(table, d: int, pipe_end, sync_done):
    """When device ``d`` has run its schedule row and synced every bucket of its stages
    (per replica): where the event loop's device waits before the optimizer step."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    x = pipe_end[d]
    syncs = [sync_done[k] for k in table.stages_of(d) if k in sync_done]
    return np.maximum(x, max(syncs)) if syncs else x


def _tied_sync(plan, network, reps, place, pipe_end, sync_done, flows, rid, algo_log, dp_links,
               stream_flows) -> dict:
    """Each replica's all-reduce of the tied embedding's gradient between the devices
    of the first and the last stage (:func:`perfsim.engine.gradient_sync.tied_sync`):
    it starts when both have synced their buckets and runs uncontended at its
    members' link and NIC rates. Returns ``devices``, and per replica its ``end`` and
    ``duration``; its NIC flows join ``stream_flows`` for the premise check."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    table, lanes, last = plan.table, plan.tp, len(plan.stages) - 1
    devices = (table.stage_device[0], table.stage_device[last])
    ready = [_grads_synced(table, d, pipe_end, sync_done) for d in devices]
    start = np.broadcast_to(np.maximum(ready[0], ready[1]), (len(reps),))
    ends, durations = [], []
    for i, r in enumerate(reps):
        members = [place(0, r, d) for d in devices]
        ring = network.ring_paths(members, network.collective_link)
        nics = tuple(dict.fromkeys(x for p in ring for x in p.resources))
        coll = network.collective(ALLREDUCE, plan.tied_sync_bytes, members)
        now = t0 = float(start[i])
        algo_log.append((now, last + 1, coll.algo))
        mine = []
        now, _ = _phases(coll, now, lanes, nics, flows, mine)
        n = len(members)
        edges = [(members[k], members[(k + 1) % n]) for k in range(n)]
        dp_links.append((now, last + 1, edges, ALLREDUCE, coll.wire_bytes, now - t0))
        if mine:
            stream_flows.append(([rid(x) for x in nics], mine))
        ends.append(now)
        durations.append(now - t0)
    return {"devices": devices, "end": np.array(ends), "duration": np.array(durations)}


def _col(x, nrep: int) -> np.ndarray:
    """A per-replica quantity (a float when one replica is replayed) as an array."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    return np.broadcast_to(np.asarray(x, float), (nrep,))


def _output(plan, network, reps, place, t, pipe_end, sync_done, compute, tp_comm, codec, sent_bytes,
            cells, sent, conns, dp_log, algo_log, dp_links, events, tied=None) -> SimOutput:
    """Assemble a SimOutput with the event loop's sums in the event loop's order."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    table, pp, nrep = plan.table, plan.pp, len(reps)
    ends = []
    for d in range(pp):
        mine = table.stages_of(d)
        x = _grads_synced(table, d, pipe_end, sync_done)
        if tied is not None and d in tied["devices"]:
            x = np.maximum(x, tied["end"])
        opt = sum(plan.stages[k].optimizer_s for k in mine)
        ends.append((_col(x + opt, nrep), opt))
        events += nrep
    # per device: the messages' time from start to delivery, summed in delivery order
    comm = []
    for d in range(pp):
        acc = np.zeros(nrep)
        if sent[d]:
            deliver = np.array([m[3] for m in sent[d]], float).reshape(len(sent[d]), nrep)
            dur = np.array([m[3] - m[2] for m in sent[d]], float).reshape(len(sent[d]), nrep)
            idx = np.argsort(deliver, axis=0, kind="stable")
            dur = np.take_along_axis(dur, idx, axis=0)
            for row in dur:
                acc = acc + row
        comm.append(acc)
    dp = sorted(dp_log, key=lambda x: (x[0], x[1]))
    sync_s: dict[int, float] = {}
    dp_bytes: dict[int, float] = {}
    for _, _, d, what, value in dp:
        if what == "sync":
            sync_s[d] = sync_s.get(d, 0.0) + value
        else:
            dp_bytes[d] = dp_bytes.get(d, 0.0) + value
    stats: dict[tuple[int, int], DeviceStats] = {}
    for i, r in enumerate(reps):
        for d in range(pp):
            sync = sync_s.get(d, 0.0)
            if tied is not None and d in tied["devices"]:
                sync = sync + float(tied["duration"][i])
            stats[(r, d)] = DeviceStats(
                compute_s=compute[d], codec_s=codec[d], optimizer_s=0.0 + ends[d][1],
                dp_sync_s=sync, bytes_sent=sent_bytes[d],
                comm_s=float(comm[d][i]), tp_comm_s=tp_comm[d], last_backward_end=float(_col(pipe_end[d], nrep)[i]),
                end=float(ends[d][0][i]))
    micro: dict[tuple[int, int, int], dict[str, float]] = {}
    r0 = reps[0]
    for (d, mb), cell in cells.items():
        micro[(r0, d, mb)] = dict(cell)
    for d in range(pp):
        for mb, kind, start, deliver in sorted(sent[d], key=lambda m: float(_col(m[3], nrep)[0])):
            key = "fwd_comm_s" if kind == FORWARD else "bwd_comm_s"
            cell = micro.setdefault((r0, d, mb), {})
            cell[key] = cell.get(key, 0.0) + float(_col(deliver, nrep)[0] - _col(start, nrep)[0])
    links: dict[tuple[int, int, str], list[float]] = {}
    for (d, d2), c in conns.items():
        busy = np.zeros(nrep)
        total = 0.0
        for start, end, nbytes in c["msgs"]:
            busy = busy + (end - start)
            total += nbytes
        for i, r in enumerate(reps):
            links[(place(0, r, d), place(0, r, d2), "p2p")] = [total, float(busy[i])]
    for _, _, edges, kind, wire, busy in sorted(dp_links, key=lambda x: (x[0], x[1])):
        for src, dst in edges:
            cell = links.setdefault((src, dst, kind), [0.0, 0.0])
            cell[0] += wire
            cell[1] += busy
    algos = tuple(dict.fromkeys(a for _, _, a in sorted(algo_log, key=lambda x: (x[0], x[1]))))
    return SimOutput(
        iteration_s=max(st.end for st in stats.values()),
        pipeline_s=max(st.last_backward_end for st in stats.values()),
        devices=stats, micro=micro, links=links, replicas=reps, dp_bytes_per_rank=dp_bytes,
        events=events, collective_algos=algos, engine="replay")
