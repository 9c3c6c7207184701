"""The kernels eager PyTorch launches for a transformer block (``kernels="eager"``, ``"eager-pure"``).

:func:`perfsim.models.ops.block_ops` lists a block as Megatron-LM runs it: fused kernels
(LayerNorm, bias-dropout-add, the scale-mask-softmax, bias-GELU), norms as one pass over the
activations. A plain PyTorch training step (a Hugging Face model, nanoGPT, ``torch.autocast`` and
``scaled_dot_product_attention``) launches one kernel per aten operator instead, and under
autocast keeps the residual stream and the norms in fp32 and casts every weight and every
linear layer's input to the compute dtype on each forward (PyTorch "Automatic Mixed
Precision", torch.amp docs: ``linear``/``matmul``/SDPA run in the lower precision, ``pow``,
``rsqrt``, ``layer_norm`` in fp32, other ops at the widest input type). :func:`eager_block_ops`
lists those kernels, forward and backward (autograd's kernels as backward-only :class:`Op`
values), with the bytes each reads and writes:

* ``rmsnorm`` (Llama, Mistral, Qwen2 ...): ``LlamaRMSNorm`` in transformers' modeling_llama.py --
  upcast, ``pow``, ``mean``, ``+ eps``, ``rsqrt``, ``mul``, the weight ``mul``: 6 kernels
  forward, 13 backward, every one a pass over fp32 activations;
* rotary embeddings (``apply_rotary_pos_emb`` with ``rotate_half``): per q and per k two ``mul``
  by the fp32 ``cos``/``sin`` (the result fp32), a ``neg`` and a ``cat`` of the halves, an
  ``add``; 9 kernels each backward under autocast;
* grouped-query attention: ``repeat_kv`` (expand, then reshape: a copy) of k and v when the
  query heads outnumber the key/value heads; under autocast SDPA casts q and k (fp32 after the
  rotary ``mul``) back to the compute dtype;
* the MLP's ``silu`` and ``gate * up`` (SwiGLU) or ``gelu``; the residual ``add``; a GPT block's
  ``native_layer_norm``, ``native_dropout`` (output and a bool mask), bias gradients as ``sum``;
* autograd's accumulation of a tensor's gradients (an ``add`` per extra use) and the casts of
  every gradient back through autocast's casts.

Without autocast, with the weights themselves in bf16/fp16 (``kernels="eager-pure"``:
``model.to(torch.bfloat16)``, FSDP2's ``param_dtype``, the steps of ``scripts/gpu_step_bench.py``)
the casts go, the residual stream, norms and rotary products are half precision, and
``LlamaRMSNorm`` casts up and back down.

The list was derived from the real thing and is held to it: ``tests/models/test_eager_ops.py``
runs a Llama decoder layer written as transformers writes it, and the GPT block
``scripts/gpu_step_bench.py`` timed on the H100/H200, under ``torch.profiler`` on the CPU and
checks the number of memory-bound kernels and the bytes they move, forward and backward, against
this list (``python scripts/eager_kernels.py`` prints the table). Bytes count each input as it is
viewed (an expanded ``repeat_kv`` input once per repeat) and each output.
"""

from __future__ import annotations

from perfsim.errors import ConfigError
from perfsim.models.ops import Op

#: bytes of an fp32 value: the residual stream and the norms under autocast, whose weights are
#: fp32 (the embedding's output is fp32); ``LlamaRMSNorm``'s internals always
FP32 = 4


def _k(name: str, fwd: float = 0.0, bwd: float = 0.0, core: bool = False) -> Op:
    """One forward kernel moving ``fwd`` bytes, or (``fwd`` 0) one backward kernel moving ``bwd``."""
    return Op(name, bytes=fwd, bwd_bytes=bwd, attention_core=core) if fwd else Op(name, bwd_bytes=bwd)


