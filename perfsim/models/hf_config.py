"""A Hugging Face ``config.json`` as a :class:`~perfsim.models.transformer.TransformerSpec`,
never silently wrong.

Every field of the file is either read (its type and range checked: an integer field
takes a JSON integer, ``2.7``, ``"two"``, ``[4]``, ``1e999`` are refused naming the field),
known to leave the cost unchanged (:data:`NO_COST`: token ids, dropouts, norm epsilons,
rotary frequencies ...), or the file is refused naming it: perfsim does not know what it
does to the cost. Defaults for absent fields are those of the ``transformers`` config
class of each ``model_type`` (e.g. ``tie_word_embeddings``: False for Llama, Mistral,
Mixtral, Qwen2, GPT-NeoX and DeepSeek, True for GPT-2, BERT, Gemma and Falcon).

Supported ``model_type``: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2,
gemma3_text, gpt_oss, llama4_text, qwen3_next, qwen3_5_text and qwen3_5_moe_text (Gated DeltaNet blocks
between gated-attention ones), granitemoehybrid (Mamba-2 blocks), falcon, gpt_neox, gpt2, bert, roberta, deepseek (DeepSeekMoE with
standard attention, deepseek-moe-16b), deepseek_v2, deepseek_v3 and kimi_k2 (multi-head latent
attention, :meth:`~perfsim.models.transformer.TransformerSpec.attention_gemms`, and DeepSeek-V3's
multi-token prediction modules); and the multimodal gemma3, mistral3, llama4, qwen3_5, qwen3_5_moe and kimi_k25
(Kimi K2.5: DeepSeek-V3's architecture), read for their
language model's ``text_config`` (:data:`TEXT_WRAPPERS`).

The sequence length is ``seq_len`` when given, else :data:`DEFAULT_SEQ_LEN` tokens capped
at ``max_position_embeddings`` -- a training length, not the longest context the model
can serve (Llama-3.1's 131072 would price every step at 32x the tokens of a 4096-token
pre-training step; Llama 2 pre-trained at 4096, Touvron et al. 2023, arXiv:2307.09288).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from perfsim.documents import load_json
from perfsim.errors import ConfigError
from perfsim.models.delta_net import GatedDeltaNet
from perfsim.models.mamba2 import Mamba2
from perfsim.models.transformer import ARCHS, TransformerSpec

#: tokens per sample when neither ``--seq-len`` nor a preset gives one (module docstring)
DEFAULT_SEQ_LEN = 4096

#: upper bounds that keep a typo from building a model of 10^9 layers (beyond any trained model)
LIMITS = {"layers": 10_000, "width": 2**20, "vocab": 2**24, "heads": 2**14, "experts": 2**14,
          "positions": 2**24}

#: fields that do not change the cost of a training step (ids, dropouts, numerics,
#: rotary frequencies, bookkeeping of ``transformers``)
NO_COST = frozenset("""
architectures model_type _name_or_path name_or_path transformers_version torch_dtype dtype
bos_token_id eos_token_id pad_token_id sep_token_id unk_token_id decoder_start_token_id
use_cache initializer_range initializer_factor rms_norm_eps layer_norm_eps layer_norm_epsilon
rope_theta rope_scaling rope_parameters rotary_emb_base rotary_pct partial_rotary_factor
rotary_emb_base attention_dropout hidden_dropout resid_pdrop embd_pdrop attn_pdrop
hidden_dropout_prob attention_probs_dropout_prob classifier_dropout summary_type summary_use_proj
summary_activation summary_proj_to_labels summary_first_dropout task_specific_params hidden_act
hidden_activation activation_function activation pretraining_tp auto_map output_router_logits
router_aux_loss_coef router_jitter_noise aux_loss_alpha seq_aux norm_topk_prob scoring_func
use_return_dict output_attentions output_hidden_states gradient_checkpointing
scale_attn_weights scale_attn_by_inverse_layer_idx reorder_and_upcast_attn n_ctx
apply_residual_connection_post_layernorm tokenizer_class id2label label2id problem_type
finetuning_task bos_token eos_token attn_implementation _attn_implementation
use_bfloat16 return_dict tie_encoder_decoder is_decoder is_encoder_decoder use_mrope
""".split())

#: transformers' default of ``tie_word_embeddings`` per model_type
_TIED_DEFAULT = {"llama": False, "mistral": False, "mixtral": False, "qwen2": False, "qwen2_moe": False,
                 "qwen3": False, "qwen3_moe": False,
                 "gemma": True, "gemma2": True, "gemma3_text": True, "gpt_oss": False, "falcon": True, "gpt_neox": False, "gpt2": True, "bert": True,
                 "roberta": True, "deepseek": False, "deepseek_v2": False, "deepseek_v3": False, "kimi_k2": False,
                 "llama4_text": False, "qwen3_next": False, "qwen3_5_text": False, "qwen3_5_moe_text": False,
                 "granitemoehybrid": False, "nemotron_h": False}
#: multimodal checkpoints whose language model is priced from their ``text_config`` (the wrapper's
#: ``model_type`` -> the text model's): a text-only job, the vision tower left out -- every
#: prediction's model note says so (``TransformerSpec.left_out``)
TEXT_WRAPPERS = {"gemma3": "gemma3_text", "mistral3": "mistral", "llama4": "llama4_text", "qwen3_5": "qwen3_5_text",
                 "qwen3_5_moe": "qwen3_5_moe_text", "kimi_k25": "deepseek_v3"}
#: a wrapper's language model that may also name itself otherwise (Kimi K2.5's ``kimi_k2``, DeepSeek-V3's
#: architecture; transformers' ``Kimi_K25Config`` reads it as ``deepseek_v3``)
_TEXT_ALIASES = {"kimi_k25": ("kimi_k2",)}
#: a wrapper's own fields besides :data:`NO_COST`: its text model, vision tower, projector and image tokens
_WRAPPER_FIELDS = frozenset("text_config vision_config mm_tokens_per_image boi_token_index eoi_token_index "
                            "image_token_index multimodal_projector_bias projector_hidden_act spatial_merge_size "
                            "vision_feature_layer image_token_id video_token_id vision_start_token_id "
                            "vision_end_token_id projection_hidden_size projection_layer_norm_eps".split())
SUPPORTED = tuple(_TIED_DEFAULT) + tuple(TEXT_WRAPPERS)


#: a field absent from the file (or null): its default applies
_ABSENT = object()


class _Fields:
    """Typed access to the fields of one config; records which were read."""

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where, self.read = cfg, where, set()

    def fail(self, text: str) -> ConfigError:
        return ConfigError(f"{self.where}: {text}")

    def _get(self, key: str, default: Any, required: bool) -> Any:
        """The value, or ``_ABSENT`` (absent or null) when ``default`` applies."""
        self.read.add(key)
        v = self.cfg.get(key)
        if v is None:
            if required:
                raise self.fail(f"lacks {key!r}")
            return _ABSENT
        return v

    def int(self, key: str, default: Any = None, *, limit: str = "width", minimum: int = 1,
            required: bool = False) -> Any:
        v = self._get(key, default, required and default is None)
        if v is _ABSENT:
            return default
        if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= LIMITS[limit]:
            raise self.fail(f"{key}={_show(v)} must be an integer from {minimum} to {LIMITS[limit]}")
        return v

    def _typed(self, key: str, default: Any, kind: type, what: str) -> Any:
        v = self._get(key, default, False)
        if v is _ABSENT:
            return default
        if not isinstance(v, kind):
            raise self.fail(f"{key}={_show(v)} must be {what}")
        return v

    def bool(self, key: str, default: bool) -> bool:
        return self._typed(key, default, bool, "true or false")

    def str(self, key: str, default: str | None) -> str | None:
        return self._typed(key, default, str, "a string")

    def float(self, key: str, default: float) -> float:
        """A finite number >= 0 (an int is taken as a float); absent or null: ``default``."""
        v = self._get(key, default, False)
        if v is _ABSENT:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise self.fail(f"{key}={_show(v)} must be a number >= 0")
        return float(v)

    def int_list(self, key: str, limit: int) -> tuple[int, ...]:
        v = self._get(key, [], False)
        v = [] if v is _ABSENT else v
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < limit
                                          for x in v):
            raise self.fail(f"{key}={_show(v)} must be a list of block indices 0..{limit - 1}")
        return tuple(v)

    def refuse_if(self, key: str, bad: bool, why: str) -> None:
        if bad:
            raise self.fail(f"{key}={_show(self.cfg.get(key))}: {why} is not modelled; perfsim refuses "
                            "the model rather than price it wrong")


def _show(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def read_config(path: str | Path) -> tuple[dict, Path]:
    """The parsed object of a ``config.json`` file or of a Hub-style folder holding one."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigError(f"model {str(path)!r}: a folder without config.json")
        p = p / "config.json"
    where = f"model config {str(p)!r}"
    try:
        cfg = load_json(p.read_text(encoding="utf-8"), where, parse_constant=_reject_constant)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{where}: malformed ({exc})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: top level must be an object")
    return cfg, p


