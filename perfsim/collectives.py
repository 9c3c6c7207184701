"""Collective algorithms: ring, double binary tree, hierarchical; NCCL-like selection.

A collective on ``N`` ranks spread over ``M`` nodes (``g`` ranks per node, the
largest count), with a per-rank buffer of ``S`` bytes, intra-node rate ``B_in``
and per-step latency ``a_in``, inter-node rate ``B_out`` (a node's NICs, shared
by its ranks) and per-step latency ``a_out``, is a sequence of *phases*; each
phase moves ``V`` bytes through its bottleneck at rate ``B`` and then pays its
latency-bound steps: ``T = sum(V / B + steps * a)``. The engine turns each
phase into a fluid flow (:mod:`perfsim.network.flows`), so collectives running at
once share the NICs max-min fairly; :meth:`Collective.time` is the uncontended
closed form.

allreduce
  * ring (Patarasuk & Yuan, JPDC 69(2) 2009): ``V = 2(N-1)/N S`` at
    ``min(B_in, B_out)``, ``2(N-1)`` steps of the slowest hop's latency. NCCL's
    rings cross each node boundary once per direction, so a node's NICs carry
    ``V`` in each direction;
  * tree: NCCL's double binary tree (Sanders, Speck & Traeff, "Two-tree algorithms
    for full bandwidth broadcast, reduction and scan", Parallel Computing 35(12),
    2009; NCCL 2.4, Jeaugey, NVIDIA blog "Massively Scale Your Deep Learning
    Training with NCCL 2.4", 2019): a chain inside each node, two complementary
    binary trees across nodes (:func:`double_binary_tree`). NCCL's kernel
    (``src/device/all_reduce.h`` at 0e35f5d, ``runTreeSplit``) runs each channel's share
    of the buffer up its tree (receive from the children, reduce, send to the parent) and
    back down (receive from the parent, send to the children), and half the channels use
    each tree (``src/graph/connect.cc`` at 0f900e1: ``ncclTopoPreset`` duplicates the
    channels, ``connectTrees`` puts channel ``c`` on the first tree and ``c + nChannels``
    on the second): a node sends and receives ``S/2`` per tree neighbour (parent or child)
    of each tree, ``V_out = d S / 2`` through its NICs with ``d`` the most tree
    neighbours a node has over both trees -- 2 on two nodes (each the other's root
    and leaf: ``S`` each way), 3 on three, 4 from four nodes on (interior in one
    tree, a leaf in the other: ``2 S``, the ring's ``2(N-1)/N S``). Inside a node each
    GPU of the chain relays ``S/2`` up and ``S/2`` down per tree: ``V_in = 2 S`` with
    three or more GPUs, ``S`` with two. ``T = max(V_out / B_out, V_in / B_in) / 0.92``
    plus ``2 (floor(log2 M) a_out + (g-1) a_in)`` -- the bandwidth factor and latency of
    NCCL's own tuning model (src/graph/tuning.cc, ncclTopoTuneModel). Two nodes are
    the case NCCL's maintainers describe: the tree's bus bandwidth "can go up to ~2x
    the network speed" there and not on 3+ nodes (S. Jeaugey, NVIDIA/nccl#209,
    NVIDIA/nccl#946);
  * hierarchical (Jia et al., "Highly Scalable Deep Learning Training System with
    Mixed-Precision", arXiv:1807.11205; Horovod's hierarchical allreduce):
    intra-node reduce-scatter ``(g-1)/g S`` at ``B_in``, ``g-1`` steps; ``g``
    concurrent inter-node ring allreduces of ``S/g`` (together ``2(M-1)/M S``
    through each node's NICs) at ``B_out``, ``2(M-1)`` steps; intra-node
    allgather ``(g-1)/g S``, ``g-1`` steps.

``auto`` picks the least modelled time, as NCCL's tuner does (it predicts each
algorithm's time from latency and bandwidth per node count and fabric and takes
the fastest, NCCL_ALGO's default; NVIDIA/nccl#790): trees win small messages on
many nodes, rings large ones, and on two nodes trees win large ones too. The tuner's
own model prices a tree across more than two nodes at ``2 S`` per node (tuning.cc,
``ncclTopoTuneModel``: the inter-node bandwidth beyond two nodes, algorithm bandwidth
half the bus bandwidth), where three nodes' trees move ``1.5 S``: the choice among
algorithms is made with that ``2 S``, so that three-node rings stay rings as NCCL
runs them, and the algorithm chosen is then priced with its own bytes.
``--collective-algo`` forces one (as NCCL_ALGO).

Other kinds (ring or pairwise only; a forced tree/hierarchical applies to allreduce):
allgather (``S`` = each rank's contribution) ``V = (N-1) S``, ``N-1`` steps;
reduce_scatter (``S`` = each rank's input) ``V = (N-1)/N S``, ``N-1`` steps;
alltoall (pairwise exchange): a node's NICs carry ``g S (N-g)/N`` while each
rank moves ``(g-1)/N S`` inside the node, ``N-1`` steps; broadcast (pipelined
chain) ``V = S``, ``N-1`` steps; p2p ``V = S``, 1 step.

Protocols: the message-size curve (``GroupShape.model == "nccl"``)
-----------------------------------------------------------------
nccl-tests' bus bandwidth rises with the message size because NCCL picks, per size, one
of three protocols, each a latency / bandwidth trade (NCCL's tuning model,
``src/graph/tuning.cc``, ``ncclTopoTuneModel``: ``baseLat``, ``hwLat`` and the bandwidth
refinements, transcribed in :data:`PROTOCOLS`): LL (8-byte stores with a flag: a quarter of
the ring's bandwidth, a third of the tree's; sub-microsecond steps), LL128 (120 of every 128
bytes; NVLink only, as NCCL enables it) and Simple (full bandwidth, ~6 us per step, 8.4 us
base). A collective of the ``nccl`` model costs, per protocol ``p``,
``base_p + sum over phases (V / (B f_p) + steps_in hw_p(intra) + steps_out hw_p(net)) + the
links' own latencies``, and the cheapest protocol is taken (NCCL's tuner). Of a ring's steps
across nodes only those whose hop leaves a node pay the network's: ``2 (M-1)`` of an
allreduce's ``2 (N-1)``, ``M-1`` of an allgather's or reduce-scatter's ``N-1``, the others
the intra-node (NVLink or PCI) latency -- ``ncclTopoTuneModel``'s ``nInterSteps``
(tuning.cc at 01afd20, ``(nsteps - nInterSteps) intraLat + nInterSteps interLat``; PyTorch's
transcription, ``torch/_inductor/comm_analysis.py``, the same; a later tuning.cc, at b647562, counts
``2 M``); a broadcast's steps and a p2p pay the network's, as there. The per-step figures
are those of the earlier ``ncclSetThresholds`` (tuning.cc, copyright 2016-2019), which
charged every step of a multi-node ring the network's. ``nominal`` keeps the
plain phases: each step costs the link's latency only, every size moves at the full rate.

``pipelined`` (the ``nccl`` model's protocols and choice, its steps overlapped): NCCL's steps
are not paid one after the other. A sender may run ``NCCL_STEPS`` (8) buffer slots ahead of its
receiver (``src/device/prims_simple.h``, ``waitPeer``: a send waits only while ``connStepCache +
NCCL_STEPS < step + StepPerSlice``), so while one step's data is on the wire the next step's
handshake is already under way, and the tuner's own comment says what its Simple per-step latency
is: "the latency a 256kB chunk, which is ~ base lat + 256k/12GB/s (+ 256k/12GB/s for the network)"
(tuning.cc at 01afd20, above ``hwLat``) -- a chunk's transfer, which overlaps the transfer of the
data itself. A phase of ``n`` steps moving ``V`` at the protocol's rate ``B f`` spends ``d = V / (n B
f)`` per step on the wire; step ``k`` needs ``max(d, h_k)`` (its data, or its handshake latency
``h_k`` -- :data:`PROTOCOLS`' ``hw`` on its hop -- whichever is longer) and the last one ``d + h``
(its data then its arrival): ``T = base + sum_{k<n} max(d, h_k) + d + max_k h_k``. Large messages
(``d >> h``) cost ``V / (B f) + base + h``: the latency of one step, not of every step; small ones
(``d << h``) cost every step's latency as ``nccl`` charges them. Each parameter is NCCL's own
(``baseLat``, ``hwLat``, the protocol's bandwidth share); nothing is fitted. The protocol is still
chosen with the tuner's additive costs (``nccl``), as NCCL chooses it; the chosen one is then priced
with its steps overlapped. The links' own latencies stay additive, as in ``nccl``.

``auto`` (the default, :func:`resolve_model`): ``pipelined`` where NCCL carries the collective --
a GPU preset's ranks over links no profile measured --, ``nominal`` elsewhere (gloo on CPUs, or a
link whose measured cost already holds its backend's per-step costs). Adopted on the published
nccl-tests rows (docs/validation.md, "NCCL's steps overlapped").

Measured kinds
--------------
A backend need not implement a kind as the ring above: gloo's
``reduce_scatter_tensor`` clones the input, allreduces all of it and copies out
the rank's chunk (torch ``ProcessGroupGloo::reduce_scatter_tensor_coalesced``),
and its ``all_gather_into_tensor`` gathers into a flat buffer and copies it out.
So where a profile measured a kind as a given torch call issues it
(``perfsim calibrate``: ``reduce_scatter`` and ``allgather`` records with their
``call``), :func:`measured` plans it as the allreduce of the same buffer scaled
by the measured ratio ``t_kind(S) / t_allreduce(S)`` (both timed in one sweep on
the same link, :meth:`perfsim.profile.costs.ProfileCosts.collective_ratio`):
the link, group shape and contention stay the network's, the kind's own cost is
the backend's. The ratio is taken on the calibration's ranks (2) and assumed to
hold for larger groups; it applies on the profile's own backend only (the plan
does not ask for it with a GPU preset beside a CPU profile).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from perfsim.errors import ConfigError

ALGORITHMS = ("auto", "ring", "tree", "hierarchical")
#: tree allreduce achieves 0.92 of the ring's bus bandwidth (NCCL src/graph/tuning.cc,
#: ncclTopoTuneModel: ``if (a == NCCL_ALGO_TREE && coll == ncclFuncAllReduce) busBw *= .92``)
TREE_EFFICIENCY = 0.92
KINDS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "p2p")
#: collective cost models (``System.collective_model``; module docstring, "Protocols")
COLLECTIVE_MODELS = ("auto", "nominal", "nccl", "pipelined")


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol (NCCL ``src/graph/tuning.cc``, ``ncclTopoTuneModel``; latencies in
    seconds): ``ring_bw`` / ``tree_bw`` share of the bus bandwidth it reaches, ``base_*`` its
    fixed latency, ``hw_*`` its latency per step on NVLink, PCI and the network."""

    name: str
    ring_bw: float
    tree_bw: float
    base_ring_s: float
    base_tree_s: float
    hw_ring_s: tuple[float, float, float]
    hw_tree_s: tuple[float, float, float]
    nvlink_only: bool = False


