"""The network's topology: per node pair, a link rate and latency (the Topology value).

Heterogeneous topologies
------------------------
``--topology FILE`` gives a per-pair rate and latency between *nodes*
(device ``d`` lives on node ``d // gpus_per_node``; devices are numbered
replica-major: device = replica * pp + stage). Formats:

JSON or TOML::

    nodes = 4                       # optional when a matrix gives the size
    bandwidth = "1Gbps"             # default rate of every pair
    latency = "5ms"                 # default one-way latency
    nic_bandwidth = "10Gbps"        # optional NIC rate per node (scalar or list); default:
                                    # the node's fastest link, shared by its GPUs as under
                                    # --bandwidth (the same cluster gives the same answer)
    bandwidth_matrix = [["0", "100Mbps", ...], ...]   # optional, n x n
    latency_matrix = [[0, "50ms", ...], ...]          # optional, n x n
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
Diagonal entries are ignored. Values take the units of :mod:`perfsim.units`; in a file a rate
or a latency written as a number without its unit is refused (0 excepted), as in a sweep file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsim.documents import document_kind, parse_document, read_document
from perfsim.errors import ConfigError
from perfsim.units import parse_bandwidth, parse_time, refuse_bare_number


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

    def default_nic_bps(self, node: int) -> float:
        """NIC rate of a node the file gives none for: its fastest link to
        another node, so a NIC is shared by its flows exactly as under
        ``--bandwidth`` (where the NIC rate is the link rate); a uniform
        topology of rate B and ``--bandwidth B`` are the same cluster."""
        cache = self.__dict__.get("_nic_default")
        if cache is None:  # every node at once: per node, its region's and its overrides' rates
            cache = {}
            if self.region is not None:
                members: dict[int, int] = {}
                for x in self.region:
                    members[x] = members.get(x, 0) + 1
                fastest = {r: [max([self.bandwidth[r][j] for j in range(len(self.bandwidth)) if j != r or k > 1],
                                   default=None)] for r, k in members.items()}
            extra: dict[int, list[float]] = {}
            for (a, _), (bw, _) in self.overrides:
                if bw is not None:
                    extra.setdefault(a, []).append(bw)
            for a in range(self.nodes):
                if self.region is None:
                    rates = [self.bandwidth[a][j] for j in range(self.nodes) if j != a]
                else:
                    rates = [x for x in fastest[self.region[a]] if x is not None]
                rates += extra.get(a, [])
                cache[a] = max(rates) if rates else float("inf")
            object.__setattr__(self, "_nic_default", cache)
        return cache[node]

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
    out, seen = [], {}
    for k, link in enumerate(links):
        if not isinstance(link, dict) or set(link) - {"src", "dst", "bandwidth", "latency", "symmetric"}:
            raise ConfigError(f"{where}: links[{k}] must have only src, dst, bandwidth, latency, symmetric")
        s, d = link.get("src"), link.get("dst")
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n for x in (s, d)) or s == d:
            raise ConfigError(f"{where}: links[{k}] src/dst must be distinct node indices < {n}")
        if (s, d) in seen:  # which one was meant? (the last one won, silently)
            raise ConfigError(f"{where}: links[{k}]: the pair {s},{d} again (links[{seen[s, d]}] gave it); "
                              "give each pair once")
        seen[s, d] = k
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
        return tuple(tuple(_fast(v, conv, f"{where}: {name}[{i}][{j}]") for j, v in enumerate(row))
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
    """A topology from CSV text (header ``src,dst,bandwidth,latency``)."""
    return topology_from_rows(parse_document(text, "csv", where), where)


def topology_from_rows(rows: list[dict[str, str]], where: str = "topology") -> Topology:
    """A topology from CSV rows (``src``, ``dst``, ``bandwidth``, ``latency``; one
    row per pair, either direction)."""
    if not rows or set(rows[0]) != {"src", "dst", "bandwidth", "latency"}:
        raise ConfigError(f"{where}: CSV needs the header src,dst,bandwidth,latency and >= 1 row")
    entries, seen = {}, {}
    for k, row in enumerate(rows):
        try:
            s, d = int(row["src"]), int(row["dst"])
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: row {k + 2}: src/dst must be integers") from None
        if s < 0 or d < 0 or s == d:
            raise ConfigError(f"{where}: row {k + 2}: src/dst must be distinct non-negative integers")
        if (s, d) in seen:  # which one was meant? (the last row won, silently)
            raise ConfigError(f"{where}: row {k + 2}: the pair {s},{d} again (row {seen[s, d]} gave it); "
                              "give each pair once (a reverse row d,s is its other direction)")
        seen[s, d] = k + 2
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
    """Read a topology file (.json, .toml or .csv). A file mirrors the flags: its rates and
    latencies take units (:func:`units_given`; CSV cells are text, parsed so)."""
    p = Path(path)
    where = f"topology {str(p)!r}"
    data = read_document(p, "topology", default="json")
    if document_kind(p, "json") == "csv":
        return topology_from_rows(data, where)
    topology = topology_from_dict(data, where)
    units_given(data, where)
    return topology


def units_given(data: dict, where: str) -> None:
    """A rate or a latency of a topology document (valid: :func:`topology_from_dict` read it)
    written as a non-zero number without its unit is refused (:func:`perfsim.units.refuse_bare_number`):
    ``bandwidth = 100`` ran at 100 bit/s and ``latency = 5`` with 5 s, silently. A Python dict
    given to :func:`topology_from_dict` keeps SI numbers."""
    kinds = {"bandwidth": "bandwidth", "latency": "time", "nic_bandwidth": "bandwidth",
             "bandwidth_matrix": "bandwidth", "latency_matrix": "time",
             "region_bandwidth": "bandwidth", "region_latency": "time"}
    for key, kind in kinds.items():
        value = data.get(key)
        if isinstance(value, list) and value and isinstance(value[0], list):  # a matrix (the node diagonal is ignored)
            for i, row in enumerate(value):
                for j, v in enumerate(row):
                    if i != j or key.startswith("region"):
                        refuse_bare_number(v, f"{where}: {key}[{i}][{j}]", kind)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                refuse_bare_number(v, f"{where}: {key}[{i}]", kind)
        elif value is not None:
            refuse_bare_number(value, f"{where}: {key}", kind)
    for k, link in enumerate(data.get("links", [])):
        for key, kind in (("bandwidth", "bandwidth"), ("latency", "time")):
            if key in link:
                refuse_bare_number(link[key], f"{where}: links[{k}].{key}", kind)

