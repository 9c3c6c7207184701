"""Any transformer: one architecture description, its parameter count and layers.

A :class:`TransformerSpec` describes GPT-2/GPT-3, GPT-NeoX, LLaMA/Mistral and
BERT alike (the knobs that change the parameter count and the operators):

* attention: ``heads`` query heads of width ``hidden / heads``, ``kv_heads``
  key/value heads (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245;
  ``kv_heads == heads`` is multi-head attention);
* MLP: width ``ffn``; ``gated`` = SwiGLU with three matrices (LLaMA, Touvron et
  al. 2023, arXiv:2307.09288), else two (GELU);
* ``bias``: linear layers and norms carry biases (GPT-2, BERT, NeoX) or not (LLaMA);
  ``norm``: ``layernorm`` (weight + bias) or ``rmsnorm`` (weight only);
* embeddings: token table ``vocab x hidden``; ``positions`` learned position
  rows (0 for rotary); ``token_types`` (BERT's segment table); ``tied`` LM head.

Parameters of one block (``d`` hidden, ``kv = kv_heads * d / heads``, ``f`` ffn):
attention ``d*(d + 2 kv) + d*d`` (+ biases ``d + 2 kv + d``), MLP ``(3 if gated else
2) * d * f`` (+ biases ``f + d``), two norms. GPT-2 gives ``12 d^2 + 13 d`` (nanoGPT),
LLaMA-2 70B 68.98 B, GPT-3 175B 174.6 B, BERT-Large (with pooler) 335.1 M.

Inline spec (``--model``): ``gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200``
with optional ``ffn=``, ``kv_heads=``; ``llama:``/``bert:``/``neox:`` select those
architectures' conventions. A Hugging Face ``config.json`` path is read with
:func:`from_hf_config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfsim.errors import ConfigError
from perfsim.models.specs import check_layer_count

#: architecture conventions: (gated MLP, bias, norm, learned positions, tied head, encoder)
ARCHS = {
    "gpt": dict(gated=False, bias=True, norm="layernorm", learned_positions=True, tied=True, encoder=False),
    "neox": dict(gated=False, bias=True, norm="layernorm", learned_positions=False, tied=False, encoder=False),
    "llama": dict(gated=True, bias=False, norm="rmsnorm", learned_positions=False, tied=False, encoder=False),
    "bert": dict(gated=False, bias=True, norm="layernorm", learned_positions=True, tied=True, encoder=True),
}


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
    kind: str = field(default="transformer", init=False)

    def __post_init__(self):
        for f in ("n_layer", "hidden", "heads", "seq_len", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{self.name}.{f}={v!r}: must be an integer >= 1")
        check_layer_count(self.n_layer, f"model {self.name!r}")
        if self.hidden % self.heads:
            raise ConfigError(f"{self.name}: hidden={self.hidden} not divisible by heads={self.heads}")
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.max_positions == 0:
            object.__setattr__(self, "max_positions", self.seq_len)
        if self.ffn < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ConfigError(f"{self.name}: kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError(f"{self.name}.norm={self.norm!r}: layernorm or rmsnorm")
        if self.arch not in ARCHS:
            raise ConfigError(f"{self.name}.arch={self.arch!r}: choose from {', '.join(ARCHS)}")

    # ------------------------------------------------------------ sizes
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def block_params(self) -> int:
        d, kv, f = self.hidden, self.kv_dim, self.ffn
        attn = d * (d + 2 * kv) + d * d + (d + 2 * kv + d if self.bias else 0)
        mlp = (3 if self.gated else 2) * d * f + (f + d if self.bias else 0)
        return attn + mlp + 2 * self.norm_params()

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

    @property
    def params(self) -> int:
        return self.embed_params() + self.n_layer * self.block_params() + self.head_params()

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def with_seq_len(self, seq_len: int) -> "TransformerSpec":
        """The same model at another sequence length (position table kept)."""
        return replace(self, seq_len=int(seq_len), max_positions=max(self.max_positions, int(seq_len))
                       if self.learned_positions else self.max_positions)

    def layers(self):
        """Partitionable layers: ``embed``, ``block0..``, ``head`` (final norm, LM
        head and loss). Forward FLOPs per sample: a GEMM of ``p`` weights costs
        ``2 p`` per token; attention adds ``4 T d`` per token (scores and the
        weighted sum, Kaplan et al. 2020 Sec. 2.1; Narayanan et al. 2021,
        arXiv:2104.04473, Sec. 5.1)."""
        from perfsim.models.specs import LayerSpec

        d, T, V = self.hidden, self.seq_len, self.vocab
        gemm_w = self.block_params() - (2 * self.norm_params()
                                        + ((2 * d + 2 * self.kv_dim + self.ffn + d) if self.bias else 0))
        block_flops = T * (2 * gemm_w + 4 * T * d)
        # the embedding's FLOPs: adding position (and token-type) rows, T d per table
        out = [LayerSpec("embed", self.embed_params(), (T, d), float(T * d * (1 + self.encoder)))]
        out += [LayerSpec(f"block{i}", self.block_params(), (T, d), float(block_flops))
                for i in range(self.n_layer)]
        head_flops = 2 * T * d * (d if self.encoder else V)
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


def _arch_spec(arch: str, name: str, **kw) -> TransformerSpec:
    return TransformerSpec(name=name, arch=arch, **{**ARCHS[arch], **kw})


#: presets beyond the runtime's GPT-2 family (published architectures)
TRANSFORMER_PRESETS: dict[str, TransformerSpec] = {s.name: s for s in (
    # GPT-3 (Brown et al. 2020, arXiv:2005.14165, Table 2.1): 96 x 12288, 96 heads, 2048 ctx
    _arch_spec("gpt", "gpt3-175b", n_layer=96, hidden=12288, heads=96, seq_len=2048, vocab=50257),
    # LLaMA 2 (Touvron et al. 2023, arXiv:2307.09288, Table 1; HF config.json of meta-llama/Llama-2-*)
    _arch_spec("llama", "llama2-7b", n_layer=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, ffn=11008),
    _arch_spec("llama", "llama2-13b", n_layer=40, hidden=5120, heads=40, seq_len=4096, vocab=32000, ffn=13824),
    _arch_spec("llama", "llama2-70b", n_layer=80, hidden=8192, heads=64, kv_heads=8, seq_len=4096,
               vocab=32000, ffn=28672),
    # BERT (Devlin et al. 2019, arXiv:1810.04805): Large 24 x 1024, Base 12 x 768; 512 positions
    _arch_spec("bert", "bert-large", n_layer=24, hidden=1024, heads=16, seq_len=512, vocab=30522,
               max_positions=512, token_types=2),
    _arch_spec("bert", "bert-base", n_layer=12, hidden=768, heads=12, seq_len=512, vocab=30522,
               max_positions=512, token_types=2),
)}

_INLINE_KEYS = {"layers": "n_layer", "hidden": "hidden", "heads": "heads", "seq": "seq_len",
                "vocab": "vocab", "ffn": "ffn", "kv_heads": "kv_heads"}


def parse_inline(text: str) -> TransformerSpec:
    """``gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200[,ffn=..,kv_heads=..]``."""
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
    return _arch_spec(arch, name, **kw)


def from_hf_config(path: str | Path, seq_len: int | None = None) -> TransformerSpec:
    """A Hugging Face ``config.json`` (GPT-2, GPT-NeoX, LLaMA/Mistral, BERT key names)."""
    p = Path(path)
    where = f"model config {str(p)!r}"
    try:
        cfg = json.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: malformed ({exc})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: top level must be an object")
    mtype = str(cfg.get("model_type", "")).lower()
    arch = ("llama" if mtype in ("llama", "mistral", "mixtral", "qwen2") else "neox" if mtype == "gpt_neox"
            else "bert" if mtype in ("bert", "roberta") else "gpt" if mtype in ("gpt2", "gpt", "") else None)
    if arch is None:
        raise ConfigError(f"{where}: model_type {mtype!r} not supported (gpt2, gpt_neox, llama, mistral, bert)")

    def get(*keys, default=None):
        for k in keys:
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        if default is None:
            raise ConfigError(f"{where}: lacks {' / '.join(keys)}")
        return default

    hidden = int(get("hidden_size", "n_embd", "d_model"))
    positions = int(get("max_position_embeddings", "n_positions", "n_ctx", default=2048))
    kw = dict(n_layer=int(get("num_hidden_layers", "n_layer")), hidden=hidden,
              heads=int(get("num_attention_heads", "n_head")), vocab=int(get("vocab_size")),
              ffn=int(get("intermediate_size", "n_inner", default=4 * hidden) or 4 * hidden),
              kv_heads=int(get("num_key_value_heads", default=0) or 0),
              seq_len=int(seq_len or positions), max_positions=positions)
    if arch == "bert":
        kw["token_types"] = int(get("type_vocab_size", default=2))
    if "tie_word_embeddings" in cfg:
        kw["tied"] = bool(cfg["tie_word_embeddings"])
    return _arch_spec(arch, str(cfg.get("_name_or_path") or p.parent.name or p.stem), **kw)


def resolve_transformer(name: str, seq_len: int | None = None) -> TransformerSpec | None:
    """A preset, inline spec or config.json path, as a TransformerSpec; None if ``name``
    is none of these (the caller tries its other presets)."""
    key = str(name).strip()
    spec = None
    if key.lower() in TRANSFORMER_PRESETS:
        spec = TRANSFORMER_PRESETS[key.lower()]
    elif ":" in key and key.split(":", 1)[0].lower() in ARCHS:
        spec = parse_inline(key)
    elif key.lower().endswith(".json") or Path(key).is_file():
        return from_hf_config(key, seq_len)
    else:
        from perfsim.models.specs import MODEL_SPECS, GPTSpec

        g = MODEL_SPECS.get(key.lower())
        if isinstance(g, GPTSpec):
            spec = _arch_spec("gpt", g.name, n_layer=g.n_layer, hidden=g.d_model, heads=g.n_head,
                              seq_len=g.seq_len, vocab=g.vocab_size)
    if spec is not None and seq_len:
        spec = spec.with_seq_len(seq_len)
    return spec
