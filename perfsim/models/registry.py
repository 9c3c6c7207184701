"""One registry of model presets: every name ``--model`` takes, for predict, plan, memory and run.

A preset is a :class:`perfsim.models.specs.ModelSpec`: a transformer
(:class:`~perfsim.models.transformer.TransformerSpec`: the GPT-2 family, GPT-3, LLaMA 2 and 3,
Mistral, Qwen2.5, Qwen3, BERT, the mixtures of experts Mixtral, DeepSeekMoE, Qwen1.5-MoE and
Qwen3-MoE), an MLP (:class:`~perfsim.models.specs.MLPSpec`) or a
model known only by its layers' sizes (:class:`~perfsim.models.size_only.SizeSpec`).
:data:`RUNTIME_PRESETS` are the ones ``perfsim run`` also trains (its torch modules are
built from the same spec, :mod:`perfsim.runtime.models`); the simulator prices them all.
Besides a preset name, :func:`get_spec` takes an inline transformer
(``gpt:layers=..,hidden=..``, :func:`perfsim.models.transformer.parse_inline`) and a
Hugging Face ``config.json`` (:func:`perfsim.models.hf_config.from_hf_config`).

GPT-2's sizes: Radford et al. 2019 ("Language Models are Unsupervised Multitask Learners",
Table 2; 1024 tokens, vocabulary 50257); the byte-level presets (vocabulary 256) are small
models the runtime trains on CPU in seconds.
"""

from __future__ import annotations

from pathlib import Path

from perfsim.errors import ConfigError
from perfsim.models.delta_net import GatedDeltaNet
from perfsim.models.size_only import SIZE_ONLY
from perfsim.models.specs import MLPSpec, ModelSpec
from perfsim.models.transformer import ARCHS, TransformerSpec, arch_spec, parse_inline


def _gpt2(name: str, n_layer: int, hidden: int, heads: int, seq_len: int, vocab: int) -> TransformerSpec:
    """A GPT-2-style decoder: pre-LN blocks, GELU MLP of width 4 d, learned positions, tied head."""
    return arch_spec("gpt", name, n_layer=n_layer, hidden=hidden, heads=heads, seq_len=seq_len, vocab=vocab)


#: presets the runtime trains (``perfsim run``) as well as the simulator prices
RUNTIME_PRESETS: tuple[ModelSpec, ...] = (
    _gpt2("gpt2-tiny", 4, 128, 4, 64, 256),
    _gpt2("gpt2-small-byte", 8, 256, 8, 128, 256),
    _gpt2("gpt2", 12, 768, 12, 1024, 50257),
    _gpt2("gpt2-medium", 24, 1024, 16, 1024, 50257),
    _gpt2("gpt2-large", 36, 1280, 20, 1024, 50257),
    _gpt2("gpt2-xl", 48, 1600, 25, 1024, 50257),
    MLPSpec("digits-mlp", sizes=(64, 256, 256, 256, 10)),
)

