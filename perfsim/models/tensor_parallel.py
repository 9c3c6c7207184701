"""Megatron-style tensor parallelism: what one transformer layer sends, and what it keeps.

Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053, Sec. 3): the attention's
QKV projection and the MLP's first GEMM are column-parallel, the attention
output projection and the MLP's second GEMM row-parallel, so each of the two
sub-blocks needs ONE all-reduce of the ``(b, s, h)`` activation in the forward
pass (operator ``g``) and one in the backward pass (operator ``f``): 2 + 2 per layer.

With sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.2.2)
each all-reduce becomes a reduce-scatter (after the row-parallel GEMM) and an
all-gather (before the column-parallel GEMM), in both passes: the same ring
volume, but norms and dropouts work on ``s / t`` tokens.

The sequence also enters and leaves the parallel region once per micro-batch
(:func:`tp_edge_collectives`): the embedding's output is split along the
sequence (its gradient is all-gathered backward) and the LM head all-gathers its
input forward. Megatron-LM's vocabulary-parallel embedding, head and cross
entropy add their own collectives (``vocab_parallel``: the GPU presets' layout);
execute mode keeps the embedding and head replicated on every TP rank, without them.

Buffer sizes follow the tensors each rank hands to the collective (as
``torch.distributed``): all-reduce its full ``(b, s, h)`` buffer; all-gather
its own ``(b, s/t, h)`` shard (the input; :func:`perfsim.network.collective_cost`
counts the ``t - 1`` other shards a ring forwards); reduce-scatter its full
``(b, s, h)`` input (the output is ``1/t`` of it).
"""

from __future__ import annotations

from perfsim.errors import ConfigError


#: how the ``t`` ranks of a stage send a boundary activation to the next stage's ``t`` ranks
#: (``Job.tp_send``): ``full`` -- every rank sends the whole ``(b, s, h)`` activation to its
#: peer (Megatron-Core without sequence parallelism; perfsim's runtime); ``scatter-gather``
#: -- each sends ``1/t`` of it and the receiving ranks all-gather the pieces over their node's
#: fabric (Megatron-LM's ``--scatter-gather-tensors-in-pipeline``, on by default in 2021;
#: Narayanan et al., arXiv:2104.04473, Sec. 4.1 and Fig. 9)
TP_SENDS = ("full", "scatter-gather")


def pipeline_send(numel: int, last_dim: int, tp: int, sequence_parallel: bool, mode: str
                  ) -> tuple[tuple[int, ...] | None, bool]:
    """What ONE tensor-parallel rank sends of a boundary activation of ``numel`` values (last
    dimension ``last_dim``), and whether the receivers all-gather it (:data:`TP_SENDS`):
    ``(shape of its slice or None for the whole tensor, gather)``. With sequence parallelism
    each rank already holds its ``1/t`` of the sequence and sends it, nothing to gather
    (Korthikanti et al., arXiv:2205.05198, Sec. 4.2.2)."""
    if mode not in TP_SENDS:
        raise ConfigError(f"tp_send={mode!r}: choose from {', '.join(TP_SENDS)}")
    if tp == 1 or (mode == "full" and not sequence_parallel):
        return None, False
    part = numel // last_dim * (last_dim // tp) if last_dim % tp == 0 else -(-numel // tp)
    return (part,), mode == "scatter-gather" and not sequence_parallel


