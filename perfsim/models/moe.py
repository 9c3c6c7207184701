"""Mixture of experts: parameters, operators and activations of a MoE block.

A MoE block (Shazeer et al. 2017, arXiv:1701.06538; GShard, Lepikhin et al. 2020,
arXiv:2006.16668; Switch Transformer, Fedus et al. 2021, arXiv:2101.03961) replaces the
dense MLP by ``experts`` MLPs of width ``expert_ffn`` and a router, a ``hidden x experts``
linear layer whose softmax picks ``top_k`` experts per token (Mixtral: 8 experts, top-2,
Jiang et al. 2024, arXiv:2401.04088). DeepSeekMoE (Dai et al. 2024, arXiv:2401.06066) and
Qwen-MoE add always-active *shared* experts (here one MLP of their summed width
``shared_ffn``) and keep the first blocks dense (``dense_layers``).

* parameters: every expert's weights are held (``params``); a token passes through the
  router, its ``top_k`` experts and the shared expert (``active_params``).
* FLOPs: the router GEMM (``2 hidden x experts`` per token), ``top_k`` expert MLPs per
  token, the shared expert; plus the memory-bound routing (softmax and top-k over the
  router's fp32 logits), the permutation of the token copies into expert order and the
  weighted combination back (:func:`moe_ops`).
* capacity factor ``C`` (a stated, adjustable assumption, ``--moe-capacity-factor``):
  GShard (Sec. 2.2) and Switch (Sec. 2.2, "expert capacity = tokens per batch / experts x
  capacity factor") give every expert a buffer of ``C x tokens x top_k / experts`` rows,
  padded, and drop the overflow: the expert GEMMs then cost ``C`` times the routed work
  whatever the routing. Without it (the default) the experts are *dropless*, each computes
  the tokens routed to it (MegaBlocks, Gale et al. 2022, arXiv:2211.15841; Megatron-Core's
  default; Hugging Face's Mixtral) and a balanced router is assumed.
* activations: each token's ``top_k`` copies of its hidden state (dispatched), their expert
  MLP activations and the router's fp32 probabilities (:func:`moe_activation_values`).
"""

from __future__ import annotations

from perfsim.errors import ConfigError


def check_moe(spec) -> None:
    """The MoE fields of a TransformerSpec are consistent (ConfigError naming the field)."""
    if not spec.experts:
        if spec.top_k or spec.expert_ffn or spec.shared_ffn or spec.shared_gate or spec.dense_layers:
            raise ConfigError(f"{spec.name}: top_k / expert_ffn / shared_ffn / dense_layers need experts >= 1")
        return
    if not 1 <= spec.top_k <= spec.experts:
        raise ConfigError(f"{spec.name}: top_k={spec.top_k} must be from 1 to experts={spec.experts}")
    if spec.expert_ffn == 0:
        object.__setattr__(spec, "expert_ffn", spec.ffn)
    if spec.expert_ffn < 1 or spec.shared_ffn < 0:
        raise ConfigError(f"{spec.name}: expert_ffn={spec.expert_ffn} must be >= 1, shared_ffn >= 0")
    if spec.shared_gate and not spec.shared_ffn:
        raise ConfigError(f"{spec.name}: shared_gate needs shared_ffn >= 1")
    bad = [i for i in spec.dense_layers if not 0 <= i < spec.n_layer]
    if bad or len(set(spec.dense_layers)) != len(spec.dense_layers):
        raise ConfigError(f"{spec.name}: dense_layers={list(spec.dense_layers)} must be distinct blocks "
                          f"0..{spec.n_layer - 1}")
    if len(spec.dense_layers) == spec.n_layer:
        raise ConfigError(f"{spec.name}: every block is dense (dense_layers); no expert is ever used")


