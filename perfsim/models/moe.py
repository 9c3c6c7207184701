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

import math
from dataclasses import dataclass, replace

from perfsim.compression import make_compressor
from perfsim.compression.spec import parse_spec
from perfsim.errors import ConfigError
from perfsim.models.specs import block_index, is_block


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
    """Parameters of one MoE block's MLP part: the router (``hidden x experts``, its bias with
    ``router_bias``), every routed expert (``active``: the ``top_k`` a token uses), the shared
    expert and its gate."""
    n = spec.top_k if active else spec.experts
    shared = spec.mlp_params(spec.shared_ffn) if spec.shared_ffn else 0
    router = (spec.hidden + (1 if spec.router_bias else 0)) * spec.experts
    return (router + n * spec.mlp_params(spec.expert_ffn) + shared
            + (spec.hidden if spec.shared_gate else 0))


@dataclass(frozen=True)
class Routing:
    """How tokens reach the experts: the strategy's stated MoE assumptions."""

    #: expert capacity factor (GShard / Switch padded capacity); None: dropless
    capacity_factor: float | None = None
    #: expert-parallel degree: the experts split over ``ep`` data-parallel replicas
    ep: int = 1
    #: the busiest expert-parallel rank's routed tokens over the balanced share (>= 1)
    imbalance: float = 1.0

    @classmethod
    def of(cls, strategy) -> "Routing":
        return cls(getattr(strategy, "moe_capacity_factor", None), getattr(strategy, "ep", 1),
                   getattr(strategy, "moe_imbalance", 1.0))

    @property
    def load(self) -> float:
        """Rows the busiest rank's experts compute over the balanced share: the capacity
        factor when padded (every expert its full buffer, whatever the routing); dropless, the
        imbalance once the experts live on different ranks (``ep > 1``; on one rank the
        grouped GEMMs do the same work however the tokens are spread)."""
        if self.capacity_factor is not None:
            return self.capacity_factor
        return self.imbalance if self.ep > 1 else 1.0


def expert_rows(spec, tokens: int, routing: Routing | None = None) -> int:
    """Rows each expert on the busiest rank processes when every rank routes ``tokens``
    tokens: ``tokens x top_k / experts`` from each of the ``ep`` ranks (dropless, balanced),
    times :attr:`Routing.load` (the padded capacity ``C x tokens x top_k / experts``, GShard
    Sec. 2.2, Switch Transformer Sec. 2.2; or the stated imbalance)."""
    r = routing or Routing()
    share = tokens * spec.top_k / spec.experts * r.ep * r.load
    return max(1, math.ceil(share - 1e-9))


def moe_ops(spec, tok: int, tp: int, bpv: int, routing: Routing | None = None) -> list:
    """Forward operators of one MoE block's MLP part on one rank for ``tok`` tokens
    (:class:`perfsim.models.ops.Op` values): router GEMM, routing, permutation of the token
    copies, the local experts' grouped GEMMs (``experts / ep`` experts, each FFN split
    ``tp`` ways as Megatron-Core's expert tensor parallelism), the combination, the shared
    expert. The all-to-all between expert-parallel ranks is communication
    (:func:`ep_alltoall_bytes`), not an op here."""
    from perfsim.models.ops import Op  # lazy: import perfsim does not load perfsim.models.ops

    r = routing or Routing()
    h, k = spec.hidden, spec.top_k
    local = spec.experts // r.ep
    ef = spec.expert_ffn // tp
    rows = expert_rows(spec, tok, r)
    computed = rows * local  # token copies this rank's experts compute
    sent = tok * k * (r.capacity_factor or 1.0)  # this rank's own copies (padded to capacity)
    # gather the copies into expert order (read and write each), and once more on arrival
    permuted = sent + (computed if r.ep > 1 else 0)
    up = (2 if spec.gated else 1) * ef
    ops = [Op("router", m=tok, n=spec.experts, k=h),
           # fp32 logits: softmax (read, write), top-k (read), the k weights written
           Op("router_topk", bytes=4 * tok * (3 * spec.experts + k)),
           Op("moe_permute", bytes=2 * bpv * permuted * h),
           Op("expert_up", m=rows, n=up, k=h, batch=local),
           Op("expert_activation", bytes=bpv * computed * ef * (3 if spec.gated else 2)),
           Op("expert_down", m=rows, n=h, k=ef, batch=local),
           # back into token order, scale by the router weight and sum the k copies per token
           Op("moe_unpermute", bytes=bpv * (2 * permuted + tok) * h)]
    if spec.shared_ffn:
        sf = spec.shared_ffn // tp
        ops += [Op("shared_up", m=tok, n=(2 if spec.gated else 1) * sf, k=h),
                Op("shared_activation", bytes=bpv * tok * sf * (3 if spec.gated else 2)),
                Op("shared_down", m=tok, n=h, k=sf)]
        if spec.shared_gate:
            ops += [Op("shared_gate", m=tok, n=1, k=h), Op("shared_gate_scale", bytes=3 * bpv * tok * h)]
    return ops


