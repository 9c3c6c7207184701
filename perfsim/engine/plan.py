"""From (workload, strategy, system, profile) to what each stage does and sends.

Everything the event loop needs is resolved here, once: per-stage compute,
the schedule table (stages = model chunks, each on its device), the EXACT wire
bytes of each boundary payload (asked from the compressor objects, never
re-derived here), encode/decode times (profile fits, plus the
host framing of each message, ``frame_send`` / ``frame_recv``, when calibrated), the
gradient buckets with their data-parallel collectives (the grad compressor's
``dp_plan``), and the optimizer step time.

Tensor parallelism (``Strategy.tp``): each stage is a group of ``tp`` GPUs
(placed by :meth:`perfsim.config.Strategy.device`); a stage's per-micro-batch
time adds its layers' Megatron collectives
(:func:`perfsim.models.tensor_parallel.tp_layer_collectives`), timed by the
network on the group's own GPUs (:meth:`perfsim.network.Network.collective_time`,
the links the group uses), serial with compute as in Megatron-LM. Parameters,
gradients and boundary activations are per GPU: weights split ``t`` ways, the
activation sent between stages whole by every TP rank or ``1/t`` of it by each
(``Strategy.tp_send``: Megatron's scatter/gather of pipeline messages, Narayanan et
al. 2021, arXiv:2104.04473, Sec. 4.1, whose receivers then all-gather the slices:
charged before the receiving stage's compute; or sequence parallelism).

Precision: with 16-bit training the plain pipeline (``fp32``) and gradient
(``none``) specs send the training dtype itself (no codec call), as Megatron /
DeepSpeed do with fp16/bf16 tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from perfsim.collectives import tensor_call
from perfsim.compression import make_compressor, make_pipeline_pair
from perfsim.compression.base import ALLGATHER, ALLREDUCE, REDUCE_SCATTER, CommStep, numel_of
from perfsim.compression.spec import Spec
from perfsim.engine.compute import optimizer_time
from perfsim.engine.offload import offload_step_time
from perfsim.errors import ConfigError
from perfsim.hardware import BYTES_PER_VALUE, curve_for, host_link_Bps, value_precision
from perfsim.job import OPTIMIZERS
from perfsim.models.moe import (Routing, a2a_wire_bytes, check_a2a_gpu, ep_alltoall_bytes, ep_replicas, expert_layers,
                                expert_params_per_rank)
from perfsim.models.tensor_parallel import pipeline_send, tp_edge_collectives, tp_layer_collectives
from perfsim.network import collective_cost
from perfsim.schedules import with_comms
from perfsim.workload import partition

#: fallback optimizer / copy cost when the profile has none: the optimizer's fp32 step
#: traffic (Adam 28 bytes per parameter: read p, g, m, v; write p, m, v;
#: :meth:`perfsim.job.Optimizer.step_bytes`) at this memory bandwidth (bytes/s;
#: V100 HBM2, NVIDIA V100 datasheet)
FALLBACK_MEMORY_BPS = 900e9


@dataclass
class Bucket:
    """One gradient bucket of a stage (layers in reverse order, as DDP fills them)."""

    numel: int
    ready_fraction: float  # share of the last backward done when it is ready
    steps: list[CommStep]
    encode_s: float  # every encode the runtime performs for this bucket
    decode_s: float  # every decode (codec_passes)
    copy_s: float = 0.0  # flatten the gradients into the bucket and copy the result back
    #: the replicas that sync it: each with every ``stride``-th other (1: all ``dp`` replicas;
    #: ``ep``: the routed experts' expert-data-parallel group of ``dp / ep`` replicas,
    #: :func:`perfsim.models.moe.expert_dp_replicas`)
    stride: int = 1


@dataclass
class StagePlan:
    """What one pipeline stage (model chunk) computes and sends, per micro-batch."""

    index: int
    first_layer: int
    last_layer: int  # exclusive
    fwd_s: float
    bwd_s: float
    params: int
    out_shape: tuple[int, ...]  # boundary activation of one micro-batch
    fw_bytes: int = 0  # activation sent to the next stage
    fw_bytes_warmup: int = 0
    bw_bytes: int = 0  # activation gradient sent to the previous stage
    fw_encode_s: float = 0.0  # on this stage, before sending forward
    fw_decode_s: float = 0.0  # on the NEXT stage, before its forward
    bw_encode_s: float = 0.0
    bw_decode_s: float = 0.0  # on the PREVIOUS stage
    buckets: list[Bucket] = field(default_factory=list)
    optimizer_s: float = 0.0
    layer_bwd: list[float] = field(default_factory=list)
    fwd_tp_s: float = 0.0  # tensor-parallel collectives of one micro-batch's forward
    bwd_tp_s: float = 0.0  # ... and backward (with full recomputation: + the forward's)
    tp_bytes: float = 0.0  # bytes one GPU sends in them per micro-batch (fwd + bwd)
    #: expert-parallel all-to-alls of one micro-batch (fwd + bwd seconds, in fwd_tp_s /
    #: bwd_tp_s: serial with compute like the TP collectives) and the bytes one GPU sends
    ep_s: float = 0.0
    ep_bytes: float = 0.0
    wgrad_s: float = 0.0  # the weight-gradient part of bwd_s (a zero-bubble W action)
    device: int = 0  # the pipeline device this stage runs on
    compress: Spec | None = None  # pipeline spec of the boundary after this stage (perfsim.boundaries)
    whole_stage_measured: bool = False  # compute from a whole-stage record (perfsim calibrate --stages / --tp)
    unit_params: list[int] = field(default_factory=list)  # parameters of each layer (sharding unit)
    #: ZeRO-2/3 units with their per-micro-batch collectives (perfsim.engine.sharding); empty otherwise
    units: list = field(default_factory=list)


@dataclass
class Plan:
    stages: list[StagePlan]  # one per stage (model chunk), in model order
    pp: int  # pipeline devices
    dp: int
    num_microbatches: int
    micro_batch: int
    compress: Spec
    grad_compress: Spec
    fw_spec: str
    bw_spec: str
    has_warmup: bool
    overlap: bool = True
    tp: int = 1
    #: GPU index of (tensor rank, replica, stage) -> perfsim.config.Strategy.device
    device: object = None
    #: 1-bit optimizer (``onebit-adam``/``onebit-lamb``): its uncompressed warm-up steps
    #: (0 otherwise) and the per-stage buckets of such a warm-up step
    onebit_warmup_steps: int = 0
    warmup_buckets: list[list[Bucket]] | None = None
    table: Any = None  # perfsim.schedules.Table
    #: bytes per rank of the tied embedding's gradient that the first and the last
    #: stage all-reduce after the data-parallel sync (``Strategy.tied_embedding``
    #: ``sync``; 0: none)
    tied_sync_bytes: int = 0
    #: ZeRO stage and FSDP2's reshard_after_forward (perfsim.engine.sharding)
    zero: int = 0
    reshard_after_forward: bool = True
    #: ZeRO-2/3's collectives block the training thread (a CPU profile: perfsim.engine.sharding.host_driven)
    shard_host_driven: bool = False
    #: 1-bit optimizer's variance refreshes (``onebit-adam:refresh=K``, 0: none): the
    #: steps of 0/1 Adam's schedule after the warm-up, each priced as a warm-up step
    #: (perfsim.compression.refresh.uncompressed_steps)
    onebit_refresh: int = 0
    #: what a host-driven ZeRO-3 plan priced for FSDP2's own host time (perfsim.engine.sharding.fsdp_host_note)
    shard_host_note: str = ""

    @cached_property
    def comm_rows(self) -> list[list]:
        """The table's rows with explicit communication (:func:`perfsim.schedules.with_comms`)."""
        return with_comms(self.table)


