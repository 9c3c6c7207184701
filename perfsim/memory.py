"""Peak memory per GPU of each pipeline stage, and whether it fits.

Per GPU of stage ``s`` (``Psi`` = parameters one tensor-parallel rank holds):

* model states (ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 3.1):
  mixed precision (fp16/bf16) keeps 16-bit weights and gradients (``2 Psi + 2 Psi``)
  and fp32 master weights, Adam momentum and variance (``12 Psi``); fp32 training
  ``4 Psi + 4 Psi + 8 Psi``. ZeRO-1 divides the optimizer term by ``dp``. Gradients
  take :attr:`perfsim.config.Strategy.grad_dtype`: Megatron's bf16 buffer is fp32
  (``4 Psi``; 18 bytes per parameter, Megatron-LM README, distributed optimizer table).
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
  output norm, logits and cross entropy ``4 s b h (1 + v/h) / t`` (Korthikanti et al., Sec. 4.3).
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

from perfsim.hardware import BYTES_PER_VALUE

GIB = 2**30


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

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers

    def breakdown(self) -> str:
        """``weights 0.8, grads 0.8, optimizer 1.6, activations 71.8[, AQ-SGD buffers 28.8]`` (GiB)."""
        return breakdown_text(self.weights / GIB, self.grads / GIB, self.optimizer / GIB,
                              self.activations / GIB, self.buffers / GIB)


def breakdown_text(weights: float, grads: float, optimizer: float, activations: float, buffers: float) -> str:
    """The parts of a stage's peak memory, in GiB, as the CLI and the out-of-memory error print them."""
    text = f"weights {weights:.1f}, grads {grads:.1f}, optimizer {optimizer:.1f}, activations {activations:.1f}"
    return text + (f", AQ-SGD buffers {buffers:.1f}" if buffers else "")


def layer_activation_bytes(spec, mb: int, tp: int, sp: bool, recompute: str, bpv: int,
                           attention: str = "megatron", routing=None) -> float:
    """Activation bytes one transformer layer keeps for one micro-batch (module docstring);
    flash attention keeps no ``s x s`` tensor, only the output (counted as the projection's
    input) and an fp32 log-sum-exp per query and head (Dao 2023, arXiv:2307.08691, Sec. 3.1.1)."""
    s, b, h, a, f = spec.seq_len, mb, spec.hidden, spec.heads, spec.ffn
    sbh = s * b * h
    v = bpv / 2  # the formula counts 2-byte values
    if recompute == "full":
        return 2 * v * sbh / (tp if sp else 1)
    # sharded by t: Q, K, V and the projection input; the MLP's activation input(s) and fc2 input
    attn_sharded = 2 * (2 * s * b * spec.q_dim + 2 * s * b * spec.kv_dim)
    mlp_sharded = 2 * s * b * f * (3 if spec.gated else 2)
    # replicated (or / t with sequence parallelism): 2 norm inputs, attention and MLP
    # inputs (2-byte values, 8 s b h) and 2 dropout masks (1 byte, 2 s b h)
    repl = 8 * v * sbh + 2 * sbh
    sharded = v * (attn_sharded + mlp_sharded) / tp
    if getattr(spec, "moe", False):  # the experts' instead of a dense MLP's (perfsim.models.moe)
        from perfsim.models.moe import moe_activation_values

        sharded = v * attn_sharded / tp + 2 * v * moe_activation_values(spec, s * b, tp, routing)
    core = 5 * a * s * s * b / tp * (1 + (v - 1) * 4 / 5)  # softmax (2B) + dropout out (2B) + mask (1B)
    if attention == "flash":
        core = 4 * a * s * b / tp
    if recompute == "selective":
        core = 0.0
    return (repl / tp if sp else repl) + sharded + core


def stage_memory(workload, strategy, plan, table) -> list[StageMemory]:
    """Peak bytes per GPU of every stage (module docstring); ``table`` the schedule."""
    from perfsim.compression import make_pipeline_pair
    from perfsim.compression.aqsgd import AQSGD
    from perfsim.schedules import max_in_flight

    from perfsim.models.moe import Routing

    spec, tp, dp, mb = workload.arch, strategy.tp, strategy.dp, strategy.micro_batch
    routing = Routing.of(strategy)
    prec = strategy.precision
    bpv = BYTES_PER_VALUE[prec]
    mixed = prec in ("fp16", "bf16")
    fw_comp, _ = make_pipeline_pair(strategy.compress)
    out = []
    for st in plan.stages:
        psi = st.params
        weights = (2 if mixed else 4) * psi
        grads = BYTES_PER_VALUE[strategy.grad_dtype] * psi
        optimizer = (12 if mixed else 8) * psi / (dp if strategy.zero == 1 else 1)
        # the stage's own peak on its device (a device with several stages sums them: an upper bound)
        inflight = max_in_flight([a for a in table[table.stage_device[st.index]] if a.stage == st.index])
        act = 0.0
        if spec is not None:
            blocks = sum(1 for i in range(st.first_layer, st.last_layer)
                         if workload.layers[i].name.startswith("block"))
            per_layer = layer_activation_bytes(spec, mb, tp, strategy.sequence_parallel,
                                               strategy.recompute, bpv, strategy.attention, routing)
            act = blocks * per_layer * inflight
            s, h = spec.seq_len, spec.hidden
            if st.first_layer == 0:
                act += s * mb * h * inflight  # embedding dropout mask
            if st.last_layer == len(workload.layers) and not spec.encoder:
                act += 4 * s * mb * h * (1 + spec.vocab / h) / tp * (bpv / 2)
            if strategy.recompute == "full" and blocks:
                act += layer_activation_bytes(spec, mb, tp, strategy.sequence_parallel, "none", bpv,
                                              strategy.attention, routing)
        else:  # known only by boundary shapes: every layer's output, 2x for the backward
            for i in range(st.first_layer, st.last_layer):
                n = 1
                for d in workload.layers[i].out_shape:
                    n *= d
                act += 2 * bpv * n * mb * inflight / tp
        buffers = 0.0
        if isinstance(fw_comp, AQSGD) and not fw_comp.disk:
            # the sender keeps its own output's messages, the receiver the previous stage's
            per_sample = 0
            if st.index < plan.pp - 1:
                per_sample += math.prod(workload.layers[st.last_layer - 1].out_shape)
            if st.index > 0:
                per_sample += math.prod(workload.layers[st.first_layer - 1].out_shape)
            buffers = per_sample * (fw_comp.mbits or 32) / 8 * strategy.dataset_samples / tp
        out.append(StageMemory(st.index, weights, grads, optimizer, act, buffers, inflight))
    return out
