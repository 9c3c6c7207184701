"""Data parallelism in the event loop: each stage's gradient sync and the tied embedding's.

During a stage's last backward (when its gradients are complete), buckets become ready
layer by layer from the back (:meth:`perfsim.engine.sim.Simulation._last_backward`);
:func:`stage_sync` runs each bucket's collectives (the grad compressor's ``dp_plan``) in
order on one communication stream, overlapping the rest of the backward; each
collective's algorithm and phases come from the backend's ``collective``
(:meth:`perfsim.engine.sim.Simulation.run_collective`). The optimizer step follows the
last bucket -- and, with a tied LM head synced Megatron's way
(:attr:`perfsim.engine.plan.Plan.tied_sync_bytes`), :func:`tied_sync`: the all-reduce of
the embedding gradient between the devices of the first and the last stage, once both
have synced their buckets.

Replica classes: a collective spans the full ring of all ``dp`` members while only the
simulated representatives' NICs are loaded (each stands for its class).

Each function is a SimPy process body over the simulation ``sim`` (as
:mod:`perfsim.engine.sharding`'s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from perfsim.compression.base import ALLREDUCE
from perfsim.models.moe import expert_dp_replicas

if TYPE_CHECKING:
    from perfsim.engine.sim import Simulation


def stage_sync(sim: Simulation, s: int):
    """Gradient sync of stage ``s`` across replicas: buckets in order, each bucket's
    collectives in ``dp_plan`` order, one communication stream
    (:meth:`~perfsim.engine.sim.Simulation.run_collective`); the replicas' copies of stage
    ``s`` live on device ``d``."""
    env, plan = sim.env, sim.plan
    d = sim.where[s]
    members = [sim.dev(r, d) for r in range(plan.dp)]
    simulated = {sim.dev(r, d) for r in sim.replicas}
    for k, bucket in enumerate(sim.buckets[s]):
        yield simpy.AllOf(env, [sim.bucket_ready[(r, s, k)] for r in sim.replicas])
        t0 = env.now
        host = bucket.copy_s / 2 + bucket.encode_s  # flatten into the bucket, encode
        if host > 0:
            yield env.timeout(host)
        for step in bucket.steps:
            start = env.now
            if bucket.stride == 1:
                coll = yield from sim.run_collective(step.kind, step.nbytes, members, simulated,
                                                     lanes=sim.lanes)
            else:  # the routed experts' groups, side by side (perfsim.engine.buckets.expert_buckets)
                coll = yield from group_collectives(sim, step, d, bucket.stride)
            sim.dp_bytes_per_rank[d] += coll.wire_bytes
            sim._span(f"{step.kind} s{s} b{k} {step.label} ({coll.algo})", "dp", sim.replicas[0],
                      2000 + d, start, env.now, {"bytes": step.nbytes, "algo": coll.algo})
        host = bucket.decode_s + bucket.copy_s / 2  # decode, copy back into the gradients
        if host > 0:
            yield env.timeout(host)
        sync, stats = env.now - t0, sim.stats  # (one value for every replica)
        for r in sim.replicas:
            stats[(r, d)].dp_sync_s += sync
    for r in sim.replicas:
        sim.sync_done[(r, s)].succeed()


def group_collectives(sim: Simulation, step, d: int, stride: int):
    """One collective step of a bucket synced within groups of replicas ``stride`` apart
    (:attr:`perfsim.engine.buckets.Bucket.stride`: the expert-data-parallel groups,
    :func:`perfsim.models.moe.expert_dp_replicas`), all at once: one per group holding a
    simulated replica, each standing for ``stride / groups run`` groups as lanes beside its
    tensor ranks' (as a simulated replica stands for its class). Returns one group's plan."""
    firsts = sorted({r % stride for r in sim.replicas})
    lanes = sim.lanes * max(1, round(stride / len(firsts)))
    runs = [sim.env.process(sim.run_collective(
                step.kind, step.nbytes, [sim.dev(r, d) for r in expert_dp_replicas(sim.plan.dp, stride, j)],
                {sim.dev(r, d) for r in sim.replicas if r % stride == j}, lanes=lanes))
            for j in firsts]
    yield simpy.AllOf(sim.env, runs)
    return runs[0].value


def tied_sync(sim: Simulation, r: int):
    """Replica ``r``'s all-reduce of the tied embedding's gradient between the
    first and the last stage (Megatron-LM ``_allreduce_embedding_grads``: after
    the data-parallel sync, before the optimizer step), counted as gradient sync."""
    env = sim.env
    yield simpy.AllOf(env, [sim.grads_synced[(r, d)] for d in sim.tied_devices])
    t0 = env.now
    members = [sim.dev(r, d) for d in sim.tied_devices]
    coll = yield from sim.run_collective(ALLREDUCE, sim.plan.tied_sync_bytes, members, set(members),
                                         lanes=sim.lanes)
    sim._span(f"allreduce tied embedding ({coll.algo})", "dp", r, 2000 + sim.tied_devices[0], t0, env.now,
              {"bytes": sim.plan.tied_sync_bytes, "algo": coll.algo})
    for d in sim.tied_devices:
        sim.stats[(r, d)].dp_sync_s += env.now - t0
    sim.tied_done[r].succeed()