#: NCCL's protocols: ``baseLat`` (ring 3.6 / 3.6 / 8.4 us, tree 4.4 / 4.4 / 0), ``hwLat``
#: (NVLink, PCI, NET) and ``busBw *= 1/4`` (ring LL), ``120/128`` (ring LL128), ``1/3`` and
#: ``7/9`` (tree LL, LL128); LL128 enabled on NVLink only
PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", 1 / 4, 1 / 3, 3.6e-6, 4.4e-6, (0.4e-6, 1.0e-6, 0.9e-6), (0.5e-6, 1.0e-6, 5.0e-6)),
    Protocol("LL128", 120 / 128, 7 / 9, 3.6e-6, 4.4e-6, (2.5e-6, 2.5e-6, 2.5e-6), (1.9e-6, 1.9e-6, 7.5e-6),
             nvlink_only=True),
    Protocol("Simple", 1.0, 1.0, 8.4e-6, 0.0, (5.7e-6, 5.7e-6, 6.6e-6), (28e-6, 28e-6, 50e-6)),
)
#: the functional collectives DTensor issues (``torch.ops._c10d_functional``, what
#: tensor parallelism calls in execute mode) -> the kind each is
TENSOR_CALLS = {"all_reduce": "allreduce", "all_gather_into_tensor": "allgather",
                "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "alltoall"}
#: the torch.distributed call a profile record of a kind timed when it names no ``call``
DEFAULT_CALLS = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter_tensor",
                 "alltoall": "all_to_all_single", "broadcast": "broadcast", "p2p": "send"}