#: presets only the simulator prices (published architectures)
SIMULATOR_PRESETS: tuple[ModelSpec, ...] = (
    # GPT-3 (Brown et al. 2020, arXiv:2005.14165, Table 2.1): 96 x 12288, 96 heads, 2048 ctx
    arch_spec("gpt", "gpt3-175b", n_layer=96, hidden=12288, heads=96, seq_len=2048, vocab=50257),
    # LLaMA 2 (Touvron et al. 2023, arXiv:2307.09288, Table 1; HF config.json of meta-llama/Llama-2-*)
    arch_spec("llama", "llama2-7b", n_layer=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, ffn=11008),
    arch_spec("llama", "llama2-13b", n_layer=40, hidden=5120, heads=40, seq_len=4096, vocab=32000, ffn=13824),
    arch_spec("llama", "llama2-70b", n_layer=80, hidden=8192, heads=64, kv_heads=8, seq_len=4096,
              vocab=32000, ffn=28672),
    # Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 3;
    # config.json of meta-llama/Meta-Llama-3-*, Llama-3.1-405B): SwiGLU, 8 key/value heads,
    # vocabulary 128256 (128K + 256 special tokens), untied; pre-trained on 8192-token sequences
    arch_spec("llama", "llama3-8b", n_layer=32, hidden=4096, heads=32, kv_heads=8, seq_len=8192,
              max_positions=8192, vocab=128256, ffn=14336),
    arch_spec("llama", "llama3-70b", n_layer=80, hidden=8192, heads=64, kv_heads=8, seq_len=8192,
              max_positions=8192, vocab=128256, ffn=28672),
    arch_spec("llama", "llama3.1-405b", n_layer=126, hidden=16384, heads=128, kv_heads=8, seq_len=8192,
              max_positions=131072, vocab=128256, ffn=53248),
    # Mistral 7B v0.3 (Jiang et al. 2023, arXiv:2310.06825, Table 1; mistralai/Mistral-7B-v0.3
    # config.json: vocabulary 32768, full attention: "sliding_window": null)
    arch_spec("llama", "mistral-7b", n_layer=32, hidden=4096, heads=32, kv_heads=8, seq_len=4096,
              max_positions=32768, vocab=32768, ffn=14336),
    # Qwen2.5 (Qwen team 2024, arXiv:2412.15115, Table 1; Qwen/Qwen2.5-* config.json): q/k/v
    # biases, untied at 7B and 72B; 4096-token sequences in its first pre-training stage
    arch_spec("llama", "qwen2.5-7b", n_layer=28, hidden=3584, heads=28, kv_heads=4, seq_len=4096,
              max_positions=131072, vocab=152064, ffn=18944, qkv_bias=True),
    arch_spec("llama", "qwen2.5-72b", n_layer=80, hidden=8192, heads=64, kv_heads=8, seq_len=4096,
              max_positions=131072, vocab=152064, ffn=29568, qkv_bias=True),
    # Qwen3 (Qwen team 2025, arXiv:2505.09388, Tables 1-2; Qwen/Qwen3-* config.json): no q/k/v
    # biases, an RMSNorm over each query and key head, heads of 128, vocabulary 151936, untied
    # from 8B up; 4096-token sequences in its first two pre-training stages (Sec. 3.2)
    arch_spec("llama", "qwen3-8b", n_layer=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, seq_len=4096,
              max_positions=40960, vocab=151936, ffn=12288, qk_norm=True),
    arch_spec("llama", "qwen3-32b", n_layer=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, seq_len=4096,
              max_positions=40960, vocab=151936, ffn=25600, qk_norm=True),
    # Qwen3's mixtures of experts: 128 routed experts, top-8, no shared expert, every block MoE
    arch_spec("llama", "qwen3-30b-a3b", n_layer=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
              seq_len=4096, max_positions=40960, vocab=151936, ffn=6144, qk_norm=True, experts=128, top_k=8,
              expert_ffn=768),
    arch_spec("llama", "qwen3-235b-a22b", n_layer=94, hidden=4096, heads=64, kv_heads=4, head_dim=128,
              seq_len=4096, max_positions=40960, vocab=151936, ffn=12288, qk_norm=True, experts=128, top_k=8,
              expert_ffn=1536),
    # Qwen3-Next-80B-A3B (Qwen Team 2025, "Qwen3-Next"; transformers' Qwen3NextConfig defaults, which are
    # its): 48 x 2048, three Gated DeltaNet blocks (16 query/key heads and 32 value heads of 128, a
    # 4-tap convolution) to one gated-attention block (16 query heads of 256 with an output gate, 2
    # key/value heads, query/key RMSNorms); every block 512 experts of width 512, top-10, and a gated
    # shared expert of 512; one multi-token prediction module (the release's "native MTP"); 80 B
    arch_spec("llama", "qwen3-next-80b-a3b", n_layer=48, hidden=2048, heads=16, kv_heads=2, head_dim=256,
              seq_len=4096, max_positions=262144, vocab=151936, ffn=5632, qk_norm=True, attention_output_gate=True,
              experts=512, top_k=10, expert_ffn=512, shared_ffn=512, shared_gate=True, mtp_layers=1,
              linear_attention_layers=tuple(i for i in range(48) if (i + 1) % 4),
              linear_mixer=GatedDeltaNet(key_heads=16, value_heads=32, key_dim=128, value_dim=128)),
    # Qwen3.5's language models (transformers 5.x Qwen3_5TextConfig / Qwen3_5MoeTextConfig defaults, which
    # their docstrings name the Qwen3.5-9B and Qwen3.5-35B-A3B shapes): Qwen3-Next's blocks, vocabulary
    # 248320; 9B dense, 32 x 4096, 4 key/value heads, SwiGLU of 12288; 35B-A3B, 40 x 2048, 256 experts of
    # 512 (top-8) and a gated shared expert of 512 in every block; one MTP module each (the checkpoints'
    # mtp_num_hidden_layers); 9.20 B and 35.51 B (3.52 B active) with it
    *(arch_spec("llama", name, n_layer=layers, hidden=hidden, heads=16, kv_heads=kv, head_dim=256, seq_len=4096,
                max_positions=32768, vocab=248320, ffn=ffn, qk_norm=True, attention_output_gate=True, mtp_layers=1,
                linear_attention_layers=tuple(i for i in range(layers) if (i + 1) % 4),
                linear_mixer=GatedDeltaNet(key_heads=16, value_heads=32, key_dim=128, value_dim=128), **moe)
      for name, layers, hidden, kv, ffn, moe in (
          ("qwen3.5-9b", 32, 4096, 4, 12288, {}),
          ("qwen3.5-35b-a3b", 40, 2048, 2, 512, dict(experts=256, top_k=8, expert_ffn=512, shared_ffn=512,
                                                      shared_gate=True)))),
    # BERT (Devlin et al. 2019, arXiv:1810.04805): Large 24 x 1024, Base 12 x 768; 512 positions
    arch_spec("bert", "bert-large", n_layer=24, hidden=1024, heads=16, seq_len=512, vocab=30522,
              max_positions=512, token_types=2),
    arch_spec("bert", "bert-base", n_layer=12, hidden=768, heads=12, seq_len=512, vocab=30522,
              max_positions=512, token_types=2),
    # Mixtral 8x7B (Jiang et al. 2024, arXiv:2401.04088, Table 1): 32 x 4096, 32 heads of 128,
    # 8 key/value heads, SwiGLU experts of width 14336, 8 experts, top-2, vocabulary 32000, untied;
    # a 4096-token training sequence (perfsim.models.hf_config.DEFAULT_SEQ_LEN, as its config.json)
    arch_spec("llama", "mixtral-8x7b", n_layer=32, hidden=4096, heads=32, kv_heads=8, seq_len=4096,
              vocab=32000, ffn=14336, experts=8, top_k=2),
    # DeepSeekMoE 16B (Dai et al. 2024, arXiv:2401.06066, Sec. 5 and its config.json):
    # 28 x 2048, 16 heads, 64 routed experts of width 1408 (top-6) and 2 shared (2816 in
    # all), the first block dense (width 10944), vocabulary 102400
    arch_spec("llama", "deepseek-moe-16b", n_layer=28, hidden=2048, heads=16, seq_len=4096, vocab=102400,
              ffn=10944, experts=64, top_k=6, expert_ffn=1408, shared_ffn=2816, dense_layers=(0,)),
    # DeepSeek-V2 (DeepSeek-AI 2024, arXiv:2405.04434, Sec. 3.1.2 and Appendix B; deepseek-ai/
    # DeepSeek-V2(-Lite) config.json): multi-head latent attention (128 heads, query/key heads of
    # 128 + 64 rotary, values of 128, key/value latent 512, query latent 1536; Lite: 16 heads, no
    # query latent), routed experts and 2 shared, the first block dense; 236 B (21 B active) and
    # 15.7 B (2.4 B active); vocabulary 102400, untied; 4096-token pre-training sequences
    arch_spec("llama", "deepseek-v2-lite", n_layer=27, hidden=2048, heads=16, head_dim=192, v_head_dim=128,
              kv_lora_rank=512, rope_head_dim=64, seq_len=4096, max_positions=163840, vocab=102400,
              ffn=10944, experts=64, top_k=6, expert_ffn=1408, shared_ffn=2816, dense_layers=(0,)),
    arch_spec("llama", "deepseek-v2", n_layer=60, hidden=5120, heads=128, head_dim=192, v_head_dim=128,
              kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64, seq_len=4096, max_positions=163840,
              vocab=102400, ffn=12288, experts=160, top_k=6, expert_ffn=1536, shared_ffn=3072, dense_layers=(0,)),
    # DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, Sec. 4.2; deepseek-ai/DeepSeek-V3 config.json):
    # 61 x 7168, the same latent attention as V2, 256 routed experts of 2048 (top-8) and one shared,
    # the first 3 blocks dense (18432), vocabulary 129280; 671 B (37 B active) -- the main model: its
    # multi-token prediction module (Sec. 2.2, 14 B more in the released weights) is --mtp-layers 1
    arch_spec("llama", "deepseek-v3", n_layer=61, hidden=7168, heads=128, head_dim=192, v_head_dim=128,
              kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64, seq_len=4096, max_positions=163840,
              vocab=129280, ffn=18432, experts=256, top_k=8, expert_ffn=2048, shared_ffn=2048,
              dense_layers=(0, 1, 2)),
    # Kimi K2 (Kimi Team 2025, arXiv:2507.20534; moonshotai/Kimi-K2-Base config.json, model_type
    # kimi_k2): DeepSeek-V3's architecture with 64 heads, 384 routed experts (top-8) and one
    # shared, only the first block dense, vocabulary 163840; "1 trillion total parameters, 32 billion
    # activated"; pre-trained on 4096-token sequences
    arch_spec("llama", "kimi-k2", n_layer=61, hidden=7168, heads=64, head_dim=192, v_head_dim=128,
              kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64, seq_len=4096, max_positions=131072,
              vocab=163840, ffn=18432, experts=384, top_k=8, expert_ffn=2048, shared_ffn=2048, dense_layers=(0,)),
    # gpt-oss (OpenAI 2025, arXiv:2508.10925; openai/gpt-oss-120b and -20b config.json, model_type gpt_oss):
    # 36 / 24 x 2880, 64 query heads of 64 over 8 key/value heads, q/k/v/output biases and a sink logit a
    # head, 128 / 32 SwiGLU experts of 2880 with biases (top-4) behind a router with a bias, the even
    # blocks attending within 128 tokens, vocabulary 201088; 116.83 B (5.13 B active) and 20.91 B (3.61 B)
    *(arch_spec("llama", name, n_layer=layers, hidden=2880, heads=64, kv_heads=8, head_dim=64, seq_len=4096,
                max_positions=131072, vocab=201088, ffn=2880, experts=experts, top_k=4, expert_ffn=2880,
                qkv_bias=True, out_bias=True, mlp_bias=True, router_bias=True, attention_sinks=True,
                sliding_window=128, full_attention_layers=tuple(range(1, layers, 2)))
      for name, layers, experts in (("gpt-oss-120b", 36, 128), ("gpt-oss-20b", 24, 32))),
    # Gemma 2 9B (Gemma Team 2024, arXiv:2408.00118; google/gemma-2-9b config.json): 42 x 3584, 16 heads of
    # 256 over 8, GeGLU 14336, four norms a block, the even blocks attending within 4096 tokens, logits
    # soft-capped at 30 and scores at 50, tied vocabulary 256000; 8,324,201,984 parameters outside it
    arch_spec("llama", "gemma-2-9b", n_layer=42, hidden=3584, heads=16, kv_heads=8, head_dim=256, seq_len=8192,
              max_positions=8192, vocab=256000, ffn=14336, tied=True, norms_per_block=4, sliding_window=4096,
              full_attention_layers=tuple(range(1, 42, 2)), final_logit_softcap=30.0, attn_logit_softcap=50.0),
    # Gemma 3 27B's language model (Gemma Team 2025, arXiv:2503.19786; google/gemma-3-27b-it's text_config):
    # 62 x 5376, 32 heads of 128 over 16 with query/key norms, GeGLU 21504, four norms a block, one
    # global block in six, the others within 1024 tokens, tied vocabulary 262208; 25,600 M outside it
    arch_spec("llama", "gemma-3-27b", n_layer=62, hidden=5376, heads=32, kv_heads=16, head_dim=128, seq_len=8192,
              max_positions=131072, vocab=262208, ffn=21504, tied=True, norms_per_block=4, qk_norm=True,
              sliding_window=1024, full_attention_layers=tuple(range(5, 62, 6))),
    # Llama 4 Scout and Maverick's language models (Meta AI 2025, "The Llama 4 herd"; the text_config of
    # meta-llama/Llama-4-Scout-17B-16E and -Maverick-17B-128E, model_type llama4_text): 48 x 5120, 40 heads
    # of 128 over 8, MoE blocks of 16 / 128 SwiGLU experts of 8192 (top-1) plus a shared one, Maverick's
    # even blocks dense (16384); one block in four without rotary embedding attends to the whole prefix,
    # the others in 8192-token chunks, Scout's with L2 query/key norms; vocabulary 202048; 107.77 B
    # (17.17 B active) and 400.71 B (17.18 B), the vision tower left out; 8192-token sequences (the
    # rotary embedding's original_max_position_embeddings), so no chunk is shorter than the sequence
    *(arch_spec("llama", name, n_layer=48, hidden=5120, heads=40, kv_heads=8, head_dim=128, seq_len=8192,
                max_positions=positions, vocab=202048, ffn=16384, experts=experts, top_k=1, expert_ffn=8192,
                shared_ffn=8192, dense_layers=tuple(range(0, 48, 2)) if experts == 128 else (),
                attention_chunk=8192, full_attention_layers=tuple(range(3, 48, 4)),
                nope_layers=tuple(range(3, 48, 4)), qk_l2_norm=experts == 16)
      for name, experts, positions in (("llama-4-scout", 16, 10485760), ("llama-4-maverick", 128, 1048576))),
    # Qwen1.5-MoE-A2.7B (Qwen team 2024, "Qwen1.5-MoE: Matching 7B Model Performance with 1/3
    # Activated Parameters"; Qwen/Qwen1.5-MoE-A2.7B config.json): 24 x 2048, 16 heads with q/k/v
    # biases, 60 experts of width 1408 (top-4), a gated shared expert of width 5632
    arch_spec("llama", "qwen1.5-moe-a2.7b", n_layer=24, hidden=2048, heads=16, seq_len=4096, vocab=151936,
              ffn=5632, qkv_bias=True, experts=60, top_k=4, expert_ffn=1408, shared_ffn=5632,
              shared_gate=True),
    *SIZE_ONLY,
)