def rms_norm_ops(name: str, tok: int, h: int, a: int = FP32) -> list[Op]:
    """``LlamaRMSNorm`` over ``tok x h`` values of ``a`` bytes (its weight too): 6 forward kernels
    in fp32 (``pow``, ``mean``, ``+ eps``, ``rsqrt``, ``mul``) but the weight ``mul``, 13 backward
    (autograd's formulas of ``weight * y``, ``x * rsqrt(v)``, ``rsqrt``, ``mean``, ``pow``), and
    autograd adding the two gradients of the fp32 input (``pow`` and ``mul``); a half-precision
    input is cast up and back down (two more kernels each way)."""
    n, f = tok * h, FP32
    casts = [] if a == f else [_k(f"{name}_upcast", (a + f) * n, (f + a) * n),
                               _k(f"{name}_downcast", (f + a) * n, (a + f) * n)]
    return casts + [
        _k(f"{name}_pow", 2 * f * n), _k(f"{name}_mean", f * n + f * tok), _k(f"{name}_add_eps", 2 * f * tok),
        _k(f"{name}_rsqrt", 2 * f * tok), _k(f"{name}_scale", 2 * f * n + f * tok),
        _k(f"{name}_weight", 2 * a * n + a * h),
        *(_k(f"{name}_bwd_{i}", bwd=b) for i, b in enumerate((
            2 * a * n + a * h, 3 * a * n, a * n + a * h,           # d(weight * y): grad y, grad weight, its sum
            3 * f * n, 2 * f * n + f * tok, f * n + f * tok,     # d(x * r): grad x, grad r, its sum
            2 * f * tok, 2 * f * tok, 3 * f * tok,               # d rsqrt: r^3, x -0.5, x grad
            2 * f * n,                                           # d mean: expand / h
            2 * f * n, 2 * f * n, 3 * f * n))),                  # d pow: x^1, x 2, x grad
        _accumulate(f"{name}_input_grad", n, f)]


def layer_norm_ops(name: str, tok: int, h: int, a: int = FP32) -> list[Op]:
    """``nn.LayerNorm`` (``native_layer_norm``: one kernel each way) on values and weights of
    ``a`` bytes, its fp32 mean and rstd kept (CUDA's accumulate type)."""
    return [_k(name, 2 * a * tok * h + 2 * a * h + 2 * FP32 * tok),
            _k(f"{name}_bwd", bwd=3 * a * tok * h + 2 * FP32 * tok + 4 * a * h)]


def _linear(name: str, tok: int, n: int, k: int, c: int, mixed: bool, cast_input: bool, bias: bool,
            lm_head: bool = False) -> list[Op]:
    """``nn.Linear`` (``tok x k`` by ``k x n``): under autocast its weight (and bias) cast to the
    compute dtype each forward and the weight gradient cast back (``ToCopyBackward``), its fp32
    input cast (``cast_input``) and that gradient cast back; the bias gradient a ``sum``."""
    f = FP32
    ops = [Op(name, m=tok, n=n, k=k, lm_head=lm_head)]
    if bias:
        ops.append(_k(f"{name}_bias_grad", bwd=c * tok * n + c * n))
    if mixed:
        ops += [_k(f"{name}_weight_cast", (f + c) * n * k), _k(f"{name}_weight_grad_cast", bwd=(f + c) * n * k)]
        if bias:
            ops += [_k(f"{name}_bias_cast", (f + c) * n), _k(f"{name}_bias_grad_cast", bwd=(f + c) * n)]
        if cast_input:
            ops += [_k(f"{name}_input_cast", (f + c) * tok * k), _k(f"{name}_input_grad_cast", bwd=(f + c) * tok * k)]
    return ops


