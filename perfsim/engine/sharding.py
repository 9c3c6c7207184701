"""ZeRO-2/3 and FSDP2 in the communication schedule: per-unit collectives beside compute.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", arXiv:1910.02054, Sec. 5 and 7; Zhao et al., "PyTorch FSDP: Experiences on
Scaling Fully Sharded Data Parallel", arXiv:2304.11277, Sec. 3-4. A *unit* is one layer
of a stage (an FSDP2 ``fully_shard`` module: a transformer block, the embedding, the head).

* ZeRO-2 (``Strategy.zero == 2``): every backward reduce-scatters each unit's gradient as
  soon as the unit's backward has produced it (DeepSpeed stage 2 and FSDP reduce at
  every micro-batch: the gradients are kept sharded), on a communication stream of its
  own; after the last backward the updated parameters are all-gathered (as ZeRO-1:
  :func:`perfsim.engine.buckets.zero1_steps`, one bucket of the whole stage).
* ZeRO-3 / FSDP2 full-shard (``zero == 3``): each forward all-gathers every unit's
  parameters before the unit computes, and each backward again (unless
  ``reshard_after_forward`` is off), in execution order, with one unit of prefetch: the
  gather of unit ``i + 1`` starts once unit ``i``'s gather is done and unit ``i`` starts
  computing (FSDP2 issues it from the CPU ahead of the GPU; its memory holds two units,
  :func:`perfsim.memory.sharding_buffers`); unit ``i`` computes once its gather is done.
  Gradients are reduce-scattered as in ZeRO-2; no gather after the step (the next
  forward gathers the updated shards).

Per iteration and rank, a ring moves ``(N-1)/N`` of each collective's full buffer
(:func:`perfsim.collectives.plan`): ZeRO-3 with ``m`` micro-batches sends
``m (2 W + G) Psi (N-1)/N`` bytes (``m (W + G) Psi (N-1)/N`` without resharding) against
DDP's ``2 G Psi (N-1)/N`` -- the paper's 1.5x at ``m = 1``, Sec. 7.2.2.

On a CPU (a profile calibrated on one, gloo, no GPU preset; :func:`host_driven`) nothing
overlaps: FSDP2 issues every all-gather and reduce-scatter with ``async_op=False`` and a
CPU has no streams, so each blocks the training thread -- a prefetch only moves the
blocking gather earlier. There each unit's gather (copy-in of the shard, the collective,
copy-out of the whole unit) runs before the unit computes and each reduce-scatter (copy-in
of the whole gradient, the collective, the shard's copy into the gradient) right after its
backward; the collectives are priced as torch's calls that FSDP2 issues, which the profile
timed (``all_gather_into_tensor``, ``reduce_scatter_tensor``: gloo's reduce-scatter is an
allreduce of the whole buffer, :mod:`perfsim.collectives` "Measured kinds"), the copies at
the profile's copy cost (:func:`perfsim.engine.buckets.copy_time`). Under ZeRO-3, FSDP2's own
host work per unit and pass (its hooks, DTensor bookkeeping, unshard / reshard: the
profile's ``fsdp_host`` records, :mod:`perfsim.calibrate.fsdp_host`) runs on that thread
too, before each unit's forward and backward, and the root's once per stage pass
(:func:`add_fsdp_host`); a profile without those records prices it as 0 and the plan says
so (:func:`fsdp_host_note`).

Gradient compression composes with the reduce-scatter only where the compressor's
payloads can be summed chunk by chunk (:meth:`perfsim.compression.base.Compressor.
reduce_scatter_plan`); otherwise the configuration is refused, naming the compressor.
The optimizer step waits for every reduce-scatter of the iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from perfsim.compression.base import ALLGATHER, REDUCE_SCATTER, CommStep
from perfsim.errors import ConfigError


@dataclass
class ShardUnit:
    """One sharding unit of a stage, per micro-batch."""

    params: int
    fwd_share: float  # share of the stage's forward compute
    bwd_share: float  # share of the stage's backward compute
    gather_bytes: int  # one rank's shard of the weights (0: no gather, ZeRO-2)
    rs_steps: list[CommStep] = field(default_factory=list)  # its gradient's reduce-scatter
    codec_s: float = 0.0  # encode + decode of a compressed reduce-scatter
    gather_host_s: float = 0.0  # host copies around each all-gather (host-driven collectives only)
    rs_host_s: float = 0.0  # host copies around each reduce-scatter (host-driven collectives only)
    fwd_hook_s: float = 0.0  # FSDP2's own host time per forward (host-driven ZeRO-3 only)
    bwd_hook_s: float = 0.0  # and per backward


#: the torch.distributed calls FSDP2 issues its collectives through (``all_gather_single`` /
#: ``reduce_scatter_single`` in newer torch: the same c10d ops), by kind
FSDP_CALLS = {ALLGATHER: "all_gather_into_tensor", REDUCE_SCATTER: "reduce_scatter_tensor"}


def host_driven(profile, gpu) -> bool:
    """Whether ZeRO-2/3's collectives run on the training thread, serial with compute: a
    profile calibrated on a CPU (gloo) and no GPU preset (module docstring). With a GPU
    (NCCL, its own streams) they overlap compute as FSDP2 and DeepSpeed overlap them."""
    return gpu is None and profile is not None and profile.metadata.get("device") == "cpu"


def add_host_copies(units: list[ShardUnit], weight_bytes: int, dp: int, copy_s) -> None:
    """The copies FSDP2 makes around each collective of each unit, priced by ``copy_s(nbytes)``
    (torch ``_fsdp_collectives``: ``foreach_all_gather`` copies the rank's shard into the
    all-gather input and ``foreach_all_gather_copy_out`` the gathered buffer out into the
    parameters; ``foreach_reduce`` copies the unsharded gradients into the reduce-scatter
    input and the reduced shard into the sharded gradient). Gradients in the weights' dtype."""
    for u in units:
        whole = u.params * weight_bytes
        shard = -(-whole // dp)
        if u.gather_bytes:
            u.gather_host_s = copy_s(shard) + copy_s(whole)
        if u.rs_steps:
            u.rs_host_s = copy_s(whole) + copy_s(shard)


#: the ``fsdp_host`` record names, per unit and for the root, by pass
FSDP_HOST = {"unit": ("unit_forward", "unit_backward"), "root": ("root_forward", "root_backward")}


def add_fsdp_host(units: list[ShardUnit], profile) -> None:
    """FSDP2's own host time on the training thread (ZeRO-3 with host-driven collectives):
    each unit's per forward and per backward, and the root's (the stage module, once per
    stage pass: its lazy-init checks, pre-forward, end-of-backward callback) on the first
    unit, whose forward runs first and whose backward last; 0 where the profile has no
    ``fsdp_host`` records (:meth:`perfsim.profile.costs.ProfileCosts.fsdp_host_time`).
    Measured with ``reshard_after_forward`` on; without it FSDP2's backward skips the
    unshard, priced the same (an upper bound)."""
    (uf, ub), (rf, rb) = ([profile.fsdp_host_time(n) or 0.0 for n in FSDP_HOST[k]] for k in ("unit", "root"))
    for i, u in enumerate(units):
        u.fwd_hook_s = uf + (rf if i == 0 else 0.0)
        u.bwd_hook_s = ub + (rb if i == 0 else 0.0)


def fsdp_host_note(profile) -> str:
    """What a host-driven ZeRO-3 prediction priced for FSDP2's own host time."""
    t = {n: profile.fsdp_host_time(n) for k in ("unit", "root") for n in FSDP_HOST[k]}
    if all(v is None for v in t.values()):
        return ("FSDP2's host time (hooks, unshard / reshard) not in the profile: priced as 0 "
                "(perfsim calibrate --comm fsdp measures it)")
    us = {n: 1e6 * (v or 0.0) for n, v in t.items()}
    return (f"FSDP2's host time from the profile: {us['unit_forward']:.0f} + {us['unit_backward']:.0f} us "
            f"per unit forward + backward, {us['root_forward']:.0f} + {us['root_backward']:.0f} us per stage pass")


def shard_units(layers, layer_fwd, layer_bwd, comp, dp: int, zero: int, weight_bytes: int,
                codec=None) -> list[ShardUnit]:
    """The units of a stage (``layers`` in model order, their per-micro-batch forward and
    backward seconds): each unit's reduce-scatter asked from the gradient compressor
    ``comp`` (refused with a one-line reason where it cannot), its all-gather of
    ``weight_bytes`` per parameter under ZeRO-3. ``codec(spec, steps, nbytes)``: encode +
    decode seconds of a compressed exchange (None: plain). A layer without parameters
    has no collectives: its compute joins the unit before it (the first unit: after it)."""
    spec = comp.spec or comp.name
    fsum, bsum = sum(layer_fwd) or 1.0, sum(layer_bwd) or 1.0
    n = len(layers)
    units: list[ShardUnit] = []
    spare_f = spare_b = 0.0  # shares of parameter-less layers before the first unit
    for layer, f, b in zip(layers, layer_fwd, layer_bwd):
        fs, bs = (f / fsum if sum(layer_fwd) else 1.0 / n), (b / bsum if sum(layer_bwd) else 1.0 / n)
        if layer.params <= 0:
            if units:
                units[-1].fwd_share += fs
                units[-1].bwd_share += bs
            else:
                spare_f, spare_b = spare_f + fs, spare_b + bs
            continue
        try:
            steps = comp.reduce_scatter_plan((layer.params,), dp)
        except ConfigError:
            raise
        except (ValueError, TypeError, RuntimeError) as exc:
            raise ConfigError(f"grad_compress {spec!r}: cannot plan the reduce-scatter of "
                              f"{layer.params} elements ({exc})") from exc
        codec_s = codec(spec, steps, 4 * layer.params) if codec is not None else 0.0
        gather = -(-layer.params * weight_bytes // dp) if zero >= 3 else 0
        units.append(ShardUnit(layer.params, fs + spare_f, bs + spare_b, gather, list(steps), codec_s))
        spare_f = spare_b = 0.0
    return units


def param_gather_steps(params: int, weight_bytes: int, dp: int) -> list[CommStep]:
    """ZeRO-2's all-gather of the updated weights after the step (each rank its shard)."""
    return [CommStep(ALLGATHER, -(-params * weight_bytes // dp), label="zero2 params")]


# ---------------------------------------------------------------- the event loop side

def _collective(sim, key, r: int, d: int, kind: str, nbytes: int, label: str):
    """Replica ``r``'s part of the collective ``key`` of the data-parallel group of
    pipeline device ``d``: returns the event of its completion. It starts once every
    simulated replica has joined (the replicas a class stands for run in step)."""
    ent = sim.shard_rdv.get(key)
    if ent is None:
        ent = sim.shard_rdv[key] = [set(), sim.env.event()]
    ent[0].add(r)
    if len(ent[0]) == len(sim.replicas):
        del sim.shard_rdv[key]
        sim.env.process(_run(sim, d, kind, nbytes, label, ent[1]))
    return ent[1]


def _run(sim, d: int, kind: str, nbytes: int, label: str, done: simpy.Event):
    members = [sim.dev(r, d) for r in range(sim.plan.dp)]
    simulated = {sim.dev(r, d) for r in sim.replicas}
    start = sim.env.now
    call = FSDP_CALLS.get(kind) if sim.plan.shard_host_driven else None
    coll = yield from sim.run_collective(kind, nbytes, members, simulated, lanes=sim.lanes, call=call)
    sim.dp_bytes_per_rank[d] += coll.wire_bytes
    sim._span(f"{kind} d{d} {label} ({coll.algo})", "dp", sim.replicas[0], 2000 + d, start, sim.env.now,
              {"bytes": nbytes, "algo": coll.algo})
    done.succeed()


def _reduce_scatter(sim, key, r: int, d: int, unit: ShardUnit, after):
    """The reduce-scatter of ``unit``'s gradient on the device's reduce-scatter stream
    (after ``after``, the previous one on that stream)."""
    if after is not None:
        yield after
    if unit.codec_s + unit.rs_host_s > 0:
        yield sim.env.timeout(unit.codec_s + unit.rs_host_s)
    for i, step in enumerate(unit.rs_steps):
        yield _collective(sim, (*key, i), r, d, step.kind, step.nbytes, step.label or "grad reduce-scatter")


def after_reduce_scatters(sim, r: int, d: int, events):
    """Fire ``events`` (ZeRO-2's gather bucket) once the device's reduce-scatters so far are done."""
    pending = list(sim.rs_all.get((r, d), ()))
    if pending:
        yield simpy.AllOf(sim.env, pending)
    for ev in events:
        ev.succeed()


def sharded_compute(sim, r: int, d: int, k: int, mb: int, forward: bool, seconds: float):
    """One forward or backward of stage ``k`` (replica ``r``, pipeline device ``d``) unit
    by unit, with its ZeRO-3 all-gathers (one unit of prefetch) and, in the backward, each
    unit's reduce-scatter queued on the reduce-scatter stream (module docstring); with
    host-driven collectives (:func:`host_driven`) each in turn on the training thread."""
    if sim.plan.shard_host_driven:
        yield from _serial_compute(sim, r, d, k, mb, forward, seconds)
        return
    env, plan = sim.env, sim.plan
    st, me = sim.stats[(r, d)], sim.dev(r, d)
    units = plan.stages[k].units if forward else plan.stages[k].units[::-1]
    gathers = plan.zero >= 3 and (forward or plan.reshard_after_forward)
    phase = "F" if forward else "B"

    def gather(i):
        u = units[i]
        return _collective(sim, ("ag", k, phase, mb, i), r, d, ALLGATHER, u.gather_bytes, "zero3 params")

    pending = gather(0) if gathers else None
    for i, u in enumerate(units):
        if pending is not None:
            t0 = env.now
            yield pending
            st.dp_sync_s += env.now - t0  # an exposed all-gather
            pending = gather(i + 1) if i + 1 < len(units) else None
        yield from sim._work(st, me, seconds * (u.fwd_share if forward else u.bwd_share))
        if not forward and u.rs_steps:
            prev = sim.rs_tail.get((r, d))
            sim.rs_tail[(r, d)] = ev = env.process(_reduce_scatter(sim, ("rs", k, mb, i), r, d, u, prev))
            sim.rs_all.setdefault((r, d), []).append(ev)


def _serial_compute(sim, r: int, d: int, k: int, mb: int, forward: bool, seconds: float):
    """:func:`sharded_compute` when the collectives block the training thread: per unit
    FSDP2's own host time (:func:`add_fsdp_host`), its gather (copies and collective), its
    compute, then (backward) its reduce-scatter; all of it but the compute is exposed
    sharding time (``dp_sync_s``)."""
    env, plan = sim.env, sim.plan
    st, me = sim.stats[(r, d)], sim.dev(r, d)
    units = plan.stages[k].units if forward else plan.stages[k].units[::-1]
    gathers = plan.zero >= 3 and (forward or plan.reshard_after_forward)
    phase = "F" if forward else "B"
    for i, u in enumerate(units):
        hook = u.fwd_hook_s if forward else u.bwd_hook_s
        if hook > 0:  # FSDP2's pre/post hooks of this unit and pass (add_fsdp_host)
            t0 = env.now
            yield env.timeout(hook)
            st.dp_sync_s += env.now - t0
        if gathers:
            t0 = env.now
            if u.gather_host_s > 0:
                yield env.timeout(u.gather_host_s)
            yield _collective(sim, ("ag", k, phase, mb, i), r, d, ALLGATHER, u.gather_bytes, "zero3 params")
            st.dp_sync_s += env.now - t0
        yield from sim._work(st, me, seconds * (u.fwd_share if forward else u.bwd_share))
        if not forward and u.rs_steps:
            t0 = env.now
            ev = env.process(_reduce_scatter(sim, ("rs", k, mb, i), r, d, u, None))
            sim.rs_all.setdefault((r, d), []).append(ev)
            yield ev
            st.dp_sync_s += env.now - t0