#: every preset by name, in the order the error message lists them
PRESETS: dict[str, ModelSpec] = {s.name: s for s in RUNTIME_PRESETS + SIMULATOR_PRESETS}
#: other names of a preset (the paper's GPT2-1.5B is GPT-2 XL; the checkpoints' own spellings)
ALIASES = {"gpt2-1.5b": "gpt2-xl", "llama-3-8b": "llama3-8b", "llama-3-70b": "llama3-70b",
           "llama-3.1-405b": "llama3.1-405b", "mistral-7b-v0.3": "mistral-7b"}


def preset_names() -> list[str]:
    """Every preset name (aliases left out)."""
    return list(PRESETS)


def _key(name) -> str:
    key = str(name).strip().lower()
    return ALIASES.get(key, key)


def _unknown(name) -> ConfigError:
    return ConfigError(f"model {name!r}: unknown preset (known: {', '.join(PRESETS)}; "
                       f"or an inline gpt:/llama:/bert:/neox: spec, or a config.json path)")


def get_spec(name, seq_len: int | None = None) -> ModelSpec:
    """The spec of a preset (or alias), an inline transformer spec or a config.json path (or
    a folder holding one); ``seq_len`` sets a transformer's sequence length (the position
    table kept). An unknown name is one error listing the presets."""
    text = str(name).strip()
    key = _key(text)
    if key in PRESETS:
        spec = PRESETS[key]
    elif ":" in text and text.split(":", 1)[0].lower() in ARCHS:
        spec = parse_inline(text)
    elif key.endswith(".json") or Path(text).is_file() or Path(text).is_dir():
        # lazy: import perfsim does not load perfsim.models.hf_config
        from perfsim.models.hf_config import from_hf_config

        return from_hf_config(text, seq_len)
    else:
        raise _unknown(name)
    if seq_len:
        if not isinstance(spec, TransformerSpec):
            raise ConfigError(f"seq_len={seq_len}: model {name!r} is not a transformer")
        spec = spec.with_seq_len(seq_len)
    return spec


def get_model_spec(name) -> ModelSpec:
    """A preset the runtime trains (:data:`RUNTIME_PRESETS`): ``perfsim run``'s and
    ``perfsim calibrate``'s model names."""
    key = _key(name)
    runtime = [s.name for s in RUNTIME_PRESETS]
    if key in runtime:
        return PRESETS[key]
    if key in PRESETS:
        raise ConfigError(f"model {name!r}: a preset the simulator prices, not one perfsim run trains "
                          f"(it trains {', '.join(runtime)})")
    raise ConfigError(f"model {name!r}: unknown (perfsim run trains {', '.join(runtime)}; "
                      f"perfsim predict also knows {', '.join(n for n in PRESETS if n not in runtime)})")


def runtime_names() -> list[str]:
    """The presets ``perfsim run`` trains."""
    return [s.name for s in RUNTIME_PRESETS]