def tp_layer_collectives(hidden: int, seq: int, micro_batch: int, tp: int, sequence_parallel: bool,
                         bytes_per_value: int, parallel_block: bool = False,
                         mlp_rows: float = 1.0, attn_widths: tuple[int, ...] = (), mixer: bool = True,
                         mlp: bool = True) -> tuple[tuple[str, str, float], ...]:
    """(phase ``fwd``/``bwd``, kind ``allreduce``/``allgather``/``reduce_scatter``,
    per-rank buffer bytes) of one transformer layer's tensor-parallel collectives,
    in execution order; empty for ``tp == 1``. ``parallel_block`` (attention and MLP on
    the same input, outputs summed: GPT-J, GPT-NeoX, Falcon): the two row-parallel
    outputs are summed before ONE forward all-reduce (GPT-NeoX's ``gpt_j_residual``
    defers both reductions, Black et al. 2022, arXiv:2204.06745; PaLM Sec. 2,
    arXiv:2204.02311); the backward keeps one per sub-block (each column-parallel
    input's gradient), and sequence parallelism keeps its pairs. ``mlp_rows``: the MLP
    sub-block's rows per token under sequence parallelism -- a MoE block whose experts are
    reached by all-to-all gathers and scatters the ``top_k`` routed copies of its tokens
    (Megatron-Core's ``MoEAlltoAllTokenDispatcher``: the all-to-all over the expert-parallel
    group, then an all-gather over the tensor-parallel group; :func:`perfsim.models.moe.tp_moe_rows`).
    ``attn_widths``: the widths the attention sub-block exchanges at its input, one collective each
    (:meth:`perfsim.models.transformer.TransformerSpec.attention_gather_widths`: MLA's latents and
    shared rotary key instead of the hidden state); empty: ``(hidden,)``. ``mixer`` / ``mlp`` False: a
    block without that sub-block (Nemotron-H's layers of a mixer alone or an MLP alone) and its collectives."""
    for name, v in (("hidden", hidden), ("seq", seq), ("micro_batch", micro_batch), ("tp", tp),
                    ("bytes_per_value", bytes_per_value)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}={v!r}: must be an integer >= 1")
    if tp == 1:
        return ()
    full = float(micro_batch * seq * hidden * bytes_per_value)
    attn_in = [float(micro_batch * seq * w * bytes_per_value) for w in (attn_widths or (hidden,))]
    if not sequence_parallel:
        # fwd: g after attention's row-parallel projection, g after the MLP's;
        # bwd: f before the MLP's column-parallel GEMM, f before attention's QKV (each input's)
        if not (mixer and mlp):
            return ((("fwd", "allreduce", full),) + ((("bwd", "allreduce", full),) if mlp else
                                                     tuple(("bwd", "allreduce", n) for n in attn_in)))
        return ((("fwd", "allreduce", full),) * (1 if parallel_block else 2)
                + (("bwd", "allreduce", full),) + tuple(("bwd", "allreduce", n) for n in attn_in))
    if seq % tp:
        raise ConfigError(f"seq={seq}: sequence parallelism needs it divisible by tp={tp}")
    shard = full / tp
    # fwd per sub-block: all-gather the sequence shards before the column-parallel
    # GEMM, reduce-scatter after the row-parallel one; bwd mirrors it (reduce-scatter
    # of the column-parallel input gradient, all-gather of the row-parallel output
    # gradient)
    sub_fwd = (("fwd", "allgather", shard), ("fwd", "reduce_scatter", full))
    sub_bwd = (("bwd", "allgather", shard), ("bwd", "reduce_scatter", full))
    attn_fwd = tuple(("fwd", "allgather", n / tp) for n in attn_in) + (("fwd", "reduce_scatter", full),)
    attn_bwd = (("bwd", "allgather", shard),) + tuple(("bwd", "reduce_scatter", n) for n in attn_in)
    mlp_fwd = tuple((ph, k, n * mlp_rows) for ph, k, n in sub_fwd) if mlp else ()
    mlp_bwd = tuple((ph, k, n * mlp_rows) for ph, k, n in sub_bwd) if mlp else ()
    if not mixer:
        attn_fwd = attn_bwd = ()
    return attn_fwd + mlp_fwd + mlp_bwd + attn_bwd  # backward: the MLP's first, then attention's


def tp_edge_collectives(hidden: int, seq: int, micro_batch: int, tp: int, sequence_parallel: bool,
                        bytes_per_value: int, embed: bool, head: bool, vocab_parallel: bool = False,
                        learned_positions: bool = True) -> tuple[tuple[str, str, float], ...]:
    """(phase, kind, per-rank buffer bytes) of the collectives a stage holding the
    embedding (``embed``) and / or the LM head (``head``) adds per micro-batch (none for
    ``tp == 1``).

    Under sequence parallelism (module docstring): a backward all-gather of the
    embedding's ``(b, s/t, h)`` output gradient, a forward all-gather of the head's
    input shard. ``vocab_parallel`` (Megatron-LM's layout, which the GPU compute model
    prices: the head's GEMM at ``vocab / t``; perfsim's runtime keeps both replicated)
    adds what its vocabulary-parallel edges launch (NVIDIA/Megatron-LM
    ``megatron/mpu/layers.py``, ``cross_entropy.py``; microsoft/Megatron-DeepSpeed alike):
    ``VocabParallelEmbedding.forward`` sums the ranks' partial lookups, an all-reduce of
    ``(b, s, h)`` forward -- a reduce-scatter under sequence parallelism when there are
    no learned positions to add first (Megatron-Core's ``reduce_scatter_embeddings``);
    the head's input enters through ``copy_to_tensor_model_parallel_region``, so its
    gradient is all-reduced backward (under sequence parallelism the all-gather's
    backward, a reduce-scatter); and the vocabulary-parallel cross entropy all-reduces
    three fp32 values per token forward (the logits' maximum, the target logit, the sum
    of exponentials). Full recomputation runs none of these again: Megatron checkpoints
    the transformer layers only."""
    if tp == 1:
        return ()
    full = float(micro_batch * seq * hidden * bytes_per_value)
    shard = full / tp
    out: list[tuple[str, str, float]] = []
    if head and sequence_parallel:
        out.append(("fwd", "allgather", shard))
    if embed and sequence_parallel:
        out.append(("bwd", "allgather", shard))
    if embed and vocab_parallel:
        out.append(("fwd", "reduce_scatter" if sequence_parallel and not learned_positions else "allreduce", full))
    if head and vocab_parallel:
        out += [("fwd", "allreduce", 4.0 * micro_batch * seq)] * 3
        out.append(("bwd", "reduce_scatter" if sequence_parallel else "allreduce", full))
    return tuple(out)


