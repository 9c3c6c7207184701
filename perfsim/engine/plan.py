"""From (workload, strategy, system, profile) to what each stage does and sends.

Everything the event loop needs is resolved here, once: per-stage compute,
the schedule table (stages = model chunks, each on its device), the EXACT wire
bytes of each boundary payload (asked from the compressor objects, never
re-derived here), encode/decode times (profile fits, plus the
host framing of each message, ``frame_send`` / ``frame_recv``, when calibrated), the
gradient buckets with their data-parallel collectives (the grad compressor's
``dp_plan``; filled by :mod:`perfsim.engine.buckets`), and the optimizer step time.

Tensor parallelism (``Strategy.tp``): each stage is a group of ``tp`` GPUs
(placed by :meth:`perfsim.config.Strategy.device`); a stage's per-micro-batch
time adds its layers' Megatron collectives
(:func:`perfsim.models.tensor_parallel.tp_layer_collectives`), timed by the
network on the group's own GPUs (:meth:`perfsim.network.Network.collective_time`,
the links the group uses), serial with compute as in Megatron-LM
(:mod:`perfsim.engine.group_times`, with the expert-parallel all-to-alls). Parameters,
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

from perfsim.compression import make_compressor, make_pipeline_pair
from perfsim.compression.base import numel_of
from perfsim.compression.spec import Spec
from perfsim.engine.buckets import (FALLBACK_MEMORY_BPS, Bucket, _buckets, bucket_codec_times, copy_time,
                                    expert_buckets)
from perfsim.engine.codec_cost import codec_costs
from perfsim.engine.compute import moe_mlp_share, optimizer_time
from perfsim.engine.context_parallel import cp_stage_times
from perfsim.engine.ep_overlap import MoELayerTimes
from perfsim.engine.ep_overlap import savings as ep_savings
from perfsim.engine.group_times import ep_alltoall_parts, ep_stage_times, tp_stage_times, uniform_network
from perfsim.engine.layer_times import measured_shape
from perfsim.engine.offload import offload_step_time
from perfsim.errors import ConfigError
from perfsim.hardware import BYTES_PER_VALUE, curve_for, host_link_Bps, value_precision
from perfsim.job import OPTIMIZERS
from perfsim.link import records_of
from perfsim.models.moe import (Routing, check_a2a_gpu, expert_params_per_rank, optimizer_shard_params,
                                stage_expert_params)
from perfsim.models.specs import block_index, is_block
from perfsim.models.tensor_parallel import pipeline_send
from perfsim.partition import partition_with_tail
from perfsim.schedules import with_comms


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
    #: ``--ep-overlap``: one MoE block's halves and all-to-alls (perfsim.engine.ep_overlap.MoELayerTimes)
    moe_layer: Any = None

    @property
    def fwd_tp_min(self) -> float:
        """:attr:`fwd_tp_s` less every all-to-all ``--ep-overlap`` may hide of it: what a lower
        bound may charge (:mod:`perfsim.plan_bounds`)."""
        return self.fwd_tp_s - (self.moe_layer.blocks * self.moe_layer.comm_fwd if self.moe_layer else 0.0)

    @property
    def bwd_tp_min(self) -> float:
        """:attr:`bwd_tp_s` less every all-to-all ``--ep-overlap`` may hide of it."""
        return self.bwd_tp_s - (self.moe_layer.blocks * self.moe_layer.comm_bwd if self.moe_layer else 0.0)


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
    #: what priced the encodes and decodes (perfsim.engine.codec_cost.codec_costs)
    codec_model: str = ""
    #: ``--ep-overlap``: (stage, micro-batch, kind) -> seconds of its all-to-alls the action hides in a
    #: combined forward/backward pair (perfsim.engine.ep_overlap.savings); empty otherwise
    ep_savings: dict = field(default_factory=dict)

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
    workload = workload.context_rank(strategy.cp)  # one context-parallel rank's tokens (cp 1: itself)
    pp, dp, mb, tp = strategy.pp, strategy.replicas, strategy.micro_batch, strategy.tp
    table = strategy.table()
    nst, where_dev = table.num_stages, table.stage_device
    costs = [f + b for f, b in zip(workload.fwd_s, workload.bwd_s)]
    # a transformer's multi-token prediction modules stay with its head on the last stage
    tail = workload.arch.mtp_layers + 1 if workload.arch is not None else 1
    bounds = (partition_with_tail(costs, nst, strategy.partition, tail) if compute is None
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
    # encode / decode: the profile's records on its own device, else modelled on the GPU's
    codecs, codec_note = codec_costs(profile, gpu, host_overhead_s)
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
        if arch is not None and pp > 1 and s == nst - 1 and arch.last_stage_embedding:
            # Megatron keeps a copy of the embedding on the last stage: stepped, stored and synced with the head
            copy = -(-arch.vocab * arch.hidden // tp)
            params += copy
            synced = [*layers[:-1], replace(layers[-1], params=layers[-1].params + copy)]
        if strategy.ep > 1:  # the experts leave the dense sync (ep == dp: alone with them; ep < dp: expert_buckets)
            synced = [replace(layer, params=layer.params - expert_params_per_rank(arch, tp, strategy.ep,
                                                                                  block_index(layer.name)))
                      if is_block(layer.name) else layer for layer in synced]
        st = StagePlan(s, a, b, fwd_s, bwd_s, params, out_shape, layer_bwd=layer_bwd, device=where_dev[s],
                       whole_stage_measured=whole, unit_params=[layer.params for layer in synced])
        tokens = workload.tokens_per_sample
        st.wgrad_s = sum(t * weight_grad_share(layer, tokens) for t, layer in zip(layer_bwd, layers))
        if compute is not None:
            c = compute.stages[s]
            st.fwd_tp_s, st.bwd_tp_s, st.tp_bytes, st.ep_s, st.ep_bytes = (c.fwd_tp_s, c.bwd_tp_s, c.tp_bytes,
                                                                           c.ep_s, c.ep_bytes)
            st.moe_layer = c.moe_layer
        elif network is not None:
            blocks = sum(1 for layer in layers if is_block(layer.name))
            names = {layer.name for layer in layers}
            moe_blocks = sum(1 for layer in layers if is_block(layer.name)
                             and arch.is_moe_block(block_index(layer.name))) if strategy.ep > 1 else 0
            st.fwd_tp_s, st.bwd_tp_s, st.tp_bytes = tp_stage_times(workload, strategy, network, where_dev[s], blocks,
                                                                   "embed" in names, "head" in names,
                                                                   measured_kinds=gpu is None,
                                                                   host_s=curve.collective_s if curve else 0.0,
                                                                   uniform=uniform, moe_blocks=moe_blocks,
                                                                   vocab_parallel=gpu is not None,
                                                                   mtp=sum(1 for n in names if n.startswith("mtp")),
                                                                   block_ids=tuple(block_index(layer.name)
                                                                                   for layer in layers
                                                                                   if is_block(layer.name)))
            if strategy.cp > 1:  # the context-parallel ring's exchanges the attention does not hide
                cf, cb, cbytes = cp_stage_times(workload, strategy, network, where_dev[s], blocks, gpu,
                                                host_s=curve.collective_s if curve else 0.0,
                                                block_ids=tuple(block_index(layer.name) for layer in layers
                                                                if is_block(layer.name)))
                st.fwd_tp_s, st.bwd_tp_s, st.tp_bytes = st.fwd_tp_s + cf, st.bwd_tp_s + cb, st.tp_bytes + cbytes
            if strategy.ep > 1:  # the experts' token all-to-alls, serial with compute as the TP collectives
                parts = ep_alltoall_parts(workload, strategy, network, where_dev[s], moe_blocks,
                                          host_s=curve.collective_s if curve else 0.0, uniform=uniform,
                                          profile=profile, gpu=gpu)
                ef, eb, st.ep_bytes = ep_stage_times(workload, strategy, network, where_dev[s], moe_blocks,
                                                     parts=parts)
                st.fwd_tp_s, st.bwd_tp_s, st.ep_s = st.fwd_tp_s + ef, st.bwd_tp_s + eb, ef + eb
                if getattr(strategy, "ep_overlap", False) and moe_blocks:
                    st.moe_layer = _moe_layer(workload, strategy, gpu, curve, a, b, parts, moe_blocks)
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
                st.fw_encode_s = codecs.encode_time(fw_spec, nbytes_fp32, *where)
                st.fw_decode_s = codecs.decode_time(fw_spec, nbytes_fp32, *where)
                st.bw_encode_s = codecs.encode_time(bw_spec, nbytes_fp32, *where)
                st.bw_decode_s = codecs.decode_time(bw_spec, nbytes_fp32, *where)
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
            st.buckets = _buckets(synced, [0.0] * len(layers), fused, grad_comp, dp, profile, gpu=gpu,
                                  codecs=codecs)
            warm_buckets.append(_buckets(synced, [0.0] * len(layers), fused, make_compressor("fp32"), dp,
                                         profile, gpu=gpu, codecs=codecs))
        elif dp > 1 and strategy.zero >= 2:
            _sharded(st, synced, workload, strategy, grad_comp, grad_spec, grad_native, profile, gpu, codecs)
        elif dp > 1:
            st.buckets = _buckets(synced, st.layer_bwd, strategy.bucket_bytes, grad_comp, dp, profile,
                                  native=grad_native, gpu=gpu, copies=strategy.grad_buffer == "bucketed",
                                  zero_param_bytes=BYTES_PER_VALUE[strategy.precision] if strategy.zero else 0,
                                  codecs=codecs)
            if 1 < strategy.ep < dp:  # the routed experts' gradients over their expert-data-parallel group
                st.buckets = expert_buckets(st.buckets, layers, st.layer_bwd, arch, strategy, grad_comp, profile,
                                            grad_native, gpu, codecs)
        if strategy.offload == "optimizer":  # the step on the host (perfsim.engine.offload)
            st.optimizer_s = _offloaded(strategy, network, gpu, st)
        else:
            experts = stage_expert_params(arch, tp, strategy.ep, [block_index(layer.name) for layer in layers
                                                                  if is_block(layer.name)])
            st.optimizer_s = _optimizer(workload, strategy, profile, gpu, s, a, b,
                                        optimizer_shard_params(params, experts, dp, strategy.ep, strategy.zero),
                                        curve)
        stages.append(st)
    warm_steps = 0
    if onebit and dp > 1:  # the runtime's warm-up setting (spec's warmup=N, else perfsim.ddp's default)
        warm_steps = strategy.grad_compress.warmup_steps()
    if sync is not None:
        warm_buckets = sync.warmup_buckets or []
    from perfsim.engine.sharding import fsdp_host_note, host_driven  # lazy: simpy stays out of perfsim memory

    hosted = dp > 1 and strategy.zero >= 2 and host_driven(profile, gpu)
    plan = Plan(stages, pp, dp, strategy.num_microbatches, mb, strategy.compress, grad_spec,
                default_fw.spec or default_fw.name, default_bw.spec or default_bw.name, has_warmup,
                strategy.overlap_grad_sync and not onebit, tp, strategy.device, warm_steps,
                warm_buckets if warm_steps else None, table, tied_sync_bytes(workload, strategy, table),
                strategy.zero, strategy.reshard_after_forward, hosted,
                (strategy.grad_compress.refresh or 0) if warm_steps else 0,
                fsdp_host_note(profile) if hosted and strategy.zero >= 3 else "", codec_note)
    if getattr(strategy, "ep_overlap", False):
        plan.ep_savings = ep_savings(table, [st.moe_layer for st in stages])
    return plan


def _moe_layer(workload, strategy, gpu, curve, a: int, b: int, parts, blocks: int) -> MoELayerTimes:
    """One MoE block of the stage holding layers ``a:b`` for ``--ep-overlap``: its time split into
    its attention and MLP halves (:func:`perfsim.engine.compute.moe_mlp_share`) and its all-to-alls
    (``parts``: :func:`perfsim.engine.group_times.ep_alltoall_parts`, one at the training precision,
    one compressed under ``--a2a-compress``)."""
    if gpu is None:
        raise ConfigError("ep_overlap: needs a GPU preset (--gpu): the overlap splits a MoE block into its "
                          "attention and MLP halves by the GPU's operator model")
    arch = workload.arch
    i = next(i for i in range(a, b) if is_block(workload.layers[i].name)
             and arch.is_moe_block(block_index(workload.layers[i].name)))
    share_f, share_b = moe_mlp_share(arch, gpu, strategy.precision, strategy.micro_batch, strategy.tp,
                                     strategy.sequence_parallel, strategy.recompute, curve, strategy.attention,
                                     Routing.of(strategy), strategy.fp8_casts,
                                     block=block_index(workload.layers[i].name))
    f, bw = workload.fwd_s[i], workload.bwd_s[i]
    full, wire = parts[:2]
    return MoELayerTimes(f * (1 - share_f), bw * (1 - share_b), f * share_f, bw * share_b, full, full, blocks,
                         wire, wire)


def _sharded(st: StagePlan, layers, workload, strategy, comp, grad_spec: Spec, native: bool, profile,
             gpu=None, codecs=None) -> None:
    """ZeRO-2/3 collectives of stage ``st`` (:mod:`perfsim.engine.sharding`): its units'
    per-micro-batch reduce-scatters (and ZeRO-3 all-gathers); ZeRO-2 gathers the updated
    weights after the last backward, one bucket of the stage. Host-driven collectives (a
    CPU profile) add FSDP2's copies around each (:func:`~perfsim.engine.sharding.add_host_copies`)
    and, under ZeRO-3, its own host time (:func:`~perfsim.engine.sharding.add_fsdp_host`)."""
    from perfsim.engine.sharding import (add_fsdp_host, add_host_copies, host_driven, param_gather_steps,  # lazy: simpy
                                         shard_units)  # stays out of perfsim memory

    dp, wb = strategy.replicas, BYTES_PER_VALUE[strategy.precision]
    plain = grad_spec.plain or native
    codecs = profile if codecs is None else codecs  # what prices the codec (perfsim.engine.codec_cost)
    codec = None if plain or codecs is None else (
        lambda spec, steps, nbytes: sum(bucket_codec_times(codecs, spec, steps, dp, nbytes)))
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
    embedding or multi-token prediction modules read it (Megatron-Core) and they live on
    different devices (``Strategy.tied_embedding`` ``sync``): ``vocab / tp x hidden`` values in the gradient dtype
    (``Strategy.grad_dtype``, the main gradient the all-reduce runs on); for a workload
    file, its ``tied_values`` (execute mode's head: ``perfsim.runtime.tied``)."""
    arch = workload.arch
    if arch is not None:
        values = -(-arch.vocab * arch.hidden // strategy.tp) if arch.last_stage_embedding else 0
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
    return offload_step_time(st.params, BYTES_PER_VALUE[strategy.precision], strategy.replicas, st.bwd_s,
                             strategy.num_microbatches, host_link_Bps(gpu),
                             system.cpu_adam_params_per_s if system else None, sharing)


def _optimizer(workload, strategy, profile, gpu, s, a, b, shard, curve) -> float:
    """Optimizer step of one GPU of stage ``s`` over the ``shard`` parameters it updates
    (:func:`perfsim.models.moe.optimizer_shard_params`): the profile's measurement (fp32
    profile when no GPU preset is named), else the GPU's compute model, else the
    memory-bandwidth fallback; ``curve``: the GPU's (None without one). The job's
    optimizer (``strategy.optimizer``) is priced by the bytes its step moves
    (:meth:`perfsim.job.Optimizer.step_bytes`): a measurement of another optimizer (the
    profile's :meth:`~perfsim.profile.Profile.timed_optimizer`) is scaled by the ratio of
    their fp32 traffic (the step is memory-bound: SGD with momentum 20 / Adam's 28)."""
    opt = None
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
        opt = optimizer_time(int(shard), gpu, strategy.precision, curve, strategy.optimizer,
                             strategy.optimizer_step)
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
    if profile is not None and measured_shape(profile, workload.model, workload.arch):
        f = profile.stage_measured(workload.model, s, a, b - 1, mb, "fwd", pp, tp, sequence_parallel, schedule)
        g = profile.stage_measured(workload.model, s, a, b - 1, mb, "bwd", pp, tp, sequence_parallel, schedule)
        if f is not None:
            fwd = f
        if g is not None:
            layer_bwd = [x * g / bwd for x in layer_bwd] if bwd > 0 else layer_bwd
            bwd = g
        return fwd, bwd, layer_bwd, f is not None or g is not None
    return fwd, bwd, layer_bwd, False



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
    for r in records_of(profile, "interference"):
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
