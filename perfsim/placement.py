"""Placement on heterogeneous topologies: which GPU runs which stage, and how many
bits each pipeline boundary gets.

On a geo-distributed cluster the order of the pipeline across nodes decides how
often an activation crosses a slow link: pipeline neighbours should sit on fast
links, and the one unavoidable slow hop should carry fewer bits. Yuan et al.,
"Decentralized Training of Foundation Models in Heterogeneous Environments"
(DT-FM, arXiv:2206.01288) search this placement with a cost model of the
pipeline's and the data-parallel groups' links; perfsim's planner takes a simpler
part of that idea and leaves the cost to the simulator:

* :func:`chain_order` orders the nodes into a path whose consecutive nodes are
  joined by the fastest links (nearest neighbour by link rate from every start
  node, the path with the fastest slowest hop and the least total time per bit
  kept), so a pipeline laid along it crosses a slow inter-region hop as rarely as
  the regions force;
* :func:`placements` offers that order and the identity, each with perfsim's
  replica-major rank order (``tp,pp,dp``: a replica's stages adjacent) and
  Megatron-LM's (``tp,dp,pp``: a stage's replicas adjacent), as
  ``(placement, device_order)`` pairs of :class:`perfsim.config.Strategy`;
* :func:`boundary_rates` gives the slowest link each pipeline boundary crosses
  (over the replicas), and :func:`per_link_compression` the per-boundary
  assignments the planner tries: the searched specs on the fastest boundaries,
  a more aggressive one on the slower boundaries (:mod:`perfsim.boundaries`).

Every candidate is then simulated by the engine with the topology, which is what
ranks them.
"""

from __future__ import annotations

import functools
import math
from typing import Iterable, Sequence

from perfsim.boundaries import BoundarySpecs, parse_boundary_compress
from perfsim.compression import make_pipeline_pair
from perfsim.config import Strategy

#: starting nodes tried by chain_order (nearest neighbour is O(n^2) per start)
MAX_STARTS = 64


def chain_order(topology, nodes: int) -> tuple[int, ...]:
    """Nodes ``0..nodes-1`` as a path over fast links (see the module docstring)."""
    if nodes <= 2:
        return tuple(range(nodes))

    def rate(a, b):
        return topology.link(a, b)[0]

    best, best_key = None, None
    for start in range(min(nodes, MAX_STARTS)):
        path, left = [start], set(range(nodes)) - {start}
        while left:
            here = path[-1]
            nxt = max(sorted(left), key=lambda j: rate(here, j))
            path.append(nxt)
            left.remove(nxt)
        hops = [rate(a, b) for a, b in zip(path, path[1:])]
        key = (-min(hops), sum(1.0 / h for h in hops))
        if best_key is None or key < best_key:
            best, best_key = path, key
    return tuple(best)


def device_order_of(chain: Sequence[int], gpus_per_node: int) -> tuple[int, ...] | None:
    """Logical GPU index -> physical GPU, filling the nodes of ``chain`` in turn
    (None when it is the identity)."""
    order = tuple(node * gpus_per_node + g for node in chain for g in range(gpus_per_node))
    return None if order == tuple(range(len(order))) else order


def placements(topology, nodes: int, gpus_per_node: int) -> list[tuple[str, tuple[int, ...] | None]]:
    """``(placement, device_order)`` pairs to search on ``topology``."""
    orders = [None]
    chained = device_order_of(chain_order(topology, nodes), gpus_per_node)
    if chained is not None:
        orders.append(chained)
    return [(pl, order) for order in orders for pl in ("tp,pp,dp", "tp,dp,pp")]


@functools.lru_cache(maxsize=4096)
def strategy_of(pp: int, dp: int, tp: int, schedule: str, microbatches: int, placement: str,
              order: tuple[int, ...] | None):
    """A (cached) :class:`perfsim.config.Strategy` of this shape: its devices and table."""
    return Strategy(pp=pp, dp=dp, tp=tp, schedule=schedule, micro_batch=1, macro_batch=microbatches,
                    placement=tuple(placement.split(",")), device_order=order)


def boundary_rates(topology, gpus_per_node: int, *, pp: int, dp: int, tp: int, schedule: str,
                   microbatches: int, placement: str, order: tuple[int, ...] | None
                   ) -> list[float | None]:
    """Per pipeline boundary (after each model chunk but the last): the slowest
    node-to-node rate (bit/s) it crosses over the replicas, ``inf`` inside a node,
    None where both chunks share a device (no message)."""
    st = strategy_of(pp, dp, tp, schedule, microbatches, placement, order)
    where = st.table().stage_device
    out: list[float | None] = []
    for k in range(len(where) - 1):
        a, b = where[k], where[k + 1]
        if a == b:
            out.append(None)
            continue
        rate = math.inf
        for r in range(dp):
            na, nb = st.device(0, r, a) // gpus_per_node, st.device(0, r, b) // gpus_per_node
            if na != nb:
                rate = min(rate, topology.link(na, nb)[0])
        out.append(rate)
    return out


def wire_fraction(spec: str) -> float:
    """Bytes a pipeline spec puts on the wire per fp32 byte, forward + backward
    (the compressors' own ``wire_bytes``; AQ-SGD after its warm-up)."""
    return _wire_fraction(spec)


@functools.lru_cache(maxsize=256)
def _wire_fraction(spec: str) -> float:
    fw, bw = make_pipeline_pair(spec)
    shape = (8, 128, 128)
    return (fw.wire_bytes(shape) + bw.wire_bytes(shape)) / (2 * 4 * 8 * 128 * 128)


def per_link_compression(rates: Sequence[float | None], specs: Iterable[str]
                         ) -> list[tuple[str, str]]:
    """``(compress, boundary_compress)`` assignments to try for these boundary rates:
    each searched spec alone, and -- when the boundaries' links differ -- every pair
    of a spec on the fastest boundaries and a strictly more aggressive one (fewer
    wire bytes) on the slower ones."""
    specs = list(dict.fromkeys(specs))
    out = [(s, BoundarySpecs()) for s in specs]
    crossing = [r for r in rates if r is not None]
    if not crossing or min(crossing) == max(crossing):
        return out
    fastest = max(crossing)
    slow = [k for k, r in enumerate(rates) if r is not None and r < fastest]
    for fast_spec in specs:
        for slow_spec in specs:
            if wire_fraction(slow_spec) < wire_fraction(fast_spec):
                out.append((fast_spec, parse_boundary_compress({k: slow_spec for k in slow})))
    return out
