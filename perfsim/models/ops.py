"""The operator vocabulary of a forward pass and a transformer's operator lists.

Models (:mod:`perfsim.models`) list their layers' kernels as :class:`Op` values; the
engine prices them (:func:`perfsim.engine.compute.op_time`: roofline x efficiency curve,
or a profile's measured rates).

A transformer layer's forward pass is a list of :class:`Op` (Megatron-LM's GPT
block, Shoeybi et al. 2019, arXiv:1909.08053; operator list and sizes as in
Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.1): the QKV, attention-output and
MLP GEMMs (split ``t`` ways by tensor parallelism), the two batched attention
GEMMs (scores ``Q K^T`` and the weighted sum), and the memory-bound operators
(norms, softmax, dropouts, GELU/SwiGLU, residual adds; with sequence parallelism
norms and dropouts see ``s / t`` tokens). The softmax is Megatron's fused kernel
where Megatron can use it, else its five-kernel PyTorch path (:func:`softmax_ops`). The
embedding (a gather), the LM head (a ``hidden x vocab/t`` GEMM per token, last stage) and
the loss (Megatron's vocab-parallel cross entropy in fp32, pass by pass:
:func:`cross_entropy_ops`) are ops too, so every layer costs something; so is the
per-micro-batch accumulation of the dense ``vocab/t x hidden`` embedding gradient (and of
the tied LM head's) into the fp32 main gradient (:func:`embedding_grad_ops`), which the
transformer GEMMs avoid under gradient accumulation fusion (the default; without it,
:class:`GradAccumulation`: every parameter's gradient is added once more per micro-batch,
:func:`block_grad_ops`). ``attention="flash"``: the attention core is FlashAttention-2's
one kernel (Dao 2023, arXiv:2307.08691). A mixture-of-experts block's MLP is
:func:`perfsim.models.moe.moe_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsim.errors import ConfigError
from perfsim.models.moe import moe_ops
from perfsim.models.tensor_parallel import shard_block_params

#: the block GEMMs Transformer Engine runs in fp8 under ``precision="fp8"`` (its
#: ``LayerNormLinear`` QKV, ``Linear`` projection, ``LayerNormMLP``'s two; a MoE block's
#: experts through its ``GroupedLinear``, the shared expert's; MLA's projections, its
#: ``Linear`` and ``LayerNormColumnParallelLinear`` modules): the attention core, the
#: router and the LM head stay bf16
FP8_GEMMS = ("qkv", "proj", "mlp_up", "mlp_down", "expert_up", "expert_down", "shared_up", "shared_down",
             "q", "q_down", "q_up", "kv_down", "kv_up")
#: Transformer Engine's quantisation kernels around the fp8 GEMMs (:func:`fp8_cast_ops`): ``te``
#: priced as TE 1.x launches them, ``none`` left out (the fp8 model before session 23)
FP8_CASTS = ("te", "none")


@dataclass(frozen=True)
class Op:
    """One kernel of a forward pass: a GEMM (``m, n, k``, ``batch`` copies) or a
    memory-bound op (``bytes`` moved)."""

    name: str
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    bytes: float = 0.0
    attention_core: bool = False  # recomputed by selective recomputation
    #: backward as one memory-bound kernel moving these bytes, instead of twice the
    #: forward (None); an op with no forward work (``bytes`` 0, not a GEMM) is backward-only
    bwd_bytes: float | None = None
    #: FlashAttention-2's fused kernel over ``batch`` (micro-batch x heads) sequences of
    #: ``m`` queries and ``n`` keys, head dimension ``k`` (:func:`perfsim.engine.compute.flash_time`)
    flash: bool = False
    #: a flash kernel's value head width when it differs from ``k`` (MLA's; 0: ``k``)
    v_dim: int = 0
    #: a causal mask: the kernel skips the upper half of the score matrix
    causal: bool = True
    #: the LM head's vocabulary projection (its rate: ``Curve.lm_head_eff``)
    lm_head: bool = False
    #: a causal flash kernel's sliding window: each query attends to the last ``window`` keys
    #: (FlashAttention-2's ``window_size``, whose kernel skips the key blocks outside it); 0: all
    window: int = 0
    #: a causal flash kernel over chunks: each query attends to the keys of its own chunk of
    #: ``chunk`` tokens (Llama 4's chunked attention; the kernel skips every key block outside the
    #: query block's chunk); 0: none
    chunk: int = 0
    #: thread blocks a GEMM-like kernel runs as, where they are too few to fill the GPU (a
    #: recurrence over chunks, one block per sequence, head and tile: a Gated DeltaNet's state pass);
    #: fewer than the GPU's SMs leave the rest idle (:func:`perfsim.engine.compute.op_time`); 0: enough
    ctas: int = 0
    #: the backward runs this op's forward again before its gradients (flash-linear-attention's
    #: chunk kernels recompute what they did not store), beyond any recomputation the job asks for
    bwd_recompute: bool = False

    @property
    def flops(self) -> float:
        """GEMM FLOPs; flash attention: the forward's two GEMMs, as FlashAttention counts
        them (``4 b h s^2 d``, halved by a causal mask; ``2 b h s^2 (d_qk + d_v)`` with
        MLA's narrower values)."""
        if self.flash:
            return 2.0 * (self.k + self.head_v) * self.batch * self.attended_pairs
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def attended_pairs(self) -> float:
        """(query, key) pairs a flash kernel computes: ``m n``; causal, half of them (``s^2 / 2``);
        with a sliding window ``w < s``, the causal triangle less the part beyond the window,
        ``s^2 / 2 - (s - w)^2 / 2 = w s - w^2 / 2`` (each query its last ``w`` keys); in chunks
        ``c < s``, a causal triangle per chunk, ``(s // c) c^2 / 2 + (s mod c)^2 / 2``."""
        if not self.causal:
            return float(self.m * self.n)
        pairs = 0.5 * self.m * self.n
        w, c = self.window, self.chunk
        if 0 < w < self.n:
            pairs -= 0.5 * (self.n - w) ** 2 * self.m / self.n
        elif 0 < c < self.n:
            whole, rest = divmod(self.n, c)
            pairs = 0.5 * (whole * c * c + rest * rest) * self.m / self.n
        return pairs

    @property
    def head_v(self) -> int:
        """A flash kernel's value head width (:attr:`v_dim`, else ``k``)."""
        return self.v_dim or self.k


def batch_per_block(sk: int) -> int:
    """Rows of scores one thread block of Megatron's fused softmax handles: 128 threads,
    warps of ``min(32, 2^ceil(log2 sk))`` lanes, 2 rows per warp up to 128 keys, else 1
    (Megatron-LM csrc/megatron/scaled_upper_triang_masked_softmax.h, ``get_batch_per_block``)."""
    pow2 = 1 << max(0, (sk - 1).bit_length())
    return (128 // min(32, pow2)) * (2 if pow2 <= 128 else 1)


def fused_softmax_available(b: int, heads: int, sq: int, sk: int, half: bool, causal: bool = True) -> bool:
    """Whether Megatron's fused scale-mask-softmax kernel runs (Megatron-LM
    megatron/model/fused_softmax.py, ``FusedScaleMaskSoftmax.is_kernel_available``):
    fp16/bf16 input, ``16 < sk <= 4096``, ``sq`` and ``sk`` divisible by 4, and
    ``b x heads`` (heads on this rank) divisible by 4 and, causal, by the kernel's
    rows per block -- e.g. not for one sequence with 2 heads per rank (TP 8 of 16 heads)."""
    n = b * heads
    if not (half and 16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and n % 4 == 0):
        return False
    return (n if causal else sq) % batch_per_block(sk) == 0


def softmax_ops(b: int, heads: int, s: int, bpv: int, n: int, causal: bool = True, exact: bool = False
                ) -> list[Op]:
    """The attention softmax on ``n`` scores: Megatron's fused kernel (read and write
    the scores) where it is available, else its PyTorch path
    (``forward_torch_softmax``: cast to fp32, scale, masked fill, softmax, cast back),
    five kernels instead of one for half-precision input; then dropout (+1 byte mask).

    ``exact``: the bytes these kernels really move (:func:`block_ops`): the fused causal
    kernel reads only the lower triangle of each row and writes the whole row (zeros above the
    diagonal), forward ``1.5 bpv n``; its backward reads the incoming gradient and the kept
    probabilities on the triangle and writes the whole row, ``2 bpv n`` (Megatron-LM
    megatron/fused_kernels/scaled_upper_triang_masked_softmax.h, both kernels load only
    ``element_index < local_seq = blockIdx.x + 1``; the 2021 version and today's alike). The
    dropout's backward is one ``masked_scale`` pass (PyTorch 1.8 aten/src/ATen/native/cuda/Dropout.cu:
    read the gradient and the uint8 mask, write the result), ``(2 bpv + 1) n``, not twice the forward."""
    if fused_softmax_available(b, heads, s, s, bpv == 2, causal):
        ops = [Op("softmax", bytes=(1.5 if exact and causal else 2) * bpv * n, attention_core=True,
                  bwd_bytes=(2 if causal else 3) * bpv * n if exact else None)]
    else:
        ops = [Op("softmax_scale", bytes=8 * n, attention_core=True),
               Op("softmax_mask", bytes=9 * n, attention_core=True),
               Op("softmax", bytes=8 * n, attention_core=True)]
        if bpv == 2:  # softmax_in_fp32 (Megatron's default)
            ops = ([Op("softmax_to_fp32", bytes=6 * n, attention_core=True)] + ops
                   + [Op("softmax_to_half", bytes=6 * n, attention_core=True)])
    return ops + [Op("attn_dropout", bytes=(2 * bpv + 1) * n, attention_core=True,
                     bwd_bytes=(2 * bpv + 1) * n if exact else None)]


def block_ops(spec, mb: int, tp: int, sp: bool, bpv: int, attention: str = "megatron",
              moe: bool | None = None, routing=None, exact: bool = False, fp8_casts: bool = False,
              block: int | None = None) -> list[Op]:
    """Forward ops of one transformer block on one tensor-parallel rank; ``attention="flash"``:
    the attention core (scores, softmax, dropout, weighted sum) is FlashAttention-2's one
    kernel (priced by :func:`perfsim.engine.compute.flash_time`). ``moe``: a block with routed experts (default: whether the
    model has any), whose MLP is :func:`perfsim.models.moe.moe_ops` (``routing``: a
    :class:`perfsim.models.moe.Routing`); a block of one norm (``norms_per_block`` 1) has no second norm.
    ``block``: the block (index) whose attention span, query/key norm, mixer and MLP these are (a block
    of a mixer alone or an MLP alone, Nemotron-H's, has only its one half and one residual add)
    (:meth:`perfsim.models.transformer.TransformerSpec.block_kind`; None: full attention, the model's
    norm): a sliding window (FlashAttention-2's ``window_size``) or chunks narrow the flash kernel; the
    separate kernels of ``attention="megatron"`` compute every score and mask those outside the
    window or chunk, as for the causal mask, so they leave them unchanged.

    ``exact`` (an experiment, off by default: ``scripts/megatron_open_data.py --exact-kernels``;
    docs/validation.md, "Megatron-LM 2021's kernels at sequence 2048"): every kernel Megatron-LM's
    GPT layer launches, with the bytes each moves, as its code reads (Megatron-LM 2021
    megatron/model/transformer.py ``ParallelSelfAttention``, megatron/mpu/layers.py; PyTorch 1.8):

    * ``qkv_bias``: ``ColumnParallelLinear`` calls ``F.linear(input, weight, bias)`` on a 3-D
      ``[s, b, h]`` input, which PyTorch 1.8's ``at::linear`` runs as ``matmul`` then ``add_(bias)``
      (only a 2-D input takes the fused ``addmm``; later Megatron-LM's
      ``LinearWithGradAccumulationAndAsyncCommunication`` adds it out of place, the same bytes):
      read and write the ``tok x 3h/t`` output; backward the bias gradient, a sum over tokens;
    * ``context_copy``: ``context_layer.permute(2, 0, 1, 3).contiguous()`` after the weighted sum,
      a copy of ``tok x h/t`` (backward: none -- the permuted gradient is a strided batch for ``bmm``);
    * ``proj_bias_grad``, ``mlp_down_bias_grad``: the row-parallel layers' biases (``skip_bias_add``,
      added in ``bias_dropout_add``) are whole on every rank; their gradients are sums of the
      ``tok x h`` output gradient, one read each, not split by tensor parallelism;
    * ``dropout_residual*`` backward: TorchScript's autodiff of dropout (symbolic_script.cpp:
      ``grad_output * mask * (1 / (1 - p))``), one pass: read the gradient and the 1-byte mask,
      write the result;
    * ``norm*`` backward: the fused LayerNorm's ``cuComputePartGradGammaBeta`` (reads the gradient
      and the input), ``cuComputeGradGammaBeta`` (small) and ``cuComputeGradInput`` (reads both
      again, writes the input gradient): five passes, not four (megatron/fused_kernels/
      layer_norm_cuda_kernel.cu, ``HostLayerNormGradient``);
    * ``norm*_input_grad_accumulate``: the norm's input is also the residual branch's, so autograd
      adds the two gradients (read two, write one: ``torch/csrc/autograd/input_buffer.cpp``);
    * the softmax and the attention dropout as :func:`softmax_ops` ``exact``.

    ``fp8_casts``: the block GEMMs run in fp8 (``precision="fp8"``), and Transformer Engine's
    quantisation kernels are priced as it launches them (:func:`fp8_cast_ops`)."""
    s, b, h, f = spec.seq_len, mb, spec.hidden, spec.ffn
    tok = b * s
    tok_sp = tok // tp if sp else tok  # norms/dropouts under sequence parallelism
    out = spec.out_dim // tp  # one rank's attention output, the projection's input
    act = bpv * tok_sp * h

    def norm(name, fp8_out: bool = False):  # exact: autograd adds the residual branch's gradient
        if fp8_out:  # TE's LayerNormLinear / LayerNormMLP: the norm writes its output in fp8
            return [Op(name, bytes=act + tok_sp * h, bwd_bytes=(5 if exact else 4) * act),
                    *([Op(f"{name}_input_grad_accumulate", bwd_bytes=3 * act)] if exact else [])]
        return [Op(name, bytes=2 * act, bwd_bytes=5 * act if exact else None),
                *([Op(f"{name}_input_grad_accumulate", bwd_bytes=3 * act)] if exact else [])]

    def dropout_add(name):
        return Op(name, bytes=3 * act + tok_sp * h, bwd_bytes=2 * act + tok_sp * h if exact else None)

    is_moe = spec.moe if moe is None else moe
    if spec.context_shards > 1 and attention != "flash":
        raise ConfigError(f"context parallelism ({spec.context_shards} shards) with attention={attention}: "
                          "Megatron-Core runs it through Transformer Engine's flash kernels; use attention=flash")
    if block is None:
        window = chunk = 0
        qk_norm, linear, has_mixer, has_mlp = spec.qk_norm or spec.qk_l2_norm, False, True, True
    else:
        _, window, chunk, qk_norm, linear, has_mixer, has_mlp = spec.block_kind(block)
    if linear:  # a Gated DeltaNet or Mamba-2 instead of attention: its projections and chunked kernels
        mixer = spec.linear_mixer.ops(b, s, h, tp, bpv)
    elif spec.mla:
        attn_in = latent_attention_ops(spec, tok, tok_sp, tp, bpv)
    else:
        v_width, qkv = rank_kv_width(spec, tp), rank_qkv_width(spec, tp)
        attn_in = [
            Op("qkv", m=tok, n=qkv, k=h),
            *([Op("qkv_bias", bytes=2 * bpv * tok * qkv, bwd_bytes=bpv * tok * qkv)] if exact else []),
            # the query and key heads' RMSNorm (Qwen3) or L2 norm (Llama 4): read and write q and k
            *([Op("qk_norm", bytes=2 * bpv * tok * (qkv - v_width - spec.gate_dim // tp))] if qk_norm else [])]
    if not linear:
        mixer = [*attn_in, *attention_core_ops(spec, b, s, tp, bpv, attention, window, chunk, exact),
                 Op("proj", m=tok, n=h, k=out), *([Op("proj_bias_grad", bwd_bytes=act)] if exact else [])]
    ops = [
        # MLA's down projections read norm1's output as a plain tensor (no fused fp8 write)
        *norm("norm1", fp8_casts and not spec.mla and not linear and has_mixer),
        *([*mixer,
           *(norm("norm_post_attn") if spec.norms_per_block == 4 else []),  # Gemma: before the residual add
           dropout_add("dropout_residual1")] if has_mixer else []),
        *(norm("norm2", fp8_casts and not is_moe) if spec.norms_per_block >= 2 else []),
    ]
    if not has_mlp:  # a mixer alone (Nemotron-H's Mamba and attention layers)
        return ops + (fp8_cast_ops(spec, tok, tp, bpv, dense_mlp=False, attention=not linear) if fp8_casts else [])
    if is_moe:
        ops += moe_ops(spec, tok, tp, bpv, routing)
    else:
        act_bytes = bpv * tok * f // tp * (3 if spec.gated else 2)
        ops += [Op("mlp_up", m=tok, n=(2 if spec.gated else 1) * f // tp, k=h),
                # under fp8 the activation writes its output in fp8 (TE's fused fp8 GELU / SwiGLU);
                # its backward, the fused dgelu-cast-transpose, moves what the bf16 one does
                Op("activation", bytes=act_bytes - (bpv - 1) * tok * f // tp, bwd_bytes=2 * act_bytes)
                if fp8_casts else Op("activation", bytes=act_bytes),
                Op("mlp_down", m=tok, n=h, k=f // tp),
                *([Op("mlp_down_bias_grad", bwd_bytes=act)] if exact else [])]
    if fp8_casts:
        ops += fp8_cast_ops(spec, tok, tp, bpv, dense_mlp=not is_moe, attention=not linear and has_mixer)
    if spec.norms_per_block == 4:
        ops += norm("norm_post_mlp")
    return ops + [dropout_add("dropout_residual2")]


def attention_core_ops(spec, b: int, s: int, tp: int, bpv: int, attention: str, window: int, chunk: int,
                       exact: bool) -> list[Op]:
    """The attention core of one block on one tensor-parallel rank, from the queries, keys and values
    to the projection's input (:func:`block_ops`): FlashAttention-2's kernel or Megatron's separate
    kernels, then the output gate (:attr:`perfsim.models.transformer.TransformerSpec.attention_output_gate`:
    a sigmoid of the gate and the product with the attention output, two element-wise passes)."""
    tok, heads = b * s, max(1, spec.heads // tp)
    dh, dv, out = spec.head_dim, spec.v_head_dim, spec.out_dim // tp
    attn_scores = b * heads * s * s
    # context parallelism: this rank's s queries against the whole sequence's keys, causal and
    # load-balanced (s x cp keys, half the pairs); Megatron-Core runs it as TE's flash kernels only
    core = ([Op("flash_attention", m=s, n=s * spec.context_shards, k=dh, batch=b * heads, attention_core=True,
                flash=True, causal=not spec.encoder, v_dim=dv if dv != dh else 0, window=window, chunk=chunk)]
            if attention == "flash" else
            [Op("scores", m=s, n=s, k=dh, batch=b * heads, attention_core=True),
             # Gemma 2's soft-capping as eager PyTorch runs it: divide, tanh, multiply (three passes;
             # backward: the three gradients, the tanh's reading its output too)
             *([Op("scores_softcap", bytes=6 * bpv * attn_scores, bwd_bytes=7 * bpv * attn_scores,
                   attention_core=True)] if spec.attn_logit_softcap else []),
             *softmax_ops(b, heads, s, bpv, attn_scores, causal=not spec.encoder, exact=exact),
             Op("attn_v", m=s, n=dv, k=s, batch=b * heads, attention_core=True),
             *([Op("context_copy", bytes=2 * bpv * tok * out, bwd_bytes=0.0)] if exact else [])])
    if spec.attention_output_gate:
        core += [Op("attn_gate_sigmoid", bytes=2 * bpv * tok * out), Op("attn_gate_mul", bytes=3 * bpv * tok * out)]
    return core


def rank_kv_width(spec, tp: int) -> int:
    """One tensor-parallel rank's keys (as wide as its values, standard attention): its share of the
    key/value heads, or one whole head when there are fewer heads than ranks."""
    return spec.kv_dim // tp if spec.kv_heads >= tp else spec.head_dim


def rank_qkv_width(spec, tp: int) -> int:
    """The output width of one rank's fused QKV projection: its queries (and output gates), keys and values."""
    return (spec.q_dim + spec.gate_dim) // tp + 2 * rank_kv_width(spec, tp)


def latent_attention_ops(spec, tok: int, tok_sp: int, tp: int, bpv: int) -> list[Op]:
    """Forward ops of multi-head latent attention's projections on one tensor-parallel rank, up
    to the attention core (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2-2.1.3), as Megatron-Core's
    ``MLASelfAttention`` launches them: each of
    :meth:`perfsim.models.transformer.TransformerSpec.attention_gemms` -- the replicated down
    projections on the rank's own tokens (``tok_sp``: its sequence shard under sequence
    parallelism, then all-gathered), the column-parallel up projections on all ``tok`` for the
    rank's heads -- each latent's RMSNorm (read and write the latent), and the concatenation of
    each head's rotary and non-rotary parts into whole query and key heads (``torch.cat``: read and
    write one rank's queries and keys)."""
    ops: list[Op] = []
    for g in spec.attention_gemms():
        if g.name == "q_up":
            ops.append(Op("q_latent_norm", bytes=2 * bpv * tok_sp * spec.q_lora_rank))
        if g.name == "kv_up":
            ops.append(Op("kv_latent_norm", bytes=2 * bpv * tok_sp * spec.kv_lora_rank))
        ops.append(Op(g.name, m=tok if g.split else tok_sp, n=g.n // tp if g.split else g.n, k=g.k))
    return ops + [Op("qk_rope_concat", bytes=2 * bpv * tok * 2 * spec.q_dim // tp)]


def fp8_cast_ops(spec, tok: int, tp: int, bpv: int, dense_mlp: bool = True, attention: bool = True) -> list[Op]:
    """Transformer Engine's quantisation kernels around a block's fp8 GEMMs, one micro-batch on one
    tensor-parallel rank (TE 1.x, delayed scaling, the amax taken inside each kernel;
    transformer_engine/pytorch/module/linear.py, layernorm_linear.py, layernorm_mlp.py and
    base.py ``grad_output_preprocess``). An fp8 GEMM reads fp8 operands, so every bf16 input is
    cast first, and the weight-gradient GEMM needs both operands transposed in fp8:

    * the attention projection's input (a plain ``Linear``): ``fp8_cast_transpose_fused`` in the
      forward -- read ``bpv``, write the fp8 copy and its transpose: ``bpv + 2`` bytes a value;
    * each GEMM's output gradient in the backward: cast and transposed the same way
      (``fp8_cast_transpose[_bgrad]_fused``, ``bpv + 2``) -- QKV's, the projection's and the
      second MLP GEMM's; the first MLP GEMM's comes out of the fused dgelu-cast-transpose
      (``fp8_cast_transpose_bgrad_dgelu_fused``), which moves what the bf16 dgelu does;
    * the fp8 inputs the norms and the activation wrote, transposed for the weight gradients in
      the backward (``tex.fp8_transpose``: read 1, write 1): QKV's and the first MLP GEMM's
      normalised input, the second MLP GEMM's activation;
    * multi-head latent attention: every projection's output gradient cast and transposed; the
      up projections' latents (their norms fused, ``LayerNormColumnParallelLinear``) transposed,
      the inputs of the plain ``Linear`` ones (the down projections, a query projection without a
      latent) cast and transposed in the forward.

    Not priced: the weights' fp8 copies, cast once per optimizer step (TE caches them over a step's
    micro-batches: ``is_first_microbatch``), about ``(bpv + 2)`` bytes per GEMM weight per step;
    the amax-history update, a few KB. ``dense_mlp`` False (a mixture-of-experts block): only the
    attention half's kernels -- the experts' ``GroupedLinear`` casts are not priced. ``attention``
    False (a linear-attention block, whose GEMMs are priced in bf16): only the MLP's."""
    h, f = spec.hidden, spec.ffn // tp
    cast_t = bpv + 2  # read bpv, write the fp8 copy and the fp8 transpose
    ops = [Op("fp8_proj_input_cast_transpose", bytes=cast_t * tok * spec.out_dim // tp, bwd_bytes=0.0)]
    if not attention:
        ops = []
    elif spec.mla:  # each projection's output gradient; its input transposed (a fused norm's) or cast
        for g in spec.attention_gemms():
            ops.append(Op(f"fp8_{g.name}_grad_cast_transpose", bwd_bytes=cast_t * tok * (g.n // tp if g.split else g.n)))
            ops.append(Op(f"fp8_{g.name}_input_transpose", bwd_bytes=2.0 * tok * g.k) if g.fused_norm else
                       Op(f"fp8_{g.name}_input_cast_transpose", bytes=cast_t * tok * g.k, bwd_bytes=0.0))
    else:
        ops += [Op("fp8_qkv_grad_cast_transpose", bwd_bytes=cast_t * tok * rank_qkv_width(spec, tp)),
                Op("fp8_norm1_out_transpose", bwd_bytes=2.0 * tok * h)]
    if attention:
        ops.append(Op("fp8_proj_grad_cast_transpose", bwd_bytes=cast_t * tok * h))
    if dense_mlp:
        ops += [Op("fp8_mlp_down_grad_cast_transpose", bwd_bytes=cast_t * tok * h),
                Op("fp8_activation_out_transpose", bwd_bytes=2.0 * tok * f),
                # the second norm writes the first MLP GEMM's input in fp8 (LayerNormMLP); a block
                # of one norm casts that input as a plain Linear does
                Op("fp8_norm2_out_transpose", bwd_bytes=2.0 * tok * h) if spec.norms_per_block >= 2 else
                Op("fp8_mlp_input_cast_transpose", bytes=cast_t * tok * h, bwd_bytes=0.0)]
    return ops


#: how a step's micro-batches accumulate their weight gradients (:class:`GradAccumulation`):
#: ``fused`` -- gradient accumulation fusion: each weight-gradient GEMM accumulates into the
#: fp32 ``main_grad`` in place (Megatron-LM ``--gradient-accumulation-fusion``, apex
#: ``fused_weight_gradient_mlp_cuda``), only the embedding's dense gradient is added;
#: ``main-grad`` -- Megatron-LM's local DDP without fusion: every parameter's half-precision
#: gradient is added into the ``main_grad`` buffer after every micro-batch
#: (megatron/model/distributed.py ``_make_param_hook``: ``param.main_grad.add_(param.grad.data)``);
#: ``autograd`` -- plain autograd (PyTorch DDP under ``no_sync``, DeepSpeed's engine, Megatron-LM's
#: local DDP of 2021 without its contiguous buffer): PyTorch's ``AccumulateGrad`` adds each
#: micro-batch's gradient into ``param.grad`` in place, every micro-batch after the first
GRAD_ACCUMULATION = ("fused", "main-grad", "autograd")


@dataclass(frozen=True)
class GradAccumulation:
    """How one replica's micro-batches accumulate their weight gradients, priced as
    backward-only memory-bound bytes per parameter per micro-batch (:meth:`per_param`)."""

    #: one of :data:`GRAD_ACCUMULATION`
    method: str = "fused"
    #: micro-batches per optimizer step on one replica (``m``)
    microbatches: int = 1
    #: bytes per value of Megatron's ``main_grad`` buffer (``main-grad``): fp32 under bf16
    #: (forced) or ``--accumulate-allreduce-grads-in-fp32``, else the parameters' own
    #: (:attr:`perfsim.config.Strategy.grad_dtype`)
    grad_bytes: int = 4
    #: bytes per value of ``param.grad`` (``autograd``: the weights' dtype; None: the
    #: activations' ``bpv``, half-precision weights as Megatron-LM and DeepSpeed keep them)
    weight_bytes: int | None = None

    def per_param(self, bpv: int, fusable: bool) -> float:
        """Bytes one micro-batch's backward moves per parameter to accumulate its gradient,
        beyond the kernel that computes it (which writes it: priced with that kernel):

        * ``fused``: 0 for a GEMM weight (``fusable``: accumulated in place by its
          weight-gradient GEMM); else Megatron's ``main_grad.add_`` on fp32: read the
          ``bpv``-byte gradient, read and write 4 bytes -- ``bpv + 8`` (the embedding's);
        * ``main-grad``: the same add for every parameter, on the buffer's
          ``grad_bytes``: ``bpv + 2 grad_bytes`` (fp16 buffer 6, fp32 buffer 10), every
          micro-batch (the buffer is zeroed once per step);
        * ``autograd``: ``param.grad += grad`` in the weights' dtype ``w``: read both, write
          one, ``3 w`` -- but not on the first micro-batch, whose gradient autograd keeps as
          it is (grads set to None by ``zero_grad``): ``3 w (m - 1) / m`` averaged over the
          step's ``m`` micro-batches (0 with one micro-batch)."""
        if self.method == "fused":
            return 0.0 if fusable else bpv + 8.0
        if self.method == "main-grad":
            return bpv + 2.0 * self.grad_bytes
        w = self.weight_bytes or bpv
        return 3.0 * w * (self.microbatches - 1) / self.microbatches


def block_grad_ops(spec, tp: int, bpv: int, acc: GradAccumulation | None, i: int | None = None,
                   ep: int = 1) -> list[Op]:
    """Backward-only: accumulating the gradients of block ``i``'s parameters on this rank
    (:func:`perfsim.models.tensor_parallel.shard_block_params`) -- nothing under ``fused``
    (its GEMMs accumulate in place; the biases' and norms' adds are left out there, as
    before: docs/validation.md, session 9), else :meth:`GradAccumulation.per_param` bytes
    each, as one memory-bound op (the adds are issued back to back by autograd's engine
    while the backward runs; one host floor, not one per tensor)."""
    per = (acc or GradAccumulation()).per_param(bpv, fusable=True)
    if not per:
        return []
    return [Op("block_grad_accumulate", bwd_bytes=per * shard_block_params(spec, tp, i, ep))]


def embedding_grad_ops(spec, tp: int, bpv: int, acc: GradAccumulation | None = None) -> list[Op]:
    """Backward-only: the word embedding's gradient is a dense ``vocab/t x h`` tensor
    (PyTorch's embedding backward zero-fills it, then scatters the tokens' rows) that
    Megatron's data-parallel wrapper adds into the fp32 ``main_grad`` after every
    micro-batch (Megatron-LM megatron/model/distributed.py, ``param.main_grad.add_``;
    the transformer GEMMs accumulate in place, gradient accumulation fusion):
    write ``bpv``, then read it and read and write 4 bytes per element; without fusion,
    the add of ``acc`` (:meth:`GradAccumulation.per_param`)."""
    n = -(-spec.vocab // tp) * spec.hidden
    per = (acc or GradAccumulation()).per_param(bpv, fusable=False)
    return [Op("embed_grad_zero", bwd_bytes=bpv * n)] + ([Op("embed_grad_accumulate", bwd_bytes=per * n)]
                                                         if per else [])


def embed_ops(spec, mb: int, tp: int, sp: bool, bpv: int, acc: GradAccumulation | None = None) -> list[Op]:
    tok = mb * spec.seq_len
    # vocab-parallel gather (each rank its rows) + position add, writes (b, s, h)
    return [Op("embed_gather", bytes=2 * bpv * tok * spec.hidden),
            Op("embed_add_dropout", bytes=(3 * bpv + 1) * tok * spec.hidden),
            *embedding_grad_ops(spec, tp, bpv, acc)]


def cross_entropy_ops(tok: int, v: int, bpv: int) -> list[Op]:
    """Megatron's vocab-parallel cross entropy on ``tok x v`` logits of this rank
    (Megatron-LM megatron/mpu/cross_entropy.py, ``_VocabParallelCrossEntropy``, called on
    ``logits.float()``): forward = cast to fp32, max, subtract, exp, sum, divide (the
    softmax kept for the backward), each a pass over the fp32 logits; backward = scale
    the kept softmax by the incoming gradient in place, then cast it back to ``bpv``
    (no casts when the logits are fp32 already)."""
    n = tok * v
    cast = [Op("loss_to_fp32", bytes=(bpv + 4) * n, bwd_bytes=(4 + bpv) * n)] if bpv < 4 else []
    return cast + [
            Op("loss_max", bytes=4 * n, bwd_bytes=0.0),
            Op("loss_sub_max", bytes=8 * n, bwd_bytes=0.0),
            Op("loss_exp", bytes=8 * n, bwd_bytes=0.0),
            Op("loss_sum", bytes=4 * n, bwd_bytes=0.0),
            Op("loss_softmax", bytes=8 * n, bwd_bytes=8 * n)]


def mtp_ops(spec, mb: int, tp: int, sp: bool, bpv: int, acc: GradAccumulation | None = None) -> list[Op]:
    """A multi-token prediction module's ops beside its transformer block (DeepSeek-V3,
    arXiv:2412.19437, Sec. 2.2, Eq. 21-22; Megatron-Core's ``MultiTokenPredictionLayer``): the
    shared embedding's rows of the tokens ``k`` ahead, ``enorm`` on them and ``hnorm`` on the
    previous depth's hidden state, their concatenation, the column-parallel projection
    ``eh_proj`` (``2 d -> d``), and the module's own pass through the final norm, the shared LM
    head and the cross entropy (:func:`head_ops`). The embedding's second use has a dense
    gradient of its own (:func:`embedding_grad_ops`)."""
    tok, h = mb * spec.seq_len, spec.hidden
    tok_sp = tok // tp if sp else tok
    return [Op("mtp_embed_gather", bytes=2 * bpv * tok * h), *embedding_grad_ops(spec, tp, bpv, acc),
            Op("mtp_enorm", bytes=2 * bpv * tok_sp * h),
            Op("mtp_hnorm", bytes=2 * bpv * tok_sp * h),
            Op("mtp_concat", bytes=4 * bpv * tok_sp * h),
            Op("mtp_eh_proj", m=tok, n=-(-h // tp), k=2 * h),
            *head_ops(spec, mb, tp, sp, bpv, acc)]


def head_ops(spec, mb: int, tp: int, sp: bool, bpv: int, acc: GradAccumulation | None = None) -> list[Op]:
    """The final norm, the LM head and the loss; the head weight's gradient accumulation: a
    tied head's is the (last stage's copy of the) embedding's, added as the embedding's is
    (:func:`embedding_grad_ops`), an untied one's a GEMM weight's (nothing under ``fused``)."""
    tok, h = mb * spec.seq_len, spec.hidden
    if spec.encoder:  # pooler on the first token
        return [Op("final_norm", bytes=2 * bpv * tok * h), Op("pooler", m=mb, n=h, k=h)]
    v = -(-spec.vocab // tp)
    ops = [Op("final_norm", bytes=2 * bpv * tok * h // (tp if sp else 1)),
           Op("lm_head", m=tok, n=v, k=h, lm_head=True),
           # Gemma 2's logit soft-capping: divide, tanh, multiply, each a pass over the logits
           *([Op("logit_softcap", bytes=6 * bpv * tok * v, bwd_bytes=7 * bpv * tok * v)]
             if spec.final_logit_softcap else []),
           *cross_entropy_ops(tok, v, bpv)]
    per = (acc or GradAccumulation()).per_param(bpv, fusable=not spec.tied)
    if per:
        ops.append(Op("lm_head_grad_accumulate", bwd_bytes=per * v * h))
    return ops