def tensor_call(kind: str) -> str:
    """The functional call tensor parallelism issues for ``kind`` (:data:`TENSOR_CALLS`)."""
    for call, k in TENSOR_CALLS.items():
        if k == kind:
            return call
    raise ConfigError(f"collective {kind!r}: tensor parallelism issues no such call")


@dataclass(frozen=True)
class Phase:
    """``volume_bytes`` through a bottleneck of ``rate_bps``, then ``latency_s``;
    ``inter_node``: the volume crosses the nodes' NICs (shared resources)."""

    volume_bytes: float
    rate_bps: float
    inter_node: bool
    latency_s: float
    #: latency-bound steps over intra-node / inter-node hops (the protocol model's ``hw`` cost)
    steps_in: int = 0
    steps_out: int = 0


@dataclass(frozen=True)
class Collective:
    """A planned collective: phases in order (each a tuple of concurrent phases)."""

    kind: str
    algo: str
    phases: tuple[tuple[Phase, ...], ...]
    wire_bytes: float  # bytes each rank puts on the wire

    def time(self) -> float:
        """Uncontended time (module docstring)."""
        return sum(max(p.volume_bytes * 8.0 / p.rate_bps + p.latency_s for p in group)
                   for group in self.phases)


@dataclass(frozen=True)
class GroupShape:
    """Where a collective's ranks live: ``n`` ranks on ``nodes`` nodes, at most
    ``per_node`` on one; the rates (bits/s) and per-step latencies inside a node and
    between nodes (the slowest hop's)."""

    n: int
    nodes: int
    per_node: int
    intra_bps: float
    intra_latency_s: float
    inter_bps: float
    inter_latency_s: float
    #: ``nominal``, ``nccl`` or ``pipelined`` (COLLECTIVE_MODELS less ``auto``, which
    #: :func:`resolve_model` settles: module docstring, "Protocols")
    model: str = "nominal"
    #: the intra-node fabric is PCIe (NCCL's PCI latencies, no LL128), else NVLink
    intra_pcie: bool = False


