"""The tensor- and expert-parallel collectives of a stage, timed on its groups' GPUs.

Tensor parallelism (``Strategy.tp``): each stage is a group of ``tp`` GPUs (placed by
:meth:`perfsim.config.Strategy.device`); a stage's per-micro-batch time adds its layers'
Megatron collectives (:func:`perfsim.models.tensor_parallel.tp_layer_collectives`; under
sequence parallelism its embedding's and LM head's,
:func:`perfsim.models.tensor_parallel.tp_edge_collectives`; Narayanan et al. 2021,
arXiv:2104.04473), timed by the network on the group's own GPUs
(:meth:`perfsim.network.Network.collective_time`, the links the group uses), serial with
compute as in Megatron-LM: :func:`tp_stage_times`.

Expert parallelism (``Strategy.ep``): the token all-to-alls of a stage's MoE blocks
(:func:`perfsim.models.moe.ep_alltoall_bytes`), optionally compressed (DeepSeek-V3,
arXiv:2412.19437 Sec. 3.3): :func:`ep_stage_times`.

Groups of one shape cost the same, so each shape is priced once (:func:`_alike`,
:func:`_shape_key`); :func:`device_map` is the placement's linear form for loops over
many replicas. :func:`perfsim.engine.plan.build_plan` calls these once per stage.
"""

from __future__ import annotations

from perfsim.collectives import tensor_call
from perfsim.engine.buckets import copy_time
from perfsim.engine.codec_cost import codec_costs
from perfsim.hardware import BYTES_PER_VALUE
from perfsim.models.moe import (Routing, a2a_tokens, a2a_wire_bytes, check_a2a_gpu, ep_alltoall_bytes, ep_replicas,
                                tp_moe_rows)
from perfsim.models.tensor_parallel import tp_edge_collectives, tp_layer_collectives, tp_mtp_collectives
from perfsim.network import collective_cost