def _rope_ops(name: str, tok: int, width: int, seq: int, dh: int, c: int, mixed: bool, a: int) -> list[Op]:
    """``q * cos + rotate_half(q) * sin`` on ``tok x width`` values of ``c`` bytes; ``cos``/``sin``
    (``seq x dh``) have the hidden states' ``a`` bytes (``LlamaRotaryEmbedding`` returns them in
    ``x.dtype``: fp32 under autocast, so the products are fp32)."""
    n, cs = tok * width, a * seq * dh
    ops = [_k(f"{name}_mul_cos", c * n + cs + a * n), _k(f"{name}_neg", c * n), _k(f"{name}_cat", 2 * c * n),
           _k(f"{name}_mul_sin", c * n + cs + a * n), _k(f"{name}_add", 3 * a * n),
           _k(f"{name}_bwd_mul_sin", bwd=2 * a * n + cs), _k(f"{name}_bwd_neg", bwd=c * n),
           _k(f"{name}_bwd_slice1", bwd=1.5 * c * n), _k(f"{name}_bwd_slice2", bwd=1.5 * c * n),
           _k(f"{name}_bwd_add_halves", bwd=3 * c * n), _k(f"{name}_bwd_mul_cos", bwd=2 * a * n + cs),
           _k(f"{name}_bwd_accumulate", bwd=3 * c * n)]
    if mixed:  # the fp32 products' gradients cast back to the projection's dtype
        ops += [_k(f"{name}_bwd_cast_sin", bwd=(a + c) * n), _k(f"{name}_bwd_cast_cos", bwd=(a + c) * n)]
    return ops


def _accumulate(name: str, n: int, a: int) -> Op:
    """autograd adding a second gradient of a tensor (of ``a`` bytes per value) used twice."""
    return _k(name, bwd=3 * a * n)


