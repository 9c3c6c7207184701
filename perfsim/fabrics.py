"""Hardware presets of the network: intra-node fabrics and NICs, with cited figures.

Every figure is an *achieved* rate (what NCCL moves, its ``busbw``), not a line
rate, because that is what a collective's time follows; each carries its source.

``--intra-node-fabric NAME`` sets the rate between the GPUs of one node
(:data:`FABRICS`; ``pcie3-shm`` / ``pcie4-shm``: GPUs without peer-to-peer, through host
memory, derived from their parts in :class:`HostPath`); ``--nic [COUNTx]RATE[:KIND]`` the NICs of a node, e.g.
``4x200Gbps:infiniband`` -- their total rate is the node's inter-node capacity,
shared by all its GPUs (:mod:`perfsim.network`), and ``KIND`` the transport
efficiency applied when the profile has no measured link (:data:`NIC_KINDS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from perfsim.errors import ConfigError
from perfsim.units import parse_bandwidth


@dataclass(frozen=True)
class Fabric:
    """An intra-node fabric: achieved bus bandwidth (bits/s) per GPU, latency, source."""

    name: str
    bandwidth_bps: float
    latency_s: float
    source: str


#: PCIe rate per lane and direction, bytes/s: 8 / 16 / 32 GT/s with 128b/130b encoding (PCI-SIG,
#: PCI Express Base Specification 3.0, 4.0, 5.0); x16 gives 15.75 / 31.5 / 63 GB/s
PCIE_LANE_BPS = {3: 8e9 * 128 / 130 / 8, 4: 16e9 * 128 / 130 / 8, 5: 32e9 * 128 / 130 / 8}
#: share of a GPU's PCIe link (per direction) that NCCL's SHM transport moves through host memory
#: when its GPU has the link to itself: x16 PCIe 3.0, 9 GB/s of 15.75 (S. Jeaugey, NVIDIA/nccl#406:
#: SHM between sockets "9 or 6" GB/s where a PCI switch keeps 12); x16 PCIe 4.0, 4 x RTX 4090 on one
#: CPU without a PCI switch, all_reduce_perf busbw 18 GB/s of 31.5 through SHM (NVIDIA/nccl#1603)
SHM_PCIE_SHARE = 0.57
#: share of a socket's peak DRAM bandwidth that streaming copies reach (STREAM on server DDR4:
#: 75-85 %, J. McCalpin, "STREAM: Sustainable Memory Bandwidth in High Performance Computers")
HOST_MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class HostPath:
    """GPUs that cannot reach each other's memory (no peer-to-peer over PCIe: GeForce cards,
    many dual-root PCIe servers, VMs; ``NCCL_P2P_DISABLE=1``): NCCL's SHM transport, "used between
    devices when peer-to-peer cannot happen, therefore, host memory is used" (NCCL documentation,
    Environment Variables, ``NCCL_SHM_DISABLE``; ``NCCL_P2P_DISABLE``). Each byte leaves its GPU up
    its PCIe link into host memory and comes down the peer's link: it crosses the root complex twice
    and host memory once written, once read. A ring all-reduce's bus bandwidth per GPU is the least of

    * ``SHM_PCIE_SHARE x lanes x PCIE_LANE_BPS[gen] / gpus_per_uplink``: the busiest PCIe segment.
      Behind a PCI switch every GPU's bytes go up and come back down its one uplink -- "a 2x increase in
      load on the PCI link to the CPU" for two GPUs on one switch (S. Jeaugey, NVIDIA/nccl#1309) --
      where peer-to-peer would have stayed inside the switch;
    * ``HOST_MEMORY_SHARE x memory_Bps / (2 x gpus_per_socket)``: a socket's DRAM, each byte written
      and read once;
    * ``socket_link_Bps``: the CPU-to-CPU link (QPI/UPI, Infinity Fabric) per direction, which the
      ring crosses once each way when the node's GPUs sit on two sockets (None: one socket)."""

    gen: int
    lanes: int
    gpus_per_uplink: int
    gpus_per_socket: int
    memory_Bps: float
    socket_link_Bps: float | None
    layout: str

    def busbw_Bps(self) -> float:
        """The achieved all-reduce bus bandwidth per GPU, bytes/s (class docstring)."""
        bounds = [SHM_PCIE_SHARE * self.lanes * PCIE_LANE_BPS[self.gen] / self.gpus_per_uplink,
                  HOST_MEMORY_SHARE * self.memory_Bps / (2 * self.gpus_per_socket)]
        if self.socket_link_Bps is not None:
            bounds.append(self.socket_link_Bps)
        return min(bounds)

    def fabric(self, name: str) -> Fabric:
        bw = self.busbw_Bps()
        return Fabric(name, 8 * bw, 10e-6,
                      f"no peer-to-peer: NCCL's SHM transport through host memory (NCCL documentation, "
                      f"NCCL_P2P_DISABLE / NCCL_SHM_DISABLE), {bw / 1e9:.1f} GB/s busbw derived in "
                      f"perfsim.fabrics.HostPath from PCIe {self.gen}.0 x{self.lanes} (PCI-SIG), "
                      f"{self.gpus_per_uplink} GPU(s) per uplink, {self.gpus_per_socket} per socket: {self.layout}")