def tp_stage_times(workload, strategy, network, s: int, blocks: int, embed: bool = False,
                   head: bool = False, measured_kinds: bool = True, host_s: float = 0.0,
                   uniform: bool | None = None, moe_blocks: int = 0,
                   vocab_parallel: bool = False, mtp: int = 0, block_ids: tuple[int, ...] = ()
                   ) -> tuple[float, float, float]:
    """(fwd s, bwd s, bytes) of the tensor-parallel collectives of ``blocks`` layers of
    stage ``s`` (and of its embedding / LM head under sequence parallelism,
    :func:`perfsim.models.tensor_parallel.tp_edge_collectives`) for one micro-batch,
    on the slowest of the stage's TP groups. ``measured_kinds``: the profile's backend
    is the run's, so its measured collective kinds price them (not with a GPU preset
    beside a profile measured elsewhere). ``host_s``: the least one collective costs (a
    GPU curve's ``collective_s``, the host's time to issue it). ``uniform``: the
    network's :func:`uniform_network` (None: asked here). ``moe_blocks`` of the ``blocks``
    gather and scatter their MLP's :func:`perfsim.models.moe.tp_moe_rows` rows a token.
    ``vocab_parallel``: the embedding, head and loss are Megatron-LM's vocabulary-parallel
    ones, with their collectives (:func:`perfsim.models.tensor_parallel.tp_edge_collectives`).
    ``mtp`` of the ``blocks`` are multi-token prediction modules, each with
    :func:`perfsim.models.tensor_parallel.tp_mtp_collectives` beside its block's. ``block_ids``: the
    blocks' indices, which a model of mixer-only and MLP-only blocks (Nemotron-H) needs to give each its
    own sub-block's collectives.
    A full recomputation runs the layers' forward collectives again, not the edges'."""
    tp, spec = strategy.tp, workload.arch
    if tp == 1 or spec is None or (blocks == 0 and not embed and not head):
        return 0.0, 0.0, 0.0
    shape = (spec.hidden, spec.seq_len, strategy.micro_batch, tp, strategy.sequence_parallel,
             BYTES_PER_VALUE[strategy.precision])
    # (collectives, times issued per micro-batch): every block's, then the stage's edges
    rows = tp_moe_rows(spec, strategy) if moe_blocks else 1.0
    widths = spec.attention_gather_widths()
    if spec.mixer_free_layers or spec.mlp_free_layers:  # each block its one sub-block's collectives
        if len(block_ids) != blocks:
            raise ValueError(f"tp_stage_times: {blocks} blocks but {len(block_ids)} block ids")
        kinds: dict[tuple[bool, bool, bool], int] = {}
        for i in block_ids:
            key = (spec.has_mixer(i), spec.has_mlp(i), rows != 1.0 and spec.is_moe_block(i))
            kinds[key] = kinds.get(key, 0) + 1
        parts = [(tp_layer_collectives(*shape, attn_widths=widths, mlp_rows=rows if moe else 1.0, mixer=mixer,
                                       mlp=mlp), n) for (mixer, mlp, moe), n in kinds.items()]
    else:
        parts = [(tp_layer_collectives(*shape, spec.parallel_block, attn_widths=widths),
                  blocks - (moe_blocks if rows != 1.0 else 0))]
    if rows != 1.0 and not (spec.mixer_free_layers or spec.mlp_free_layers):
        # MoE blocks whose dispatched copies the TP group gathers (Megatron-Core)
        parts.append((tp_layer_collectives(*shape, spec.parallel_block, mlp_rows=rows, attn_widths=widths),
                      moe_blocks))
    layer_parts = len(parts)  # what a full recomputation runs again
    parts.append((tp_edge_collectives(*shape, embed, head, vocab_parallel=vocab_parallel,
                                      learned_positions=spec.learned_positions), 1))
    if mtp:
        parts.append((tp_mtp_collectives(*shape, vocab_parallel=vocab_parallel,
                                         learned_positions=spec.learned_positions), mtp))
    reps = _alike(strategy, network, lambda r: strategy.device(0, r, s), strategy.replicas, uniform)
    seen = {}
    # without a device_order, Strategy.device is linear (perfsim.job.place): a group's tensor
    # ranks follow its first at one stride
    stride = strategy.device(1, 0, s) - strategy.device(0, 0, s) if strategy.device_order is None else 0
    for r in reps:
        if stride:
            first = strategy.device(0, r, s)
            members = list(range(first, first + tp * stride, stride))
        else:
            members = [strategy.device(t, r, s) for t in range(tp)]
        # a collective's time depends on its group only through the group's shape (nodes,
        # ranks per node, slowest hop: Network.collective): replicas alike are priced once
        key = _shape_key(network, members)
        if key in seen:
            continue
        # back to back, the whole group in step (perfsim.network.lockstep_link), each kind
        # as the functional call DTensor issues (its measured cost when profiled)
        # each collective timed once: (its part's index, phase, seconds), in execution order
        timed = [(i, ph, times * max(host_s, network.collective_time(
                      k, n, members, lockstep=True, call=tensor_call(k) if measured_kinds else None)))
                 for i, (coll, times) in enumerate(parts) for ph, k, n in coll]
        # (fwd, bwd, the layers' fwd: what a full recomputation runs again)
        seen[key] = (sum(t for _, ph, t in timed if ph == "fwd"), sum(t for _, ph, t in timed if ph == "bwd"),
                     sum(t for i, ph, t in timed if ph == "fwd" and i < layer_parts))
    fwd = max(v[0] for v in seen.values())
    bwd = max(v[1] for v in seen.values())
    nbytes = sum(times * collective_cost(k, n, tp)[0] for coll, times in parts for _, k, n in coll)
    if strategy.recompute == "full":  # the recomputed forward runs its layers' collectives again
        bwd += max(v[2] for v in seen.values())
        nbytes += sum(times * collective_cost(k, n, tp)[0] for coll, times in parts[:layer_parts]
                      for ph, k, n in coll if ph == "fwd")
    return fwd, bwd, nbytes


def uniform_network(network) -> bool:
    """Every path between two nodes alike (no topology, or a uniform one,
    :meth:`perfsim.network.topology.Topology.is_uniform`)."""
    topo = getattr(network, "topology", None)
    return topo is None or topo.is_uniform()