def a2a_tokens(strategy, seq_len: int) -> int:
    """Tokens one rank dispatches per micro-batch: its ``micro_batch x seq_len``, of which a
    tensor-parallel rank under sequence parallelism holds ``1 / tp`` (Megatron-Core's
    ``MoEAlltoAllTokenDispatcher``, "num_local_tokens: S/TP*B": each rank sends its own
    sequence shard's copies over the expert-parallel group, and the tensor-parallel group
    all-gathers what arrives, :func:`tp_moe_rows`). Without sequence parallelism every
    tensor-parallel rank holds and sends them all."""
    tok = strategy.micro_batch * seq_len
    return tok // strategy.tp if strategy.sequence_parallel and strategy.tp > 1 else tok  # SP: tp divides seq


def tp_moe_rows(spec, strategy) -> float:
    """Rows per token of a MoE block's tensor-parallel all-gather and reduce-scatter under
    sequence parallelism with ``ep > 1`` (:func:`a2a_tokens`): the ``top_k`` routed copies
    (times :attr:`Routing.load`, the busiest rank's) where a dense MLP gathers each token
    once; 1 otherwise (the dense pattern, as without expert parallelism)."""
    if strategy.ep > 1 and strategy.sequence_parallel and strategy.tp > 1:
        return spec.top_k * Routing.of(strategy).load
    return 1.0


def ep_alltoall_bytes(spec, tok: int, bpv: int, routing: Routing) -> float:
    """Per-rank buffer of ONE token all-to-all between expert-parallel ranks (dispatch or
    combine; GShard Sec. 2.2, Lepikhin et al. 2020, arXiv:2006.16668; Megatron-Core's
    ``MoEAlltoAllTokenDispatcher``): the ``top_k`` copies of each of ``tok`` tokens,
    ``hidden`` values each, times :attr:`Routing.load` (the capacity buffers when padded;
    the busiest rank's share when imbalanced). A MoE block issues four per micro-batch:
    dispatch and combine forward, their gradients backward."""
    return float(tok * spec.top_k * spec.hidden * bpv * routing.load)


def ep_replicas(ep: int, g: int) -> range:
    """Data-parallel replicas of expert-parallel group ``g``: ``ep`` consecutive ones, which
    split the experts between them (Megatron-Core lays the expert-parallel group inside the
    data-parallel one, ranks ordered tensor, expert / data, pipeline); the ranks are
    :meth:`perfsim.job.Job.device` of these replicas."""
    return range(g * ep, (g + 1) * ep)


def expert_dp_replicas(dp: int, ep: int, r: int) -> range:
    """Replicas holding the same experts as replica ``r``: its expert-data-parallel group, the
    ``dp / ep`` replicas ``{r mod ep, r mod ep + ep, ...}`` (Megatron-Core's expert data
    parallel group; DeepSpeed-MoE, Rajbhandari et al. 2022, arXiv:2201.05596, Sec. 5), over
    which the experts' gradients would be all-reduced -- one replica each with ``ep = dp``,
    the only case the engine models today (``check_routing``)."""
    return range(r % ep, dp, ep)


