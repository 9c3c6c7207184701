"""Any transformer: one architecture description, its parameter count and layers.

A :class:`TransformerSpec` describes GPT-2/GPT-3, GPT-NeoX, LLaMA/Mistral and
BERT alike (the knobs that change the parameter count and the operators):

* attention: ``heads`` query heads of width ``head_dim`` (default ``hidden / heads``), ``kv_heads``
  key/value heads (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245;
  ``kv_heads == heads`` is multi-head attention); or multi-head latent attention
  (``kv_lora_rank``, DeepSeek-V2/V3: :meth:`TransformerSpec.attention_gemms`);
* MLP: width ``ffn``; ``gated`` = SwiGLU with three matrices (LLaMA, Touvron et
  al. 2023, arXiv:2307.09288), else two (GELU);
* ``bias``: linear layers carry biases (GPT-2, BERT, NeoX) or not (LLaMA); ``qkv_bias``,
  ``out_bias``, ``mlp_bias`` override it per projection (Qwen2: q, k, v only); ``qk_norm``:
  an RMSNorm over each query and key head (Qwen3), ``qk_l2_norm`` a weightless L2 norm (Llama 4);
  ``norm``: ``layernorm`` (weight + bias) or ``rmsnorm`` (weight only), ``norms_per_block``
  of them (Falcon-7B's parallel block: 1; Gemma 2/3's norms before and after each sub-block: 4);
* attention span: ``sliding_window`` (Mistral, Gemma 2/3, gpt-oss) or ``attention_chunk`` (Llama 4),
  each but in ``full_attention_layers``;
* hybrid linear attention: ``linear_attention_layers`` mix tokens with a Gated DeltaNet or a Mamba-2
  layer (``linear_mixer``, :mod:`perfsim.models.delta_net`, :mod:`perfsim.models.mamba2`) instead of
  softmax attention, whose output may pass through a sigmoid gate (``attention_output_gate``; Qwen3-Next);
* mixture of experts: ``experts``, ``top_k``, ``expert_ffn``, ``shared_ffn``,
  ``dense_layers`` (:mod:`perfsim.models.moe`);
* embeddings: token table ``vocab x hidden``; ``positions`` learned position
  rows (0 for rotary); ``token_types`` (BERT's segment table); ``tied`` LM head.

Parameters of one block (``d`` hidden, ``q = heads * head_dim``, ``kv = kv_heads * head_dim``,
``f`` ffn): attention ``d*(q + 2 kv) + q*d`` (+ biases ``q + 2 kv`` and ``d``), MLP ``(3 if
gated else 2) * d * f`` (+ biases ``(2 if gated else 1) f + d``), the norms; a MoE block's
MLP is its router and experts (:func:`perfsim.models.moe.moe_mlp_params`). GPT-2 gives
``12 d^2 + 13 d`` (nanoGPT),
LLaMA-2 70B 68.98 B, GPT-3 175B 174.6 B, BERT-Large (with pooler) 335.1 M.

Inline spec (``--model``): ``gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200``
with optional ``ffn=``, ``kv_heads=``; ``llama:``/``bert:``/``neox:`` select those
architectures' conventions; ``head_dim=``, ``experts=``, ``top_k=``, ``expert_ffn=``
describe wider heads and a mixture of experts (:mod:`perfsim.models.moe`); ``kv_lora_rank=``,
``q_lora_rank=``, ``rope_head_dim=``, ``v_head_dim=`` multi-head latent attention. A Hugging
Face ``config.json`` path (or a folder holding one) is read by
:func:`perfsim.models.hf_config.from_hf_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from perfsim.errors import ConfigError
from perfsim.models.delta_net import GatedDeltaNet
from perfsim.models.mamba2 import Mamba2
from perfsim.models.moe import check_moe, moe_mlp_params
from perfsim.models.specs import LayerSpec, check_layer_count

#: architecture conventions: (gated MLP, bias, norm, learned positions, tied head, encoder)
ARCHS = {
    "gpt": dict(gated=False, bias=True, norm="layernorm", learned_positions=True, tied=True, encoder=False),
    "neox": dict(gated=False, bias=True, norm="layernorm", learned_positions=False, tied=False, encoder=False),
    "llama": dict(gated=True, bias=False, norm="rmsnorm", learned_positions=False, tied=False, encoder=False),
    "bert": dict(gated=False, bias=True, norm="layernorm", learned_positions=True, tied=True, encoder=True),
}


@dataclass(frozen=True)
class AttentionGemm:
    """One GEMM taking a block's normalised input into its attention heads
    (:meth:`TransformerSpec.attention_gemms`)."""

    #: its operator's name (:class:`perfsim.models.ops.Op`)
    name: str
    #: input width
    k: int
    #: output width, all tensor-parallel ranks together
    n: int
    #: column-parallel (its output split over the ranks' heads), else replicated on every rank
    split: bool
    #: its input is written by the norm before it (Transformer Engine's ``LayerNormLinear``:
    #: in fp8 the norm writes the fp8 copy), else it reads (and in fp8 casts) a plain tensor
    fused_norm: bool


@dataclass(frozen=True)
class TransformerSpec:
    """A transformer's shape; sizes in elements, ``seq_len`` in tokens."""

    #: model name
    name: str
    #: transformer blocks
    n_layer: int
    #: hidden size d
    hidden: int
    #: query heads
    heads: int
    #: sequence length (tokens per sample)
    seq_len: int
    #: vocabulary size
    vocab: int
    #: MLP width (default 4 d)
    ffn: int = 0
    #: key/value heads (default = heads)
    kv_heads: int = 0
    #: architecture family (key of ARCHS)
    arch: str = "gpt"
    #: SwiGLU MLP with three matrices
    gated: bool = False
    #: linear layers and norms have biases
    bias: bool = True
    #: ``layernorm`` or ``rmsnorm``
    norm: str = "layernorm"
    #: learned position embeddings (rows = max positions), else rotary/none
    learned_positions: bool = True
    #: rows of the learned position table (default seq_len)
    max_positions: int = 0
    #: LM head shares the token embedding
    tied: bool = True
    #: BERT-style encoder: token-type table, embedding norm, pooler instead of an LM head
    encoder: bool = False
    #: token-type (segment) rows of an encoder
    token_types: int = 0
    #: width of one attention head (default hidden / heads; Gemma's is 256 at any hidden size)
    head_dim: int = 0
    #: biases of the query, key and value projections (None: ``bias``; Qwen2 has them alone)
    qkv_bias: bool | None = None
    #: bias of the attention output projection (None: ``bias``)
    out_bias: bool | None = None
    #: biases of the MLP's (and every expert's) linear layers (None: ``bias``)
    mlp_bias: bool | None = None
    #: norms per block: 2 (pre-attention, pre-MLP), 1 (Falcon-7B's parallel block shares one) or 4
    #: (Gemma 2/3: a norm before and after attention and the MLP, the output norms applied before
    #: the residual add; Gemma Team, "Gemma 2", arXiv:2408.00118, Sec. 2)
    norms_per_block: int = 2
    #: the LM head's logits pass through ``cap x tanh(logits / cap)`` (Gemma 2's 30.0; arXiv:2408.00118,
    #: Sec. 2, "Logit soft-capping"); 0: none
    final_logit_softcap: float = 0.0
    #: every attention score passes through ``cap x tanh(score / cap)`` before the softmax (Gemma 2's
    #: 50.0); 0: none
    attn_logit_softcap: float = 0.0
    #: a learned logit per query head joins every softmax's denominator ("attention sinks": Xiao et
    #: al., arXiv:2309.17453; gpt-oss, OpenAI, arXiv:2508.10925): ``heads`` weights a block
    attention_sinks: bool = False
    #: the MoE router's linear layer has a bias, ``experts`` weights a block (gpt-oss)
    router_bias: bool = False
    #: an RMSNorm over every query and key head before the rotary embedding, ``head_dim``
    #: weights each (Qwen3, arXiv:2505.09388 Sec. 2; Dehghani et al., arXiv:2302.05442)
    qk_norm: bool = False
    #: attention and MLP read the same input and their outputs are summed (GPT-J, GPT-NeoX's
    #: parallel residual, Falcon, PaLM Sec. 2, Chowdhery et al. 2022, arXiv:2204.02311): one
    #: tensor-parallel reduction per pass instead of two
    parallel_block: bool = False
    #: mixture of experts (perfsim.models.moe): routed experts per MoE block (0: dense model)
    experts: int = 0
    #: experts each token is routed to (top-k)
    top_k: int = 0
    #: MLP width of one routed expert (default ``ffn``)
    expert_ffn: int = 0
    #: MLP width of the always-active shared expert(s) of a MoE block, summed (DeepSeekMoE,
    #: Qwen-MoE); 0: none
    shared_ffn: int = 0
    #: the shared expert's output is scaled by a sigmoid gate, a ``hidden x 1`` linear (Qwen-MoE)
    shared_gate: bool = False
    #: blocks (0-based) that keep a dense MLP of width ``ffn`` in a MoE model
    #: (DeepSeekMoE's ``first_k_dense_replace``, Qwen-MoE's ``mlp_only_layers``)
    dense_layers: tuple[int, ...] = ()
    #: multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2): the keys and
    #: values of every head are up-projected from one shared latent of this width (0: standard
    #: attention); ``head_dim`` is then a query/key head's width, its rotary part included
    kv_lora_rank: int = 0
    #: MLA's query latent width (0: the queries are projected from the hidden state directly,
    #: as in DeepSeek-V2-Lite)
    q_lora_rank: int = 0
    #: MLA's decoupled rotary part of each query/key head (DeepSeek-V2 Sec. 2.1.3): one key
    #: part of this width shared by all heads, projected from the hidden state with the latent
    rope_head_dim: int = 0
    #: width of one value head (default ``head_dim``; only MLA's may differ)
    v_head_dim: int = 0
    #: multi-token prediction modules trained with the model (DeepSeek-V3, arXiv:2412.19437,
    #: Sec. 2.2; Megatron-Core's ``--mtp-num-layers``): module ``k`` predicts the token ``k + 1``
    #: ahead from the previous depth's hidden state and the embedding of the token ``k`` ahead,
    #: through two RMSNorms, a ``2 d -> d`` projection, one transformer block (block ``n_layer + k``,
    #: a MoE block in a MoE model) and the shared LM head; 0: none
    mtp_layers: int = 0
    #: sliding-window attention: in a windowed block each query attends to itself and the
    #: ``sliding_window - 1`` tokens before it (Mistral 7B, Jiang et al. 2023, arXiv:2310.06825,
    #: Sec. 2; Longformer, Beltagy et al. 2020, arXiv:2004.05150); 0: every block attends to the
    #: whole causal prefix
    sliding_window: int = 0
    #: blocks (0-based) that keep full attention when ``sliding_window`` is set (a config's
    #: ``layer_types``; Qwen2's blocks before ``max_window_layers``); the others are windowed
    full_attention_layers: tuple[int, ...] = ()
    #: chunked attention: in a chunked block each query attends causally to the tokens of its own
    #: chunk of ``attention_chunk`` (Llama 4's ``attention_chunk_size``, 8192: Meta AI, "The Llama 4
    #: herd", 2025; transformers' ``create_chunked_causal_mask``); blocks in ``full_attention_layers``
    #: attend to the whole causal prefix; 0: none. Not with ``sliding_window``
    attention_chunk: int = 0
    #: a weightless L2 norm over every query and key head, after the rotary embedding, in each block
    #: with one (Llama 4's ``use_qk_norm``: transformers' modeling_llama4.py ``Llama4TextL2Norm``, only
    #: where the block rotates; Megatron-Core's ``--qk-l2-norm``). Not with ``qk_norm``
    qk_l2_norm: bool = False
    #: blocks (0-based) without rotary position embedding ("NoPE", Kazemnejad et al. 2023,
    #: arXiv:2305.19466; Llama 4 interleaves one in four): no GEMM or fused kernel changes, and such
    #: a block has no L2 query/key norm (:meth:`TransformerSpec.has_qk_norm`)
    nope_layers: tuple[int, ...] = ()
    #: context parallelism's view of the model (set by the job, ``Strategy.cp``; never a config's):
    #: ``seq_len`` is one rank's shard of a sequence of ``seq_len x context_shards`` tokens, whose
    #: queries attend causally over the whole sequence's keys, the shards load-balanced so each holds
    #: ``1 / context_shards`` of the (query, key) pairs (Megatron-Core's context parallelism: 2 x cp
    #: chunks, rank ``i`` holding chunks ``i`` and ``2 cp - 1 - i``); 1: the whole sequence
    context_shards: int = 1
    #: blocks (0-based) whose token mixer is a linear-time recurrence (:attr:`linear_mixer`) instead of
    #: softmax attention (Qwen3-Next's three in four, a config's ``layer_types`` ``linear_attention``;
    #: Granite 4.0-H's ``mamba`` blocks); their MLP is the model's as in any block
    linear_attention_layers: tuple[int, ...] = ()
    #: the mixer of :attr:`linear_attention_layers`: a Gated DeltaNet (Yang et al., arXiv:2412.06464;
    #: :mod:`perfsim.models.delta_net`) or a Mamba-2 layer (Dao and Gu, arXiv:2405.21060;
    #: :mod:`perfsim.models.mamba2`)
    linear_mixer: GatedDeltaNet | Mamba2 | None = None
    #: blocks (0-based) that are an MLP alone, without a token mixer (NVIDIA Nemotron-H's ``-`` and ``E``
    #: layers: one pre-norm, the MLP or experts, the residual add); with :attr:`mlp_free_layers` they
    #: must cover every block, each of one norm (``norms_per_block`` 1)
    mixer_free_layers: tuple[int, ...] = ()
    #: blocks (0-based) that are a token mixer alone, without an MLP (Nemotron-H's ``M`` and ``*`` layers)
    mlp_free_layers: tuple[int, ...] = ()
    #: softmax attention's output is multiplied by ``sigmoid`` of a gate the query projection also
    #: computes (its width doubled: Qiu et al., "Gated Attention for Large Language Models",
    #: arXiv:2505.06708; Qwen3-Next's attention blocks)
    attention_output_gate: bool = False
    #: read from a Hugging Face config.json (perfsim.models.hf_config)
    from_config: bool = False
    #: what this description leaves out of the checkpoint it was read from (a multimodal wrapper's
    #: vision tower), said in every prediction's model note; empty: nothing
    left_out: str = ""
    kind: str = field(default="transformer", init=False)

    def __post_init__(self):
        for f in ("n_layer", "hidden", "heads", "seq_len", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{self.name}.{f}={v!r}: must be an integer >= 1")
        check_layer_count(self.n_layer, f"model {self.name!r}")
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ConfigError(f"{self.name}: hidden={self.hidden} not divisible by heads={self.heads}")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        for f in ("qkv_bias", "out_bias", "mlp_bias"):
            if getattr(self, f) is None:
                object.__setattr__(self, f, self.bias)
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.max_positions == 0:
            object.__setattr__(self, "max_positions", self.seq_len)
        if self.ffn < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ConfigError(f"{self.name}: kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError(f"{self.name}.norm={self.norm!r}: layernorm or rmsnorm")
        if self.arch not in ARCHS:
            raise ConfigError(f"{self.name}.arch={self.arch!r}: choose from {', '.join(ARCHS)}")
        if self.head_dim < 1 or self.norms_per_block not in (1, 2, 4):
            raise ConfigError(f"{self.name}: head_dim={self.head_dim} must be >= 1, norms_per_block="
                              f"{self.norms_per_block} 1, 2 or 4")
        if self.norms_per_block == 4 and self.parallel_block:
            raise ConfigError(f"{self.name}: norms_per_block=4 (Gemma's norms around each sub-block) with a "
                              "parallel block is not modelled")
        for f in ("final_logit_softcap", "attn_logit_softcap"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
                raise ConfigError(f"{self.name}.{f}={v!r}: must be a number >= 0 (0: none)")
        check_moe(self)
        self._check_latent_attention()
        if isinstance(self.mtp_layers, bool) or not isinstance(self.mtp_layers, int) or self.mtp_layers < 0:
            raise ConfigError(f"{self.name}.mtp_layers={self.mtp_layers!r}: must be an integer >= 0")
        if self.mtp_layers and self.encoder:
            raise ConfigError(f"{self.name}: mtp_layers={self.mtp_layers} needs an LM head (an encoder has none)")
        check_layer_count(self.n_layer + self.mtp_layers, f"model {self.name!r}")
        self._check_window()
        self._check_linear_attention()
        self._check_single_sublayer()

    def _check_single_sublayer(self) -> None:
        """The mixer-only and MLP-only blocks are consistent (ConfigError naming the field)."""
        free, alone = self.mixer_free_layers, self.mlp_free_layers
        for name in ("mixer_free_layers", "mlp_free_layers"):
            bad = [i for i in getattr(self, name) if not (isinstance(i, int) and 0 <= i < self.n_layer)]
            if bad:
                raise ConfigError(f"{self.name}.{name}: {bad[0]!r} is not a block (0..{self.n_layer - 1})")
        if not (free or alone):
            return
        if set(free) & set(alone):
            raise ConfigError(f"{self.name}: block {min(set(free) & set(alone))} in both mixer_free_layers and "
                              "mlp_free_layers (a block holds a mixer or an MLP)")
        if len(set(free) | set(alone)) != self.n_layer or self.norms_per_block != 1:
            raise ConfigError(f"{self.name}: mixer-only and MLP-only blocks must make every block, of one norm each "
                              f"(norms_per_block=1; got {self.norms_per_block})")
        other = ("a parallel block" if self.parallel_block else "an encoder" if self.encoder else
                 "multi-token prediction modules" if self.mtp_layers else "")
        if other:
            raise ConfigError(f"{self.name}: mixer-only and MLP-only blocks with {other} are not modelled")

    def has_mixer(self, i: int) -> bool:
        """Block ``i`` mixes tokens (attention or a linear mixer): all but :attr:`mixer_free_layers`."""
        return i not in self.mixer_free_layers

    def has_mlp(self, i: int) -> bool:
        """Block ``i`` has an MLP (dense or experts): all but :attr:`mlp_free_layers`."""
        return i not in self.mlp_free_layers

    def _check_linear_attention(self) -> None:
        """The hybrid linear-attention fields are consistent (ConfigError naming the field)."""
        layers, net = self.linear_attention_layers, self.linear_mixer
        bad = [i for i in layers if not (isinstance(i, int) and 0 <= i < self.n_layer)]
        if bad:
            raise ConfigError(f"{self.name}.linear_attention_layers: {bad[0]!r} is not a block (0..{self.n_layer - 1})")
        if net is not None and not isinstance(net, (GatedDeltaNet, Mamba2)):
            raise ConfigError(f"{self.name}.linear_mixer={net!r}: a GatedDeltaNet or a Mamba2")
        if bool(layers) != (net is not None):
            raise ConfigError(f"{self.name}: linear_attention_layers and linear_mixer go together (one without the other)")
        if not layers:
            return
        # Megatron-Core shards a Mamba-2 mixer's heads over the context-parallel ranks (MambaContextParallel);
        # a Gated DeltaNet's context parallelism is not modelled
        other = ("an encoder" if self.encoder else "multi-head latent attention" if self.mla else
                 "a sliding window" if self.sliding_window else "chunked attention" if self.attention_chunk else
                 "a parallel block" if self.parallel_block else
                 "context parallelism" if self.context_shards > 1 and not isinstance(net, Mamba2) else "")
        if other:
            raise ConfigError(f"{self.name}: linear-attention blocks ({type(net).__name__}, linear_attention_layers) "
                              f"with {other} are not modelled")

    def _check_window(self) -> None:
        """The sliding-window, chunk, NoPE and L2 query/key norm fields are consistent (ConfigError
        naming the field)."""
        w, c = self.sliding_window, self.attention_chunk
        for name, v in (("sliding_window", w), ("attention_chunk", c)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{self.name}.{name}={v!r}: must be an integer >= 0")
        for name in ("full_attention_layers", "nope_layers"):
            bad = [i for i in getattr(self, name) if not (isinstance(i, int) and 0 <= i < self.n_layer)]
            if bad:
                raise ConfigError(f"{self.name}.{name}: {bad[0]!r} is not a block (0..{self.n_layer - 1})")
        if w and c:
            raise ConfigError(f"{self.name}: sliding_window={w} with attention_chunk={c}: one or the other")
        if self.full_attention_layers and not (w or c):
            raise ConfigError(f"{self.name}: full_attention_layers need a sliding_window or an attention_chunk")
        if (w or c) and self.encoder:
            raise ConfigError(f"{self.name}: {'sliding_window' if w else 'attention_chunk'}={w or c} with an encoder "
                              "(a two-sided window, Longformer's) is not modelled")
        c = self.context_shards
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ConfigError(f"{self.name}.context_shards={c!r}: must be an integer >= 1")
        if c > 1 and (self.encoder or w or self.attention_chunk):
            raise ConfigError(f"{self.name}: context_shards={c} (context parallelism) with "
                              + ("an encoder" if self.encoder else "a sliding window" if w else "chunked attention")
                              + " is not modelled (causal attention over the whole sequence only)")
        if self.qk_l2_norm and (self.qk_norm or self.mla):
            raise ConfigError(f"{self.name}: qk_l2_norm with {'qk_norm' if self.qk_norm else 'multi-head latent attention'}"
                              ": one query/key norm or none")

    def _check_latent_attention(self) -> None:
        """The MLA fields are consistent (ConfigError naming the field)."""
        for f in ("kv_lora_rank", "q_lora_rank", "rope_head_dim", "v_head_dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{self.name}.{f}={v!r}: must be an integer >= 0")
        if not self.mla:
            if self.q_lora_rank or self.rope_head_dim or self.v_head_dim != self.head_dim:
                raise ConfigError(f"{self.name}: q_lora_rank / rope_head_dim / a v_head_dim other than head_dim "
                                  "need multi-head latent attention (kv_lora_rank >= 1)")
            return
        if self.kv_heads != self.heads:
            raise ConfigError(f"{self.name}: kv_heads={self.kv_heads} must equal heads={self.heads} with "
                              "multi-head latent attention (every head has its own up-projected key and value)")
        if not 1 <= self.rope_head_dim < self.head_dim:
            raise ConfigError(f"{self.name}: rope_head_dim={self.rope_head_dim} must be from 1 to head_dim - 1 "
                              f"(head_dim={self.head_dim} is the query/key head's width, its rotary part included)")
        if self.qkv_bias or self.qk_norm:
            raise ConfigError(f"{self.name}: q/k/v biases and qk_norm are not modelled with multi-head latent "
                              "attention (DeepSeek-V2/V3 have neither)")

    # ------------------------------------------------------------ sizes
    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): ``heads x head_dim``."""
        return self.heads * self.head_dim

    @property
    def gate_dim(self) -> int:
        """Width of the attention output gate the query projection computes (:attr:`attention_output_gate`):
        ``q_dim``, else 0."""
        return self.q_dim if self.attention_output_gate else 0

    @property
    def kv_dim(self) -> int:
        """Width of the keys: ``kv_heads x head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the values: ``kv_heads x v_head_dim`` (``kv_dim`` but with MLA)."""
        return self.kv_heads * self.v_head_dim

    @property
    def out_dim(self) -> int:
        """Width of the attention output, the output projection's input: ``heads x v_head_dim``
        (``q_dim`` but with MLA)."""
        return self.heads * self.v_head_dim

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (:attr:`kv_lora_rank`)."""
        return self.kv_lora_rank > 0

    def attention_gemms(self) -> tuple[AttentionGemm, ...]:
        """The GEMMs that take a block's normalised input into its attention heads (the output
        projection, ``out_dim x hidden``, is not among them). Standard attention: one fused QKV
        projection. Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2-2.1.3,
        Eq. 9-19), as Megatron-Core's ``MLASelfAttention`` runs it: the down projections
        ``hidden -> q_lora_rank`` and ``hidden -> kv_lora_rank + rope_head_dim`` (the latent and the
        shared rotary key) are replicated on every tensor-parallel rank (Transformer Engine's
        ``parallel_mode="duplicated"``), each latent's RMSNorm is fused into the column-parallel up
        projection after it, ``q_lora_rank -> heads x head_dim`` and ``kv_lora_rank -> heads x
        (head_dim - rope_head_dim + v_head_dim)`` (the keys' non-rotary part and the values); without
        ``q_lora_rank`` the queries come from one column-parallel ``hidden -> heads x head_dim``."""
        return self._attention_gemms

    @cached_property
    def _attention_gemms(self) -> tuple[AttentionGemm, ...]:
        """:meth:`attention_gemms`, built once per spec (the planner asks for it per candidate)."""
        d = self.hidden
        if not self.mla:
            return (AttentionGemm("qkv", d, self.q_dim + self.gate_dim + 2 * self.kv_dim, split=True, fused_norm=True),)
        nope = self.head_dim - self.rope_head_dim
        q = ((AttentionGemm("q_down", d, self.q_lora_rank, split=False, fused_norm=False),
              AttentionGemm("q_up", self.q_lora_rank, self.q_dim, split=True, fused_norm=True))
             if self.q_lora_rank else (AttentionGemm("q", d, self.q_dim, split=True, fused_norm=False),))
        return q + (AttentionGemm("kv_down", d, self.kv_lora_rank + self.rope_head_dim, split=False,
                                  fused_norm=False),
                    AttentionGemm("kv_up", self.kv_lora_rank, self.heads * (nope + self.v_head_dim), split=True,
                                  fused_norm=True))

    def latent_norm_widths(self) -> tuple[int, ...]:
        """Widths of MLA's latent RMSNorms (the query latent's, the key/value latent's); none
        without MLA."""
        return tuple(w for w in (self.q_lora_rank, self.kv_lora_rank) if w)

    def attention_gather_widths(self) -> tuple[int, ...]:
        """Widths of the activations a tensor-parallel group exchanges at the attention's input:
        the inputs of its column-parallel GEMMs (their gradients all-reduced backward; all-gathered
        forward and reduce-scattered backward under sequence parallelism), and with MLA the shared
        rotary key, which every rank's heads read (Megatron-Core gathers it from the sequence shards,
        ``gather_from_sequence_parallel_region(k_pos_emb)``, whose backward sums the ranks' gradients).
        Standard attention: the hidden state alone."""
        widths = tuple(g.k for g in self.attention_gemms() if g.split)
        return widths + ((self.rope_head_dim,) if self.mla else ())

    def attention_gemm_weights(self, i: int | None = None) -> int:
        """Weights of block ``i``'s token-mixer GEMMs (default: a softmax-attention block's):
        :meth:`attention_gemms` and the output projection, or a linear mixer's (:meth:`is_linear_block`)."""
        if i is not None and self.is_linear_block(i):
            return self.linear_mixer.gemm_weights(self.hidden)
        return sum(g.k * g.n for g in self.attention_gemms()) + self.out_dim * self.hidden

    def attention_replicated_weights(self) -> int:
        """Weights every tensor-parallel rank holds whole: MLA's down projections and latent norms."""
        return sum(g.k * g.n for g in self.attention_gemms() if not g.split) + sum(self.latent_norm_widths())

    @property
    def moe(self) -> bool:
        """A mixture-of-experts model (perfsim.models.moe)."""
        return self.experts > 0

    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def is_linear_block(self, i: int) -> bool:
        """Block ``i`` mixes tokens with the linear mixer (:attr:`linear_attention_layers`, :attr:`linear_mixer`)."""
        return i in self.linear_attention_layers

    def attention_params(self, i: int | None = None) -> int:
        """Q, K, V and output projections (``d x (q + 2 kv)``, ``q x d``; MLA's:
        :meth:`attention_gemms`), their biases, the query/key norms' and MLA's latent norms'
        weights; a linear-attention block's (``i`` in :attr:`linear_attention_layers`) its mixer's
        (``GatedDeltaNet.params``, ``Mamba2.params``)."""
        if i is not None and self.is_linear_block(i):
            return self.linear_mixer.params(self.hidden)
        d, q, kv = self.hidden, self.q_dim, self.kv_dim
        return (self.attention_gemm_weights() + ((q + self.gate_dim + 2 * kv) if self.qkv_bias else 0)
                + (d if self.out_bias else 0) + self.qk_norm_params() + sum(self.latent_norm_widths())
                + (self.heads if self.attention_sinks else 0))

    def qk_norm_params(self) -> int:
        """Weights of the query and key norms (:attr:`qk_norm`): ``head_dim`` each, shared by the heads."""
        return 2 * self.head_dim if self.qk_norm else 0

    def mlp_params(self, width: int) -> int:
        """One MLP of ``width``: SwiGLU/GeGLU three matrices (gate, up, down), else two."""
        d = self.hidden
        mats = 3 if self.gated else 2
        return mats * d * width + (((mats - 1) * width + d) if self.mlp_bias else 0)

    def is_moe_block(self, i: int) -> bool:
        """Whether block ``i`` has routed experts (else a dense MLP of width ``ffn``, or none:
        :meth:`has_mlp`)."""
        return self.moe and i not in self.dense_layers and i not in self.mlp_free_layers

    def is_window_block(self, i: int) -> bool:
        """Block ``i`` attends within a window shorter than the sequence (:attr:`sliding_window`);
        a multi-token prediction module's block keeps full attention."""
        return (0 < self.sliding_window < self.seq_len and i < self.n_layer
                and i not in self.full_attention_layers)

    def attention_window(self, i: int) -> int:
        """The window block ``i``'s attention kernels run with: :attr:`sliding_window` in a
        windowed block (:meth:`is_window_block`), else 0 (the whole causal prefix)."""
        return self.sliding_window if self.is_window_block(i) else 0

    def is_chunked_block(self, i: int) -> bool:
        """Block ``i`` attends within chunks shorter than the sequence (:attr:`attention_chunk`); a
        multi-token prediction module's block keeps full attention."""
        return (0 < self.attention_chunk < self.seq_len and i < self.n_layer
                and i not in self.full_attention_layers)

    def attention_chunk_of(self, i: int) -> int:
        """The chunk block ``i``'s attention kernels run with: :attr:`attention_chunk` in a chunked
        block (:meth:`is_chunked_block`), else 0."""
        return self.attention_chunk if self.is_chunked_block(i) else 0

    def has_qk_norm(self, i: int) -> bool:
        """Block ``i`` normalises its query and key heads: an RMSNorm (:attr:`qk_norm`) or, outside
        :attr:`nope_layers`, an L2 norm (:attr:`qk_l2_norm`)."""
        return self.qk_norm or (self.qk_l2_norm and i not in self.nope_layers)

    def block_kind(self, i: int) -> tuple[bool, int, int, bool, bool, bool, bool]:
        """What block ``i``'s kernels depend on besides the model's sizes: routed experts, its
        attention window, its attention chunk, a query/key norm, a linear mixer instead of
        attention, and whether it has a mixer and an MLP at all (blocks of one kind cost the same)."""
        kinds = self._block_kinds
        return kinds[i] if 0 <= i < len(kinds) else self._kind_of(i)

    @cached_property
    def _block_kinds(self) -> tuple[tuple[bool, int, int, bool, bool, bool, bool], ...]:
        """:meth:`block_kind` of every block, built once per spec (priced per candidate by a planner)."""
        return tuple(self._kind_of(i) for i in self.all_blocks)

    def _kind_of(self, i: int) -> tuple[bool, int, int, bool, bool, bool, bool]:
        linear, mixer = self.is_linear_block(i), self.has_mixer(i)
        return (self.is_moe_block(i), self.attention_window(i) if mixer else 0,
                self.attention_chunk_of(i) if mixer else 0, self.has_qk_norm(i) and not linear and mixer, linear,
                mixer, self.has_mlp(i))

    def keys_per_query(self, i: int) -> float:
        """Keys a query of block ``i`` is counted against in its FLOPs (the causal mask not halved,
        Narayanan et al. 2021's convention): the sequence (the whole one, of every context shard), a
        window, or with chunks the mean over the sequence's tokens of their chunk's length (a shorter
        last chunk counts its own)."""
        T = self.seq_len * self.context_shards
        if self.attention_window(i):
            return float(min(T, self.attention_window(i)))
        c = self.attention_chunk_of(i)
        if c:
            whole, rest = divmod(T, c)
            return (whole * c * c + rest * rest) / T
        return float(T)

    @property
    def last_stage_embedding(self) -> bool:
        """A pipeline's last stage keeps a copy of the token embedding (stepped, stored and its
        gradient all-reduced with the first stage's): a head tied to it, or multi-token prediction
        modules that read it (Megatron-Core builds it where ``mtp_process``)."""
        return (self.tied or self.mtp_layers > 0) and not self.encoder

    def context_shard(self, cp: int) -> "TransformerSpec":
        """One context-parallel rank's view of this model (:attr:`context_shards`): ``seq_len / cp`` tokens
        whose queries attend over the whole sequence; itself for ``cp == 1``."""
        return self if cp == 1 else replace(self, seq_len=self.seq_len // cp, context_shards=cp)

    def is_mtp_block(self, i: int) -> bool:
        """Block ``i`` is a multi-token prediction module's (``n_layer <= i < n_layer + mtp_layers``)."""
        return self.n_layer <= i < self.n_layer + self.mtp_layers

    def mtp_projection_weights(self) -> int:
        """An MTP module's projection ``eh_proj`` (``2 d -> d``, no bias): the concatenated
        normalised hidden state and embedding back to the hidden size (arXiv:2412.19437, Eq. 21)."""
        return 2 * self.hidden * self.hidden

    def mtp_norm_params(self) -> int:
        """An MTP module's own norms: ``enorm`` on the embedding, ``hnorm`` on the hidden state and
        the final norm before the shared LM head (Hugging Face's ``shared_head.norm``)."""
        return 3 * self.norm_params()

    def block_params(self, i: int | None = None) -> int:
        """Parameters of block ``i`` (default: the last block, a MoE block in a MoE model);
        a MoE block counts every expert (:func:`perfsim.models.moe.moe_mlp_params`); a
        multi-token prediction module's (:meth:`is_mtp_block`) its projection and norms too
        (the embedding and the LM head it shares are the model's)."""
        i = self.n_layer - 1 if i is None else i
        mlp = (moe_mlp_params(self) if self.is_moe_block(i) else self.mlp_params(self.ffn)) if self.has_mlp(i) else 0
        mtp = self.mtp_projection_weights() + self.mtp_norm_params() if self.is_mtp_block(i) else 0
        mixer = self.attention_params(i) if self.has_mixer(i) else 0
        return mixer + mlp + self.norms_per_block * self.norm_params() + mtp

    def active_block_params(self, i: int | None = None) -> int:
        """Parameters one token passes through in block ``i``: ``top_k`` routed experts,
        the shared expert and the router (Fedus et al. 2021, arXiv:2101.03961, Sec. 2)."""
        i = self.n_layer - 1 if i is None else i
        if not self.is_moe_block(i):
            return self.block_params(i)
        return self.block_params(i) - moe_mlp_params(self) + moe_mlp_params(self, active=True)

    def embed_params(self) -> int:
        d = self.hidden
        n = self.vocab * d + (self.max_positions * d if self.learned_positions else 0)
        if self.encoder:
            n += self.token_types * d + self.norm_params()
        return n

    def head_params(self) -> int:
        """Final norm and LM head (0 if tied); an encoder's pooler instead."""
        d = self.hidden
        if self.encoder:
            return d * d + d
        return self.norm_params() + (0 if self.tied else self.vocab * d)

    def gemm_weights(self, i: int | None = None) -> int:
        """Weights of block ``i`` one token multiplies with (biases and norms left out):
        the attention projections and the dense MLP, or the router, ``top_k`` routed experts
        and the shared expert of a MoE block; a multi-token prediction module's projection too."""
        d = self.hidden
        i = self.n_layer - 1 if i is None else i
        mats = 3 if self.gated else 2
        if self.is_moe_block(i):
            mlp = (self.experts * d + mats * d * (self.top_k * self.expert_ffn + self.shared_ffn)
                   + (d if self.shared_gate else 0))
        else:
            mlp = mats * d * self.ffn if self.has_mlp(i) else 0
        mixer = self.attention_gemm_weights(i) if self.has_mixer(i) else 0
        return mixer + mlp + (self.mtp_projection_weights() if self.is_mtp_block(i) else 0)

    @property
    def all_blocks(self) -> range:
        """Every block's index: the model's ``n_layer``, then its multi-token prediction modules'."""
        return range(self.n_layer + self.mtp_layers)

    @property
    def params(self) -> int:
        return self.embed_params() + sum(self.block_params(i) for i in self.all_blocks) + self.head_params()

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (= ``params`` for a dense model)."""
        return (self.embed_params() + sum(self.active_block_params(i) for i in self.all_blocks)
                + self.head_params())

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def with_seq_len(self, seq_len: int) -> "TransformerSpec":
        """The same model at another sequence length (position table kept)."""
        return replace(self, seq_len=int(seq_len), max_positions=max(self.max_positions, int(seq_len))
                       if self.learned_positions else self.max_positions)

    def layers(self):
        """Partitionable layers: ``embed``, ``block0..``, a multi-token prediction module's
        ``mtp<n_layer + k>`` (its block, projection and pass through the LM head), ``head``
        (final norm, LM head and loss). Forward FLOPs per sample: a GEMM of ``p`` weights costs
        ``2 p`` per token; attention adds ``4 T d`` per token (scores and the
        weighted sum, Kaplan et al. 2020 Sec. 2.1; Narayanan et al. 2021,
        arXiv:2104.04473, Sec. 5.1): ``2 T q_dim`` for the scores, ``2 T out_dim`` for the
        weighted sum (the two differ with MLA's narrower value heads)."""
        d, T, V = self.hidden, self.seq_len, self.vocab

        def block_flops(i: int) -> float:
            # every weight a token passes through (the active experts' and the router's in a
            # MoE block), plus the scores (q_dim wide) and the weighted sum (out_dim wide) over
            # the keys a query sees (a windowed or chunked block's: its window or chunk), or a
            # Gated DeltaNet's chunked delta rule
            gemm_w = self.gemm_weights(i)
            if not self.has_mixer(i):
                return float(2 * T * gemm_w)
            if self.is_linear_block(i):
                return float(2 * T * gemm_w + self.linear_mixer.core_flops(T))
            return float(T * (2 * gemm_w + 2 * self.keys_per_query(i) * (self.q_dim + self.out_dim)))

        # the embedding's FLOPs: adding position (and token-type) rows, T d per table
        out = [LayerSpec("embed", self.embed_params(), (T, d), float(T * d * (1 + self.encoder)))]
        out += [LayerSpec(f"block{i}", self.block_params(i), (T, d), block_flops(i))
                for i in range(self.n_layer)]
        head_flops = 2 * T * d * (d if self.encoder else V)
        # a multi-token prediction module: its projection and block, and its own pass through the
        # shared LM head; it goes on the last pipeline stage with the head (Megatron-Core)
        out += [LayerSpec(f"mtp{i}", self.block_params(i), (T, d), block_flops(i) + head_flops)
                for i in self.all_blocks[self.n_layer:]]
        out.append(LayerSpec("head", self.head_params(), (T, d) if self.encoder else (T, V),
                             float(head_flops)))
        return out


#: Megatron-LM pads the vocabulary to a multiple of this times the tensor-parallel degree
#: (``--make-vocab-size-divisible-by``, default 128; megatron/tokenizer/tokenizer.py,
#: ``_vocab_size_with_padding``), so every rank's share of the embedding and LM head is
#: aligned for the tensor cores
MEGATRON_VOCAB_MULTIPLE = 128


def padded_vocab(spec: TransformerSpec, multiple: int) -> TransformerSpec:
    """``spec`` with its vocabulary rounded up to a multiple of ``multiple``."""
    v = -(-spec.vocab // multiple) * multiple
    return spec if v == spec.vocab else replace(spec, vocab=v)


def arch_spec(arch: str, name: str, **kw) -> TransformerSpec:
    """A TransformerSpec with ``arch``'s conventions (:data:`ARCHS`) and the sizes ``kw``."""
    return TransformerSpec(name=name, arch=arch, **{**ARCHS[arch], **kw})


_INLINE_KEYS = {"layers": "n_layer", "hidden": "hidden", "heads": "heads", "seq": "seq_len",
                "vocab": "vocab", "ffn": "ffn", "kv_heads": "kv_heads", "head_dim": "head_dim",
                "experts": "experts", "top_k": "top_k", "expert_ffn": "expert_ffn",
                "kv_lora_rank": "kv_lora_rank", "q_lora_rank": "q_lora_rank", "rope_head_dim": "rope_head_dim",
                "v_head_dim": "v_head_dim", "mtp": "mtp_layers", "window": "sliding_window",
                "chunk": "attention_chunk"}


def parse_inline(text: str) -> TransformerSpec:
    """``gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200[,ffn=..,kv_heads=..,head_dim=..,
    experts=..,top_k=..,expert_ffn=..,kv_lora_rank=..,q_lora_rank=..,rope_head_dim=..,v_head_dim=..,mtp=..,
    window=..,chunk=..]`` (``window``: a sliding window in every block; ``chunk``: chunked attention in every
    block)."""
    arch, _, rest = text.partition(":")
    arch = arch.strip().lower()
    if arch not in ARCHS:
        raise ConfigError(f"model {text!r}: unknown architecture {arch!r} (choose from {', '.join(ARCHS)})")
    kw = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq or key.strip() not in _INLINE_KEYS:
            raise ConfigError(f"model {text!r}: bad item {item!r} (keys: {', '.join(_INLINE_KEYS)})")
        try:
            kw[_INLINE_KEYS[key.strip()]] = int(val)
        except ValueError:
            raise ConfigError(f"model {text!r}: {key}={val!r} must be an integer") from None
    missing = [k for k, v in _INLINE_KEYS.items() if v in ("n_layer", "hidden", "heads", "seq_len", "vocab")
               and v not in kw]
    if missing:
        raise ConfigError(f"model {text!r}: missing {', '.join(missing)}")
    name = text if len(text) <= 80 else text[:77] + "..."
    return arch_spec(arch, name, **kw)