def from_hf_config(path: str | Path, seq_len: int | None = None):
    """A Hugging Face ``config.json`` (or a folder holding one) as a TransformerSpec
    (module docstring); ``seq_len`` overrides :data:`DEFAULT_SEQ_LEN`."""
    cfg, p = read_config(path)
    f = _Fields(cfg, f"model config {str(p)!r}")
    mtype = f.str("model_type", None)
    if mtype is None:
        raise f.fail("lacks 'model_type' (one of " + ", ".join(SUPPORTED) + ")")
    mtype = mtype.lower()
    if mtype not in SUPPORTED:
        raise f.fail(f"model_type {mtype!r} not supported (supported: {', '.join(SUPPORTED)})")
    left_out = ""
    if mtype in TEXT_WRAPPERS:
        cfg, f, mtype = _text_model(cfg, f, mtype, p)
        left_out = "the vision tower (vision_config) is not priced: a text-only job"
    read = _READERS.get(mtype, _read_llama)
    arch, kw = read(f, mtype)
    left_out = "; ".join(filter(None, (left_out, kw.pop("_left_out", ""))))
    if cfg.get("gradient_checkpointing") is True:  # a training switch that changes the cost: said, not ignored
        raise f.fail("gradient_checkpointing=true: perfsim prices recomputation from the job, not the model; "
                     "give --recompute full and remove the field")
    if kw.get("experts") and kw.get("top_k", 1) > kw["experts"]:  # named as the config names it
        raise f.fail(f"num_experts_per_tok={kw['top_k']}: more than the {kw['experts']} routed experts")
    positions = f.int("max_position_embeddings", kw.pop("_positions", 2048), limit="positions")
    kw["tied"] = f.bool("tie_word_embeddings", _TIED_DEFAULT[mtype])
    seq = seq_len or min(positions, DEFAULT_SEQ_LEN)
    if ARCHS[arch]["learned_positions"] and seq > positions:
        raise f.fail(f"seq_len={seq} exceeds the {positions} learned position embeddings "
                     f"({'n_positions' if mtype == 'gpt2' else 'max_position_embeddings'}); give --seq-len <= {positions}")
    unknown = sorted(set(cfg) - f.read - NO_COST)
    if unknown:
        raise f.fail(f"field {unknown[0]!r}={_show(cfg[unknown[0]])} is not modelled "
                     f"(perfsim does not know its cost; remove it if it changes nothing)"
                     + (f"; also {', '.join(unknown[1:4])}" if len(unknown) > 1 else ""))
    name = cfg.get("_name_or_path") or (p.parent.name if p.name == "config.json" else p.stem) or p.stem
    return TransformerSpec(name=str(name), arch=arch, **{**ARCHS[arch], **kw}, seq_len=int(seq),
                           max_positions=positions, from_config=True, left_out=left_out)