def expert_params_per_rank(spec, tp: int, ep: int, i: int) -> int:
    """Parameters of block ``i``'s routed experts one rank holds (``experts / ep`` experts,
    each split ``tp`` ways); 0 for a dense block."""
    if not spec.is_moe_block(i):
        return 0
    return (spec.experts // ep) * -(-spec.mlp_params(spec.expert_ffn) // tp)


def optimizer_shard_params(params: float, expert_params: float, dp: int, ep: int, zero: int) -> float:
    """Parameters whose optimizer state (and step) one rank holds of ``params``, ``expert_params`` of
    them routed experts': all without ZeRO; under ZeRO-1 and up the dense ones' ``1 / dp`` and the
    experts' ``1 / (dp / ep)`` -- each shards over the replicas holding the same parameters, the
    experts over their expert-data-parallel group (Megatron-Core's distributed optimizer keeps one
    buffer per group: ``--use-distributed-optimizer`` with ``--expert-model-parallel-size``;
    DeepSeek-V3 trains with ZeRO-1 and expert parallelism, arXiv:2412.19437, Sec. 3.2)."""
    if not zero:
        return params
    return (params - expert_params) / dp + expert_params / (dp // ep)


def stage_expert_params(spec, tp: int, ep: int, block_ids) -> int:
    """Routed experts' parameters one rank holds of the blocks ``block_ids``
    (:func:`expert_params_per_rank`); 0 without expert parallelism (its experts are then
    replicated like any dense weight)."""
    if ep == 1 or spec is None or not getattr(spec, "moe", False):
        return 0
    return sum(expert_params_per_rank(spec, tp, ep, i) for i in block_ids)


def moe_activation_values(spec, tokens: int, tp: int, routing: Routing | None = None) -> float:
    """Values (of the activation dtype) one MoE block's MLP part keeps for the backward
    on the busiest rank when each rank routes ``tokens`` tokens: the token copies its
    experts compute (``hidden`` each), their MLP inputs and activations (as a dense MLP
    keeps, per copy: ``3 f`` gated, ``2 f`` else, split ``tp`` ways), the shared expert's,
    and the router's fp32 probabilities (2 values each)."""
    r = routing or Routing()
    rows = expert_rows(spec, tokens, r) * (spec.experts // r.ep)
    mats = 3 if spec.gated else 2
    return (rows * spec.hidden + rows * spec.expert_ffn * mats / tp + tokens * spec.shared_ffn * mats / tp
            + 2 * tokens * spec.experts)


def check_routing(spec, name: str, strategy) -> None:
    """The strategy's MoE settings fit the model (ConfigError naming the setting)."""
    moe = getattr(spec, "moe", False)
    for what, set_ in (("moe_capacity_factor", strategy.moe_capacity_factor is not None),
                       ("ep", strategy.ep > 1), ("moe_imbalance", strategy.moe_imbalance != 1.0)):
        if set_ and not moe:
            raise ConfigError(f"{what}={getattr(strategy, what):g}: model {name!r} has no experts")
    # moe_imbalance with ep 1 or padded capacity changes nothing (Routing.load): accepted and said
    # unused (perfsim.api.model_facts), as a2a_compress with ep 1, so a grid over ep keeps its ep-1 point
    if strategy.ep == 1:
        return
    if spec.experts % strategy.ep:
        raise ConfigError(f"ep={strategy.ep}: does not divide the {spec.experts} experts of {name!r}")
    # a rank holding experts/ep experts receives each token's copies at most min(top_k, experts/ep)
    # times, from every one of the ep ranks: ep x that / top_k times the balanced share
    local = min(spec.top_k, spec.experts // strategy.ep)
    most = strategy.ep * local / spec.top_k
    if strategy.moe_imbalance > most * (1 + 1e-9):
        raise ConfigError(f"moe_imbalance={strategy.moe_imbalance:g}: more than the busiest rank can receive "
                          f"(at most {most:g} x the balanced share: every token's copies to its {local} "
                          f"expert(s) on one rank, ep={strategy.ep}, top-{spec.top_k})")


def expert_layers(spec, layers, tp: int, ep: int) -> list:
    """``layers`` (``LayerSpec`` of one rank, model order) holding only their routed experts'
    parameters (:func:`expert_params_per_rank`; 0 for a dense block and every other layer):
    the gradients an expert-data-parallel group all-reduces when ``ep`` is smaller than
    ``dp`` (:func:`expert_dp_replicas`)."""
    return [replace(layer, tensors=(), params=expert_params_per_rank(spec, tp, ep, block_index(layer.name))
                    if is_block(layer.name) else 0) for layer in layers]


def check_simulated(strategy) -> None:
    """What the memory model answers but the simulator cannot run yet (ConfigError). Expert
    parallelism smaller than data parallelism is simulated with plain or element-wise
    gradient compressors (the experts' buckets over their expert-data-parallel group,
    :func:`expert_dp_replicas`); not with PowerSGD's per-matrix hook (the experts' matrices
    are not listed) nor with a 1-bit optimizer (one fused buffer over all replicas)."""
    family = strategy.grad_compress.family
    if 1 < strategy.ep < strategy.replicas and family in ("hook", "optimizer"):
        raise ConfigError(f"grad_compress {strategy.grad_compress.text!r} with ep={strategy.ep} < dp={strategy.dp}: "
                          f"the experts' gradient sync over dp/ep = {strategy.dp // strategy.ep} replicas is not "
                          "simulated with a " + ("per-matrix hook" if family == "hook" else "1-bit optimizer")
                          + "; give --ep equal to --dp or another --grad-compress (perfsim memory answers "
                          "for this job)")


#: values per fp32 scale of an fp8 dispatch: DeepSeek-V3's fine-grained quantization of the
#: activations, "on a 1x128 tile basis (i.e., per token per 128 channels)" (DeepSeek-AI 2024,
#: arXiv:2412.19437, Sec. 3.3, "Fine-Grained Quantization"); the scale is taken as one fp32 (4 bytes)
FP8_BLOCK = 128
#: what ``--a2a-compress`` accepts (``directq:BITS[:det][:bucket=N]``: any DirectQ spec)
A2A_COMPRESS = ("none", "fp8", "directq:BITS")


def parse_a2a_compress(text) -> str:
    """The canonical ``--a2a-compress`` value (ConfigError naming it otherwise): ``none``,
    ``fp8`` (DeepSeek-V3's fp8 dispatch, arXiv:2412.19437 Sec. 3.3) or a DirectQ spec
    (direct quantization of activations, the baseline of AQ-SGD, arXiv:2206.01299 Sec. 4.1).
    AQ-SGD is refused (it compresses each sample's change against the previous message it
    sent to the same receiver, and a token's copies go to other experts, hence other ranks,
    every step); gradient compressors are refused (they compress gradients, not activations)."""

    s = str(text).strip().lower()
    if s in ("none", "fp8"):
        return s
    if s.split(":", 1)[0] == "aqsgd":
        raise ConfigError(f"a2a_compress={text!r}: AQ-SGD needs each sample's previous message to the same "
                          "receiver, and tokens route to different experts (ranks) every step; use directq or fp8")
    spec = parse_spec(s, "grad")
    if spec.name != "directq":
        raise ConfigError(f"a2a_compress={text!r}: the all-to-all carries activations; choose none, fp8 or "
                          "directq:BITS (gradient compressors do not apply)")

    return make_compressor(spec).spec  # checks its arguments; canonical text


def check_a2a_gpu(codec: str, gpu) -> None:
    """An ``fp8`` dispatch needs fp8 hardware: a GPU preset (``--gpu``) with an fp8 rate
    (Hopper or newer, :mod:`perfsim.hardware`); ConfigError otherwise."""
    if codec == "fp8" and (gpu is None or "fp8" not in gpu.peak_flops):
        raise ConfigError(f"a2a_compress='fp8': needs a GPU preset with fp8 (--gpu, Hopper or newer); "
                          f"{'no --gpu given' if gpu is None else gpu.name + ' has no fp8'}")


def a2a_wire_bytes(codec: str, spec, tok: int, bpv: int, routing: Routing) -> float:
    """Per-rank buffer of ONE compressed dispatch-direction all-to-all (the forward dispatch,
    or the backward's gradient into the expert outputs), :func:`ep_alltoall_bytes`'s
    ``tok x top_k`` rows of ``hidden`` values sent at ``codec``'s wire size: ``fp8`` one byte a
    value plus one fp32 scale per :data:`FP8_BLOCK` values of a row (arXiv:2412.19437
    Sec. 3.3, "Fine-Grained Quantization"); ``directq:...`` its compressor's own ``wire_bytes`` (codes and scales,
    :class:`perfsim.compression.directq.DirectQ`); ``none`` the training precision's."""
    if codec == "none":
        return ep_alltoall_bytes(spec, tok, bpv, routing)
    rows, h = tok * spec.top_k, spec.hidden
    if codec == "fp8":
        wire = rows * (h + 4 * math.ceil(h / FP8_BLOCK))
    else:

        wire = make_compressor(codec).wire_bytes((rows, h))
    return float(wire * routing.load)
