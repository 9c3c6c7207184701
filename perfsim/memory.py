"""Peak memory per GPU of each pipeline stage, and whether it fits.

Per GPU of stage ``s`` (``Psi`` = parameters one tensor-parallel rank holds):

* model states (ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 3.1):
  mixed precision (fp16/bf16) keeps 16-bit weights and gradients (``2 Psi + 2 Psi``)
  and fp32 master weights, Adam momentum and variance (``12 Psi``); fp32 training
  ``4 Psi + 4 Psi + 8 Psi``. SGD with momentum (``--optimizer sgd``) keeps one fp32 buffer:
  ``K = 8`` mixed, 4 in fp32 (:meth:`perfsim.job.Optimizer.state_bytes`). Gradients take :attr:`perfsim.config.Strategy.grad_dtype`:
  Megatron's bf16 buffer is fp32 (``4 Psi``; 18 bytes per parameter, Megatron-LM README,
  distributed optimizer table). With ``W`` bytes of weights, ``G`` of gradients and
  ``K`` of optimizer state per parameter and ``N_d = dp`` (ZeRO Sec. 5 and Fig. 1:
  ``(2+2+K) Psi``, ``(2+2+K/N_d) Psi``, ``(2+(2+K)/N_d) Psi``, ``(2+2+K) Psi/N_d``)::

      ZeRO-0: (W + G + K) Psi        ZeRO-2: (W + (G + K)/N_d) Psi
      ZeRO-1: (W + G + K/N_d) Psi    ZeRO-3: (W + G + K) Psi / N_d

  These are the shards; :func:`sharding_buffers` adds the working buffers of ZeRO-2/3.
  CPU offload (``--offload optimizer`` on ZeRO-2/3; ZeRO-Offload, Ren et al., arXiv:2101.06840,
  Sec. 4): ``G = K = 0`` on the GPU (each reduced gradient shard is copied to the host as it is
  produced; one unit's 16-bit gradient stays, :func:`sharding_buffers`), and
  :func:`offloaded_state_bytes` in host memory.
* fp8 (``precision="fp8"``, NVIDIA Transformer Engine's recipe; Micikevicius et al.,
  "FP8 Formats for Deep Learning", arXiv:2209.05433): bf16 weights and values outside
  the GEMMs (counted as bf16), plus :func:`fp8_bytes` (fp8 weight copies, scaling state).
* activations of one micro-batch per transformer layer (Korthikanti et al. 2022,
  arXiv:2205.05198, Sec. 4.1-4.2, 16-bit values, ``s`` sequence, ``b`` micro-batch,
  ``h`` hidden, ``a`` heads, ``t`` tensor parallel)::

      none:      s b h (10 + 24/t + 5 a s / (h t))     with sequence parallel: s b h (34 + 5 a s / h) / t
      selective: s b h (10 + 24/t)                     with sequence parallel: s b h 34 / t
      full:      2 s b h                               with sequence parallel: 2 s b h / t

  ``--attention flash`` replaces the ``5 a s / (h t)`` term (the stored scores) by an fp32
  log-sum-exp per query and head, ``4 a s b / t`` bytes; the rest is
  generalised to other MLP widths / gated MLPs / grouped-query attention by the
  same per-tensor accounting (``24 s b h`` = Q, K, V, projection input ``8``, MLP
  ``4 s b f`` = 16 for f = 4h); fp32 activations double the 2-byte terms.
  The first stage adds the embedding dropout mask ``s b h``; the last stage the
  output norm, logits and cross entropy ``4 s b h (1 + v/h) / t`` (Korthikanti et al., Sec. 4.3;
  fp32 training ``(8 s b h + 4 s b v) / t``: its softmax is fp32 in both):
  Megatron's fused vocab-parallel cross entropy; :func:`loss_bytes` for the others; every
  micro-batch in flight on the last stage keeps its own (GPipe: all ``m``).
  With full recomputation one layer's activations are rebuilt during the backward:
  the stage also holds one layer's ``none`` activations.
* micro-batches held: the schedule table's peak in flight on that stage
  (:func:`perfsim.schedules.max_in_flight`: GPipe all ``m``, 1F1B ``pp - s``).
* AQ-SGD message buffers: one buffered message per training sample and boundary
  on both sides of it (Wang et al. 2022, "Fine-tuning Language Models over Slow Networks
  using Activation Compression with Guarantees", arXiv:2206.01299, Sec. 3), unless the
  spec keeps them on disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfsim.compression import make_pipeline_pair
from perfsim.compression.aqsgd import AQSGD
from perfsim.hardware import BYTES_PER_VALUE, MIXED_PRECISIONS
from perfsim.job import OPTIMIZERS
from perfsim.models.moe import Routing, moe_activation_values, optimizer_shard_params, stage_expert_params
from perfsim.models.specs import block_index, is_block
from perfsim.models.tensor_parallel import block_mlp_widths, rank_gemm_params
from perfsim.schedules import max_in_flight

if TYPE_CHECKING:
    from perfsim.models.transformer import TransformerSpec

GIB = 2**30
#: share of a GPU's memory above which a predicted peak is said to be under allocator pressure
#: (``perfsim predict``'s ``memory_warning``; no slowdown is priced: none measured here). PyTorch's
#: CUDA caching allocator keeps freed blocks cached; when a request cannot be served from them it
#: frees every cached block (``release_cached_blocks``: it waits for all in-flight work, then
#: ``cudaFree``) and calls ``cudaMalloc`` again, and freed blocks split by size fragment the
#: pool, so a run near capacity stalls or runs out of memory before the sum of its tensors does
#: (PyTorch docs, "CUDA semantics / Memory management", ``PYTORCH_CUDA_ALLOC_CONF``). 0.8 is the
#: threshold PyTorch's docs give as the example of ``garbage_collection_threshold`` ("e.g., 0.8":
#: above it the allocator starts reclaiming cached blocks; pytorch/pytorch#74261, which added it
#: because "release_cached_blocks ... is very expensive as it will likely stall all the GPU
#: operations"); fairseq empties the cache periodically "to mitigate memory fragmentation ...
#: that can cause OOMs on models approaching GPU memory limit" (facebookresearch/fairseq 315c463)
ALLOCATOR_PRESSURE = 0.8


@dataclass(frozen=True)
class StageMemory:
    """Bytes per GPU of one stage."""

    stage: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    inflight: int
    #: ZeRO-2/3 working buffers (:func:`sharding_buffers`)
    sharding: float = 0.0
    #: host memory of an offloaded optimizer, its gradients and state (:func:`offloaded_state_bytes`;
    #: not in ``total``)
    host: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers + self.sharding

    def breakdown(self) -> str:
        """``weights 0.8, grads 0.8, optimizer 1.6, activations 71.8[, AQ-SGD buffers 28.8]`` (GiB)."""
        text = breakdown_text(self.weights / GIB, self.grads / GIB, self.optimizer / GIB,
                              self.activations / GIB, self.buffers / GIB, self.sharding / GIB)
        return text + (f"; gradients and optimizer state in host memory {self.host / GIB:.1f}" if self.host else "")


def breakdown_text(weights: float, grads: float, optimizer: float, activations: float, buffers: float,
                   sharding: float = 0.0) -> str:
    """The parts of a stage's peak memory, in GiB, as the CLI and the out-of-memory error print them."""
    text = f"weights {weights:.1f}, grads {grads:.1f}, optimizer {optimizer:.1f}, activations {activations:.1f}"
    text += f", AQ-SGD buffers {buffers:.1f}" if buffers else ""
    return text + (f", ZeRO gathered/unsharded buffers {sharding:.1f}" if sharding else "")