def moe_mlp_params(spec, active: bool = False) -> int:
    """Parameters of one MoE block's MLP part: the router (``hidden x experts``, no bias),
    every routed expert (``active``: the ``top_k`` a token uses), the shared expert and
    its gate."""
    n = spec.top_k if active else spec.experts
    shared = spec.mlp_params(spec.shared_ffn) if spec.shared_ffn else 0
    return (spec.hidden * spec.experts + n * spec.mlp_params(spec.expert_ffn) + shared
            + (spec.hidden if spec.shared_gate else 0))


def expert_rows(spec, tokens: int, capacity_factor: float | None) -> int:
    """Rows one expert's GEMMs process for ``tokens`` tokens: ``tokens x top_k / experts``
    (dropless, balanced), or the padded capacity ``ceil(C x tokens x top_k / experts)``
    (GShard Sec. 2.2; Switch Transformer Sec. 2.2)."""
    routed = tokens * spec.top_k / spec.experts
    if capacity_factor is None:
        return max(1, -(-int(tokens * spec.top_k) // spec.experts))
    return max(1, int(-(-(capacity_factor * routed) // 1)))


def moe_ops(spec, tok: int, tp: int, bpv: int, capacity_factor: float | None = None) -> list:
    """Forward operators of one MoE block's MLP part on one tensor-parallel rank for
    ``tok`` tokens (:mod:`perfsim.engine.compute` Ops): router GEMM, routing, permutation,
    the experts' grouped GEMMs (every expert's FFN split ``tp`` ways, as Megatron-Core's
    expert tensor parallelism without expert parallelism), the combination, the shared
    expert."""
    from perfsim.engine.compute import Op

    h, e, k = spec.hidden, spec.experts, spec.top_k
    ef = spec.expert_ffn // tp
    rows = expert_rows(spec, tok, capacity_factor)
    routed = rows * e  # token copies the experts compute (capacity padding included)
    up = (2 if spec.gated else 1) * ef
    ops = [Op("router", m=tok, n=e, k=h),
           # fp32 logits: softmax (read, write), top-k (read), the k weights written
           Op("router_topk", bytes=4 * tok * (3 * e + k)),
           # gather the token copies into expert order (read and write each copy)
           Op("moe_permute", bytes=2 * bpv * routed * h),
           Op("expert_up", m=rows, n=up, k=h, batch=e),
           Op("expert_activation", bytes=bpv * routed * ef * (3 if spec.gated else 2)),
           Op("expert_down", m=rows, n=h, k=ef, batch=e),
           # scatter back, scale by the router weight and sum the k copies per token
           Op("moe_unpermute", bytes=bpv * (2 * routed + tok) * h)]
    if spec.shared_ffn:
        sf = spec.shared_ffn // tp
        ops += [Op("shared_up", m=tok, n=(2 if spec.gated else 1) * sf, k=h),
                Op("shared_activation", bytes=bpv * tok * sf * (3 if spec.gated else 2)),
                Op("shared_down", m=tok, n=h, k=sf)]
        if spec.shared_gate:
            ops += [Op("shared_gate", m=tok, n=1, k=h), Op("shared_gate_scale", bytes=3 * bpv * tok * h)]
    return ops


def moe_activation_values(spec, tokens: int, tp: int, capacity_factor: float | None = None) -> float:
    """Values (of the activation dtype) one MoE block's MLP part keeps for the backward,
    for ``tokens`` tokens on one tensor-parallel rank: the dispatched token copies
    (``routed x hidden``), the experts' MLP inputs and activations (as a dense MLP keeps,
    per copy: ``3 f`` gated, ``2 f`` else, split ``tp`` ways), the shared expert's, and the
    router's fp32 probabilities (2 values each)."""
    rows = expert_rows(spec, tokens, capacity_factor) * spec.experts
    mats = 3 if spec.gated else 2
    return (rows * spec.hidden + rows * spec.expert_ffn * mats / tp + tokens * spec.shared_ffn * mats / tp
            + 2 * tokens * spec.experts)