def tp_mtp_collectives(hidden: int, seq: int, micro_batch: int, tp: int, sequence_parallel: bool,
                       bytes_per_value: int, vocab_parallel: bool = False,
                       learned_positions: bool = True) -> tuple[tuple[str, str, float], ...]:
    """(phase, kind, per-rank buffer bytes) of what a multi-token prediction module adds to
    its transformer block's collectives (:func:`tp_layer_collectives`) per micro-batch
    (Megatron-Core ``megatron/core/transformer/multi_token_prediction.py``): its projection
    ``eh_proj`` is column-parallel without gathering its output, then
    ``all_gather_last_dim_from_tensor_parallel_region`` gathers the ``(b, s, h)`` output
    forward (its backward a split); the projection's ``2 h`` wide input enters as a
    column-parallel input does (its gradient all-reduced backward; under sequence
    parallelism all-gathered forward and reduce-scattered backward, and the gathered output
    scattered back to the sequence shards, whose backward is an all-gather). Its use of the
    embedding and its pass through the LM head and the loss add what those edges add
    (:func:`tp_edge_collectives`)."""
    if tp == 1:
        return ()
    full = float(micro_batch * seq * hidden * bytes_per_value)
    shard = full / tp
    if sequence_parallel:
        proj = (("fwd", "allgather", 2 * shard), ("fwd", "allgather", shard), ("bwd", "allgather", shard),
                ("bwd", "reduce_scatter", 2 * full))
    else:
        proj = (("fwd", "allgather", shard), ("bwd", "allreduce", 2 * full))
    return proj + tp_edge_collectives(hidden, seq, micro_batch, tp, sequence_parallel, bytes_per_value, True,
                                      True, vocab_parallel, learned_positions)