def model_state_bytes(psi: float, weight_bytes: int, grad_bytes: int, optimizer_bytes: int, dp: int,
                      zero: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes per GPU of ``psi`` parameters under ZeRO
    stage ``zero`` over ``dp`` ranks: stage 1 shards the optimizer state, 2 also the
    gradients, 3 also the weights (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
    Training Trillion Parameter Models", arXiv:1910.02054, Sec. 5; module docstring)."""
    weights = weight_bytes * psi / (dp if zero >= 3 else 1)
    grads = grad_bytes * psi / (dp if zero >= 2 else 1)
    optimizer = optimizer_bytes * psi / (dp if zero >= 1 else 1)
    return weights, grads, optimizer


#: bytes per parameter an offloaded optimizer keeps in host memory: fp32 master weights,
#: momentum and variance, and the fp32 gradient CPU-Adam reads (ZeRO-Offload, arXiv:2101.06840,
#: Sec. 4: the gradients, the optimizer state and its step on the CPU; DeepSpeed's ZeRO-2 offload
#: holds its fp32 partition and that partition's fp32 gradient on the host)
OFFLOADED_BYTES_PER_PARAM = 16


def offloaded_state_bytes(psi: float, dp: int, zero: int) -> float:
    """Host bytes per GPU of an offloaded optimizer (``--offload optimizer``) over ``psi``
    parameters: :data:`OFFLOADED_BYTES_PER_PARAM` each, of the shard ZeRO gives the rank
    (``psi / dp`` from stage 1 on). The GPU keeps its 16-bit weights (their ZeRO-3 shard), no
    gradient shard and no optimizer state."""
    return OFFLOADED_BYTES_PER_PARAM * psi / (dp if zero >= 1 else 1)


def sharding_buffers(unit_params, weight_bytes: int, grad_bytes: int, dp: int, zero: int,
                     reshard_after_forward: bool = True, offload: bool = False) -> float:
    """Working buffers of ZeRO-2/3 on top of the shards, per GPU (0 for ZeRO-0/1 or dp 1).

    ``unit_params``: the parameters of each sharding unit of the stage in order (a layer:
    an FSDP2 ``fully_shard`` module, a DeepSpeed ZeRO-3 submodule).

    * ZeRO-2 and 3: one unit's unsharded gradient, produced by its backward before its
      reduce-scatter (``grad_bytes`` per parameter; DeepSpeed's ``reduce_bucket_size``
      would replace the unit by a bucket -- not modelled);
    * ZeRO-3 with ``reshard_after_forward``: the gathered weights of the unit computing and
      of the next, prefetched one (the largest adjacent pair; FSDP2 prefetches one unit,
      Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
      arXiv:2304.11277, Sec. 3.3-3.4); without it every unit's gathered weights are kept
      from its forward to its backward: the whole stage's.
    """
    units = [p for p in unit_params if p > 0]
    if zero < 2 or (dp == 1 and not offload) or not units:
        return 0.0
    out = grad_bytes * max(units)  # offloaded on one GPU too: the unit's gradient before its copy down
    if zero >= 3 and dp > 1:
        if reshard_after_forward:
            pair = max((a + b for a, b in zip(units, units[1:])), default=units[0])
            out += weight_bytes * pair
        else:
            out += weight_bytes * sum(units)
    return float(out)


#: Transformer Engine's default amax history length (``DelayedScaling(amax_history_len=1024)``)
FP8_AMAX_HISTORY = 1024
#: fp8 tensors with scaling state per GEMM: input, weight, output (forward), gradient
#: output and gradient input (backward) -- TE's ``fp8_meta["scaling_fwd"/"scaling_bwd"]``
FP8_TENSORS_PER_GEMM = 5


def fp8_bytes(spec: TransformerSpec, blocks, tp: int, dp: int = 1, zero: int = 0, ep: int = 1) -> float:
    """Memory fp8 training adds to a stage holding the transformer blocks ``blocks``
    (their indices), per GPU
    (NVIDIA Transformer Engine's delayed-scaling recipe; Micikevicius et al., "FP8 Formats
    for Deep Learning", arXiv:2209.05433, Sec. 4: per-tensor scaling factors):

    * an fp8 copy of each GEMM weight and of its transpose (1 + 1 bytes per GEMM
      parameter, :func:`perfsim.models.tensor_parallel.rank_gemm_params`: this
      expert-parallel rank's experts, MLA's replicated down projections whole; TE caches them over a step's micro-batches), ``/ dp``
      under ZeRO-3 (the shard's copies);
    * per GEMM (QKV -- MLA's attention GEMMs --, projection, two per local MLP:
      :data:`perfsim.models.ops.FP8_GEMMS`),
      the scaling state of its 5 fp8 tensors: an fp32 amax history of
      :data:`FP8_AMAX_HISTORY` entries, a scale and an inverse scale.

    The LM head and the attention core stay in bf16 (TE's ``DotProductAttention`` and
    Megatron's output layer are not fp8 by default), as do a Gated DeltaNet's or Mamba-2's GEMMs
    (:func:`perfsim.models.ops.block_ops` prices them in bf16)."""
    def fp8_weights(i: int) -> int:
        linear = spec.is_linear_block(i)
        return rank_gemm_params(spec, tp, i, ep) - (-(-spec.attention_gemm_weights(i) // tp) if linear else 0)

    copies = 2 * sum(fp8_weights(i) for i in blocks) / (dp if zero >= 3 else 1)
    gemms = sum((1 + len(spec.attention_gemms()) if spec.has_mixer(i) and not spec.is_linear_block(i) else 0)
                + 2 * len(block_mlp_widths(spec, i, ep)) for i in blocks)
    return copies + gemms * FP8_TENSORS_PER_GEMM * (FP8_AMAX_HISTORY + 2) * 4


def loss_bytes(spec: TransformerSpec, mb: int, tp: int, bpv: int, cross_entropy: str = "fused",
               in_flight: int = 1) -> float:
    """Peak bytes of the last stage's output norm, LM head and cross entropy with
    ``in_flight`` micro-batches waiting for their backward (``s b`` tokens each, vocabulary
    ``v`` split ``t`` ways): what each micro-batch keeps from its forward to its backward,
    ``in_flight`` times (GPipe's last stage holds all ``m``, 1F1B's one), plus what only the
    backward running at the peak holds, once:

    * ``fused`` (Megatron-LM's vocab-parallel cross entropy; Korthikanti et al. 2022,
      arXiv:2205.05198, Sec. 4.3): ``4 s b h (1 + v/h) / t`` for 16-bit values -- the
      inputs of the norm and the projection (``4 s b h``) and the fp32 softmax
      (``4 s b v``), whose gradient the backward computes in place; fp32 training doubles
      the inputs only (``8 s b h``: the softmax is fp32 either way);
    * ``pytorch`` (``F.cross_entropy`` on the LM head's logits under autocast, PyTorch's
      ``log_softmax`` + ``nll_loss`` in fp32), as measured on an H100 (torch 2.11,
      traces/gpu/h100-memory-fp8-2026-11-27.json; docs/model.md): after the forward
      ``2 bpv + 4`` bytes per logit are held -- the logits the caller keeps (``bpv``), the
      fp32 log-softmax saved for the backward (4) and one more logit-sized ``bpv``
      buffer (measured, not identified) -- and the backward's peak adds one fp32 gradient
      of the logits (4): ``(2 bpv + 8) s b v`` instead of ``4 s b v``, 12 bytes per bf16
      logit (10 when the caller drops its logits before the backward; fp32 training's 16
      is the same count, not measured);
    * ``chunked`` (Liger-Kernel's fused linear cross entropy; Hsu et al., "Liger Kernel:
      Efficient Triton Kernels for LLM Training", arXiv:2410.10989, Sec. 3.2): the logits
      of one chunk of ``next_pow2(ceil(s b / ceil(v / h)))`` tokens at a time (about
      ``s b h`` values) with their gradient written in place, the input gradient
      (``bpv s b h``) and the fp32 weight gradient (``4 v h``) it computes in the forward.
    """
    s, h, v = spec.seq_len, spec.hidden, spec.vocab
    n = max(1, in_flight)
    if cross_entropy == "fused":  # all kept: the softmax's gradient is computed in place
        return n * (2 * bpv * s * mb * h + 4 * s * mb * v) / tp
    head_inputs = 2 * bpv * s * mb * h / tp  # the norm's and the projection's inputs
    if cross_entropy == "pytorch":  # kept: inputs, logits, log-softmax, the extra buffer; the backward's fp32 gradient
        return n * (head_inputs + (2 * bpv + 4) * s * mb * v / tp) + 4 * s * mb * v / tp
    # chunked: kept, the inputs and the input gradient; one chunk's logits at a time, one weight gradient
    chunk = 1 << max(0, math.ceil(s * mb / math.ceil(v / h)) - 1).bit_length()
    return n * (head_inputs + bpv * s * mb * h / tp) + bpv * min(chunk, s * mb) * v / tp + 4 * v * h / tp


def layer_activation_bytes(spec: TransformerSpec, mb: int, tp: int, sp: bool, recompute: str, bpv: int,
                           attention: str = "megatron", routing=None, block: int | None = None) -> float:
    """Activation bytes one transformer layer keeps for one micro-batch (module docstring);
    flash attention keeps no ``s x s`` tensor, only the output (counted as the projection's
    input) and an fp32 log-sum-exp per query and head (Dao 2023, arXiv:2307.08691, Sec. 3.1.1);
    an attention output gate (Qwen3-Next) its sigmoid. ``block``: a linear-attention block
    (:meth:`perfsim.models.transformer.TransformerSpec.is_linear_block`) keeps its mixer's tensors
    (:meth:`perfsim.models.delta_net.GatedDeltaNet.activation_bytes`) instead of attention's; a block of a
    mixer alone or an MLP alone (Nemotron-H's) keeps that half's tensors, one norm input, one sub-block
    input and one dropout mask."""
    s, b, h, a, f = spec.seq_len, mb, spec.hidden, spec.heads, spec.ffn
    sbh = s * b * h
    v = bpv / 2  # the formula counts 2-byte values
    if recompute == "full":
        return 2 * v * sbh / (tp if sp else 1)
    # sharded by t: Q, K, V and the projection input; the MLP's activation input(s) and fc2 input
    attn_sharded = 2 * s * b * (spec.q_dim + spec.kv_dim + spec.v_dim + spec.out_dim)
    # the query and key norms keep their inputs (Qwen3; Llama 4's, counted in every block: an upper bound)
    if getattr(spec, "qk_norm", False) or getattr(spec, "qk_l2_norm", False):
        attn_sharded += 2 * s * b * (spec.q_dim + spec.kv_dim)
    attn_sharded += 2 * s * b * spec.gate_dim  # the output gate's sigmoid, kept for the product's backward
    mlp_sharded = 2 * s * b * f * (3 if spec.gated else 2)
    # replicated (or / t with sequence parallelism): 2 norm inputs, attention and MLP
    # inputs (2-byte values, 8 s b h) and 2 dropout masks (1 byte, 2 s b h)
    repl = 8 * v * sbh + 2 * sbh
    if spec.norms_per_block == 4:  # Gemma's output norms keep their inputs too
        repl += 4 * v * sbh
    # MLA (replicated, or / t under sequence parallelism): each latent's norm input and the up
    # projection's input after it (2-byte values)
    repl += 2 * v * s * b * 2 * sum(spec.latent_norm_widths())
    sharded = v * (attn_sharded + mlp_sharded) / tp
    moe = getattr(spec, "moe", False) and (block is None or spec.is_moe_block(block))
    if moe:  # the experts' instead of a dense MLP's (perfsim.models.moe)
        sharded = v * attn_sharded / tp + 2 * v * moe_activation_values(spec, s * b, tp, routing)
    mixer = block is None or spec.has_mixer(block)
    if block is not None and not (mixer and spec.has_mlp(block)):  # one sub-block: its norm, input and mask
        repl -= 4 * v * sbh + sbh
    mlp = 2 * v * moe_activation_values(spec, s * b, tp, routing) if moe else v * mlp_sharded / tp
    if block is not None and not spec.has_mlp(block):
        mlp, sharded = 0.0, v * attn_sharded / tp
    if not mixer:  # an MLP alone
        return (repl / tp if sp else repl) + mlp
    if block is not None and spec.is_linear_block(block):  # a linear mixer's tensors instead of attention's
        return (repl / tp if sp else repl) + spec.linear_mixer.activation_bytes(s * b, tp, bpv) + mlp
    core = 5 * a * s * s * b / tp * (1 + (v - 1) * 4 / 5)  # softmax (2B) + dropout out (2B) + mask (1B)
    if spec.attn_logit_softcap:  # the soft-capped scores' tanh, kept for its backward
        core += 2 * v * a * s * s * b / tp
    if attention == "flash":
        core = 4 * a * s * b / tp
    if recompute == "selective":
        core = 0.0
    return (repl / tp if sp else repl) + sharded + core


def device_memory(mem: list[StageMemory], table) -> list[float]:
    """Peak bytes per GPU of each pipeline device of schedule ``table``: a device holds all
    its stages (an interleaved schedule's model chunks), so their sum (an upper bound)."""
    return [sum(mem[k].total for k in table.stages_of(d)) for d in range(table.num_devices)]


def host_memory_per_node(mem: list[StageMemory], table, strategy, gpus_per_node: int) -> list[float]:
    """Host bytes each node holds for its GPUs' offloaded optimizers (:attr:`StageMemory.host`,
    ZeRO-Offload's state per GPU; 0 without offload): the sum over the node's GPUs of their
    pipeline device's stages, GPUs numbered as the engines place them (:meth:`perfsim.job.Job.device`)."""
    per_device = [sum(mem[k].host for k in table.stages_of(d)) for d in range(table.num_devices)]
    nodes = [0.0] * -(-strategy.devices // gpus_per_node)
    if not any(per_device):
        return nodes
    for t in range(strategy.tp):
        for r in range(strategy.replicas):
            for d in range(strategy.pp):
                nodes[strategy.device(t, r, d) // gpus_per_node] += per_device[d]
    return nodes


def stage_memory(workload, strategy, plan, table) -> list[StageMemory]:
    """Peak bytes per GPU of every stage (module docstring); ``table`` the schedule."""
    workload = workload.context_rank(getattr(strategy, "cp", 1))  # one context-parallel rank's tokens
    spec, tp, dp, mb = workload.arch, strategy.tp, strategy.replicas, strategy.micro_batch
    routing = Routing.of(strategy)
    prec = strategy.precision
    bpv = BYTES_PER_VALUE[prec]
    mixed = prec in MIXED_PRECISIONS
    k = OPTIMIZERS[strategy.optimizer].state_bytes(prec)  # ZeRO's K: Adam 12 mixed, 8 fp32; SGD 8, 4
    # each boundary's own forward compressor (boundary k: after stage k; perfsim.boundaries)
    specs = {k: strategy.boundary_compress.get(k, strategy.compress) for k in range(table.num_stages - 1)}
    built = {spec: make_pipeline_pair(spec)[0] for spec in set(specs.values())}  # one per distinct spec
    fw_comps = {k: built[spec] for k, spec in specs.items()}
    out = []
    for st in plan.stages:
        psi = st.params
        ids = [block_index(workload.layers[i].name) for i in range(st.first_layer, st.last_layer)
               if is_block(workload.layers[i].name)]  # the stage's transformer blocks
        wb, gb = (2 if mixed else 4), BYTES_PER_VALUE[strategy.grad_dtype]
        offload = strategy.offload == "optimizer"
        if offload:  # ZeRO-Offload: 16-bit gradients streamed to the host; no shard, no state on the GPU
            gb = wb
        weights, grads, optimizer = model_state_bytes(psi, wb, 0 if offload else gb, 0 if offload else k,
                                                      dp, strategy.zero)
        if strategy.zero and strategy.ep > 1 and not offload:  # the experts' state over their own group
            optimizer = k * optimizer_shard_params(psi, stage_expert_params(spec, tp, strategy.ep, ids), dp,
                                                   strategy.ep, strategy.zero)
        host = offloaded_state_bytes(psi, dp, strategy.zero) if offload else 0.0
        sharding = sharding_buffers(st.unit_params or [psi], wb, gb, dp, strategy.zero,
                                    strategy.reshard_after_forward, offload)
        # the stage's own peak on its device (a device with several stages sums them: an upper bound)
        inflight = max_in_flight([a for a in table[table.stage_device[st.index]] if a.stage == st.index])
        act = 0.0
        if spec is not None:
            blocks = len(ids)
            kinds = {}  # a block of each kind (blocks of one kind keep the same activations)
            for i in ids:
                kinds.setdefault(spec.block_kind(i), i)
            per_kind = {k: layer_activation_bytes(spec, mb, tp, strategy.sequence_parallel, strategy.recompute, bpv,
                                                  strategy.attention, routing, block=i) for k, i in kinds.items()}
            act = sum(per_kind[spec.block_kind(i)] for i in ids) * inflight
            s, h = spec.seq_len, spec.hidden
            if st.first_layer == 0:
                act += s * mb * h * inflight  # embedding dropout mask
            if st.last_layer == len(workload.layers) and not spec.encoder:
                act += loss_bytes(spec, mb, tp, bpv, strategy.cross_entropy, inflight)
                if spec.final_logit_softcap:  # the soft-capped logits' tanh, kept for its backward
                    act += inflight * bpv * s * mb * spec.vocab / tp
            mtp = sum(1 for i in ids if spec.is_mtp_block(i))
            if mtp:  # each module's norm inputs and concatenation (4 h a token), and what its head pass keeps
                kept = (loss_bytes(spec, mb, tp, bpv, strategy.cross_entropy, 2)
                        - loss_bytes(spec, mb, tp, bpv, strategy.cross_entropy, 1))
                act += mtp * inflight * (4 * bpv * s * mb * h / (tp if strategy.sequence_parallel else 1) + kept)
            if prec == "fp8" and blocks:
                weights += fp8_bytes(spec, ids, tp, dp, strategy.zero, strategy.ep)
            if strategy.recompute == "full" and blocks:  # the largest of the stage's blocks, rebuilt
                act += max(layer_activation_bytes(spec, mb, tp, strategy.sequence_parallel, "none", bpv,
                                                  strategy.attention, routing, block=i) for i in kinds.values())
        else:  # known only by boundary shapes: every layer's output, 2x for the backward
            for i in range(st.first_layer, st.last_layer):
                n = 1
                for d in workload.layers[i].out_shape:
                    n *= d
                act += 2 * bpv * n * mb * inflight / tp
        # AQ-SGD: the sender keeps its own output's messages, the receiver the previous stage's -- on
        # a boundary between devices (one inside a device is a local hand-off, no codec), each
        # boundary by its own spec
        i, dev = st.index, table.stage_device
        sides = []
        if i < table.num_stages - 1 and dev[i + 1] != dev[i]:
            sides.append((fw_comps[i], workload.layers[st.last_layer - 1].out_shape))
        if i > 0 and dev[i - 1] != dev[i]:
            sides.append((fw_comps[i - 1], workload.layers[st.first_layer - 1].out_shape))
        buffers = sum(math.prod(shape) * (comp.mbits or 32) / 8 * strategy.dataset_samples / tp
                      for comp, shape in sides if isinstance(comp, AQSGD) and not comp.disk)
        out.append(StageMemory(st.index, weights, grads, optimizer, act, buffers, inflight, sharding, host))
    return out