def weight_grad_share(layer, tokens: int) -> float:
    """Share of a layer's backward that is weight-gradient work (ZB's W).

    Each weight matrix costs the same multiply-adds for the input gradient and
    for the weight gradient, as in its forward (Qi et al., "Zero Bubble Pipeline
    Parallelism", arXiv:2401.10241, Table 1: a transformer layer's W is 24bsh^2 of
    its 48bsh^2 + 8bs^2h backward). With the forward's ``flops_fwd`` and 2
    FLOPs per parameter and token, W = 2 * params * tokens of the backward's
    2 * flops_fwd; layers without FLOPs split evenly."""
    if layer.flops_fwd <= 0:
        return 0.5
    return min(1.0, layer.params * tokens / layer.flops_fwd)


def _grad_steps(comp, layers, dp: int) -> list[CommStep]:
    """The collectives of one bucket. Compressors that work per matrix (PowerSGD's
    ``matrix_plan``) see each parameter tensor of a layer where the model lists them
    (``LayerSpec.tensors``: an MLP's weight matrix and bias vector), else the layer's
    gradient as one (hidden, rest) matrix -- the last boundary dimension as rows, an
    approximation of its weight matrices. As torch's ``powerSGD_hook`` does, the
    tensors it leaves uncompressed (vectors, too small to pay) go in one fp32
    allreduce first, then all P's in one allreduce, then all Q's.
    Others see the flattened bucket, as DDP hands it to a comm hook."""
    if not hasattr(comp, "matrix_plan"):
        return list(comp.dp_plan((sum(layer.params for layer in layers),), dp))
    first: list[CommStep] = []  # the uncompressed allreduce
    merged: list[CommStep] = []  # P's, Q's
    for layer in layers:
        rows = layer.out_shape[-1]
        shapes = layer.tensors or [
            (rows, layer.params // rows) if layer.params % rows == 0 and layer.params >= rows else (layer.params,)]
        for shape in shapes:
            steps = comp.dp_plan(shape, dp)
            into = first if len(steps) == 1 else merged
            for i, st in enumerate(steps):
                if i < len(into) and into[i].kind == st.kind and into[i].reduce == st.reduce:
                    into[i] = CommStep(st.kind, into[i].nbytes + st.nbytes, st.reduce, st.label)
                else:
                    into.append(st)
    return first + merged


def native_specs(strategy) -> tuple[Spec, Spec, bool, bool]:
    """(pipeline spec, gradient spec, pipeline native, gradients native): the plain
    specs become the training dtype under 16-bit precision (no codec cost); the
    gradients' dtype is :attr:`perfsim.config.Strategy.grad_dtype` (fp32 in Megatron's
    bf16 buffer)."""
    values = value_precision(strategy.precision)  # fp8 training sends bf16 values
    half = values if values in ("fp16", "bf16") else None
    grad_half = strategy.grad_dtype if strategy.grad_dtype in ("fp16", "bf16") else None
    compress, grad = strategy.compress, strategy.grad_compress
    fw_native = half is not None and compress.plain
    grad_native = grad_half is not None and grad.plain
    return (_cast(half, "pipeline") if fw_native else compress), (_cast(grad_half, "grad") if grad_native else grad), \
        fw_native, grad_native


def _cast(dtype: str, role: str) -> Spec:
    """The plain cast to the training dtype (``fp16`` / ``bf16``) as a spec value."""
    return Spec(dtype, "pipeline" if role == "pipeline" else "compressor", (), role)


def tp_stage_times(workload, strategy, network, s: int, blocks: int, embed: bool = False,
                   head: bool = False, measured_kinds: bool = True, host_s: float = 0.0,
                   uniform: bool | None = None) -> tuple[float, float, float]:
    """(fwd s, bwd s, bytes) of the tensor-parallel collectives of ``blocks`` layers of
    stage ``s`` (and of its embedding / LM head under sequence parallelism,
    :func:`perfsim.models.tensor_parallel.tp_edge_collectives`) for one micro-batch,
    on the slowest of the stage's TP groups. ``measured_kinds``: the profile's backend
    is the run's, so its measured collective kinds price them (not with a GPU preset
    beside a profile measured elsewhere). ``host_s``: the least one collective costs (a
    GPU curve's ``collective_s``, the host's time to issue it). ``uniform``: the
    network's :func:`uniform_network` (None: asked here)."""
    tp, spec = strategy.tp, workload.arch
    if tp == 1 or spec is None or (blocks == 0 and not embed and not head):
        return 0.0, 0.0, 0.0
    shape = (spec.hidden, spec.seq_len, strategy.micro_batch, tp, strategy.sequence_parallel,
             BYTES_PER_VALUE[strategy.precision])
    # (collectives, times issued per micro-batch): every block's, then the stage's edges
    parts = [(tp_layer_collectives(*shape, spec.parallel_block), blocks),
             (tp_edge_collectives(*shape, embed, head), 1)]
    reps = _alike(strategy, network, lambda r: strategy.device(0, r, s), strategy.dp, uniform)
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
        seen[key] = tuple(sum(times * max(host_s, network.collective_time(
                                  k, n, members, lockstep=True, call=tensor_call(k) if measured_kinds else None))
                              for coll, times in parts for ph, k, n in coll if ph == phase)
                          for phase in ("fwd", "bwd"))
    fwd = max(v[0] for v in seen.values())
    bwd = max(v[1] for v in seen.values())
    nbytes = sum(times * collective_cost(k, n, tp)[0] for coll, times in parts for _, k, n in coll)
    if strategy.recompute == "full":  # the recomputed forward runs its collectives again
        bwd += fwd
        nbytes += sum(times * collective_cost(k, n, tp)[0] for coll, times in parts for ph, k, n in coll
                      if ph == "fwd")
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
    b = strategy.device(0, 1, 0) - o if strategy.dp > 1 else 0
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


def ep_stage_times(workload, strategy, network, s: int, moe_blocks: int, host_s: float = 0.0,
                   uniform: bool | None = None, profile=None, gpu=None) -> tuple[float, float, float]:
    """(fwd s, bwd s, bytes one GPU sends) of the expert-parallel all-to-alls of ``moe_blocks``
    MoE blocks of pipeline device ``s`` for one micro-batch: per block a dispatch and a
    combine forward and their gradients backward (:func:`perfsim.models.moe.ep_alltoall_bytes`),
    over the ``ep`` consecutive data-parallel replicas of each expert-parallel group
    (Megatron-Core's rank order: tensor, expert / data, pipeline), priced by the network's
    all-to-all (a node's NICs shared by its ranks, :mod:`perfsim.collectives`), the slowest
    group's; with full recomputation the forward's run again in the backward.

    ``strategy.a2a_compress`` (``fp8`` / ``directq:B``) sends the dispatch-direction pair
    (forward dispatch, backward gradient into the expert outputs) at the codec's wire size
    (:func:`perfsim.models.moe.a2a_wire_bytes`) plus an encode and a decode each, the combine
    pair at the training precision (DeepSeek-V3, arXiv:2412.19437 Sec. 3.3)."""
    ep, spec = strategy.ep, workload.arch
    if ep == 1 or spec is None or not moe_blocks:
        return 0.0, 0.0, 0.0
    routing = Routing.of(strategy)
    tok, bpv = strategy.micro_batch * spec.seq_len, BYTES_PER_VALUE[strategy.precision]
    size = ep_alltoall_bytes(spec, tok, bpv, routing)
    codec = getattr(strategy, "a2a_compress", "none")
    if codec == "none":
        one = _ep_alltoall_time(strategy, network, s, size, host_s, uniform)
        fwd = bwd = 2 * moe_blocks * one
        sent = 2 * moe_blocks * collective_cost("alltoall", size, ep)[0]
    else:
        check_a2a_gpu(codec, gpu)
        wire = a2a_wire_bytes(codec, spec, tok, bpv, routing)
        if codec == "fp8":  # a memory-bound cast: read the training dtype, write codes and scales (and back)
            enc = dec = copy_time(profile, (size + wire) / 2, gpu)
        else:  # the codec cost model of the pipeline's activations (Profile.encode_time / decode_time)
            fp32 = 4 * size / bpv
            enc = profile.encode_time(codec, fp32) if profile is not None else 0.0
            dec = profile.decode_time(codec, fp32) if profile is not None else 0.0
        one = (_ep_alltoall_time(strategy, network, s, size, host_s, uniform)
               + _ep_alltoall_time(strategy, network, s, wire, host_s, uniform) + enc + dec)
        fwd = bwd = moe_blocks * one
        sent = moe_blocks * (collective_cost("alltoall", size, ep)[0] + collective_cost("alltoall", wire, ep)[0])
    if strategy.recompute == "full":
        bwd += fwd
        sent *= 1.5
    return fwd, bwd, 2 * sent


def _ep_alltoall_time(strategy, network, s: int, size: float, host_s: float, uniform) -> float:
    """One token all-to-all of ``size`` bytes per rank on pipeline device ``s``: the slowest
    expert-parallel group's (:func:`ep_stage_times`)."""
    ep = strategy.ep
    one = 0.0
    seen = set()
    for t in range(strategy.tp):
        for g in _alike(strategy, network, lambda q: strategy.device(t, q * ep, s), strategy.dp // ep, uniform):
            members = [strategy.device(t, r, s) for r in ep_replicas(ep, g)]
            key = _shape_key(network, members)
            if key in seen:  # priced through its shape only: once per shape
                continue
            seen.add(key)
            one = max(one, max(host_s, network.collective_time("alltoall", size, members, lockstep=True)))
    return one


def build_plan(workload, strategy, profile, network=None, gpu=None, host_overhead_s: float | None = None,
               compute_only: bool = False, compute: Plan | None = None, sync: Plan | None = None) -> Plan:
    """Resolve every per-stage cost (see module docstring). ``network`` times the
    tensor-parallel collectives; ``gpu`` (a perfsim.hardware.GPU) the optimizer step
    when the profile has none for this precision; ``host_overhead_s``: the host time
    per operator that replaces the GPU curve's (``System.host_overhead_s``).
    ``compute_only``: each stage's compute, tensor- and expert-parallel collectives and
    parameters only (what the planner's bounds and the memory check read), without
    the boundaries' wire bytes, the gradient buckets and the optimizer step.
    ``compute``: a plan of the same job but for its compression (which changes no
    stage's compute), whose per-stage compute and collectives are taken as they are
    (the planner prices a group's compressions from one resolution), its partition too.
    ``sync``: a plan of the same job and gradient compression (its pipeline compression
    may differ: that changes no gradient), whose gradient buckets, ZeRO units, 1-bit
    warm-up buckets and optimizer steps are taken as they are."""
    check_a2a_gpu(getattr(strategy, "a2a_compress", "none"), gpu)
    pp, dp, mb, tp = strategy.pp, strategy.dp, strategy.micro_batch, strategy.tp
    table = strategy.table()
    nst, where_dev = table.num_stages, table.stage_device
    costs = [f + b for f, b in zip(workload.fwd_s, workload.bwd_s)]
    bounds = (partition(costs, nst, strategy.partition) if compute is None
              else [(c.first_layer, c.last_layer) for c in compute.stages])
    fw_spec_in, grad_spec, fw_native, grad_native = native_specs(strategy)
    fw_half = value_precision(strategy.precision)  # the dtype a plain boundary sends under 16-bit training
    fw_half = fw_half if fw_half in ("fp16", "bf16") else None
    default_fw, default_bw = make_pipeline_pair(fw_spec_in)
    per_boundary = strategy.boundary_compress
    pairs = {strategy.compress: (default_fw, default_bw, fw_native)}  # one pair per distinct spec
    onebit = strategy.grad_compress.family == "optimizer"
    # built (so validated) even when dp == 1: Spec.compressor -- fp32 for none, and the
    # onebit compressor with which a 1-bit optimizer's compressed stage averages momentum
    grad_comp = make_compressor(grad_spec)
    rank_layers = [replace(layer, params=workload.params_of(i)) for i, layer in enumerate(workload.layers)]
    warm_buckets: list[list[Bucket]] = []
    stages: list[StagePlan] = []
    curve = None  # a GPU's curve: host times per pipeline message and per TP collective
    if gpu is not None:
        curve = curve_for(gpu, host_overhead_s)[0]
    has_warmup = False
    uniform = uniform_network(network) if network is not None and tp * strategy.ep > 1 else None
    for s, (a, b) in enumerate(bounds):
        layers = rank_layers[a:b]
        out_shape = (mb, *layers[-1].out_shape)
        # what each TP rank sends (perfsim.models.tensor_parallel.pipeline_send): the whole
        # activation, or its 1/t slice (sequence parallelism; scatter/gather, then gathered)
        part, gather = pipeline_send(numel_of(out_shape), out_shape[-1], tp, strategy.sequence_parallel,
                                     strategy.tp_send)
        wire_shape = out_shape if part is None else (*out_shape[:-1], out_shape[-1] // tp) \
            if out_shape[-1] % tp == 0 else part
        # whole-stage records (of this tp degree): no recomputation, on the profile's own device
        measured = profile if gpu is None and strategy.recompute == "none" else None
        if compute is not None:  # the same job's compute, resolved before
            c = compute.stages[s]
            fwd_s, bwd_s, layer_bwd, whole = c.fwd_s, c.bwd_s, list(c.layer_bwd), c.whole_stage_measured
        else:
            fwd_s, bwd_s, layer_bwd, whole = _stage_compute(workload, measured, s, a, b, nst, mb, tp,
                                                            strategy.sequence_parallel, strategy.schedule)
        params = sum(layer.params for layer in layers)
        synced = layers  # the layers whose gradients the data-parallel sync carries
        arch = workload.arch
        if arch is not None and pp > 1 and s == nst - 1 and arch.tied and not arch.encoder:
            # Megatron keeps a copy of the tied embedding: stepped, stored and synced with the head
            copy = -(-arch.vocab * arch.hidden // tp)
            params += copy
            synced = [*layers[:-1], replace(layers[-1], params=layers[-1].params + copy)]
        if strategy.ep > 1:  # the experts leave the dense sync (ep == dp: alone with them; ep < dp: expert_buckets)
            synced = [replace(layer, params=layer.params - expert_params_per_rank(arch, tp, strategy.ep,
                                                                                  int(layer.name[5:])))
                      if layer.name.startswith("block") else layer for layer in synced]
        st = StagePlan(s, a, b, fwd_s, bwd_s, params, out_shape, layer_bwd=layer_bwd, device=where_dev[s],
                       whole_stage_measured=whole, unit_params=[layer.params for layer in synced])
        tokens = workload.tokens_per_sample
        st.wgrad_s = sum(t * weight_grad_share(layer, tokens) for t, layer in zip(layer_bwd, layers))
        if compute is not None:
            c = compute.stages[s]
            st.fwd_tp_s, st.bwd_tp_s, st.tp_bytes, st.ep_s, st.ep_bytes = (c.fwd_tp_s, c.bwd_tp_s, c.tp_bytes,
                                                                           c.ep_s, c.ep_bytes)
        elif network is not None:
            blocks = sum(1 for layer in layers if layer.name.startswith("block"))
            names = {layer.name for layer in layers}
            st.fwd_tp_s, st.bwd_tp_s, st.tp_bytes = tp_stage_times(workload, strategy, network, where_dev[s], blocks,
                                                                   "embed" in names, "head" in names,
                                                                   measured_kinds=gpu is None,
                                                                   host_s=curve.collective_s if curve else 0.0,
                                                                   uniform=uniform)
            if strategy.ep > 1:  # the experts' token all-to-alls, serial with compute as the TP collectives
                moe_blocks = sum(1 for layer in layers if layer.name.startswith("block")
                                 and arch.is_moe_block(int(layer.name[5:])))
                ef, eb, st.ep_bytes = ep_stage_times(workload, strategy, network, where_dev[s], moe_blocks,
                                                     host_s=curve.collective_s if curve else 0.0,
                                                     uniform=uniform, profile=profile, gpu=gpu)
                st.fwd_tp_s, st.bwd_tp_s, st.ep_s = st.fwd_tp_s + ef, st.bwd_tp_s + eb, ef + eb
        if compute_only:
            stages.append(st)
            continue
        # a boundary inside one device is a local hand-off: no message, no codec
        if s < nst - 1 and where_dev[s + 1] != where_dev[s]:
            nbytes_fp32 = 4 * numel_of(wire_shape)
            spec_s = per_boundary.get(s, strategy.compress)
            if spec_s not in pairs:  # fp32 under 16-bit training sends the training dtype
                native = fw_half is not None and spec_s.plain
                pairs[spec_s] = (*make_pipeline_pair(_cast(fw_half, "pipeline") if native else spec_s), native)
            fw_comp, bw_comp, fw_native = pairs[spec_s]
            st.compress = spec_s
            st.fw_bytes = int(fw_comp.wire_bytes(wire_shape))
            st.fw_bytes_warmup = int(fw_comp.wire_bytes(wire_shape, warmup=True))
            st.bw_bytes = int(bw_comp.wire_bytes(wire_shape))
            has_warmup |= st.fw_bytes_warmup != st.fw_bytes
            fw_spec, bw_spec = fw_comp.spec or fw_comp.name, bw_comp.spec or bw_comp.name
            if not fw_native:
                where = (wire_shape, workload.model)  # in-situ boundary points, when calibrated
                st.fw_encode_s = profile.encode_time(fw_spec, nbytes_fp32, *where)
                st.fw_decode_s = profile.decode_time(fw_spec, nbytes_fp32, *where)
                st.bw_encode_s = profile.encode_time(bw_spec, nbytes_fp32, *where)
                st.bw_decode_s = profile.decode_time(bw_spec, nbytes_fp32, *where)
            if gather and network is not None:  # the receivers all-gather the slices over their fabric
                members = [strategy.device(t, 0, where_dev[s]) for t in range(tp)]
                g = network.collective_time("allgather", numel_of(wire_shape) * BYTES_PER_VALUE[strategy.precision],
                                            members, lockstep=True)
                st.fw_decode_s += max(g, curve.collective_s if curve else 0.0)
                st.bw_decode_s += max(g, curve.collective_s if curve else 0.0)
            if curve is not None:  # the host side of each message on a GPU (its curve), serial with the codec
                host = curve.p2p_s
                st.fw_encode_s += host
                st.fw_decode_s += host
                st.bw_encode_s += host
                st.bw_decode_s += host
            elif profile is not None:  # the host side of each message (framing), serial with the codec
                st.fw_encode_s += profile.framing_time("send", st.fw_bytes)
                st.fw_decode_s += profile.framing_time("recv", st.fw_bytes)
                st.bw_encode_s += profile.framing_time("send", st.bw_bytes)
                st.bw_decode_s += profile.framing_time("recv", st.bw_bytes)
        if sync is not None:  # the same job's gradient sync, resolved before
            c = sync.stages[s]
            st.buckets, st.units, st.optimizer_s = c.buckets, c.units, c.optimizer_s
            stages.append(st)
            continue
        if dp > 1 and onebit and strategy.zero >= 2:
            raise ConfigError(f"grad_compress {strategy.grad_compress.text!r}: cannot reduce-scatter ZeRO-{strategy.zero} "
                              f"gradients: a 1-bit optimizer exchanges the whole momentum after the backward")
        if dp > 1 and onebit:
            # the optimizer step fuses every gradient (warm-up: fp32 allreduce) or momentum
            # (then: the 3-phase 1-bit allreduce) of the stage into ONE buffer after the
            # backward (perfsim.runtime.onebit_optim; Li et al., "1-bit LAMB: Communication
            # Efficient Large-Scale Large-Batch Training with LAMB's Convergence Speed",
            # arXiv:2104.06069, Sec. 4.2)
            fused = 4 * max(1, st.params)
            st.buckets = _buckets(synced, [0.0] * len(layers), fused, grad_comp, dp, profile, gpu=gpu)
            warm_buckets.append(_buckets(synced, [0.0] * len(layers), fused, make_compressor("fp32"), dp,
                                         profile, gpu=gpu))
        elif dp > 1 and strategy.zero >= 2:
            _sharded(st, synced, workload, strategy, grad_comp, grad_spec, grad_native, profile, gpu)
        elif dp > 1:
            st.buckets = _buckets(synced, st.layer_bwd, strategy.bucket_bytes, grad_comp, dp, profile,
                                  native=grad_native, gpu=gpu, copies=strategy.grad_buffer == "bucketed",
                                  zero_param_bytes=BYTES_PER_VALUE[strategy.precision] if strategy.zero else 0)
            if 1 < strategy.ep < dp:  # the routed experts' gradients over their expert-data-parallel group
                st.buckets = expert_buckets(st.buckets, layers, st.layer_bwd, arch, strategy, grad_comp, profile,
                                            grad_native, gpu)
        if strategy.offload == "optimizer":  # the step on the host (perfsim.engine.offload)
            st.optimizer_s = _offloaded(strategy, network, gpu, st)
        else:
            st.optimizer_s = _optimizer(workload, strategy, profile, gpu, s, a, b, st.params, curve)
        stages.append(st)
    warm_steps = 0
    if onebit and dp > 1:  # the runtime's warm-up setting (spec's warmup=N, else perfsim.ddp's default)
        warm_steps = strategy.grad_compress.warmup_steps()
    if sync is not None:
        warm_buckets = sync.warmup_buckets or []
    from perfsim.engine.sharding import fsdp_host_note, host_driven  # lazy: simpy stays out of perfsim memory

    hosted = dp > 1 and strategy.zero >= 2 and host_driven(profile, gpu)
    return Plan(stages, pp, dp, strategy.num_microbatches, mb, strategy.compress, grad_spec,
                default_fw.spec or default_fw.name, default_bw.spec or default_bw.name, has_warmup,
                strategy.overlap_grad_sync and not onebit, tp, strategy.device, warm_steps,
                warm_buckets if warm_steps else None, table, tied_sync_bytes(workload, strategy, table),
                strategy.zero, strategy.reshard_after_forward, hosted,
                (strategy.grad_compress.refresh or 0) if warm_steps else 0,
                fsdp_host_note(profile) if hosted and strategy.zero >= 3 else "")


def _sharded(st: StagePlan, layers, workload, strategy, comp, grad_spec: Spec, native: bool, profile,
             gpu=None) -> None:
    """ZeRO-2/3 collectives of stage ``st`` (:mod:`perfsim.engine.sharding`): its units'
    per-micro-batch reduce-scatters (and ZeRO-3 all-gathers); ZeRO-2 gathers the updated
    weights after the last backward, one bucket of the stage. Host-driven collectives (a
    CPU profile) add FSDP2's copies around each (:func:`~perfsim.engine.sharding.add_host_copies`)
    and, under ZeRO-3, its own host time (:func:`~perfsim.engine.sharding.add_fsdp_host`)."""
    from perfsim.engine.sharding import (add_fsdp_host, add_host_copies, host_driven, param_gather_steps,  # lazy: simpy
                                         shard_units)  # stays out of perfsim memory

    dp, wb = strategy.dp, BYTES_PER_VALUE[strategy.precision]
    plain = grad_spec.plain or native
    codec = None if plain or profile is None else (
        lambda spec, steps, nbytes: sum(bucket_codec_times(profile, spec, steps, dp, nbytes)))
    a = st.first_layer
    fwd = list(workload.fwd_s[a:st.last_layer])
    scale = st.fwd_s / sum(fwd) if sum(fwd) > 0 else 1.0  # a whole-stage measurement keeps the proportions
    st.units = shard_units(layers, [f * scale for f in fwd], st.layer_bwd, comp, dp, strategy.zero, wb, codec)
    if host_driven(profile, gpu):
        add_host_copies(st.units, wb, dp, lambda nbytes: copy_time(profile, nbytes))
        if strategy.zero >= 3:  # FSDP2's own hooks and bookkeeping per unit
            add_fsdp_host(st.units, profile)
    if strategy.zero == 2:
        st.buckets = [Bucket(st.params, 1.0, param_gather_steps(st.params, wb, dp), 0.0, 0.0)]


def tied_sync_bytes(workload, strategy, table) -> int:
    """Bytes per tensor rank of the embedding gradient that Megatron-LM all-reduces
    between the first and the last pipeline stage when the LM head is tied to the
    embedding and they live on different devices (``Strategy.tied_embedding``
    ``sync``): ``vocab / tp x hidden`` values in the gradient dtype
    (``Strategy.grad_dtype``, the main gradient the all-reduce runs on); for a workload
    file, its ``tied_values`` (execute mode's head: ``perfsim.runtime.tied``)."""
    arch = workload.arch
    if arch is not None:
        values = -(-arch.vocab * arch.hidden // strategy.tp) if arch.tied and not arch.encoder else 0
    else:
        values = workload.tied_values
    if (strategy.tied_embedding != "sync" or not values
            or table.stage_device[0] == table.stage_device[table.num_stages - 1]):
        return 0
    return values * BYTES_PER_VALUE[strategy.grad_dtype]


def _offloaded(strategy, network, gpu, st: StagePlan) -> float:
    """The offloaded optimizer step of one GPU of stage ``st``
    (:func:`perfsim.engine.offload.offload_step_time`): its host link is the GPU preset's PCIe,
    the host's Adam rate the system's, shared by the job's GPUs on one node."""
    if gpu is None:
        raise ConfigError(f"offload={strategy.offload!r}: needs a GPU preset (--gpu): the host copies "
                          "cross its PCIe link, and a CPU profile has no device memory to offload from")
    system = network.system if network is not None else None
    sharing = min(system.gpus_per_node, strategy.devices) if system is not None else 1
    return offload_step_time(st.params, BYTES_PER_VALUE[strategy.precision], strategy.dp, st.bwd_s,
                             strategy.num_microbatches, host_link_Bps(gpu),
                             system.cpu_adam_params_per_s if system else None, sharing)


def _optimizer(workload, strategy, profile, gpu, s, a, b, params, curve) -> float:
    """Optimizer step of one GPU of stage ``s``: the profile's measurement (fp32
    profile when no GPU preset is named), else the GPU's compute model, else the
    memory-bandwidth fallback; ``curve``: the GPU's (None without one). The job's
    optimizer (``strategy.optimizer``) is priced by the bytes its step moves
    (:meth:`perfsim.job.Optimizer.step_bytes`): a measurement of another optimizer (the
    profile's :meth:`~perfsim.profile.Profile.timed_optimizer`) is scaled by the ratio of
    their fp32 traffic (the step is memory-bound: SGD with momentum 20 / Adam's 28)."""
    opt = None
    shard = params / (strategy.dp if strategy.zero >= 1 else 1)
    moved = OPTIMIZERS[strategy.optimizer].step_bytes("fp32")
    if profile is not None and gpu is None:
        # the whole stage's step as a rank runs it, else the per-layer fit
        opt = (profile.stage_optimizer_measured(workload.model, s, a, b - 1, strategy.num_stages,
                                                strategy.schedule)
               if strategy.tp == 1 else None)
        if opt is None:
            opt = profile.optimizer_time(4 * shard)
        if opt is not None:
            opt *= moved / OPTIMIZERS[profile.timed_optimizer()].step_bytes("fp32")
    if opt is None and gpu is not None:
        opt = optimizer_time(int(shard), gpu, strategy.precision, curve, strategy.optimizer)
    return opt if opt is not None else moved * shard / FALLBACK_MEMORY_BPS


def _stage_compute(workload, profile, s: int, a: int, b: int, pp: int, mb: int, tp: int = 1,
                   sequence_parallel: bool = False, schedule: str | None = None
                   ) -> tuple[float, float, list[float], bool]:
    """Forward and backward seconds of stage ``s`` (layers ``a..b-1``) per micro-batch.

    A profile's whole-stage measurement of the same partition
    (:meth:`perfsim.profile.Profile.stage_measured`, ``perfsim calibrate --stages``)
    is preferred over the sum of per-layer records: it includes the per-call and
    autograd overheads between layers that timing layers one by one misses
    (docs/validation.md, "Measurement notes"); with tensor parallelism, a TP rank's
    measured compute (``perfsim calibrate --tp``) includes what the TP implementation
    adds per operator, which the split of single-rank layer times cannot know.
    The per-layer backward times are kept in proportion (they place the gradient
    buckets' ready times), scaled to the stage's measured total. The last item: whether
    a whole-stage measurement was used (forward or backward). ``schedule``: records
    timed under it win (an interleaved chunk or a split backward costs more per call)."""
    fwd = sum(workload.fwd_s[a:b])
    layer_bwd = list(workload.bwd_s[a:b])
    bwd = sum(layer_bwd)
    if profile is not None:
        f = profile.stage_measured(workload.model, s, a, b - 1, mb, "fwd", pp, tp, sequence_parallel, schedule)
        g = profile.stage_measured(workload.model, s, a, b - 1, mb, "bwd", pp, tp, sequence_parallel, schedule)
        if f is not None:
            fwd = f
        if g is not None:
            layer_bwd = [x * g / bwd for x in layer_bwd] if bwd > 0 else layer_bwd
            bwd = g
        return fwd, bwd, layer_bwd, f is not None or g is not None
    return fwd, bwd, layer_bwd, False


def _buckets(layers, layer_bwd, bucket_bytes, comp, dp, profile, native: bool = False, gpu=None,
             copies: bool = True, zero_param_bytes: int = 0) -> list[Bucket]:
    """Fill buckets from the last layer backwards (backward produces gradients in
    that order; PyTorch DDP's ``bucket_cap_mb``, Li et al., "PyTorch Distributed: Experiences on
    Accelerating Data Parallel Training", arXiv:2006.15704, Sec. 3.2.3). ``copies``:
    each bucket is copied in and out (:func:`copy_time`); not for a contiguous
    gradient buffer (``Strategy.grad_buffer``). ``zero_param_bytes``: bytes per
    parameter of the weights under ZeRO-1 (0: off), :func:`zero1_steps`."""
    total_bwd = sum(layer_bwd) or 1.0
    order = list(range(len(layers)))[::-1]
    buckets, current, done_bwd = [], [], 0.0
    spec = comp.spec or comp.name
    for i in order:
        current.append(layers[i])
        done_bwd += layer_bwd[i]
        size = 4 * sum(layer.params for layer in current)
        if size >= bucket_bytes or i == order[-1]:
            numel = size // 4
            if numel:
                try:
                    steps = _grad_steps(comp, current, dp)
                except (ValueError, TypeError, RuntimeError) as exc:  # cannot plan this shape
                    raise ConfigError(f"grad_compress {spec!r}: cannot plan a bucket of {numel} "
                                      f"elements ({exc})") from exc
                # uncompressed gradients go to the collective as they are (no codec call)
                plain = spec in ("fp32", "none") or native
                enc_s, dec_s = (0.0, 0.0) if plain else bucket_codec_times(profile, spec, steps, dp, 4 * numel)
                if zero_param_bytes:
                    steps = zero1_steps(steps, numel, zero_param_bytes, dp, reduce_scatter=plain and not copies)
                buckets.append(Bucket(numel, done_bwd / total_bwd if sum(layer_bwd) else 1.0, steps,
                                      enc_s, dec_s, 2 * copy_time(profile, 4 * numel, gpu) if copies else 0.0))
            current = []
    return buckets


def expert_buckets(dense: list[Bucket], layers, layer_bwd, arch, strategy, comp, profile, native: bool,
                   gpu=None) -> list[Bucket]:
    """A stage's buckets when expert parallelism is smaller than data parallelism: the
    dense ones (all ``dp`` replicas) and the routed experts' gradients, bucketed alike but
    all-reduced over their expert-data-parallel group only -- the ``dp / ep`` replicas
    holding the same experts (:func:`perfsim.models.moe.expert_dp_replicas`; Megatron-Core's
    expert data parallel group; DeepSpeed-MoE, Rajbhandari et al. 2022, arXiv:2201.05596,
    Sec. 5), ``experts / ep`` experts' parameters per rank
    (:func:`perfsim.models.moe.expert_params_per_rank`). Both on the stage's one sync stream,
    in the order they become ready (a tie: the dense one first)."""
    group = strategy.dp // strategy.ep
    moe = expert_layers(arch, layers, strategy.tp, strategy.ep)
    experts = _buckets(moe, layer_bwd, strategy.bucket_bytes, comp, group, profile, native=native, gpu=gpu,
                       copies=strategy.grad_buffer == "bucketed")
    return sorted(dense + [replace(b, stride=strategy.ep) for b in experts], key=lambda b: b.ready_fraction)


def zero1_steps(steps: list[CommStep], numel: int, param_bytes: int, dp: int, reduce_scatter: bool
                ) -> list[CommStep]:
    """A bucket's collectives under ZeRO-1 (Rajbhandari et al. 2020, arXiv:1910.02054,
    Sec. 5.1: each rank updates its ``1/dp`` of the parameters, then they are gathered):
    the gradient exchange, then an all-gather of the updated ``param_bytes``-per-value
    weights (each rank contributes its shard). ``reduce_scatter``: the plain
    all-reduce becomes a reduce-scatter, as in Megatron-LM's distributed optimizer
    over its contiguous buffer (``--use-distributed-optimizer``; PyTorch's
    ``ZeroRedundancyOptimizer`` beside DDP keeps the all-reduce). The gather is
    charged with the sync, before the step: the same total when not overlapped."""
    if reduce_scatter:
        steps = [CommStep(REDUCE_SCATTER, st.nbytes, st.reduce, st.label) if st.kind == ALLREDUCE else st
                 for st in steps]
    return [*steps, CommStep(ALLGATHER, -(-numel * param_bytes // dp), label="zero1 params")]


def bucket_codec_times(profile, spec: str, steps, dp: int, nbytes: float) -> tuple[float, float]:
    """(encode, decode) seconds of one bucket's exchange of ``nbytes`` of fp32 gradients:
    the compressor's own data-parallel path where the profile timed it
    (:meth:`perfsim.profile.Profile.dp_codec_time`: what ``allreduce_mean`` runs around
    its collectives, in concurrent processes), else :func:`codec_passes` full-bucket
    compress / decompress calls."""
    enc, dec = profile.dp_codec_time("encode", spec, nbytes), profile.dp_codec_time("decode", spec, nbytes)
    if enc is not None and dec is not None:
        return enc, dec
    passes = codec_passes(steps, dp)
    return passes[0] * profile.encode_time(spec, nbytes), passes[1] * profile.decode_time(spec, nbytes)


def codec_passes(steps, dp: int) -> tuple[float, float]:
    """(encodes, decodes) of a whole bucket that the runtime performs per sync,
    counted in full-bucket passes (measured: tests/engine/test_fidelity.py counts the
    runtime's codec calls and the elements they touch).

    * 1-bit 3-phase allreduce (an alltoall then an allgather;
      :meth:`perfsim.compression.onebit.OneBit.allreduce_mean`): encode the bucket,
      decode the ``dp`` received chunks (one bucket), re-encode this rank's chunk
      (``1/dp`` of a bucket), decode the ``dp`` gathered chunks (one bucket): 1 + 1/dp
      encodes, 2 decodes;
    * an allgather of payloads (the compressor base class, QSGD, ECQ-SGD, DirectQ):
      one encode, one decode per gathered payload, this rank's included: ``dp``;
    * otherwise (allreduce of codes, MaxNorm family): one of each.
    """
    kinds = {st.kind for st in steps}
    if "alltoall" in kinds and "allgather" in kinds:
        return 1.0 + 1.0 / dp, 2.0
    if "allgather" in kinds:
        return 1.0, float(dp)
    return 1.0, 1.0


def copy_time(profile, nbytes: float, gpu=None) -> float:
    """One copy of ``nbytes`` (gradient bucketing: flatten into the bucket, copy the
    averaged bucket back; PyTorch DDP, arXiv:2006.15704 Sec. 3.2.3): with a GPU
    preset, read + write at its achieved memory bandwidth (its compute curve; a
    profile measured elsewhere does not apply); else the profile's measured fp32
    "codec" (a copy into a fresh buffer), else read + write at
    :data:`FALLBACK_MEMORY_BPS` (V100 HBM2, NVIDIA V100 datasheet: 900 GB/s)."""
    if gpu is not None:
        return 2.0 * nbytes / (gpu.memory_bandwidth_Bps * curve_for(gpu)[0].mem_eff)
    measured = profile.encode_time("fp32", nbytes) if profile is not None else 0.0
    return measured if measured > 0 else 2.0 * nbytes / FALLBACK_MEMORY_BPS


def system_slowdown(system, profile) -> float:
    """The slowdown the engine applies: ``System.comm_slowdown`` when given, else the
    profile's measurement for the system's link (:func:`comm_slowdown`)."""
    if system.comm_slowdown is not None:
        return system.comm_slowdown
    return comm_slowdown(profile, system.bandwidth_bps)


def comm_slowdown(profile, link_bps: float | None = None) -> float:
    """Compute slowdown while communication overlaps it: the profile's compute time
    under concurrent allreduces over its time alone, minus one (``perfsim calibrate``
    op ``interference``, :mod:`perfsim.calibrate.interference`); 0 when not measured.

    Traffic over a shaped link can cost the host more than over loopback (the kernel's
    veth / qdisc path runs on the same cores), so records measured over an emulated link
    (``perfsim calibrate --emulate-ops ...,interference``) win: those of the rate nearest
    ``link_bps`` in log scale; else the loopback pair (before, a profile with both used
    whichever came last)."""
    if profile is None:
        return 0.0
    pairs: dict[float | None, dict[str, float]] = {}
    for r in profile.records:
        if r.get("op") == "interference":
            rate = r.get("emulated_bandwidth_bps")
            pairs.setdefault(float(rate) if rate else None, {})[str(r["name"]).rsplit(" ", 1)[-1]] = float(r["time_s"])
    rates = [k for k, v in pairs.items() if k is not None and v.get("alone", 0) > 0 and "allreduce" in v]
    key = None
    if rates:
        key = min(rates, key=lambda k: abs(math.log(k / link_bps))) if link_bps and link_bps > 0 else max(rates)
    times = pairs.get(key, {})
    if times.get("alone", 0) > 0 and "allreduce" in times:
        return max(0.0, times["allreduce"] / times["alone"] - 1.0)
    return 0.0