#: the node layouts of the no-P2P fabrics (``pcieN-shm``); each number's source is in ``layout``.
#: No ``pcie5-shm``: the one PCIe 5.0 figure (``pcie5``) was measured on GeForce cards, which
#: NVIDIA ships without peer-to-peer, and no layout of its node is stated
HOST_PATHS: dict[str, HostPath] = {
    "pcie3-shm": HostPath(3, 16, 2, 4, 6 * 21.33e9, 2 * 20.8e9,
                          "8-GPU dual-socket PCIe 3.0 server (V100/P100/T4 PCIe era): 4 GPUs per Xeon Scalable "
                          "socket, more than its 48 lanes carry, so behind PCI switches; assumed 48-lane ones "
                          "(e.g. Broadcom PEX 8747: one x16 uplink, two x16 GPU ports), 2 GPUs per uplink; 6 x DDR4-2666 per socket (128 GB/s); "
                          "2 UPI links x 20.8 GB/s (10.4 GT/s x 2 bytes) between the sockets (Intel Xeon "
                          "Scalable platform brief)"),
    "pcie4-shm": HostPath(4, 16, 1, 4, 8 * 25.6e9, None,
                          "GPUs on their own CPU root ports (no PCI switch, as in NVIDIA/nccl#1603's 4 x RTX "
                          "4090), 4 per socket; 8 x DDR4-3200 per socket (204.8 GB/s, AMD EPYC 7002/7003); "
                          "the CPU-to-CPU link not binding at this rate"),
}

