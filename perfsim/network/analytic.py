"""The analytical network: links and shared NIC capacities of a System's devices.

:class:`Network` is the description every backend prices with (:mod:`perfsim.network`):
full-duplex NICs (separate send and receive capacity per node), each pair of nodes a
link of its own rate and latency (:class:`perfsim.link.Link`, over the
:class:`~perfsim.network.topology.Topology` when one is given), devices of one node
connected by a faster intra-node fabric; its collectives are priced by
:class:`~perfsim.network.collectives.CollectivePricing`. Over a TCP transport a flow's
rate is at most its connections' windows per round trip (:mod:`perfsim.tcp`), applied
here, in :meth:`Network._path`, the one place every p2p path and collective hop is made.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

from perfsim.collectives import Collective, GroupShape
from perfsim.errors import ConfigError
from perfsim.fabrics import NIC_KINDS, gpu_nic_share
from perfsim.link import Link, resolve_link
from perfsim.network.collectives import CollectivePricing, lockstep_link
from perfsim.network.topology import Topology
from perfsim.tcp import SlowStart, TcpWindow, resolve_slow_start
from perfsim.tcp import resolve as resolve_tcp_window


@dataclass(frozen=True)
class Path_:
    """What a flow from one device to another uses."""

    bandwidth_bps: float
    latency_s: float
    resources: tuple[Any, ...]  # shared capacities, e.g. ("tx", node), ("rx", node)
    #: round trip of an inter-node TCP path whose connections restart slow start after idle
    #: (perfsim.tcp.SlowStart); 0 elsewhere
    rtt_s: float = 0.0



class Network(CollectivePricing):
    """Analytical network of ``num_devices`` devices described by a System.

    Its inter-node links are :class:`perfsim.link.Link` objects resolved once
    (:func:`perfsim.link.resolve_link`): ``link`` for point-to-point messages,
    ``collective_link`` for collectives (calibrated from the profile's p2p and
    allreduce measurements respectively when it has them at this rate), and
    ``lockstep_link`` for collectives that a group issues back to back with all its
    ranks in step (tensor parallelism: :meth:`collective` with ``lockstep=True``)."""

    def __init__(self, system, num_devices: int, profile=None):
        self.system = system
        self.num_devices = int(num_devices)
        self.topology: Topology | None = system.topology
        self._paths: dict[tuple[int, int], Path_] = {}
        self._collectives: dict[tuple, Collective] = {}
        self._shapes: dict[tuple, GroupShape] = {}
        self._ratios: dict[tuple, float | None] = {}
        gpn = system.gpus_per_node
        self.num_nodes = -(-self.num_devices // gpn)
        if self.topology is not None and self.topology.nodes < self.num_nodes:
            raise ConfigError(f"{self.topology.source}: has {self.topology.nodes} nodes, "
                              f"the job needs {self.num_nodes} ({self.num_devices} devices, "
                              f"{gpn} per node)")
        common = dict(model=system.link_model, efficiency=NIC_KINDS[system.nic_kind].efficiency_at(system.bandwidth_bps),
                      burst_bytes=system.link_burst_bytes, protocol=system.p2p_protocol,
                      control_latency_s=system.p2p_control_latency_s)
        self.link: Link = resolve_link(profile, system.bandwidth_bps, system.latency_s, op="p2p", **common)
        self.collective_link: Link = resolve_link(profile, system.bandwidth_bps, system.latency_s,
                                                  op="allreduce", **common)
        self._profile = profile
        #: the window of each inter-node TCP connection (perfsim.tcp; ``off`` for other transports)
        self.tcp: TcpWindow = resolve_tcp_window(
            system.tcp_window, system.tcp_connections, NIC_KINDS[system.nic_kind].tcp_connections,
            getattr(profile, "metadata", None), f"profile {getattr(profile, 'path', '') or ''}".strip())
        #: whether those connections restart slow start after an idle spell (perfsim.tcp)
        self.slow_start: SlowStart = resolve_slow_start(
            system.tcp_slow_start_after_idle, system.tcp_connections, NIC_KINDS[system.nic_kind].tcp_connections,
            getattr(profile, "metadata", None))

    @functools.cached_property
    def lockstep_link(self) -> Link:
        """The link of collectives issued back to back (:func:`lockstep_link`); resolved
        on first use (only tensor-parallel groups ask)."""
        return lockstep_link(self.collective_link, self._profile)

    @functools.cached_property
    def prices_slow_start(self) -> bool:
        """Whether some inter-node path has a round trip over which connections restart slow
        start after idle (:attr:`slow_start`, :attr:`Path_.rtt_s`)."""
        if not self.slow_start.on or self.num_nodes < 2:
            return False
        return self.topology is not None or self.link.latency_s > 0

    def node(self, device: int) -> int:
        return device // self.system.gpus_per_node

    def path(self, src: int, dst: int) -> Path_:
        """Rate, latency and shared resources of the flow ``src -> dst``."""
        key = (src, dst)
        p = self._paths.get(key)
        if p is None:
            p = self._paths[key] = self._path(src, dst, self.link)
        return p

    def _path(self, src: int, dst: int, link: Link, one_gpu: bool = True) -> Path_:
        """``one_gpu``: the flow is one GPU's, so it reaches only that GPU's NICs
        (:func:`perfsim.fabrics.gpu_nic_share`; ``System.nic_affinity``)."""
        a, b = self.node(src), self.node(dst)
        sysm = self.system
        if a == b:
            return Path_(sysm.intra_node_bandwidth_bps, sysm.intra_node_latency_s, ())
        if self.topology is None:
            share = gpu_nic_share(sysm.nics_per_node, sysm.gpus_per_node, sysm.nic_affinity) if one_gpu else 1.0
            bw, lat, rtt = link.rate_bps * share, link.one_way_s, 2.0 * link.latency_s
        else:
            bw, lat = self.topology.link(a, b)
            bw, lat, rtt = bw * link.efficiency, lat + link.overhead_s, 2.0 * lat
        cap = self.tcp.rate_cap_bps(rtt)  # the connections' windows per round trip (perfsim.tcp)
        if cap < bw:
            bw = cap
        res = (("tx", a), ("rx", b)) if sysm.nic_sharing else ()
        if self.slow_start.on and rtt > 0:
            return Path_(bw, lat, res, rtt)
        return Path_(bw, lat, res)

    def capacity(self, resource) -> float:
        """Rate in bits/s of a shared resource (a node's sending or receiving NICs)."""
        _, node = resource
        if self.topology is None:
            return max(self.link.rate_bps, self.collective_link.rate_bps)
        if self.topology.nic_bps is not None and self.topology.nic_bps[node] is not None:
            return self.topology.nic_bps[node] * self.link.efficiency
        return self.topology.default_nic_bps(node) * self.link.efficiency

    def p2p_time(self, src: int, dst: int, nbytes: float) -> float:
        """Uncontended time of a point-to-point transfer: latency + bytes / rate."""
        p = self.path(src, dst)
        return p.latency_s + nbytes * 8.0 / p.bandwidth_bps

    def ring_paths(self, members: Sequence[int], link: Link | None = None) -> list[Path_]:
        """The links of a ring over ``members`` (member i sends to i+1)."""
        n = len(members)
        if n < 2:
            return []
        if link is None or link is self.link:
            return [self.path(members[i], members[(i + 1) % n]) for i in range(n)]
        return [self._path(members[i], members[(i + 1) % n], link) for i in range(n)]
