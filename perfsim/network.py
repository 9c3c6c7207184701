"""The network, behind one narrow interface (as ASTRA-sim's network API).

The engine asks a :class:`Network` three things:

* :meth:`Network.path` -- for a pair of devices, the link rate, one-way latency
  and the shared resources (sending NIC, receiving NIC) a flow between them uses;
* :meth:`Network.capacity` -- the rate of such a shared resource;
* :func:`collective_cost` -- how many bytes each rank puts on the wire and how
  many latency-bound steps a collective takes.

The default :class:`Network` is analytical: full-duplex NICs (separate send and
receive capacity per node), each pair of nodes a link of its own rate and
latency, devices of one node connected by a faster intra-node fabric. The SimPy
engine shares those capacities among concurrent flows max-min fairly
(:mod:`perfsim.engine.flows`). A finer model (packet-level, congestion control)
can replace this class by offering the same three methods.

Heterogeneous topologies
------------------------
``--topology FILE`` gives a per-pair rate and latency between *nodes*
(device ``d`` lives on node ``d // gpus_per_node``; devices are numbered
replica-major: device = replica * pp + stage). Formats:

JSON or TOML::

    nodes = 4                       # optional when a matrix gives the size
    bandwidth = "1Gbps"             # default rate of every pair
    latency = "5ms"                 # default one-way latency
    nic_bandwidth = "10Gbps"        # optional NIC rate per node (scalar or list);
                                    # default: unlimited, only pair links limit
    bandwidth_matrix = [["0", "100Mbps", ...], ...]   # optional, n x n
    latency_matrix = [[0, 0.05, ...], ...]            # optional, n x n (seconds or "50ms")
    # large (geo-distributed) systems: nodes in regions, an R x R matrix
    # between regions (the diagonal is the rate inside a region)
    regions = [0, 0, 1, 1]           # region of each node (or {"size": 256}: 256 nodes per region)
    region_bandwidth = [["10Gbps", "100Mbps"], ["100Mbps", "10Gbps"]]
    region_latency = [["1ms", "40ms"], ["40ms", "1ms"]]
    [[links]]                        # optional overrides, both directions
    src = 0
    dst = 1
    bandwidth = "100Mbps"
    latency = "50ms"
    symmetric = true                 # default true; false = only src -> dst

CSV: a header ``src,dst,bandwidth,latency`` and one row per pair (both
directions unless the reverse row is given); every pair of nodes must appear.
Diagonal entries are ignored. Values take the units of :mod:`perfsim.units`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from perfsim.errors import ConfigError
from perfsim.units import parse_bandwidth, parse_time

# ---------------------------------------------------------------- collectives


def collective_cost(kind: str, nbytes: float, world_size: int) -> tuple[float, int]:
    """(bytes each rank sends on its busiest link, latency-bound steps) of a
    collective on ``world_size`` ranks whose per-rank buffer is ``nbytes``.

    * allreduce, ring (Patarasuk & Yuan 2009; Thakur et al. 2005):
      reduce-scatter then allgather, ``2(N-1)/N * S`` bytes, ``2(N-1)`` steps,
      so ``T = 2(N-1)/N * S/B + 2(N-1) * latency``;
    * allgather, ring: each rank forwards the ``N-1`` other contributions:
      ``(N-1) * S`` bytes, ``N-1`` steps (volume grows with N, the point of the
      multi-scale quantizers paper's Sec. 1 on non-allreduce compressors);
    * reduce-scatter, ring: the first half of a ring allreduce, ``(N-1)/N * S``
      bytes, ``N-1`` steps (``S`` = each rank's full input);
    * alltoall, pairwise exchange: ``(N-1)/N * S`` bytes, ``N-1`` steps;
    * broadcast, pipelined chain: ``S`` bytes, ``N-1`` steps;
    * p2p: ``S`` bytes, 1 step.
    """
    n = int(world_size)
    if n < 1:
        raise ConfigError(f"world_size={world_size}: must be >= 1")
    if kind == "p2p":
        return float(nbytes), 1
    if n == 1:
        return 0.0, 0
    if kind == "allreduce":
        return 2.0 * (n - 1) / n * nbytes, 2 * (n - 1)
    if kind == "allgather":
        return float((n - 1) * nbytes), n - 1
    if kind in ("alltoall", "reduce_scatter"):
        return (n - 1) / n * nbytes, n - 1
    if kind == "broadcast":
        return float(nbytes), n - 1
    raise ConfigError(f"collective {kind!r}: unknown")


def collective_time(kind: str, nbytes: float, world_size: int, bandwidth_bps: float,
                    latency_s: float) -> float:
    """Closed-form time of a collective on a uniform ring (no contention)."""
    volume, steps = collective_cost(kind, nbytes, world_size)
    return volume * 8.0 / bandwidth_bps + steps * latency_s


# ---------------------------------------------------------------- topology


@dataclass(frozen=True)
class Topology:
    """Rate (bits/s) and latency (s) between nodes; optional NIC rates.

    Without ``region``, ``bandwidth``/``latency`` are node x node matrices. With
    ``region`` (the region index of every node) they are region x region
    matrices, the diagonal giving the links inside a region -- so a
    10,000-node geo-distributed system needs a few numbers, not 10^8.
    ``overrides`` maps a node pair to its own (rate, latency).
    """

    bandwidth: tuple[tuple[float, ...], ...]
    latency: tuple[tuple[float, ...], ...]
    nic_bps: tuple[float | None, ...] | None = None
    source: str = ""
    region: tuple[int, ...] | None = None
    overrides: tuple[tuple[tuple[int, int], tuple[float, float]], ...] = ()

    @property
    def nodes(self) -> int:
        return len(self.region) if self.region is not None else len(self.bandwidth)

    def link(self, a: int, b: int) -> tuple[float, float]:
        """(rate, latency) from node ``a`` to node ``b``."""
        if self.overrides:
            o = self._override_map().get((a, b))
            if o is not None:
                return o
        if self.region is not None:
            a, b = self.region[a], self.region[b]
        return self.bandwidth[a][b], self.latency[a][b]

    def _override_map(self) -> dict:
        m = self.__dict__.get("_omap")
        if m is None:
            m = dict(self.overrides)
            object.__setattr__(self, "_omap", m)
        return m

    def is_uniform(self) -> bool:
        if self.region is None:
            n = self.nodes
            off = {(self.bandwidth[i][j], self.latency[i][j]) for i in range(n) for j in range(n) if i != j}
        else:
            sizes: dict[int, int] = {}
            for r in self.region:
                sizes[r] = sizes.get(r, 0) + 1
            used = list(sizes)
            off = {(self.bandwidth[i][j], self.latency[i][j]) for i in used for j in used
                   if i != j or sizes[i] > 1}
        off |= {v for _, v in self.overrides}
        return len(off) <= 1 and (self.nic_bps is None or len(set(self.nic_bps)) <= 1)


def _bw(value: Any, where: str) -> float:
    return parse_bandwidth(value, what=where)


def _lat(value: Any, where: str) -> float:
    return parse_time(value, what=where)


def _fast(value: Any, conv, where: str) -> float:
    """Plain positive numbers skip the unit parser (large matrices)."""
    if type(value) in (int, float) and 0 < value < math.inf:
        return float(value)
    return conv(value, where)


def _matrix(raw: Any, n: int | None, conv, where: str) -> list[list[float]]:
    if not isinstance(raw, list) or not raw or any(not isinstance(r, list) for r in raw):
        raise ConfigError(f"{where}: must be a list of rows")
    size = len(raw)
    if n is not None and size != n:
        raise ConfigError(f"{where}: has {size} rows, expected {n}")
    out = []
    for i, row in enumerate(raw):
        if len(row) != size:
            raise ConfigError(f"{where}: row {i} has {len(row)} entries, expected {size}")
        out.append([0.0 if i == j else _fast(v, conv, f"{where}[{i}][{j}]") for j, v in enumerate(row)])
    return out


def topology_from_dict(data: Any, where: str = "topology") -> Topology:
    """Validate a parsed JSON/TOML topology document."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: top level must be a table/object")
    known = {"nodes", "bandwidth", "latency", "nic_bandwidth", "bandwidth_matrix", "latency_matrix", "links",
             "regions", "region_bandwidth", "region_latency"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    if "regions" in data:
        return _regional(data, where)
    n = data.get("nodes")
    for key in ("bandwidth_matrix", "latency_matrix"):
        if n is None and key in data and isinstance(data[key], list):
            n = len(data[key])
    if n is None or isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{where}: 'nodes' missing or not an integer >= 1")
    if "bandwidth" not in data and "bandwidth_matrix" not in data:
        raise ConfigError(f"{where}: needs 'bandwidth' or 'bandwidth_matrix'")
    bw_default = _bw(data["bandwidth"], f"{where}: bandwidth") if "bandwidth" in data else None
    lat_default = _lat(data.get("latency", 0), f"{where}: latency")
    bw = (_matrix(data["bandwidth_matrix"], n, _bw, f"{where}: bandwidth_matrix")
          if "bandwidth_matrix" in data else [[0.0 if i == j else bw_default for j in range(n)] for i in range(n)])
    lat = (_matrix(data["latency_matrix"], n, _lat, f"{where}: latency_matrix")
           if "latency_matrix" in data else [[0.0 if i == j else lat_default for j in range(n)] for i in range(n)])
    for (a, b), (rate, delay) in _links(data, n, where):
        if rate is not None:
            bw[a][b] = rate
        if delay is not None:
            lat[a][b] = delay
    return Topology(tuple(map(tuple, bw)), tuple(map(tuple, lat)), _nic(data, n, where), where)


def _links(data, n: int, where: str):
    """The ``links`` overrides as ((src, dst), (rate or None, latency or None))."""
    links = data.get("links", [])
    if not isinstance(links, list):
        raise ConfigError(f"{where}: 'links' must be a list")
    out = []
    for k, link in enumerate(links):
        if not isinstance(link, dict) or set(link) - {"src", "dst", "bandwidth", "latency", "symmetric"}:
            raise ConfigError(f"{where}: links[{k}] must have only src, dst, bandwidth, latency, symmetric")
        s, d = link.get("src"), link.get("dst")
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n for x in (s, d)) or s == d:
            raise ConfigError(f"{where}: links[{k}] src/dst must be distinct node indices < {n}")
        rate = _bw(link["bandwidth"], f"{where}: links[{k}].bandwidth") if "bandwidth" in link else None
        delay = _lat(link["latency"], f"{where}: links[{k}].latency") if "latency" in link else None
        out.append(((s, d), (rate, delay)))
        if link.get("symmetric", True):
            out.append(((d, s), (rate, delay)))
    return out


def _nic(data, n: int, where: str):
    nic = data.get("nic_bandwidth")
    nic_bps = None
    if nic is not None:
        if isinstance(nic, list):
            if len(nic) != n:
                raise ConfigError(f"{where}: nic_bandwidth has {len(nic)} entries, expected {n}")
            nic_bps = tuple(_bw(v, f"{where}: nic_bandwidth[{i}]") for i, v in enumerate(nic))
        else:
            nic_bps = (_bw(nic, f"{where}: nic_bandwidth"),) * n
    return nic_bps


def _regional(data, where: str) -> Topology:
    """Nodes grouped in regions with region x region rate/latency matrices."""
    regions = data["regions"]
    if isinstance(regions, dict):
        size, n = regions.get("size"), data.get("nodes")
        if set(regions) != {"size"} or not isinstance(size, int) or size < 1 or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{where}: regions = {{size = K}} needs an integer size >= 1 and 'nodes'")
        regions = [i // size for i in range(n)]
    if (not isinstance(regions, list) or not regions
            or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in regions)):
        raise ConfigError(f"{where}: 'regions' must list a region index >= 0 per node")
    n = len(regions)
    if data.get("nodes", n) != n:
        raise ConfigError(f"{where}: nodes={data['nodes']} but 'regions' lists {n}")
    for key in ("bandwidth_matrix", "latency_matrix"):
        if key in data:
            raise ConfigError(f"{where}: {key} cannot be combined with 'regions' (use region_bandwidth)")
    if "region_bandwidth" not in data:
        raise ConfigError(f"{where}: 'regions' needs 'region_bandwidth'")
    R = max(regions) + 1

    def square(raw, conv, name):
        if not isinstance(raw, list) or len(raw) != R or any(not isinstance(r, list) or len(r) != R for r in raw):
            raise ConfigError(f"{where}: {name} must be {R} x {R} (one row/column per region)")
        return tuple(tuple(conv(v, f"{where}: {name}[{i}][{j}]") for j, v in enumerate(row))
                     for i, row in enumerate(raw))

    bw = square(data["region_bandwidth"], _bw, "region_bandwidth")
    lat = (square(data["region_latency"], _lat, "region_latency") if "region_latency" in data
           else tuple((0.0,) * R for _ in range(R)))
    over = {}
    for pair, (rate, delay) in _links(data, n, where):
        base = over.get(pair) or (bw[regions[pair[0]]][regions[pair[1]]], lat[regions[pair[0]]][regions[pair[1]]])
        over[pair] = (rate if rate is not None else base[0], delay if delay is not None else base[1])
    return Topology(bw, lat, _nic(data, n, where), where, tuple(regions), tuple(over.items()))


def topology_from_csv(text: str, where: str = "topology") -> Topology:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or set(rows[0]) != {"src", "dst", "bandwidth", "latency"}:
        raise ConfigError(f"{where}: CSV needs the header src,dst,bandwidth,latency and >= 1 row")
    entries = {}
    for k, row in enumerate(rows):
        try:
            s, d = int(row["src"]), int(row["dst"])
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: row {k + 2}: src/dst must be integers") from None
        if s < 0 or d < 0 or s == d:
            raise ConfigError(f"{where}: row {k + 2}: src/dst must be distinct non-negative integers")
        entries[(s, d)] = (_bw(row["bandwidth"], f"{where}: row {k + 2} bandwidth"),
                           _lat(row["latency"], f"{where}: row {k + 2} latency"))
    n = 1 + max(max(p) for p in entries)
    bw = [[0.0] * n for _ in range(n)]
    lat = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            e = entries.get((i, j)) or entries.get((j, i))
            if e is None:
                raise ConfigError(f"{where}: no row for the pair {i},{j}")
            bw[i][j], lat[i][j] = e
    return Topology(tuple(map(tuple, bw)), tuple(map(tuple, lat)), None, where)


def load_topology(path: str | Path) -> Topology:
    """Read a topology file (.json, .toml or .csv)."""
    p = Path(path)
    where = f"topology {str(p)!r}"
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    suffix = p.suffix.lower()
    try:
        if suffix == ".csv":
            return topology_from_csv(text, where)
        if suffix == ".toml":
            return topology_from_dict(tomllib.loads(text), where)
        return topology_from_dict(json.loads(text), where)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{where}: malformed ({exc})") from None


# ---------------------------------------------------------------- interface


@dataclass(frozen=True)
class Path_:
    """What a flow from one device to another uses."""

    bandwidth_bps: float
    latency_s: float
    resources: tuple[Any, ...]  # shared capacities, e.g. ("tx", node), ("rx", node)


class Network:
    """Analytical network of ``num_devices`` devices described by a System."""

    def __init__(self, system, num_devices: int):
        self.system = system
        self.num_devices = int(num_devices)
        self.topology: Topology | None = system.topology
        self._paths: dict[tuple[int, int], Path_] = {}
        gpn = system.gpus_per_node
        self.num_nodes = -(-self.num_devices // gpn)
        if self.topology is not None and self.topology.nodes < self.num_nodes:
            raise ConfigError(f"{self.topology.source}: has {self.topology.nodes} nodes, "
                              f"the job needs {self.num_nodes} ({self.num_devices} devices, "
                              f"{gpn} per node)")

    def node(self, device: int) -> int:
        return device // self.system.gpus_per_node

    def path(self, src: int, dst: int) -> Path_:
        """Rate, latency and shared resources of the flow ``src -> dst``."""
        key = (src, dst)
        p = self._paths.get(key)
        if p is None:
            p = self._paths[key] = self._path(src, dst)
        return p

    def _path(self, src: int, dst: int) -> Path_:
        a, b = self.node(src), self.node(dst)
        sysm = self.system
        if a == b:
            return Path_(sysm.intra_node_bandwidth_bps, sysm.intra_node_latency_s, ())
        if self.topology is None:
            bw, lat = sysm.bandwidth_bps, sysm.latency_s
        else:
            bw, lat = self.topology.link(a, b)
        res = (("tx", a), ("rx", b)) if sysm.nic_sharing else ()
        return Path_(bw, lat, res)

    def capacity(self, resource) -> float:
        """Rate in bits/s of a shared resource (a node's sending or receiving NIC)."""
        _, node = resource
        if self.topology is None:
            return self.system.bandwidth_bps
        if self.topology.nic_bps is not None:
            return self.topology.nic_bps[node]
        return float("inf")

    def p2p_time(self, src: int, dst: int, nbytes: float) -> float:
        """Uncontended time of a point-to-point transfer: latency + bytes / rate."""
        p = self.path(src, dst)
        return p.latency_s + nbytes * 8.0 / p.bandwidth_bps

    def ring_paths(self, members: Sequence[int]) -> list[Path_]:
        """The links of a ring over ``members`` (member i sends to i+1)."""
        n = len(members)
        return [self.path(members[i], members[(i + 1) % n]) for i in range(n)] if n > 1 else []

    def collective_time(self, kind: str, nbytes: float, members: Sequence[int]) -> float:
        """Uncontended time of a ring collective over ``members``: a ring moves in
        lock step, so the slowest link sets the rate and the largest latency
        each step's delay."""
        paths = self.ring_paths(members)
        if not paths:
            return 0.0
        volume, steps = collective_cost(kind, nbytes, len(members))
        return volume * 8.0 / min(p.bandwidth_bps for p in paths) + steps * max(p.latency_s for p in paths)
