"""Kimi K2.5 (``kimi_k25``): a multimodal wrapper around DeepSeek-V3's architecture (transformers 5.x
``Kimi_K25Config``: its ``text_config`` is read as ``deepseek_v3``, also when it names itself
``kimi_k2``), read for its language model; and DeepSeek-V3 configs as transformers 5.x writes them
(``qk_head_dim``, the sum it derives, and ``rope_interleave``, a layout without cost)."""

import json

import pytest

from perfsim.errors import ConfigError
from perfsim.models.hf_config import from_hf_config

TEXT = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, vocab_size=16384,
            intermediate_size=2048, moe_intermediate_size=256, n_routed_experts=16, n_shared_experts=1,
            num_experts_per_tok=4, first_k_dense_replace=1, kv_lora_rank=128, q_lora_rank=256, qk_nope_head_dim=64,
            qk_rope_head_dim=32, v_head_dim=64, n_group=4, topk_group=2, topk_method="noaux_tc")
WRAPPER = dict(model_type="kimi_k25", image_token_id=163605, video_token_id=163840, vision_start_token_id=163602,
               vision_end_token_id=163604, projection_hidden_size=1152, projection_layer_norm_eps=1e-5,
               tie_word_embeddings=False, vision_config={"model_type": "kimi_k25_vision", "hidden_size": 1152})


def _write(tmp_path, cfg):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize("name", ["kimi_k2", "deepseek_v3"])
def test_the_wrapper_is_its_language_model(tmp_path, name):
    text = from_hf_config(_write(tmp_path, dict(model_type="deepseek_v3", **TEXT)))
    wrapped = from_hf_config(_write(tmp_path, dict(WRAPPER, text_config=dict(model_type=name, **TEXT))))
    assert wrapped.params == text.params and wrapped.mla and wrapped.experts == 16
    assert "vision tower" in wrapped.left_out
    with pytest.raises(ConfigError, match='text_config.model_type="qwen3"'):
        from_hf_config(_write(tmp_path, dict(WRAPPER, text_config=dict(model_type="qwen3", **TEXT))))


def test_transformers_5_fields(tmp_path):
    base = from_hf_config(_write(tmp_path, dict(model_type="deepseek_v3", **TEXT))).params
    five = dict(model_type="deepseek_v3", qk_head_dim=96, rope_interleave=True, **TEXT)
    assert from_hf_config(_write(tmp_path, five)).params == base
    with pytest.raises(ConfigError, match="qk_head_dim=128 differs from qk_nope_head_dim \\+ qk_rope_head_dim = 96"):
        from_hf_config(_write(tmp_path, dict(five, qk_head_dim=128)))