def eager_block_ops(spec, mb: int, tp: int, sp: bool, bpv: int, attention: str = "flash",
                    autocast: bool = True) -> list[Op]:
    """The kernels of one block on one tensor-parallel rank as eager PyTorch runs it (module
    docstring): a Llama-style block (``norm == "rmsnorm"``: RMSNorm, rotary, grouped-query SDPA,
    SwiGLU or a plain MLP, no dropout: transformers' ``LlamaDecoderLayer``) or a GPT-style one
    (LayerNorm, learned positions, dropouts: ``scripts/gpu_step_bench.py``'s block).
    ``bpv < 4``: under autocast (fp32 weights and residual stream, compute in ``bpv`` bytes), or
    without (``autocast=False``: the parameters themselves in ``bpv`` bytes, ``model.to(torch.bfloat16)``
    or FSDP2's ``param_dtype``; no casts but the RMSNorm's, the residual stream in ``bpv`` bytes).
    ``attention="megatron"``: the attention core as separate kernels (copies of q, k, v into
    ``(b x heads, s, d)``, the causal mask, ``masked_fill_``, ``softmax``, dropout, ``bmm``) in
    the compute dtype."""
    s, h, c = spec.seq_len, spec.hidden, bpv
    mixed = autocast and c < FP32  # autocast's casts
    a = FP32 if autocast else c  # the residual stream's and the weights' bytes
    tok = mb * s
    tok_sp = tok // tp if sp else tok
    heads = max(1, spec.heads // tp)
    dh = spec.head_dim
    q = heads * dh
    kv = max(1, spec.kv_heads // tp) * dh
    f = spec.ffn // tp
    llama = spec.norm == "rmsnorm"
    ops: list[Op] = []
    norm = rms_norm_ops if llama else layer_norm_ops
    ops += norm("norm1", tok_sp, h, a)
    if llama:
        for name, width in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            ops += _linear(name, tok, width, h, c, mixed, True, bool(spec.qkv_bias if spec.qkv_bias is not None
                                                                     else spec.bias))
            if name != "v_proj" or kv < q:  # a (b, heads, s, d) gradient viewed back as (b, s, width): a copy;
                # SDPA returns v's gradient in v's own layout already (unless repeat_kv's sum made it)
                ops.append(_k(f"{name}_grad_layout", bwd=2 * c * tok * width))
        ops += [_accumulate("norm1_out_grad_k", tok * h, a), _accumulate("norm1_out_grad_q", tok * h, a)]
        ops += _rope_ops("rope_q", tok, q, s, dh, c, mixed, a) + _rope_ops("rope_k", tok, kv, s, dh, c, mixed, a)
        k_width = kv
        if kv < q:  # repeat_kv: expand + reshape copies k (fp32 after the rotary mul) and v
            ops += [_k("repeat_k", 2 * a * tok * q, a * tok * q + a * tok * kv),
                    _k("repeat_v", 2 * c * tok * q, c * tok * q + c * tok * kv)]
            k_width = q
        if mixed:  # SDPA's autocast casts the fp32 q and k
            ops += [_k("sdpa_cast_q", (a + c) * tok * q, (a + c) * tok * q),
                    _k("sdpa_cast_k", (a + c) * tok * k_width, (a + c) * tok * k_width)]
    else:
        ops += _linear("qkv", tok, 3 * q, h, c, mixed, True, spec.bias)
        ops.append(_k("qkv_grad_cat", bwd=2 * c * tok * 3 * q))  # chunk's backward
    ops += _attention_ops(spec, mb, heads, s, dh, q, tok, c, attention)
    ops += _linear("proj", tok, h, q, c, mixed, False, bool(spec.out_bias if spec.out_bias is not None else spec.bias))
    ops += _residual_ops(1, tok_sp * h, c, mixed, llama, a)  # sequence parallel: a slice of the tokens
    ops += norm("norm2", tok_sp, h, a)
    mlp_bias = bool(spec.mlp_bias if spec.mlp_bias is not None else spec.bias)
    if spec.gated:
        ops += _linear("gate_proj", tok, f, h, c, mixed, True, mlp_bias)
        ops += _linear("up_proj", tok, f, h, c, mixed, True, mlp_bias)
        ops += [_k("silu", 2 * c * tok * f, 3 * c * tok * f), _k("gate_mul_up", 3 * c * tok * f),
                _k("gate_mul_up_bwd_gate", bwd=3 * c * tok * f), _k("gate_mul_up_bwd_up", bwd=3 * c * tok * f),
                _accumulate("norm2_out_grad", tok * h, a)]
    else:
        ops += _linear("fc", tok, f, h, c, mixed, True, mlp_bias)
        ops.append(_k("gelu", 2 * c * tok * f, 3 * c * tok * f))
    ops += _linear("down_proj" if spec.gated else "fc_proj", tok, h, f, c, mixed, False, mlp_bias)
    return ops + _residual_ops(2, tok_sp * h, c, mixed, llama, a)


def _residual_ops(i: int, n: int, c: int, mixed: bool, llama: bool, a: int) -> list[Op]:
    """Residual add ``i`` of a block on ``n`` values: the compute-dtype branch's gradient cast
    back under autocast, a GPT block's dropout (``native_dropout``: output and a bool mask), the
    ``add`` into the stream of ``a`` bytes; autograd adding the gradients of the next norm's
    input (the residual's and the norm's)."""
    ops = [_k(f"residual{i}_grad_cast", bwd=(FP32 + c) * n)] if mixed else []
    if not llama:
        ops.append(_k(f"dropout{i}", (2 * c + 1) * n, (2 * c + 1) * n))
    return ops + [_k(f"residual{i}", (2 * a + c) * n), _accumulate(f"residual{i}_grad", n, a)]


def eager_head_ops(spec, mb: int, tp: int, sp: bool, bpv: int, autocast: bool = True) -> list[Op]:
    """The final norm, the LM head and the loss as eager PyTorch runs them (transformers'
    ``ForCausalLMLoss``: the bf16 logits cast to fp32, the labels shifted by ``pad`` and a copy,
    ``cross_entropy`` as ``log_softmax`` then ``nll_loss``; backward ``nll_loss_backward`` (a
    zero-filled fp32 gradient of the logits), ``log_softmax``'s, the cast back); a tied head's
    gradient added into the embedding's (fp32, as :func:`perfsim.models.ops.head_ops`)."""
    s, h, c = spec.seq_len, spec.hidden, bpv
    mixed = autocast and c < FP32
    a = FP32 if autocast else c
    tok = mb * s
    v = -(-spec.vocab // tp)
    n = tok * v
    norm = rms_norm_ops if spec.norm == "rmsnorm" else layer_norm_ops
    ops = norm("final_norm", tok // tp if sp else tok, h, a)
    ops += _linear("lm_head", tok, v, h, c, mixed, True, False, lm_head=True)
    if c < FP32:
        ops.append(_k("logits_to_fp32", (c + FP32) * n, (FP32 + c) * n))
    ops += [_k("labels_pad", 16 * tok + 8 * mb), _k("labels_shift", 16 * tok),  # int64 labels
            _k("log_softmax", 2 * FP32 * n, 3 * FP32 * n),
            _k("nll_loss", FP32 * n + 8 * tok + 8, 2 * FP32 * n + 8 * tok)]
    if spec.tied:
        ops.append(Op("lm_head_grad_accumulate", bwd_bytes=(c + 8) * v * h))
    return ops


def _attention_ops(spec, mb: int, heads: int, s: int, dh: int, q: int, tok: int, c: int, attention: str
                   ) -> list[Op]:
    """The attention core: SDPA (``flash``: one kernel each way) or ``megatron``'s separate kernels
    (scripts/gpu_step_bench.py ``megatron_block``)."""
    causal = not spec.encoder
    if attention == "flash":
        return [Op("flash_attention", m=s, n=s, k=dh, batch=mb * heads, attention_core=True, flash=True,
                   causal=causal)]
    n = mb * heads * s * s
    layout = 2 * c * tok * q  # a copy of tok x q values of the compute dtype
    return [_k("q_copy", layout, core=True), _k("k_copy", layout, core=True), _k("v_copy", layout, core=True),
            _k("mask_ones", s * s, core=True), _k("mask_triu", 2 * s * s, core=True),
            Op("scores", m=s, n=s, k=dh, batch=mb * heads, attention_core=True),
            _k("masked_fill", 2 * c * n + s * s, 2 * c * n + s * s, core=True),
            _k("softmax", 2 * c * n, 3 * c * n, core=True),
            _k("attn_dropout", (2 * c + 1) * n, (2 * c + 1) * n, core=True),
            Op("attn_v", m=s, n=dh, k=s, batch=mb * heads, attention_core=True),
            _k("y_copy", layout, layout, core=True),
            _k("scores_grad_scale_q", bwd=layout), _k("scores_grad_scale_k", bwd=layout),
            _k("q_grad_copy", bwd=layout), _k("k_grad_copy", bwd=layout)]


def eager_listed(spec, precision: str) -> bool:
    """Whether :func:`eager_block_ops` lists this block: a dense decoder block of two norms
    (no query/key norms, no latent attention, no multi-token prediction, every block rotary, no window
    or chunk shorter than the sequence), either Llama-style (RMSNorm, rotary) or GPT-style (LayerNorm, learned positions), in a
    precision plain PyTorch trains in (fp8 is Transformer Engine's, whose kernels are fused)."""
    llama = spec.norm == "rmsnorm" and not spec.learned_positions
    gpt = spec.norm == "layernorm" and spec.learned_positions
    dense = not (spec.moe or spec.encoder or spec.parallel_block or spec.norms_per_block != 2 or spec.qk_norm
                or spec.qk_l2_norm or spec.nope_layers or spec.mla or spec.mtp_layers or spec.context_shards > 1
                or spec.linear_attention_layers or spec.attention_output_gate or spec.mixer_free_layers
                or spec.mlp_free_layers
                or 0 < spec.sliding_window < spec.seq_len or 0 < spec.attention_chunk < spec.seq_len
                or spec.final_logit_softcap or spec.attn_logit_softcap)
    return dense and (llama or gpt) and precision != "fp8"


def check_eager(spec, precision: str, kernels: str = "eager") -> None:
    """ConfigError (naming ``kernels``) unless :func:`eager_listed`."""
    if precision == "fp8":
        raise ConfigError(f"kernels={kernels} with precision=fp8: fp8 training runs Transformer Engine's fused "
                          "kernels; use kernels=fused")
    if not eager_listed(spec, precision):
        raise ConfigError(f"kernels={kernels}: model {spec.name!r} is not modelled as eager PyTorch runs it (a dense "
                          "decoder without query/key norms, latent attention, multi-token prediction, NoPE blocks, a sliding window "
                          "or chunks, Gated DeltaNet, Mamba-2 or one-sub-block layers, gated attention, Llama-style: RMSNorm and rotary, or GPT-style: LayerNorm "
                          "and learned positions); use kernels=fused")