def _text_model(cfg: dict, f: _Fields, mtype: str, p: Path) -> tuple[dict, _Fields, str]:
    """A multimodal wrapper's (:data:`TEXT_WRAPPERS`) language model: its ``text_config`` (whose own
    ``model_type`` must be the text model's, or absent), read as a config of its own; the wrapper's
    other fields must be its vision tower's and image tokens' (:data:`_WRAPPER_FIELDS`) or cost nothing."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise f.fail(f"model_type {mtype!r} without a 'text_config' object (its language model)")
    unknown = sorted(set(cfg) - _WRAPPER_FIELDS - NO_COST - {"_name_or_path", "tie_word_embeddings"})
    if unknown:
        raise f.fail(f"field {unknown[0]!r}={_show(cfg[unknown[0]])} is not modelled "
                     "(perfsim does not know its cost; remove it if it changes nothing)")
    want = TEXT_WRAPPERS[mtype]
    if text.get("model_type") in _TEXT_ALIASES.get(mtype, ()):
        want = text["model_type"]
    if text.get("model_type", want) != want:
        raise f.fail(f"text_config.model_type={_show(text.get('model_type'))}: {want!r} expected in a {mtype!r} config")
    inner = dict(text, model_type=want)
    if "_name_or_path" in cfg and "_name_or_path" not in text:
        inner["_name_or_path"] = cfg["_name_or_path"]
    tied = cfg.get("tie_word_embeddings")  # the wrapper's word for its language model's head, where the text lacks one
    if tied is not None and text.get("tie_word_embeddings", tied) != tied:
        raise f.fail(f"tie_word_embeddings={_show(tied)} differs from text_config.tie_word_embeddings="
                     f"{_show(text['tie_word_embeddings'])}")
    if tied is not None:
        inner["tie_word_embeddings"] = tied
    return inner, _Fields(inner, f"model config {str(p)!r} (text_config)"), want


def _core(f: _Fields, layers: str = "num_hidden_layers", hidden: str = "hidden_size",
          heads: str = "num_attention_heads") -> dict:
    d = f.int(hidden, required=True)
    return dict(n_layer=f.int(layers, required=True, limit="layers"), hidden=d,
                heads=f.int(heads, required=True, limit="heads"), vocab=f.int("vocab_size", required=True,
                                                                             limit="vocab"))


def _attention(f: _Fields, kw: dict, head_dim_default: int = 0, kv_heads_default: int = 0) -> None:
    kw["kv_heads"] = f.int("num_key_value_heads", kv_heads_default or kw["heads"], limit="heads")
    kw["head_dim"] = f.int("head_dim", head_dim_default or 0)
    if kw["head_dim"] == 0 and kw["hidden"] % kw["heads"]:
        raise f.fail(f"hidden_size={kw['hidden']} not divisible by num_attention_heads={kw['heads']} "
                     "(and no head_dim)")
    if kw["heads"] % kw["kv_heads"]:
        raise f.fail(f"num_key_value_heads={kw['kv_heads']} must divide num_attention_heads={kw['heads']}")


def _window(f: _Fields, kw: dict, default: Any, switch: str | None = None) -> None:
    """``sliding_window`` (Mistral; Qwen2 only with ``use_sliding_window``, and only in blocks
    ``max_window_layers`` and later: none when it is >= ``num_hidden_layers``) into
    ``TransformerSpec.sliding_window`` and ``full_attention_layers``. An explicit
    ``"sliding_window": null`` (Mistral-7B v0.2/v0.3) means full attention: the class default
    applies only when the field is absent. ``layer_types`` (written by transformers >= 4.53)
    lists each block's attention; all ``full_attention`` means no window. Switched off (``use_sliding_window``
    false), a window of 0 means none too (transformers 5.x writes Qwen2-MoE's so)."""
    active = f.bool(switch, False) if switch else True
    if switch and not active and f.cfg.get("sliding_window") == 0:
        f.read.add("sliding_window")
        w = None
    else:
        w = f.int("sliding_window", default if "sliding_window" not in f.cfg else None, limit="positions")
    full: tuple[int, ...] = ()
    if switch:  # transformers' modeling_qwen2.py: blocks from max_window_layers on use the window
        first = f.int("max_window_layers", None, limit="layers", minimum=0)
        active = active and (first is None or first < kw["n_layer"])
        full = tuple(range(min(first or 0, kw["n_layer"])))
    types = f.cfg.get("layer_types")
    f.read.add("layer_types")
    if types is not None:
        kinds = ("full_attention", "sliding_attention")
        if not isinstance(types, list) or len(types) != kw["n_layer"] or any(t not in kinds for t in types):
            raise f.fail(f"layer_types={_show(types)} must be a list of {kw['n_layer']} "
                         f"(num_hidden_layers) of {' / '.join(kinds)}")
        active = "sliding_attention" in types
        full = tuple(i for i, t in enumerate(types) if t == "full_attention")
    if active and w is not None:  # f.int refuses a window below 1
        kw["sliding_window"], kw["full_attention_layers"] = w, full


def _causal_only(f: _Fields) -> None:
    """``use_bidirectional_attention`` (transformers 5.x's Gemma configs): absent, null or false is the
    causal decoder priced; true (every token attending both ways) is refused."""
    f.refuse_if("use_bidirectional_attention", f.cfg.get("use_bidirectional_attention") is True,
                "bidirectional attention in a decoder")
    f.read.add("use_bidirectional_attention")


def _gemma_blocks(f: _Fields, kw: dict, mtype: str) -> None:
    """Gemma 2 (Gemma Team, arXiv:2408.00118, Sec. 2) and Gemma 3's text model (arXiv:2503.19786,
    Sec. 2), as transformers' ``modeling_gemma2.py`` / ``modeling_gemma3.py`` build them: a norm
    before and after attention and after the MLP as well as before it (``norms_per_block`` 4);
    local sliding-window blocks between global ones -- Gemma 2 alternates, the even blocks local
    (``is_sliding = not layer_idx % 2``), Gemma 3 has one global block in ``sliding_window_pattern``
    (``(layer_idx + 1) % pattern == 0``), or ``layer_types`` says; Gemma 2's logit soft-capping of the
    scores and of the LM head's logits. ``query_pre_attn_scalar`` scales the queries (no cost)."""
    kw["norms_per_block"] = 4
    kw["_positions"] = 131072 if mtype == "gemma3_text" else 8192  # the configs' defaults when absent
    _causal_only(f)
    kw["final_logit_softcap"] = f.float("final_logit_softcapping", 0.0)
    kw["attn_logit_softcap"] = f.float("attn_logit_softcapping", 0.0)
    f.read.update(("query_pre_attn_scalar", "rope_local_base_freq", "cache_implementation"))
    _window(f, kw, 4096)  # Gemma2Config's and Gemma3TextConfig's default window
    legacy = f.int("sliding_window_size", None, limit="positions")  # gemma-2's config.json repeats the window
    if legacy is not None and legacy != kw.get("sliding_window", legacy):
        raise f.fail(f"sliding_window_size={legacy} differs from sliding_window={kw['sliding_window']}")
    n = kw["n_layer"]
    if mtype == "gemma2":
        full = tuple(i for i in range(n) if i % 2)
    else:
        pattern = f.int("sliding_window_pattern", 6, limit="layers")
        mirror = f.int("_sliding_window_pattern", None, limit="layers")  # transformers 5.x writes both
        if mirror is not None and mirror != pattern:
            raise f.fail(f"_sliding_window_pattern={mirror} differs from sliding_window_pattern={pattern}")
        full = tuple(i for i in range(n) if (i + 1) % pattern == 0)
    if "sliding_window" in kw and f.cfg.get("layer_types") is None:
        kw["full_attention_layers"] = full


def _gpt_oss_blocks(f: _Fields, kw: dict) -> None:
    """gpt-oss (OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", arXiv:2508.10925, Sec. 2; transformers'
    ``modeling_gpt_oss.py``): every block a mixture of ``num_local_experts`` SwiGLU experts of width
    ``intermediate_size`` with biases, top-``num_experts_per_tok``, behind a router with a bias;
    attention with q/k/v/output biases and a learned sink logit per head; local blocks of a
    ``sliding_window`` (128) between global ones (``layer_types``). ``swiglu_limit`` clamps the
    activation (no cost); a ``quantization_config`` of ``mxfp4`` says how the released experts are
    stored, not how a job trains (its ``--precision``)."""
    kw["experts"] = f.int("num_local_experts", 128, limit="experts")
    kw["top_k"] = f.int("num_experts_per_tok", 4, limit="experts")
    if f.cfg.get("experts_per_token") not in (None, kw["top_k"]):
        raise f.fail(f"experts_per_token={_show(f.cfg['experts_per_token'])} differs from "
                     f"num_experts_per_tok={kw['top_k']}")
    kw["expert_ffn"] = kw["ffn"]
    kw["mlp_bias"] = kw["router_bias"] = kw["attention_sinks"] = True
    f.read.update(("experts_per_token", "swiglu_limit", "swiglu_alpha", "initial_context_length"))
    quant = f.cfg.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":  # any other is refused as unread
        f.read.add("quantization_config")
    _window(f, kw, 128)


def _experts(f: _Fields, default: int) -> int:
    """Routed experts of a Qwen MoE config: ``num_experts``, or ``num_local_experts`` as transformers 5.x
    writes it (both given: they must agree)."""
    old, new = f.int("num_experts", None, limit="experts"), f.int("num_local_experts", None, limit="experts")
    if None not in (old, new) and old != new:
        raise f.fail(f"num_experts={old} differs from num_local_experts={new}")
    return next((v for v in (old, new) if v is not None), default)


def _read_llama(f: _Fields, mtype: str) -> tuple[str, dict]:
    """Llama, Mistral, Mixtral, Qwen2(-MoE), Qwen3(-MoE), Gemma: SwiGLU/GeGLU, RMSNorm, rotary;
    Qwen3 adds an RMSNorm over each query and key head (transformers' modeling_qwen3.py
    ``q_norm``/``k_norm``) and drops Qwen2's q/k/v biases."""
    kw = _core(f)
    kw["ffn"] = f.int("intermediate_size", required=True)
    _attention(f, kw, 256 if mtype in ("gemma", "gemma2", "gemma3_text") else 0)
    bias = f.bool("attention_bias", False)
    kw["qkv_bias"], kw["out_bias"] = bias or mtype in ("qwen2", "qwen2_moe"), bias
    if mtype == "qwen2_moe":  # transformers 5.x's Qwen2MoeConfig states it (default true)
        kw["qkv_bias"] = f.bool("qkv_bias", kw["qkv_bias"])
    kw["mlp_bias"] = f.bool("mlp_bias", False)
    if mtype == "gpt_oss":
        _gpt_oss_blocks(f, kw)
    elif mtype == "mistral":
        _window(f, kw, 4096)  # MistralConfig's default window
    elif mtype == "mixtral":
        _window(f, kw, None)
        kw["experts"] = f.int("num_local_experts", 8, limit="experts")
        kw["top_k"] = f.int("num_experts_per_tok", 2, limit="experts")
    elif mtype in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        _window(f, kw, None, switch="use_sliding_window")
    kw["qk_norm"] = mtype in ("qwen3", "qwen3_moe", "gemma3_text")
    if mtype in ("gemma2", "gemma3_text"):
        _gemma_blocks(f, kw, mtype)
    elif mtype == "gemma":
        _causal_only(f)
    if mtype == "qwen2_moe":
        kw["experts"] = _experts(f, 60)
        kw["top_k"] = f.int("num_experts_per_tok", 4, limit="experts")
        kw["expert_ffn"] = f.int("moe_intermediate_size", 1408)
        kw["shared_ffn"] = f.int("shared_expert_intermediate_size", 5632, minimum=0)
        kw["shared_gate"] = kw["shared_ffn"] > 0
    if mtype == "qwen3_moe":  # Qwen3MoeConfig's defaults (Qwen3-30B-A3B's); no shared expert
        kw["experts"] = _experts(f, 128)
        kw["top_k"] = f.int("num_experts_per_tok", 8, limit="experts")
        kw["expert_ffn"] = f.int("moe_intermediate_size", 768)
    if mtype in ("qwen2_moe", "qwen3_moe"):  # dense blocks: mlp_only_layers, or off decoder_sparse_step
        step = f.int("decoder_sparse_step", 1, limit="layers")
        only = f.int_list("mlp_only_layers", kw["n_layer"])
        kw["dense_layers"] = tuple(i for i in range(kw["n_layer"]) if i in only or (i + 1) % step)
    return "llama", kw


#: DeepSeek's expert selection (``topk_method``): ``greedy`` (the top-k of all experts),
#: ``group_limited_greedy`` (DeepSeek-V2's device-limited routing, arXiv:2405.04434, Sec. 2.2.2)
#: and ``noaux_tc`` (DeepSeek-V3's node-limited routing with bias-balanced, auxiliary-loss-free
#: scores, arXiv:2412.19437, Sec. 2.1.2). The limits change which experts a token picks, not the
#: ``top_k`` copies Megatron-Core's all-to-all dispatcher sends per token, so perfsim's balanced
#: router prices the three alike (Megatron-Core ``--moe-router-num-groups``/``--moe-router-group-topk``)
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def _read_deepseek(f: _Fields, mtype: str) -> tuple[str, dict]:
    """DeepSeekMoE (deepseek-moe-16b): routed + shared experts, the first blocks dense;
    DeepSeek-V2/V3 (``deepseek_v2``, ``deepseek_v3``) add multi-head latent attention
    (:func:`_latent_attention`) and group-limited routing (:data:`TOPK_METHODS`)."""
    arch, kw = _read_llama(f, mtype)
    routed = f.int("n_routed_experts", None, limit="experts")
    shared = f.int("n_shared_experts", None, limit="experts", minimum=0)
    width = f.int("moe_intermediate_size", None)
    first = f.int("first_k_dense_replace", 0, limit="layers", minimum=0)
    freq = f.int("moe_layer_freq", 1, limit="layers")
    method = f.str("topk_method", "greedy")
    f.refuse_if("topk_method", method not in TOPK_METHODS, f"routing {method!r}")
    groups, picked = f.int("n_group", 1, limit="experts"), f.int("topk_group", 1, limit="experts")
    if picked > groups or (routed and routed % groups):
        raise f.fail(f"n_group={groups}, topk_group={picked}: the groups must split n_routed_experts={routed} "
                     "evenly and topk_group be at most n_group")
    for key in ("routed_scaling_factor", "ep_size"):  # a scale inside the combine; an inference hint
        f.read.add(key)
    if mtype in ("deepseek_v2", "deepseek_v3", "kimi_k2"):  # Kimi K2: DeepSeek-V3's architecture
        _latent_attention(f, kw)
    if routed:
        if width is None:
            raise f.fail("lacks 'moe_intermediate_size' (needed with n_routed_experts)")
        kw.update(experts=routed, top_k=f.int("num_experts_per_tok", required=True, limit="experts"),
                  expert_ffn=width, shared_ffn=(shared or 0) * width,
                  dense_layers=tuple(i for i in range(kw["n_layer"]) if i < first or i % freq))
    return arch, kw


def _latent_attention(f: _Fields, kw: dict) -> None:
    """DeepSeek-V2/V3's multi-head latent attention (arXiv:2405.04434, Sec. 2.1; transformers'
    ``DeepseekV3Attention``): ``kv_lora_rank``, ``q_lora_rank`` (null: DeepSeek-V2-Lite's direct
    query projection), query/key heads of ``qk_nope_head_dim + qk_rope_head_dim``, value heads of
    ``v_head_dim``; ``num_nextn_predict_layers``: DeepSeek-V3's multi-token prediction modules
    (arXiv:2412.19437, Sec. 2.2; ``TransformerSpec.mtp_layers``); the stored checkpoint's fp8 ``quantization_config`` (fp8 weights with 128 x 128 block
    scales) says how the released weights are kept, not how a job trains (its ``--precision``); any
    other quantization is refused, as for every model type."""
    nope = f.int("qk_nope_head_dim", required=True)
    kw["rope_head_dim"] = f.int("qk_rope_head_dim", required=True)
    kw["head_dim"] = nope + kw["rope_head_dim"]
    # transformers 5.x writes the sum too, and how the rotary part is laid out (no cost)
    whole = f.int("qk_head_dim", None)
    if whole is not None and whole != kw["head_dim"]:
        raise f.fail(f"qk_head_dim={whole} differs from qk_nope_head_dim + qk_rope_head_dim = {kw['head_dim']}")
    f.read.add("rope_interleave")
    kw["v_head_dim"] = f.int("v_head_dim", required=True)
    kw["kv_lora_rank"] = f.int("kv_lora_rank", required=True)
    kw["q_lora_rank"] = f.int("q_lora_rank", 0)
    # DeepSeek-V3's multi-token prediction modules (Sec. 2.2), trained with the model
    kw["mtp_layers"] = f.int("num_nextn_predict_layers", 0, limit="layers", minimum=0)
    quant = f.cfg.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "fp8":  # any other is refused as unread
        f.read.add("quantization_config")
    if kw["kv_heads"] != kw["heads"]:
        raise f.fail(f"num_key_value_heads={kw['kv_heads']} must equal num_attention_heads={kw['heads']} with "
                     "multi-head latent attention")


def _read_qwen3_next(f: _Fields, mtype: str) -> tuple[str, dict]:
    """Qwen3-Next (``qwen3_next``; Qwen Team, "Qwen3-Next", 2025; transformers'
    ``modeling_qwen3_next.py``, whose ``Qwen3NextConfig`` defaults -- Qwen3-Next-80B-A3B's -- apply to
    absent fields): Gated DeltaNet blocks (``layer_types`` ``linear_attention``, else all but every
    ``full_attention_interval``-th; :mod:`perfsim.models.delta_net`, the ``linear_*`` fields) between
    gated-attention blocks (queries twice as wide for the output gate, RMSNorm over each query and key
    head); Qwen2-MoE's experts with a gated shared expert in every block but ``mlp_only_layers`` (or
    off ``decoder_sparse_step``), whose dense MLP is ``intermediate_size`` wide;
    ``mtp_num_hidden_layers`` (vLLM: ``num_nextn_predict_layers``; absent: none, transformers models
    none) multi-token prediction modules sharing the embedding (a dedicated
    embedding, ``mtp_use_dedicated_embeddings``, is refused). ``partial_rotary_factor`` rotates a
    quarter of each head (no cost priced).

    Qwen3.5's language models (``qwen3_5_text``, ``qwen3_5_moe_text``, also read from the multimodal
    ``qwen3_5`` / ``qwen3_5_moe`` wrappers; transformers 5.x ``modeling_qwen3_5*.py``) are the same
    blocks, the Gated DeltaNet's input projections split four ways (the same weights): the dense models
    with a SwiGLU MLP of ``intermediate_size`` in every block, the MoE models with experts and a gated
    shared expert in every block (no ``mlp_only_layers``, no ``decoder_sparse_step``); their classes'
    defaults apply to absent fields."""
    kw = _core(f)
    n = kw["n_layer"]
    kw["_positions"] = 32768  # the config classes' max_position_embeddings
    if mtype == "qwen3_next":
        kw["ffn"] = f.int("intermediate_size", 5632)
    _attention(f, kw, 256, 4 if mtype == "qwen3_5_text" else 2)
    f.refuse_if("attention_bias", f.bool("attention_bias", False), "q/k/v/output biases in Qwen3-Next")
    kw.update(qk_norm=True, attention_output_gate=True, qkv_bias=False, out_bias=False, mlp_bias=False)
    types = f.cfg.get("layer_types")
    f.read.add("layer_types")
    interval = f.int("full_attention_interval", 4, limit="layers")
    if types is None:
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    kinds = ("linear_attention", "full_attention")
    if not isinstance(types, list) or len(types) != n or any(t not in kinds for t in types):
        raise f.fail(f"layer_types={_show(types)} must be a list of {n} (num_hidden_layers) of {' / '.join(kinds)}")
    linear = tuple(i for i, t in enumerate(types) if t == "linear_attention")
    key_heads, value_heads = f.int("linear_num_key_heads", 16, limit="heads"), f.int("linear_num_value_heads", 32,
                                                                                      limit="heads")
    if value_heads % key_heads:
        raise f.fail(f"linear_num_key_heads={key_heads} must divide linear_num_value_heads={value_heads}")
    net = GatedDeltaNet(key_heads=key_heads, value_heads=value_heads, key_dim=f.int("linear_key_head_dim", 128),
                        value_dim=f.int("linear_value_head_dim", 128),
                        conv_kernel=f.int("linear_conv_kernel_dim", 4, limit="layers"))
    if linear:  # read either way: all-attention blocks leave the linear_* fields without cost
        kw["linear_attention_layers"], kw["linear_mixer"] = linear, net
    if mtype == "qwen3_5_text":  # Qwen3.5's dense models: every block's MLP intermediate_size wide
        kw["ffn"] = f.int("intermediate_size", 12288)
        kw.pop("experts", None)
    else:
        experts, top_k = (256, 8) if mtype == "qwen3_5_moe_text" else (512, 10)
        kw["experts"] = f.int("num_experts", experts, limit="experts", minimum=0 if mtype == "qwen3_next" else 1)
    if kw.get("experts"):
        kw["top_k"] = f.int("num_experts_per_tok", top_k, limit="experts")
        kw["expert_ffn"] = f.int("moe_intermediate_size", 512)
        kw["shared_ffn"] = f.int("shared_expert_intermediate_size", 512, minimum=0)
        kw["shared_gate"] = kw["shared_ffn"] > 0
        if mtype == "qwen3_next":
            step = f.int("decoder_sparse_step", 1, limit="layers")
            only = f.int_list("mlp_only_layers", n)
            kw["dense_layers"] = tuple(i for i in range(n) if i in only or (i + 1) % step)
        else:  # Qwen3.5-MoE: every block, and no dense MLP width (its width is the experts')
            kw["ffn"] = kw["expert_ffn"]
    elif mtype == "qwen3_next":
        f.read.update(("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                       "decoder_sparse_step", "mlp_only_layers"))
    mtp = f.int("mtp_num_hidden_layers", None, limit="layers", minimum=0)
    nextn = f.int("num_nextn_predict_layers", None, limit="layers", minimum=0)  # vLLM's name for it
    if None not in (mtp, nextn) and mtp != nextn:
        raise f.fail(f"mtp_num_hidden_layers={mtp} differs from num_nextn_predict_layers={nextn}")
    kw["mtp_layers"] = mtp if mtp is not None else nextn or 0
    f.refuse_if("mtp_use_dedicated_embeddings", f.bool("mtp_use_dedicated_embeddings", False),
                "a multi-token prediction module with an embedding of its own")
    return "llama", kw


#: Granite 4.0-H's names of its block kinds (``layer_types``, ``layers_block_type``): transformers 4.x
#: configs say ``mamba`` / ``attention``, 5.x ``linear_attention`` / ``full_attention``
_GRANITE_KINDS = {"mamba": True, "linear_attention": True, "attention": False, "full_attention": False}


def _read_granite_hybrid(f: _Fields, mtype: str) -> tuple[str, dict]:
    """IBM Granite 4.0-H (``granitemoehybrid``; transformers' ``modeling_granitemoehybrid.py``, whose
    ``GraniteMoeHybridConfig`` defaults apply to absent fields): Mamba-2 blocks (``layer_types`` or
    ``layers_block_type`` ``mamba``; :mod:`perfsim.models.mamba2`, the ``mamba_*`` fields, ``mamba_d_head``
    ``auto`` = ``mamba_expand x hidden_size / mamba_n_heads``) between grouped-query attention blocks; in
    every block a SwiGLU MLP of ``shared_intermediate_size`` and, with ``num_local_experts`` > 0, beside
    it experts of ``intermediate_size`` (top-``num_experts_per_tok``, a router without bias). The
    multipliers (``embedding_multiplier``, ``residual_multiplier``, ``attention_multiplier``,
    ``logits_scaling``) scale values in place (no cost priced); ``position_embedding_type`` rope or nope
    changes no GEMM."""
    kw = _core(f)
    n = kw["n_layer"]
    _attention(f, kw)
    bias = f.bool("attention_bias", False)
    kw.update(qkv_bias=bias, out_bias=bias, mlp_bias=False)
    f.read.update(("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
                   "time_step_limit", "time_step_min", "time_step_max", "time_step_floor"))
    pos = f.str("position_embedding_type", None)
    f.refuse_if("position_embedding_type", pos not in (None, "rope", "nope"), f"position embedding {pos!r}")
    key = "layers_block_type" if "layers_block_type" in f.cfg else "layer_types"
    types = f.cfg.get(key)
    f.read.update(("layers_block_type", "layer_types"))
    if types is None:
        types = ["mamba"] * n  # the config class's default: every block Mamba-2
    if not isinstance(types, list) or len(types) != n or any(t not in _GRANITE_KINDS for t in types):
        raise f.fail(f"{key}={_show(types)} must be a list of {n} (num_hidden_layers) of "
                     + " / ".join(_GRANITE_KINDS))
    heads = f.int("mamba_n_heads", 128, limit="heads")
    expand = f.int("mamba_expand", 2, limit="layers")
    inner = expand * kw["hidden"]
    head_dim = f.cfg.get("mamba_d_head", "auto")
    f.read.add("mamba_d_head")
    if head_dim == "auto":
        head_dim = inner // heads if inner % heads == 0 else 0
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim * heads != inner:
        raise f.fail(f"mamba_d_head={_show(f.cfg.get('mamba_d_head', 'auto'))}: mamba_n_heads={heads} heads of it "
                     f"must make mamba_expand x hidden_size = {inner}")
    groups = f.int("mamba_n_groups", 1, limit="heads")
    if heads % groups:
        raise f.fail(f"mamba_n_groups={groups} must divide mamba_n_heads={heads}")
    mixer = Mamba2(heads=heads, head_dim=head_dim, state_dim=f.int("mamba_d_state", 256),
                   groups=groups, conv_kernel=f.int("mamba_d_conv", 4, limit="layers"),
                   chunk=f.int("mamba_chunk_size", 256, limit="positions"),
                   conv_bias=f.bool("mamba_conv_bias", True), proj_bias=f.bool("mamba_proj_bias", False))
    linear = tuple(i for i, t in enumerate(types) if _GRANITE_KINDS[t])
    if linear:
        kw["linear_attention_layers"], kw["linear_mixer"] = linear, mixer
    shared = f.int("shared_intermediate_size", 1024)
    experts = f.int("num_local_experts", 8, limit="experts", minimum=0)
    width = f.int("intermediate_size", 11008)
    top_k = f.int("num_experts_per_tok", 2, limit="experts")
    if experts:
        kw.update(experts=experts, top_k=top_k, expert_ffn=width, shared_ffn=shared, ffn=width)
    else:  # a dense Granite 4.0-H: the shared MLP alone
        kw["ffn"] = shared
    return "llama", kw


#: Nemotron-H's layer kinds: ``hybrid_override_pattern``'s characters and ``layers_block_type``'s names
#: (transformers 5.x; the legacy ``mamba`` / ``attention``) -> (token mixer, MLP)
_NEMOTRON_KINDS = {"M": ("mamba", None), "*": ("attention", None), "-": (None, "mlp"), "E": (None, "moe"),
                   "linear_attention": ("mamba", None), "mamba": ("mamba", None), "full_attention": ("attention", None),
                   "attention": ("attention", None), "mlp": (None, "mlp"), "moe": (None, "moe")}
#: aliases of Nemotron-H's Mamba fields (transformers' ``NemotronHConfig`` takes either)
_NEMOTRON_ALIASES = (("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"), ("chunk_size", "mamba_chunk_size"),
                     ("use_conv_bias", "mamba_conv_bias"))


def _read_nemotron_h(f: _Fields, mtype: str) -> tuple[str, dict]:
    """NVIDIA Nemotron-H (``nemotron_h``; "Nemotron-H: A Family of Accurate and Efficient Hybrid
    Mamba-Transformer Models", arXiv:2504.03624; transformers' ``modeling_nemotron_h.py``, whose
    ``NemotronHConfig`` defaults apply to absent fields): every layer is one pre-norm, one sub-block and a
    residual add (``norms_per_block`` 1; ``TransformerSpec.mlp_free_layers``, ``mixer_free_layers``): a
    Mamba-2 mixer (``M``), grouped-query attention without biases (``*``), a non-gated MLP of
    ``intermediate_size`` (``-``, squared ReLU) or experts of ``moe_intermediate_size`` beside a shared
    MLP of ``moe_shared_expert_intermediate_size`` (``E``), as ``hybrid_override_pattern`` or
    ``layers_block_type`` lists them. Refused: multi-token prediction modules
    (``num_nextn_predict_layers``), a latent MoE (``moe_latent_size``), a sliding window."""
    d = f.int("hidden_size", 4096)
    kw = dict(hidden=d, heads=f.int("num_attention_heads", 32, limit="heads"),
              vocab=f.int("vocab_size", 131072, limit="vocab"))
    pattern = f.cfg.get("hybrid_override_pattern")
    key = "layers_block_type" if "layers_block_type" in f.cfg else "layer_types"
    types = f.cfg.get(key)
    f.read.update(("hybrid_override_pattern", "layers_block_type", "layer_types"))
    if types is None and isinstance(pattern, str):
        types, key = list(pattern), "hybrid_override_pattern"
    if types is None:
        types = ["linear_attention", "moe", "full_attention", "mlp"]  # the config class's default
    if not isinstance(types, list) or not types or any(t not in _NEMOTRON_KINDS for t in types):
        raise f.fail(f"{key}={_show(f.cfg.get(key))}: a list of linear_attention / full_attention / mlp / moe "
                     "(or a pattern of M * - E)")
    n = len(types)
    given = f.int("num_hidden_layers", None, limit="layers")
    if given is not None and given != n:
        raise f.fail(f"num_hidden_layers={given} differs from the {n} layers of {key}")
    kinds = [_NEMOTRON_KINDS[t] for t in types]
    kw.update(n_layer=n, gated=False, norms_per_block=1, qkv_bias=False, out_bias=False,
              mlp_free_layers=tuple(i for i, (mixer, _) in enumerate(kinds) if mixer),
              mixer_free_layers=tuple(i for i, (_, mlp) in enumerate(kinds) if mlp))
    _attention(f, kw, 128, 8)
    f.read.add("attention_bias")  # transformers' NemotronHAttention builds its projections without biases
    f.refuse_if("sliding_window", f.cfg.get("sliding_window") is not None, "a sliding window in Nemotron-H")
    f.read.update(("sliding_window", "moe_latent_size"))
    kw["ffn"] = f.int("intermediate_size", 21504)
    kw["mlp_bias"] = f.bool("mlp_bias", False)
    f.refuse_if("num_nextn_predict_layers", f.int("num_nextn_predict_layers", 0, limit="layers", minimum=0) > 0,
                "Nemotron-H's multi-token prediction layers")
    f.refuse_if("moe_latent_size", f.cfg.get("moe_latent_size") is not None, "a latent MoE projection")
    values = {}
    for name, alias in _NEMOTRON_ALIASES:
        if name in f.cfg and alias in f.cfg:
            raise f.fail(f"{name} and {alias} both given (one name for one field)")
        values[name] = alias if alias in f.cfg else name
    mixer = Mamba2(heads=f.int("mamba_num_heads", 128, limit="heads"), head_dim=f.int("mamba_head_dim", 64),
                   state_dim=f.int("ssm_state_size", 128), groups=f.int(values["n_groups"], 8, limit="heads"),
                   conv_kernel=f.int(values["conv_kernel"], 4, limit="layers"),
                   chunk=f.int(values["chunk_size"], 128, limit="positions"),
                   conv_bias=f.bool(values["use_conv_bias"], True), proj_bias=f.bool("use_bias", False))
    if any(m == "mamba" for m, _ in kinds):
        kw["linear_attention_layers"] = tuple(i for i, (m, _) in enumerate(kinds) if m == "mamba")
        kw["linear_mixer"] = mixer
    moe = tuple(i for i, (_, mlp) in enumerate(kinds) if mlp == "moe")
    # transformers' routed experts have no biases where the dense and shared MLPs take mlp_bias's
    f.refuse_if("mlp_bias", bool(moe) and kw["mlp_bias"], "MLP biases beside bias-free routed experts")
    if moe:
        kw.update(experts=f.int("n_routed_experts", 8, limit="experts"),
                  top_k=f.int("num_experts_per_tok", 2, limit="experts"),
                  expert_ffn=f.int("moe_intermediate_size", 7688),
                  shared_ffn=f.int("moe_shared_expert_intermediate_size", 7688, minimum=0),
                  dense_layers=tuple(i for i, (_, mlp) in enumerate(kinds) if mlp == "mlp"))
    # no cost: the Mamba state's and residual's dtypes, initialisation, the routing rule's details, the
    # deprecated expand (the mixer is mamba_num_heads x mamba_head_dim wide), Megatron's overlap switch
    f.read.update(("mamba_hidden_act", "mlp_hidden_act", "use_mamba_kernels", "expand", "mamba_expand",
                   "mamba_ssm_cache_dtype", "residual_in_fp32", "rescale_prenorm_residual", "num_logits_to_keep",
                   "time_step_min", "time_step_max", "time_step_limit", "time_step_floor", "mamba_dt_min",
                   "mamba_dt_max", "mamba_dt_limit", "mamba_dt_init_floor", "mamba_proj_bias",
                   "n_shared_experts", "routed_scaling_factor", "n_group", "topk_group", "moe_shared_expert_overlap",
                   "mtp_layers_block_type", "mtp_hybrid_override_pattern", "n_routed_experts",
                   "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size"))
    kw["_positions"] = 4096
    return "llama", kw


def _read_llama4(f: _Fields, mtype: str) -> tuple[str, dict]:
    """Llama 4's language model (``llama4_text``; Meta AI, "The Llama 4 herd", 2025; transformers'
    ``modeling_llama4.py``, whose ``Llama4TextConfig`` defaults -- Llama 4 Scout's -- apply to absent
    fields): grouped-query attention with no biases (``attention_bias`` is forced off); MoE blocks
    (``moe_layers``, else every ``interleave_moe_layer_step``-th) of ``num_local_experts`` SwiGLU experts
    of width ``intermediate_size``, top-``num_experts_per_tok``, behind a sigmoid router without a
    bias, plus one shared expert of that width; dense blocks of width ``intermediate_size_mlp``.
    Attention interleaves rotary blocks with NoPE blocks (``no_rope_layers``: 1 rotates, 0 does not;
    default one in ``no_rope_layer_interval``); rotary blocks attend in chunks of
    ``attention_chunk_size`` and, with ``use_qk_norm``, L2-normalise their queries and keys, NoPE
    blocks attend to the whole prefix (``layer_types`` may say so itself). The NoPE blocks' attention
    temperature tuning (``attn_temperature_tuning``, ``floor_scale``, ``attn_scale``; arXiv:2501.19399)
    scales their queries: not priced, said in the model note."""
    kw = _core(f)
    n = kw["n_layer"]
    kw["ffn"] = f.int("intermediate_size_mlp", 16384)
    kw["expert_ffn"] = kw["shared_ffn"] = f.int("intermediate_size", 8192)
    kw["experts"] = f.int("num_local_experts", 16, limit="experts")
    kw["top_k"] = f.int("num_experts_per_tok", 1, limit="experts")
    _attention(f, kw, 128, 8)  # Llama4TextConfig's defaults: 128-wide heads, 8 key/value heads
    f.read.add("attention_bias")  # Llama4TextConfig sets attention_bias = False whatever the file says
    step = f.int("interleave_moe_layer_step", 1, limit="layers")
    moe = f.int_list("moe_layers", n) if f.cfg.get("moe_layers") is not None else tuple(range(step - 1, n, step))
    kw["dense_layers"] = tuple(i for i in range(n) if i not in moe)
    interval = f.int("no_rope_layer_interval", 4, limit="layers")
    rotary = f.cfg.get("no_rope_layers")
    f.read.add("no_rope_layers")
    if not rotary:  # absent, null or [] (transformers: the default pattern)
        rotary = [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(rotary, list) or len(rotary) != n or any(x not in (0, 1) or isinstance(x, bool) for x in rotary):
        raise f.fail(f"no_rope_layers={_show(rotary)} must be a list of {n} (num_hidden_layers) of 0 / 1")
    kw["nope_layers"] = tuple(i for i, r in enumerate(rotary) if not r)
    kw["qk_l2_norm"] = f.bool("use_qk_norm", True)
    chunk = f.int("attention_chunk_size", 8192, limit="positions")
    types = f.cfg.get("layer_types")
    f.read.add("layer_types")
    if types is None:
        types = ["chunked_attention" if r else "full_attention" for r in rotary]
    kinds = ("full_attention", "chunked_attention")
    if not isinstance(types, list) or len(types) != n or any(t not in kinds for t in types):
        raise f.fail(f"layer_types={_show(types)} must be a list of {n} (num_hidden_layers) of {' / '.join(kinds)}")
    if "chunked_attention" in types:
        kw["attention_chunk"] = chunk
        kw["full_attention_layers"] = tuple(i for i, t in enumerate(types) if t == "full_attention")
    f.read.update(("attn_temperature_tuning", "floor_scale", "attn_scale", "cache_implementation"))
    if kw["nope_layers"] and f.cfg.get("attn_temperature_tuning", True):
        kw["_left_out"] = ("attention temperature tuning (Llama 4's NoPE blocks scale their queries by position): "
                           "not priced")
    kw["_positions"] = 131072  # Llama4TextConfig's max_position_embeddings when absent
    return "llama", kw


def _read_falcon(f: _Fields, mtype: str) -> tuple[str, dict]:
    """Falcon: parallel attention/MLP, multi-query or grouped ``num_kv_heads``, GELU MLP,
    LayerNorm; ``bias`` on every linear layer or none."""
    kw = _core(f)
    new = f.bool("new_decoder_architecture", False)
    multi_query = f.bool("multi_query", True)
    parallel = f.bool("parallel_attn", True)
    f.refuse_if("alibi", f.bool("alibi", False), "ALiBi attention bias")
    if kw["hidden"] % kw["heads"]:
        raise f.fail(f"hidden_size={kw['hidden']} not divisible by num_attention_heads={kw['heads']}")
    kv = f.int("num_kv_heads", None, limit="heads")
    kw["kv_heads"] = (kv or kw["heads"]) if new else 1 if multi_query else kw["heads"]
    kw["ffn"] = f.int("ffn_hidden_size", 4 * kw["hidden"])
    kw["bias"] = f.bool("bias", False)
    lns = f.int("num_ln_in_parallel_attn", None, limit="layers")
    if new and (lns or 2) == 2:
        kw["norms_per_block"] = 2
    else:
        kw["norms_per_block"] = 1 if parallel else 2
    kw["parallel_block"] = parallel
    return "neox", kw


def _read_neox(f: _Fields, mtype: str) -> tuple[str, dict]:
    kw = _core(f)
    kw["ffn"] = f.int("intermediate_size", 4 * kw["hidden"])
    kw["qkv_bias"] = kw["out_bias"] = f.bool("attention_bias", True)  # the MLP always has biases
    kw["parallel_block"] = f.bool("use_parallel_residual", True)
    if kw["hidden"] % kw["heads"]:
        raise f.fail(f"hidden_size={kw['hidden']} not divisible by num_attention_heads={kw['heads']}")
    return "neox", kw


def _read_gpt2(f: _Fields, mtype: str) -> tuple[str, dict]:
    kw = _core(f, "n_layer", "n_embd", "n_head")
    kw["ffn"] = f.int("n_inner", 4 * kw["hidden"])
    f.refuse_if("add_cross_attention", f.bool("add_cross_attention", False), "cross-attention")
    kw["_positions"] = f.int("n_positions", 1024, limit="positions")
    return "gpt", kw


def _read_bert(f: _Fields, mtype: str) -> tuple[str, dict]:
    kw = _core(f)
    kw["ffn"] = f.int("intermediate_size", 4 * kw["hidden"])
    kw["token_types"] = f.int("type_vocab_size", 2, limit="vocab")
    kw["_positions"] = 512
    pos = f.str("position_embedding_type", "absolute")
    f.refuse_if("position_embedding_type", pos != "absolute", "relative position embeddings")
    # transformers 5.x writes it false; true adds a cross-attention layer to every block
    f.refuse_if("add_cross_attention", f.bool("add_cross_attention", False), "cross-attention layers")
    return "bert", kw


_READERS = {"deepseek": _read_deepseek, "deepseek_v2": _read_deepseek, "deepseek_v3": _read_deepseek,
            "kimi_k2": _read_deepseek, "llama4_text": _read_llama4, "qwen3_next": _read_qwen3_next,
            "qwen3_5_text": _read_qwen3_next, "qwen3_5_moe_text": _read_qwen3_next,
            "granitemoehybrid": _read_granite_hybrid, "nemotron_h": _read_nemotron_h,
            "falcon": _read_falcon, "gpt_neox": _read_neox, "gpt2": _read_gpt2,
            "bert": _read_bert, "roberta": _read_bert}
