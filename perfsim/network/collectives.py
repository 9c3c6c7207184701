"""Collective pricing: what a collective costs on a group of devices of the network.

:mod:`perfsim.collectives` holds the algorithms (ring, tree, hierarchical: phases, bytes
per rank, latency-bound steps, with their sources); this module prices them on the
network's devices: where a group's members live (:meth:`CollectivePricing.group_shape`),
which link carries them (:func:`lockstep_link` for a stream a group issues back to back)
and, where the profile timed the torch.distributed call, the measured cost
(:meth:`CollectivePricing.collective`). :func:`collective_cost` / :func:`collective_time`
price a flat ring without a network (the runtime's byte counts, the report's columns).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from perfsim.collectives import Collective, GroupShape
from perfsim.collectives import measured as measured_collective
from perfsim.collectives import plan as plan_collective
from perfsim.collectives import resolve_model
from perfsim.errors import ConfigError
from perfsim.link import Link


def _uniform(n: int) -> GroupShape:
    """``n`` ranks, one per node, unit rate and unit per-step latency."""
    return GroupShape(n, n, 1, 1.0, 1.0, 1.0, 1.0)


def collective_cost(kind: str, nbytes: float, world_size: int) -> tuple[float, int]:
    """(bytes each rank sends, latency-bound steps) of a flat ring collective
    (``p2p`` one step) on ``world_size`` ranks of per-rank buffer ``nbytes``
    (formulas: :mod:`perfsim.collectives`)."""
    n = int(world_size)
    if n < 1:
        raise ConfigError(f"world_size={world_size}: must be >= 1")
    c = plan_collective(kind, nbytes, _uniform(n), "ring")
    return c.wire_bytes, int(round(sum(p.latency_s for grp in c.phases for p in grp)))


def collective_time(kind: str, nbytes: float, world_size: int, bandwidth_bps: float,
                    latency_s: float) -> float:
    """Closed-form time of a flat ring collective (no contention)."""
    volume, steps = collective_cost(kind, nbytes, world_size)
    return volume * 8.0 / bandwidth_bps + steps * latency_s



def lockstep_link(collective_link: Link, profile=None) -> Link:
    """The link of collectives a group issues back to back, every rank in step
    (Megatron's tensor-parallel allreduces, several per layer). Each rank posts its
    receive before its peer's bytes arrive, so none pays the wait of a receive posted
    late (up to a scheduler tick on gloo), which the emulated links' calibrated fixed
    cost pools in (their small messages are timed after idle gaps): the fixed cost per
    step is the backend's own, calibrated on loopback (``Link.calibrated`` with no
    nominal rate), when the profile has it and it is smaller. Rate and latency stay
    the collective link's. Without a profile (nominal links) it is the collective link."""
    if profile is None or collective_link.source == "nominal":
        return collective_link
    loop = Link.calibrated(profile, None, 0.0, op="allreduce")
    if loop is None or loop.overhead_s >= collective_link.overhead_s:
        return collective_link
    return replace(collective_link, overhead_s=loop.overhead_s,
                   source=f"{collective_link.source}, loopback per-step cost (lockstep)")