def block_mlp_widths(spec, i: int | None = None, ep: int = 1) -> list[int]:
    """The MLP widths of block ``i`` (default the last) on one expert-parallel rank: its
    ``ffn``, or ``experts / ep`` expert widths and the shared expert's."""
    i = spec.n_layer - 1 if i is None else i
    if spec.is_moe_block(i):
        return [spec.expert_ffn] * (spec.experts // ep) + ([spec.shared_ffn] if spec.shared_ffn else [])
    return [spec.ffn] if spec.has_mlp(i) else []


def block_gemm_params(spec, i: int | None = None, ep: int = 1) -> int:
    """GEMM weights of block ``i`` (default the last) on one expert-parallel rank: the
    attention's (:meth:`perfsim.models.transformer.TransformerSpec.attention_gemm_weights`)
    and every local MLP's matrices."""
    mats = 3 if spec.gated else 2
    i = spec.n_layer - 1 if i is None else i
    mtp = spec.mtp_projection_weights() if spec.is_mtp_block(i) else 0
    mixer = spec.attention_gemm_weights(i) if spec.has_mixer(i) else 0
    return mixer + sum(mats * spec.hidden * w for w in block_mlp_widths(spec, i, ep)) + mtp


def rank_gemm_params(spec, tp: int, i: int | None = None, ep: int = 1) -> int:
    """GEMM weights of block ``i`` one tensor-parallel rank holds: :func:`block_gemm_params`
    split ``t`` ways, but MLA's down projections whole on every rank."""
    i = spec.n_layer - 1 if i is None else i
    whole = (0 if spec.is_linear_block(i) or not spec.has_mixer(i) else
             sum(g.k * g.n for g in spec.attention_gemms() if not g.split))
    return -(-(block_gemm_params(spec, i, ep) - whole) // tp) + whole


def shard_block_params(spec, tp: int, i: int | None = None, ep: int = 1) -> int:
    """Parameters one tensor-parallel rank holds of block ``i`` (default the last): the
    GEMM weights (and their column-parallel biases) split ``t`` ways -- every expert's
    too, as Megatron-Core's expert tensor parallelism; ``experts / ep`` of them with
    expert parallelism -- the norms, the row-parallel biases and a MoE router
    replicated (Megatron-LM Sec. 3), as are MLA's down projections and latent norms
    (:meth:`perfsim.models.transformer.TransformerSpec.attention_replicated_weights`); a
    multi-token prediction module's projection split (column-parallel), its norms replicated; a
    Gated DeltaNet or Mamba-2 block's mixer split by head (its GEMMs, convolution taps and decay
    parameters), what it holds whole (a gated norm's weight shared by the heads, a row-parallel bias)
    replicated."""
    d, q, kv = spec.hidden, spec.q_dim, spec.kv_dim
    i = spec.n_layer - 1 if i is None else i
    mats = 3 if spec.gated else 2
    widths = block_mlp_widths(spec, i, ep)
    router = ((d + (1 if spec.router_bias else 0)) * spec.experts + (d if spec.shared_gate else 0)
              if spec.is_moe_block(i) else 0)
    mlp_col_bias = sum((mats - 1) * w for w in widths) if spec.mlp_bias else 0
    replicated = (spec.norms_per_block * spec.norm_params() + (d * len(widths) if spec.mlp_bias else 0) + router
                  + (spec.mtp_norm_params() if spec.is_mtp_block(i) else 0))
    if not spec.has_mixer(i):  # an MLP alone
        return -(-(block_gemm_params(spec, i, ep) + mlp_col_bias) // tp) + replicated
    if spec.is_linear_block(i):
        net = spec.linear_mixer
        whole = net.replicated_params() + net.row_bias(d)
        split = block_gemm_params(spec, i, ep) + net.params(d) - net.gemm_weights(d) - whole
        return -(-(split + mlp_col_bias) // tp) + replicated + whole
    whole = spec.attention_replicated_weights()
    gemm = block_gemm_params(spec, i, ep) - (whole - sum(spec.latent_norm_widths()))
    # column-parallel (split by heads or MLP width): q/k/v biases, the attention sinks, the MLPs' first biases
    col_bias = (((q + spec.gate_dim + 2 * kv) if spec.qkv_bias else 0) + (spec.heads if spec.attention_sinks else 0)
                + mlp_col_bias)
    replicated += (d if spec.out_bias else 0) + spec.qk_norm_params() + whole
    return -(-(gemm + col_bias) // tp) + replicated


def check_tp(spec, tp: int, sequence_parallel: bool = False, model: str = "") -> None:
    """The one rule set of tensor parallelism, for ``perfsim predict`` and ``perfsim run``
    alike: ``spec`` (a TransformerSpec; None: a model that is not a transformer, named
    ``model``) splits ``tp`` ways when its heads, MLP widths and key/value heads split evenly
    (Megatron-LM's column/row-parallel layers, Shoeybi et al., arXiv:1909.08053, Sec. 3), and
    with sequence parallelism (``tp > 1`` needed) the sequence too (Korthikanti et al.,
    arXiv:2205.05198, Sec. 4.2.2)."""
    if tp == 1:
        if sequence_parallel:
            raise ConfigError("sequence_parallel: needs tp > 1")
        return
    if spec is None:
        raise ConfigError(f"tp={tp}: tensor parallelism needs a transformer (GPT, LLaMA, BERT ...), not {model!r}")
    for what, n in (("heads", spec.heads), ("ffn", spec.ffn), ("expert_ffn", spec.expert_ffn),
                    ("shared_ffn", spec.shared_ffn)):
        if not n:
            continue
        if n % tp:
            raise ConfigError(f"tp={tp}: does not divide {spec.name} {what}={n}")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        raise ConfigError(f"tp={tp}: kv_heads={spec.kv_heads} neither divisible by nor dividing tp")
    if spec.linear_mixer is not None:
        spec.linear_mixer.check_tp(tp)
    if sequence_parallel and spec.seq_len % tp:
        raise ConfigError(f"tp={tp}: sequence_parallel needs it to divide seq_len={spec.seq_len}")