def device_map(strategy):
    """``(t, r, s) -> GPU``, :meth:`perfsim.config.Strategy.device` itself, or without a
    ``device_order`` its linear form (the rank strides of its ``placement``, read from
    it) for loops over many replicas."""
    if strategy.device_order is not None:
        return strategy.device
    o = strategy.device(0, 0, 0)
    a = strategy.device(1, 0, 0) - o if strategy.tp > 1 else 0
    b = strategy.device(0, 1, 0) - o if strategy.replicas > 1 else 0
    c = strategy.device(0, 0, 1) - o if strategy.pp > 1 else 0
    return lambda t, r, s: o + t * a + r * b + s * c


def _alike(strategy, network, first, n: int, uniform: bool | None) -> list[int]:
    """Indices of the groups worth pricing among ``n`` groups whose ``i``-th starts on
    GPU ``first(i)`` and whose members follow at fixed strides (a TP group's tensor
    ranks, an EP group's replicas: :meth:`perfsim.config.Strategy.device` is linear
    without a ``device_order``, so ``first(i)`` is too). On a uniform network two such
    groups whose first GPUs sit at the same place in their nodes (``first mod
    gpus_per_node``) span the nodes alike, so have one shape: one of each is kept --
    and as ``first(i) mod gpus_per_node`` repeats with a period dividing
    ``gpus_per_node``, the first ``gpus_per_node`` groups hold every place. Otherwise
    every group."""
    if uniform is None:
        uniform = uniform_network(network)
    if not uniform or strategy.device_order is not None:
        return list(range(n))
    gpn = network.system.gpus_per_node
    kept: dict[int, int] = {}
    for i in range(min(n, gpn)):
        kept.setdefault(first(i) % gpn, i)
    return list(kept.values())


def _shape_key(network, members) -> tuple:
    """What a lockstep collective's time on ``members`` depends on: the group's shape
    (:meth:`perfsim.network.Network.group_shape`), else (a network without one) the
    members' nodes."""
    shape = getattr(network, "group_shape", None)
    if shape is not None:
        return (shape(members, lockstep=True),)
    return tuple(network.node(m) for m in members)


def ep_alltoall_parts(workload, strategy, network, s: int, moe_blocks: int, host_s: float = 0.0,
                      uniform: bool | None = None, profile=None, gpu=None
                      ) -> tuple[float, float | None, float, float]:
    """``(full, wire, encode, decode)`` seconds of one MoE block's token all-to-alls on pipeline device ``s``
    for one micro-batch, each way: one all-to-all at the training precision (``full``: the combine, and
    uncompressed the dispatch too), the compressed one under ``strategy.a2a_compress`` (``wire``: the
    dispatch-direction pair, the forward dispatch and the backward gradient into the expert outputs;
    None without) and its codec's encode and decode (0 without) -- each priced over the
    ``ep`` consecutive data-parallel replicas of each expert-parallel group (Megatron-Core's rank
    order: tensor, expert / data, pipeline) by the network's all-to-all (a node's NICs shared by its
    ranks, :mod:`perfsim.collectives`), the slowest group's (DeepSeek-V3, arXiv:2412.19437 Sec. 3.3)."""
    spec = workload.arch
    if strategy.ep == 1 or spec is None or not moe_blocks:
        return 0.0, None, 0.0, 0.0
    routing = Routing.of(strategy)
    tok, bpv = a2a_tokens(strategy, spec.seq_len), BYTES_PER_VALUE[strategy.precision]
    size = ep_alltoall_bytes(spec, tok, bpv, routing)
    full = _ep_alltoall_time(strategy, network, s, size, host_s, uniform)
    codec = getattr(strategy, "a2a_compress", "none")
    if codec == "none":
        return full, None, 0.0, 0.0
    check_a2a_gpu(codec, gpu)
    wire = a2a_wire_bytes(codec, spec, tok, bpv, routing)
    if codec == "fp8":  # a memory-bound cast: read the training dtype, write codes and scales (and back)
        enc = dec = copy_time(profile, (size + wire) / 2, gpu)
    else:  # the codec cost of the pipeline's activations: the profile's on its own device, else
        fp32 = 4 * size / bpv  # modelled on the GPU's (perfsim.engine.codec_cost)
        codecs = codec_costs(profile, gpu)[0]
        enc = codecs.encode_time(codec, fp32) if codecs is not None else 0.0
        dec = codecs.decode_time(codec, fp32) if codecs is not None else 0.0
    return full, _ep_alltoall_time(strategy, network, s, wire, host_s, uniform), enc, dec