#: achieved all-reduce bus bandwidth per GPU (nccl-tests ``busbw``, GB/s x 8 bits)
FABRICS: dict[str, Fabric] = {f.name: f for f in (
    Fabric("pcie3", 8 * 10e9, 10e-6,
           "PCIe 3.0 x16: 15.75 GB/s per direction (PCI-SIG, 128b/130b); NCCL's protocol overhead "
           "~20 % (S. Jeaugey, NVIDIA/nccl-tests#212) and the shared root complex leave ~10 GB/s busbw "
           "on 8-GPU PCIe3 servers (NVIDIA/nccl#1530 class of reports)"),
    Fabric("pcie4", 8 * 20e9, 10e-6,
           "PCIe 4.0 x16: 31.5 GB/s per direction (PCI-SIG); ~20 % protocol overhead "
           "(NVIDIA/nccl-tests#212) and CPU/memory-bound flows on PCI systems (S. Jeaugey, NVIDIA/nccl#1639)"),
    Fabric("pcie5", 8 * 28e9, 10e-6,
           "8 x RTX 5090 on PCIe 5.0: all_reduce_perf busbw 28 GB/s (NVIDIA/nccl#1639; 4 GPUs: 35 GB/s)"),
    Fabric("nvlink2", 8 * 120e9, 5e-6,
           "V100 hybrid cube-mesh (DGX-1): 6 NVLink2 links x 25 GB/s = 150 GB/s per direction "
           "(NVIDIA V100 datasheet) x ~0.8 NCCL protocol efficiency (NVIDIA/nccl-tests#212)"),
    Fabric("nvlink3", 8 * 200e9, 5e-6,
           "8 x A100 SXM4 on NVSwitch: all_reduce_perf busbw ~200 GB/s (NVIDIA/nccl-tests#149; "
           "208 GB/s in NVIDIA/nccl-tests#178)"),
    Fabric("nvlink4", 8 * 370e9, 5e-6,
           "8 x H100 SXM on NVSwitch: 450 GB/s line rate, ~370 GB/s busbw with NCCL_ALGO=RING "
           "(S. Jeaugey, NVIDIA/nccl-tests#212)"),
    *(path.fabric(name) for name, path in HOST_PATHS.items()),
)}


@dataclass(frozen=True)
class NicKind:
    """Payload share of the nominal rate a transport achieves on large transfers, and the
    most a node moves through it whatever the line rate (``ceiling_bps``: a host-bound
    transport, bits/s; None: none). ``tcp_connections``: a TCP transport's connections that
    carry one message (their window bounds its rate over a long link, :mod:`perfsim.tcp`);
    None: not TCP."""

    name: str
    efficiency: float
    source: str
    ceiling_bps: float | None = None
    tcp_connections: int | None = None

    def efficiency_at(self, nominal_bps: float) -> float:
        """The achieved share of ``nominal_bps`` (a node's NICs together): the efficiency, lower
        where the transport's ceiling binds."""
        if self.ceiling_bps is None or nominal_bps <= 0:
            return self.efficiency
        return min(self.efficiency, self.ceiling_bps / nominal_bps)


NIC_KINDS: dict[str, NicKind] = {k.name: k for k in (
    NicKind("ethernet", 1448 / 1538,
            "TCP/IPv4 over Ethernet, MTU 1500: 1448 payload bytes (RFC 7323 timestamps) per 1538 bytes "
            "on the wire (IEEE 802.3 header, FCS, preamble and inter-frame gap); this machine's tc-shaped "
            "links measured 0.94-0.96 (traces/cpu-2core.json, metadata.network); one TCP connection "
            "per peer (gloo's pair)", tcp_connections=1),
    NicKind("infiniband", 0.96,
            "InfiniBand or RoCE through NCCL's IB transport, the per-NIC share NCCL's maintainers state for "
            "its largest transfers: 24 GB/s per 200 Gb/s NIC (S. Jeaugey, NVIDIA/nccl-tests#119), 192 GB/s "
            "over a DGX A100's eight (NVIDIA/nccl#812); 12.2 per 100 Gb/s (nccl-tests#29) and 46-48 per "
            "400 Gb/s (nccl-tests#290) bracket it (0.92-0.98). Smaller messages lose what NCCL's protocols "
            "and steps cost (perfsim.collectives, collective_model auto/pipelined). Was 0.8 (DGX-1, "
            "4 x EDR, ~40 GB/s with NCCL 2.0, GTC 2017 S7155) until the size curve was modelled "
            "(docs/validation.md, 'NCCL's steps overlapped')"),
    NicKind("socket", 1448 / 1538,
            "NCCL's socket transport over TCP (NCCL_IB_DISABLE=1, no RDMA): TCP/IPv4 framing as ethernet, and "
            "the proxy threads' host copies bound a node at 4-6 GB/s whatever the line rate: 4 x 8 V100 over "
            "100 Gb/s TCP, all_reduce_perf busbw 4-6 GB/s of 12.5 with tuned NCCL_SOCKET_NTHREADS / "
            "NCCL_NSOCKS_PERTHREAD (NVIDIA/nccl#450); ceiling 5 GB/s, the middle of that range; "
            "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = 1 x 1 connections per peer and channel by "
            "default (NCCL documentation, Environment Variables; src/transport/net_socket.cc)",
            ceiling_bps=8 * 5e9, tcp_connections=1),
    NicKind("ideal", 1.0, "the nominal rate itself (no transport overhead)"),
)}