def resolve_model(model: str, nccl: bool) -> str:
    """The collective model a group is priced with: ``model``, or for ``auto`` ``pipelined`` when
    ``nccl`` (NCCL carries it, over links no profile measured) and ``nominal`` otherwise (module
    docstring, ``auto``)."""
    if model not in COLLECTIVE_MODELS:
        raise ConfigError(f"collective_model={model!r}: choose from {', '.join(COLLECTIVE_MODELS)}")
    return ("pipelined" if nccl else "nominal") if model == "auto" else model


def _flat(kind: str, S: float, g: GroupShape, volume: float, steps: int, algo: str = "ring",
          inter_steps: int | None = None) -> Collective:
    """``inter_steps``: of the ``steps``, those whose hop crosses nodes (the rest stay inside a
    node; module docstring, "Protocols"); None: all of them when the group spans nodes."""
    multi = g.nodes > 1
    rate = min(g.inter_bps, g.intra_bps) if multi and g.per_node > 1 else (g.inter_bps if multi else g.intra_bps)
    lat = g.inter_latency_s if multi else g.intra_latency_s
    out = (steps if inter_steps is None else inter_steps) if multi else 0
    return Collective(kind, algo, ((Phase(volume, rate, multi, steps * lat, steps - out, out),),), volume)


def plan(kind: str, nbytes: float, g: GroupShape, algo: str = "auto") -> Collective:
    """The collective ``kind`` of per-rank buffer ``nbytes`` on ``g`` (module docstring)."""
    if algo not in ALGORITHMS:
        raise ConfigError(f"collective_algo={algo!r}: choose from {', '.join(ALGORITHMS)}")
    n, m, S = g.n, g.nodes, float(nbytes)
    if kind == "p2p":
        return _flat(kind, S, g, S, 1)
    if kind not in KINDS:
        raise ConfigError(f"collective {kind!r}: unknown")
    if n <= 1:
        return Collective(kind, "ring", (), 0.0)
    if kind == "allreduce":
        options = {"ring": lambda: _flat(kind, S, g, 2.0 * (n - 1) / n * S, 2 * (n - 1), inter_steps=2 * (m - 1)),
                   "tree": lambda: _tree(S, g),
                   "hierarchical": lambda: _hierarchical(S, g)}
        chosen = [options[algo]()] if algo != "auto" else [f() for f in options.values()]
    elif kind == "allgather":
        chosen = [_flat(kind, S, g, (n - 1) * S, n - 1, inter_steps=m - 1)]
    elif kind == "reduce_scatter":
        chosen = [_flat(kind, S, g, (n - 1) / n * S, n - 1, inter_steps=m - 1)]
    elif kind == "broadcast":
        chosen = [_flat(kind, S, g, S, n - 1)]
    else:
        chosen = [_alltoall(S, g)]
    # each candidate beside what NCCL's tuner believes it costs (module docstring, "auto")
    pairs = [(c, _tree(S, g, tuner=True) if c.algo == "tree" and algo == "auto" else c) for c in chosen]
    if g.model in ("nccl", "pipelined"):  # each algorithm at the protocol NCCL's tuner finds cheapest (additive)
        pipelined = g.model == "pipelined"
        pairs = [(with_protocol(c, g, p, pipelined), with_protocol(k, g, p)) for c, k in pairs for p in PROTOCOLS
                 if g.intra_pcie is False or not p.nvlink_only]
    return min(pairs, key=lambda ck: ck[1].time())[0]