class CollectivePricing:
    """The collectives of a network's device groups (the methods below), mixed into
    :class:`perfsim.network.analytic.Network`, which provides what they read:
    ``system`` (:class:`perfsim.config.System`), ``node(device)``, ``_path(src, dst,
    link)``, ``collective_link``, ``lockstep_link``, ``_profile`` and the caches
    ``_shapes``, ``_collectives``, ``_ratios``."""

    def group_shape(self, members: Sequence[int], lockstep: bool = False) -> GroupShape:
        """Where ``members`` live (:class:`perfsim.collectives.GroupShape`): the inter-node
        rate and latency are the slowest ring hop's between different nodes (over
        ``lockstep_link`` when ``lockstep``)."""
        key = (tuple(members), lockstep)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = self._group_shape(members, self.lockstep_link if lockstep
                                                          else self.collective_link)
        return shape

    def _group_shape(self, members: Sequence[int], link: Link) -> GroupShape:
        nodes = [self.node(d) for d in members]
        n = len(members)
        if n and nodes.count(nodes[0]) == n:
            # one node: no inter-node hop is read, so every such group of n ranks has one shape
            key = ("one node", n, link)
            shape = self._shapes.get(key)
            if shape is None:
                shape = self._shapes[key] = self._shape_of(members, nodes, link)
            return shape
        return self._shape_of(members, nodes, link)

    def _shape_of(self, members: Sequence[int], nodes: list[int], link: Link) -> GroupShape:
        counts: dict[int, int] = {}
        for a in nodes:
            counts[a] = counts.get(a, 0) + 1
        sysm = self.system
        n = len(members)
        one_gpu = max(counts.values(), default=1) == 1  # else NCCL runs a ring per NIC: all of them
        inter = [self._path(members[i], members[(i + 1) % n], link, one_gpu) for i in range(n)
                 if nodes[i] != nodes[(i + 1) % n]]
        inter_bps = min((p.bandwidth_bps for p in inter), default=link.rate_bps)
        inter_lat = max((p.latency_s for p in inter), default=link.one_way_s)
        return GroupShape(len(members), len(counts), max(counts.values(), default=1),
                          sysm.intra_node_bandwidth_bps, sysm.intra_node_latency_s, inter_bps, inter_lat,
                          resolve_model(sysm.collective_model, sysm.gpu is not None
                                        and not link.source.startswith("profile")),
                          sysm.intra_node_pcie)

    def collective(self, kind: str, nbytes: float, members: Sequence[int], algo: str | None = None,
                   lockstep: bool = False, call: str | None = None) -> Collective:
        """The collective ``kind`` of per-rank buffer ``nbytes`` on ``members``: its
        algorithm (``algo`` or ``System.collective_algo``; ``auto`` = least modelled
        time), phases, and bytes per rank (:mod:`perfsim.collectives`). The one entry
        point for data-parallel, tensor-parallel and any other group's collectives;
        ``lockstep``: one of a stream the group issues back to back (:func:`lockstep_link`).
        ``call``: the torch.distributed call that issues it; when the profile measured
        that call of ``kind`` (other than the allreduce the link itself is calibrated
        from), its measured cost relative to the allreduce prices it
        (:func:`perfsim.collectives.measured`), else the model's algorithm does."""
        algo = algo or self.system.collective_algo
        key = (kind, nbytes, tuple(members), algo, lockstep, call)
        c = self._collectives.get(key)
        if c is None:
            shape = self.group_shape(members, lockstep)
            ratio = self.measured_ratio(kind, call, nbytes) if call and shape.n > 1 else None
            if call and lockstep and shape.nodes > 1 and (ratio is not None or kind == "allreduce"):
                # a measured kind is priced relative to the allreduce of its buffer: to the
                # measured one where the profile (of the run's backend: a call is named) timed it
                measured = self.measured_lockstep_ratio(nbytes, shape)
                if measured is not None:
                    ratio = measured if ratio is None else ratio * measured
            c = (measured_collective(kind, nbytes, shape, ratio) if ratio is not None
                 else plan_collective(kind, nbytes, shape, algo))
            self._collectives[key] = c
        return c

    def measured_lockstep_ratio(self, nbytes: float, shape) -> float | None:
        """A lockstep allreduce (tensor parallelism) of a size the profile timed on this
        group's link and rank count: its measured time over the ring model's. Such a
        call runs between compute, as the calibration's did, so a shaped link's bucket
        has refilled before it -- which the ring model, pricing every byte at the rate,
        leaves out (1 Gbps `tc tbf`, 262 KB on 2 ranks: 1.91 ms measured, 2.83 ms
        modelled, 1.83 ms in the runs; docs/validation.md). None otherwise."""
        if self._profile is None or not self._profile.records:
            return None
        key = ("lockstep allreduce", nbytes, shape)
        if key not in self._ratios:
            t = self._profile.measured_allreduce_s(nbytes, shape.n, self.collective_link.nominal_bps)
            ring = plan_collective("allreduce", nbytes, shape, "ring").time() if t is not None else 0.0
            self._ratios[key] = t / ring if t is not None and ring > 0 else None
        return self._ratios[key]

    def measured_ratio(self, kind: str, call: str, nbytes: float) -> float | None:
        """The profile's measured time of ``kind`` issued by ``call`` over its allreduce
        of the same buffer, at the collective link's nominal rate or on loopback
        (:meth:`perfsim.profile.costs.ProfileCosts.collective_ratio`); None for an
        allreduce, without a profile, or when that call was not measured."""
        if kind in ("allreduce", "p2p") or self._profile is None or not self._profile.records:
            return None
        key = (kind, call, nbytes)
        if key not in self._ratios:  # one profile lookup per kind and size, not per group
            self._ratios[key] = self._profile.collective_ratio(kind, call, nbytes, self.collective_link.nominal_bps)
        return self._ratios[key]

    def collective_time(self, kind: str, nbytes: float, members: Sequence[int],
                        algo: str | None = None, lockstep: bool = False, call: str | None = None) -> float:
        """Uncontended time of a collective over ``members`` (:meth:`collective`)."""
        return self.collective(kind, nbytes, members, algo, lockstep, call).time()
