"""gpt-oss from config.json (OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", arXiv:2508.10925):
experts with biases behind a router with a bias, attention biases and sinks, local/global blocks of a
128-token window, MXFP4 storage. The config is written here in transformers' field names
(openai/gpt-oss-120b); sizes are checked against the model card's totals."""

import dataclasses
import json

import pytest

import perfsim
from perfsim.errors import ConfigError
from perfsim.models.hf_config import from_hf_config
from perfsim.models.tensor_parallel import shard_block_params

GPT_OSS_120B = dict(
    architectures=["GptOssForCausalLM"], attention_bias=True, attention_dropout=0.0, experts_per_token=4,
    head_dim=64, hidden_act="silu", hidden_size=2880, initial_context_length=4096, intermediate_size=2880,
    layer_types=["sliding_attention", "full_attention"] * 18, max_position_embeddings=131072,
    model_type="gpt_oss", num_attention_heads=64, num_experts_per_tok=4, num_hidden_layers=36,
    num_key_value_heads=8, num_local_experts=128, output_router_logits=False,
    quantization_config={"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                    "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    rms_norm_eps=1e-5, rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                     "truncate": False},
    rope_theta=150000, router_aux_loss_coef=0.9, sliding_window=128, swiglu_limit=7.0, tie_word_embeddings=False,
    torch_dtype="bfloat16", vocab_size=201088)


def _config(tmp_path, **changes):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(GPT_OSS_120B, **changes)))
    return p


def test_sizes_are_the_model_cards(tmp_path):
    """Model card, Table 1: gpt-oss-120b 116.83 B parameters, 5.13 B active a token (the embedding
    left out); gpt-oss-20b (24 blocks, 32 experts) 20.91 B and 3.61 B."""
    big = from_hf_config(_config(tmp_path))
    assert round(big.params / 1e7) == 11683 and round((big.active_params - big.vocab * big.hidden) / 1e7) == 513
    small = from_hf_config(_config(tmp_path, num_hidden_layers=24, num_local_experts=32,
                                   layer_types=["sliding_attention", "full_attention"] * 12))
    assert round(small.params / 1e7) == 2091 and round((small.active_params - small.vocab * small.hidden) / 1e7) == 361
    # what the biases, the router's bias and the sinks add to a block, by hand
    d, f, e, h = 2880, 2880, 128, 64
    plain = dataclasses.replace(big, mlp_bias=False, router_bias=False, attention_sinks=False)
    assert big.block_params(0) - plain.block_params(0) == e * (2 * f + d) + e + h
    for tp in (1, 2, 8):  # split: the experts' first biases, the sinks (by heads); whole: the row-parallel
        # down projections' biases and the router's
        assert shard_block_params(big, tp, 0) - shard_block_params(plain, tp, 0) == (e * 2 * f + h) // tp + e * d + e


def test_blocks_window_and_refusals(tmp_path):
    spec = from_hf_config(_config(tmp_path), seq_len=8192)
    assert spec.sliding_window == 128 and spec.full_attention_layers == tuple(range(1, 36, 2))
    assert (spec.experts, spec.top_k, spec.expert_ffn, spec.qkv_bias, spec.tied) == (128, 4, 2880, True, False)
    with pytest.raises(ConfigError, match="experts_per_token=2 differs from num_experts_per_tok=4"):
        from_hf_config(_config(tmp_path, experts_per_token=2))
    with pytest.raises(ConfigError, match="'quantization_config'"):
        from_hf_config(_config(tmp_path, quantization_config={"quant_method": "gptq", "bits": 4}))


def test_predict_and_megatron_flags(tmp_path):
    p = _config(tmp_path)
    r = perfsim.predict(model=str(p), gpu="h100", gpus_per_node=8, tp=1, pp=1, dp=8, ep=8, micro_batch=1,
                        global_batch=64, seq_len=8192, precision="bf16", recompute="selective", allow_oom=True)
    note = r.summary["model_note"]
    assert "116.83 B parameters" in note and "top-4 of 128 experts" in note
    assert "attention sinks (gpt-oss): one learned logit a head in every softmax, not priced" in note
    assert "sliding-window attention (128 tokens) in 18 of 36 blocks" in note
    from perfsim.emit import architecture_args

    args, notes = architecture_args(from_hf_config(p))
    assert args[args.index("--softmax-type") + 1] == "learnable" and args[args.index("--window-size") + 1] == "127,0"
    assert any("router's linear layer" in n for n in notes)


def test_the_presets_are_the_configs(tmp_path):
    from perfsim.models.registry import get_spec

    for preset, changes in (("gpt-oss-120b", {}),
                            ("gpt-oss-20b", dict(num_hidden_layers=24, num_local_experts=32,
                                                 layer_types=["sliding_attention", "full_attention"] * 12))):
        spec = from_hf_config(_config(tmp_path, **changes), seq_len=4096)
        assert dataclasses.replace(spec, name=preset, from_config=False) == get_spec(preset)
