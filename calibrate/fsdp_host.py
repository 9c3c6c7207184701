"""FSDP2's own host time per sharding unit: its hooks, DTensor bookkeeping, unshard / reshard.

Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
arXiv:2304.11277, Sec. 3-4: each ``fully_shard`` module runs a pre-forward hook (unshard:
all-gather its parameters, swap in the unsharded DTensors), a post-forward hook (reshard,
register the backward hooks), a pre-backward hook (unshard again) and a post-backward hook
(reduce-scatter its gradient into the sharded one, reshard). On a CPU (gloo) every step of
it runs on the training thread; the simulator prices the collectives themselves (the
profile's timings of ``all_gather_into_tensor`` / ``reduce_scatter_tensor``) and FSDP2's
copies around them (:func:`perfsim.engine.sharding.add_host_copies`), not this Python and
C++ bookkeeping, which this op measures.

Method (op ``fsdp`` of ``perfsim calibrate --comm``, in the comm sweep's process group,
every rank at once): a stack of ``n`` ``Linear(WIDTH, WIDTH)`` units, once plain and once
with every unit and the stack (the root) under ``fully_shard`` -- the layout of
:func:`perfsim.runtime.fsdp.shard_stage` -- runs forward and backward on a batch of
``BATCH`` rows, the two alternating, for ``n`` in :data:`UNIT_COUNTS`. Each repeat records
the training thread's **CPU time** (``time.thread_time``) of the forward and of the
backward: a thread blocked in a collective's wait uses none (gloo moves the bytes on its
own threads), so what the sharded run adds over the plain one is FSDP2's host work, and a
shared machine's load (other processes on the cores) does not enter it. Per repeat the
added time at ``n`` units minus that at ``n0`` units over ``n - n0`` is the time per unit
and pass; what is left at ``n0`` units beyond ``n0`` of those is the root's (once per
forward and backward of the stage: lazy init checks, the root's pre-forward, the
end-of-backward callback). The units are tiny (:data:`WIDTH`): their compute and FSDP2's
copies (``WIDTH * (WIDTH + 1) * 4`` bytes, a few microseconds) are small beside the
bookkeeping, which does not depend on the size. Left in: the host dispatch of each
collective call (also inside the profile's collective timings).

Records (op ``fsdp_host``, :mod:`perfsim.profile.format`): ``unit_forward``,
``unit_backward``, ``root_forward``, ``root_backward`` -- seconds per unit (or root) and
pass, the median over repeats of each rank's figure, averaged over ranks; ``size_bytes``
is one unit's fp32 parameters, ``world_size`` the group's ranks. Used by
:meth:`perfsim.profile.costs.ProfileCosts.fsdp_host_time`.
"""

from __future__ import annotations

import statistics
import time

#: features of each unit (a Linear of WIDTH x WIDTH + WIDTH parameters)
WIDTH = 32
#: rows of the batch
BATCH = 8
#: unit counts timed: the slope between them is the per-unit time
UNIT_COUNTS = (2, 8)
#: untimed steps of each model before the timed ones
WARMUP = 3
#: the record names, in order
NAMES = ("unit_forward", "unit_backward", "root_forward", "root_backward")


def _stack(n: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(n)])


def _step(model, x) -> tuple[float, float]:
    """CPU seconds of the training thread in one forward and one backward."""
    t0 = time.thread_time()
    out = model(x)
    t1 = time.thread_time()
    out.sum().backward()
    t2 = time.thread_time()
    model.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1


def measure(rank: int, device, world: int, group=None, repeats: int = 15) -> list[dict]:
    """Run on every rank inside an initialised process group (``group``: the default);
    returns raw items ``{"op": "fsdp", "name": NAME, "samples": [...], "size_bytes": ...}``,
    one per :data:`NAMES` entry, the samples being this rank's per-repeat figures."""
    import copy

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    group = group or dist.group.WORLD
    mesh = DeviceMesh.from_group(group, device.type)
    x = torch.randn(BATCH, WIDTH, device=device)
    added: dict[int, list[tuple[float, float]]] = {}
    for n in UNIT_COUNTS:
        plain = _stack(n).to(device)
        sharded = copy.deepcopy(plain)
        for layer in sharded:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        for _ in range(WARMUP):
            _step(plain, x)
            _step(sharded, x)
        out = added[n] = []
        for _ in range(repeats):
            dist.barrier(group)  # the ranks in step: a collective's partner is there
            pf, pb = _step(plain, x)
            dist.barrier(group)
            sf, sb = _step(sharded, x)
            out.append((sf - pf, sb - pb))
    n0, n1 = UNIT_COUNTS[0], UNIT_COUNTS[-1]
    samples: dict[str, list[float]] = {name: [] for name in NAMES}
    for (f0, b0), (f1, b1) in zip(added[n0], added[n1]):
        uf, ub = (f1 - f0) / (n1 - n0), (b1 - b0) / (n1 - n0)
        for name, v in zip(NAMES, (uf, ub, f0 - n0 * uf, b0 - n0 * ub)):
            samples[name].append(v)
    nbytes = WIDTH * (WIDTH + 1) * 4
    return [{"op": "fsdp", "name": name, "size_bytes": nbytes, "samples": samples[name]} for name in NAMES]


def record(per_rank: list[dict], world: int, threads: int) -> dict:
    """The profile record of one :func:`measure` item as each rank returned it: the mean
    over ranks of each rank's median, clamped at 0 (a noisy root term may dip below)."""
    from perfsim.calibrate.timing import summarize

    meds = [summarize(it["samples"]).median_s for it in per_rank]
    t = summarize([s for it in per_rank for s in it["samples"]])
    first = per_rank[0]
    return {"op": "fsdp_host", "name": first["name"], "size_bytes": first["size_bytes"],
            "world_size": world, "dtype": "float32", "threads": threads,
            "time_s": max(0.0, statistics.fmean(meds)), "spread_s": t.spread_s, "repeats": t.repeats}