def with_protocol(c: Collective, g: GroupShape, p: Protocol, pipelined: bool = False) -> Collective:
    """``c`` carried by NCCL protocol ``p`` (module docstring, "Protocols"): every phase's
    rate times the protocol's share, its steps charged the protocol's per-step latency on
    their hop (intra: NVLink or PCI; inter: NET) on top of the links' own, the protocol's
    base latency once; ``algo`` names both (``ring/LL``). ``pipelined``: each phase's steps
    overlap its data (:func:`overlapped_steps_s`)."""
    tree = c.algo == "tree"
    share = p.tree_bw if tree else p.ring_bw
    hw = p.hw_tree_s if tree else p.hw_ring_s
    intra = hw[1] if g.intra_pcie else hw[0]
    base = p.base_tree_s if tree else p.base_ring_s
    phases, first = [], True
    for group in c.phases:
        out = []
        for ph in group:
            rate = ph.rate_bps * share
            steps = (ph.steps_in * intra + ph.steps_out * hw[2] if not pipelined else
                     overlapped_steps_s(ph.volume_bytes * 8.0 / rate, ph.steps_in, intra, ph.steps_out, hw[2]))
            lat = ph.latency_s + steps + (base if first else 0.0)
            out.append(Phase(ph.volume_bytes, rate, ph.inter_node, lat, ph.steps_in, ph.steps_out))
        first = False
        phases.append(tuple(out))
    return Collective(c.kind, f"{c.algo}/{p.name}", tuple(phases), c.wire_bytes)


def overlapped_steps_s(transfer_s: float, steps_in: int, h_in: float, steps_out: int, h_out: float) -> float:
    """What ``steps_in`` steps of latency ``h_in`` and ``steps_out`` of ``h_out`` add to a phase whose
    data takes ``transfer_s`` on the wire when each step overlaps the data of the one before (module
    docstring, ``pipelined``): ``sum_{k<n} max(d, h_k) + d + max_k h_k - transfer_s`` with ``d =
    transfer_s / n``; the last step is a network one where the phase has any."""
    n = steps_in + steps_out
    if n == 0:
        return 0.0
    d = transfer_s / n
    last = h_out if steps_out else h_in
    rest_in, rest_out = (steps_in, steps_out - 1) if steps_out else (steps_in - 1, 0)
    return rest_in * max(d, h_in) + rest_out * max(d, h_out) + d + last - transfer_s


