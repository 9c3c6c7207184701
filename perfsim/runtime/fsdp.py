"""Execute-mode ZeRO-3: torch's ``fully_shard`` (FSDP2) on every layer of a stage, and
a meter of what its collectives put on the wire.

Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
arXiv:2304.11277. Each layer of the stage (the simulator's sharding unit,
:mod:`perfsim.engine.sharding`) becomes one ``fully_shard`` module over the
data-parallel group, the stage itself the root; FSDP2 then all-gathers every layer in
each forward and again in each backward (``reshard_after_forward``, its default) and
reduce-scatters every layer's gradient in each backward, averaging them.

:class:`CollectiveMeter` counts the bytes of those collectives as the simulator does
(:func:`perfsim.network.collective_cost`, a ring: an all-gather sends ``N - 1``
shards, a reduce-scatter ``(N - 1)/N`` of its input, per rank) by wrapping the
``torch.distributed`` functions FSDP2 calls while the meter is active.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from perfsim.network import collective_cost

#: the torch.distributed functions FSDP2 issues its collectives through (newer names first)
_FUNCTIONS = {"allgather": ("all_gather_single", "all_gather_into_tensor"),
              "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}


def shard_stage(module, layers, group, device_type: str) -> None:
    """``fully_shard`` each of ``layers`` (modules of ``module``), then ``module`` as the
    root, over the process ``group``; each backward prefetches the previous unit's
    all-gather within its own micro-batch only (:func:`prefetch_within_micro_batch`)."""
    from torch.distributed.device_mesh import DeviceMesh  # lazy: torch is heavy, needed only here
    from torch.distributed.fsdp import fully_shard  # lazy: torch is heavy, needed only here

    mesh = DeviceMesh.from_group(group, device_type)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    prefetch_within_micro_batch([layer for layer in layers if any(True for _ in layer.parameters())])


def prefetch_within_micro_batch(units) -> None:
    """Unit ``i``'s backward prefetches unit ``i - 1``'s all-gather, and the first unit's
    prefetches nothing (its own, already gathered: a no-op).

    FSDP2's default backward prefetch gathers the module that ran forward just before the
    current one in its record of every forward since the last backward. When several
    forwards run before their backwards (GPipe: ``F0 F1 B0 B1``), the first unit's backward
    of ``B0`` thus prefetches the *last* unit of ``F0``'s record; the backward ends before
    anything uses it and FSDP2 drops the gather (``FSDPParamGroup.finalize_backward``,
    "a mistargeted unshard"). That cost one avoidable all-gather of the stage's last unit
    per step (digits-mlp on 2 gloo ranks: +10,280 B per step against the simulator's
    2 gathers per unit and micro-batch). The explicit list is, within a micro-batch, the
    default's own order ("a singleton list containing the previous FSDP module gives the
    same all-gather overlap behavior as the default", ``set_modules_to_backward_prefetch``)."""
    for i, unit in enumerate(units):
        unit.set_modules_to_backward_prefetch([units[i - 1] if i else unit])


class CollectiveMeter:
    """While active (``with meter:``), the ring bytes this rank sends in FSDP2's
    all-gathers and reduce-scatters over ``world_size`` ranks, and the seconds spent
    issuing them; :meth:`pop` returns and resets both."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.bytes = 0.0
        self.seconds = 0.0
        self.calls = 0
        self._saved: dict[str, object] = {}

    def _wrap(self, fn, kind: str):
        def call(*args, **kw):
            inp = kw.get("input", kw.get("input_tensor", args[1] if len(args) > 1 else None))
            self.bytes += collective_cost(kind, inp.numel() * inp.element_size(), self.world_size)[0]
            self.calls += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        return call

    def __enter__(self):
        for kind, names in _FUNCTIONS.items():
            for name in names:
                if hasattr(dist, name):
                    self._saved[name] = getattr(dist, name)
                    setattr(dist, name, self._wrap(self._saved[name], kind))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()
        return False

    def pop(self) -> tuple[float, float]:
        """(bytes, seconds) since the last pop."""
        out = (self.bytes, self.seconds)
        self.bytes, self.seconds = 0.0, 0.0
        return out