def ep_stage_times(workload, strategy, network, s: int, moe_blocks: int, host_s: float = 0.0,
                   uniform: bool | None = None, profile=None, gpu=None, parts=None) -> tuple[float, float, float]:
    """(fwd s, bwd s, bytes one GPU sends) of the expert-parallel all-to-alls of ``moe_blocks``
    MoE blocks of pipeline device ``s`` for one micro-batch: per block a dispatch and a
    combine forward and their gradients backward (:func:`perfsim.models.moe.ep_alltoall_bytes`),
    each as :func:`ep_alltoall_parts` prices it (``parts``: its answer, if already asked); with full
    recomputation the forward's run again in the backward.

    ``strategy.a2a_compress`` (``fp8`` / ``directq:B``) sends the dispatch-direction pair
    (forward dispatch, backward gradient into the expert outputs) at the codec's wire size
    (:func:`perfsim.models.moe.a2a_wire_bytes`) plus an encode and a decode each, the combine
    pair at the training precision (DeepSeek-V3, arXiv:2412.19437 Sec. 3.3)."""
    ep, spec = strategy.ep, workload.arch
    if ep == 1 or spec is None or not moe_blocks:
        return 0.0, 0.0, 0.0
    full, wire, enc, dec = parts if parts is not None else ep_alltoall_parts(
        workload, strategy, network, s, moe_blocks, host_s, uniform, profile, gpu)
    tok, bpv = a2a_tokens(strategy, spec.seq_len), BYTES_PER_VALUE[strategy.precision]
    size = ep_alltoall_bytes(spec, tok, bpv, Routing.of(strategy))
    if wire is None:
        fwd = bwd = 2 * moe_blocks * full
        sent = 2 * moe_blocks * collective_cost("alltoall", size, ep)[0]
    else:
        wire_bytes = a2a_wire_bytes(strategy.a2a_compress, spec, tok, bpv, Routing.of(strategy))
        fwd = bwd = moe_blocks * (full + wire + enc + dec)
        sent = moe_blocks * (collective_cost("alltoall", size, ep)[0] + collective_cost("alltoall", wire_bytes, ep)[0])
    if strategy.recompute == "full":
        bwd += fwd
        sent *= 1.5
    return fwd, bwd, 2 * sent


def _ep_alltoall_time(strategy, network, s: int, size: float, host_s: float, uniform) -> float:
    """One token all-to-all of ``size`` bytes per rank on pipeline device ``s``: the slowest
    expert-parallel group's (:func:`ep_stage_times`)."""
    return max((max(host_s, network.collective_time("alltoall", size, members, lockstep=True))
                for members in replica_groups(strategy, network, s, strategy.ep, uniform)), default=0.0)


def replica_groups(strategy, network, s: int, size: int, uniform: bool | None = None):
    """The GPUs of each group of ``size`` consecutive replicas on pipeline device ``s``, one group
    per shape (:func:`_shape_key`: its collectives cost the same), for every tensor rank: an
    expert-parallel group (:func:`perfsim.models.moe.ep_replicas`) or a context-parallel one
    (:mod:`perfsim.engine.context_parallel`), both consecutive in Megatron-Core's rank order."""
    seen = set()
    for t in range(strategy.tp):
        for g in _alike(strategy, network, lambda q: strategy.device(t, q * size, s), strategy.replicas // size,
                        uniform):
            members = [strategy.device(t, r, s) for r in ep_replicas(size, g)]
            key = _shape_key(network, members)
            if key not in seen:  # priced through its shape only: once per shape
                seen.add(key)
                yield members