@functools.lru_cache(maxsize=256)
def double_binary_tree(n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The parent of each of ``n`` ranks (-1: the root) in NCCL's two trees (``src/graph/trees.cc`` at
    18a07ee, ``ncclGetBtree`` / ``ncclGetDtree``; Sanders, Speck & Traeff 2009). The first is a binary tree
    rooted at 0 that alternates leaves and interior ranks: rank ``r``'s parent clears its lowest
    set bit ``b`` and sets the next one, ``(r ^ b) | 2b``, or only clears it where that falls past
    ``n - 1``. The second mirrors it (``r -> n - 1 - r``) when ``n`` is even and shifts it by one
    rank when ``n`` is odd, so that a rank interior in one tree is a leaf in the other."""
    first = [-1] * n
    for r in range(1, n):
        b = r & -r
        up = (r ^ b) | (b << 1)
        first[r] = up if up < n else r ^ b
    if n % 2 == 0:
        second = [-1 if first[n - 1 - r] < 0 else n - 1 - first[n - 1 - r] for r in range(n)]
    else:
        second = [-1 if first[(r - 1) % n] < 0 else (first[(r - 1) % n] + 1) % n for r in range(n)]
    return tuple(first), tuple(second)


@functools.lru_cache(maxsize=256)
def tree_neighbours(n: int) -> int:
    """The most tree neighbours (parent and children, both trees together) a rank of
    :func:`double_binary_tree` has on ``n`` ranks: 2 for two ranks, 3 for three, 4 from four on."""
    count = [0] * n
    for parents in double_binary_tree(n):
        for r, up in enumerate(parents):
            if up >= 0:
                count[r] += 1
                count[up] += 1
    return max(count)


def _tree(S: float, g: GroupShape, tuner: bool = False) -> Collective:
    """``tuner``: the tree as NCCL's tuner prices it, ``2 S`` through the NICs on more than two
    nodes (module docstring, "auto")."""
    lat = 2.0 * (math.floor(math.log2(g.nodes)) * g.inter_latency_s + (g.per_node - 1) * g.intra_latency_s)
    multi = g.nodes > 1
    # module docstring: bytes through a node's NICs, and through one GPU of a node's chain
    v_in = 0.0 if g.per_node < 2 else (S if g.per_node == 2 else 2.0 * S)
    v_out = (2.0 * S if tuner and g.nodes > 2 else tree_neighbours(g.nodes) * S / 2.0) if multi else 0.0
    if not multi:
        volume, rate = v_in, g.intra_bps
    else:  # the NICs' volume, at the rate the busier of NICs and chain lets it move
        volume, rate = v_out, (g.inter_bps if v_in == 0 else min(g.inter_bps, g.intra_bps * v_out / v_in))
    steps_in, steps_out = 2 * (g.per_node - 1), 2 * math.floor(math.log2(g.nodes))
    return Collective("allreduce", "tree", ((Phase(volume, rate * TREE_EFFICIENCY, multi, lat, steps_in, steps_out),),),
                      max(v_in, v_out))


def _hierarchical(S: float, g: GroupShape) -> Collective:
    k, m = g.per_node, g.nodes
    if m == 1 or k == 1:  # one level only: the plain ring
        c = _flat("allreduce", S, g, 2.0 * (g.n - 1) / g.n * S, 2 * (g.n - 1))
        return Collective("allreduce", "hierarchical", c.phases, c.wire_bytes)
    local = Phase((k - 1) / k * S, g.intra_bps, False, (k - 1) * g.intra_latency_s, k - 1, 0)
    inter = Phase(2.0 * (m - 1) / m * S, g.inter_bps, True, 2 * (m - 1) * g.inter_latency_s, 0, 2 * (m - 1))
    wire = 2.0 * (k - 1) / k * S + 2.0 * (m - 1) / m * S / k
    return Collective("allreduce", "hierarchical", ((local,), (inter,), (local,)), wire)


def _alltoall(S: float, g: GroupShape) -> Collective:
    n, k = g.n, g.per_node
    lat = (n - 1) * (g.inter_latency_s if g.nodes > 1 else g.intra_latency_s)
    phases = []
    if g.nodes > 1:  # the node's k ranks each send (n-k)/n of their buffer through its NICs
        phases.append(Phase(k * S * (n - k) / n, g.inter_bps, True, lat, 0, n - 1))
    if k > 1:
        phases.append(Phase((k - 1) / n * S, g.intra_bps, False, 0.0 if g.nodes > 1 else lat,
                            0 if g.nodes > 1 else n - 1, 0))
    return Collective("alltoall", "pairwise", (tuple(phases),), (n - 1) / n * S)


def measured(kind: str, nbytes: float, g: GroupShape, ratio: float) -> Collective:
    """``kind`` of per-rank buffer ``nbytes`` on ``g`` costed as ``ratio`` times the
    ring allreduce of the same buffer (module docstring, "Measured kinds"): every
    phase's volume and latency scaled, so contention shares it as the allreduce's
    bytes; ``wire_bytes`` stays the kind's own ring count."""
    if not ratio > 0 or not math.isfinite(ratio):
        raise ConfigError(f"measured {kind} ratio={ratio!r}: must be a finite number > 0")
    base = plan("allreduce", nbytes, g, "ring")
    phases = tuple(tuple(Phase(p.volume_bytes * ratio, p.rate_bps, p.inter_node, p.latency_s * ratio)
                         for p in group) for group in base.phases)
    return Collective(kind, "measured", phases, plan(kind, nbytes, g, "ring").wire_bytes)