#: which of a node's NICs one GPU's flows may use (``System.nic_affinity``)
NIC_AFFINITIES = ("gpu", "node")


def gpu_nic_share(nics: int, gpus_per_node: int, affinity: str = "gpu") -> float:
    """Share of a node's NIC capacity that the flows of ONE GPU can use.

    ``gpu``: each GPU sends through the NICs nearest to it on PCIe, ``1 / min(nics, g)`` of
    the node's total -- one NIC per GPU on a DGX A100 / H100 with 8 compute HCAs ("rail
    optimised": NVIDIA DGX A100 User Guide, network ports; NCCL binds each GPU's channels to
    its closest NIC, NCCL's topology search in ``src/graph/search.cc``), the whole NIC when
    the node has one. A collective whose ring holds several GPUs of a node still reaches
    every NIC: NCCL builds one ring per NIC (``src/graph/rings.cc``), so this applies to a
    p2p message and to collectives with one rank per node. ``node``: any flow may use all
    of the node's NICs (the earlier model; optimistic for a lone pipeline message)."""
    if affinity == "node":
        return 1.0
    return 1.0 / max(1, min(nics, gpus_per_node))


@dataclass(frozen=True)
class Nic:
    """A node's NICs: ``count`` of ``rate_bps`` each, of transport ``kind``."""

    count: int
    rate_bps: float
    kind: str = "ethernet"

    def __post_init__(self):
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"nic count={self.count!r}: must be an integer >= 1")
        if not self.rate_bps > 0:
            raise ConfigError(f"nic rate={self.rate_bps!r}: must be > 0")
        if self.kind not in NIC_KINDS:
            raise ConfigError(f"nic kind={self.kind!r}: choose from {', '.join(NIC_KINDS)}")

    @property
    def total_bps(self) -> float:
        return self.count * self.rate_bps

    @property
    def efficiency(self) -> float:
        return NIC_KINDS[self.kind].efficiency


_NIC = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?([^:]+?)\s*(?::\s*([A-Za-z-]+))?\s*$")


def parse_nic(text, what: str = "nic") -> Nic:
    """``"4x200Gbps:infiniband"`` / ``"100Gbps"`` -> :class:`Nic` (kind default ethernet)."""
    if isinstance(text, Nic):
        return text
    if isinstance(text, (int, float)) and not isinstance(text, bool):  # SI bit/s (API, sweeps)
        return Nic(1, parse_bandwidth(text, what), "ethernet")
    m = _NIC.match(str(text))
    if not m:
        raise ConfigError(f"{what}={text!r}: expected [COUNTx]RATE[:KIND], e.g. 4x200Gbps:infiniband")
    count = int(m.group(1)) if m.group(1) else 1
    kind = (m.group(3) or "ethernet").lower()
    if kind not in NIC_KINDS:
        raise ConfigError(f"{what}={text!r}: kind {kind!r} unknown (choose from {', '.join(NIC_KINDS)})")
    return Nic(count, parse_bandwidth(m.group(2), what), kind)


def get_fabric(name: str) -> Fabric:
    key = str(name).strip().lower()
    if key not in FABRICS:
        raise ConfigError(f"intra_node_fabric={name!r}: unknown (choose from {', '.join(FABRICS)})")
    return FABRICS[key]
