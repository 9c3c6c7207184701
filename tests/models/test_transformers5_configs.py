"""Configs as transformers 5.x writes them (``save_pretrained``, checked against transformers 5.24.0's
output, 2026-11-30): new or renamed fields that change nothing, or mean what an older field meant, are read
as such -- and the few that would change the model are refused by name."""

import json
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.models.hf_config import from_hf_config

CONFIGS = Path(__file__).parents[1] / "data" / "configs"


def _read(tmp_path, name: str, **changes):
    cfg = {**json.loads((CONFIGS / f"{name}.json").read_text()), **changes}
    p = tmp_path / "config.json"
    p.write_text(json.dumps({k: v for k, v in cfg.items() if v is not ...}))
    return from_hf_config(p)


def test_qwen_moe_fields(tmp_path):
    base = _read(tmp_path, "qwen1.5-moe-a2.7b")
    # Qwen2-MoE: a window of 0 with use_sliding_window false; the q/k/v biases stated
    assert _read(tmp_path, "qwen1.5-moe-a2.7b", sliding_window=0, use_sliding_window=False, qkv_bias=True) == base
    assert _read(tmp_path, "qwen1.5-moe-a2.7b", num_experts=..., num_local_experts=60).params == base.params
    with pytest.raises(ConfigError, match="num_experts=60 differs from num_local_experts=64"):
        _read(tmp_path, "qwen1.5-moe-a2.7b", num_local_experts=64)
    with pytest.raises(ConfigError, match="sliding_window=0"):  # a window switched on must be >= 1
        _read(tmp_path, "qwen1.5-moe-a2.7b", sliding_window=0, use_sliding_window=True, max_window_layers=0)


def test_gemma_fields(tmp_path):
    base = _read(tmp_path, "gemma-7b")
    assert _read(tmp_path, "gemma-7b", use_bidirectional_attention=None) == base
    assert _read(tmp_path, "gemma-7b", use_bidirectional_attention=False) == base
    with pytest.raises(ConfigError, match="use_bidirectional_attention=true"):
        _read(tmp_path, "gemma-7b", use_bidirectional_attention=True)
    gemma3 = dict(model_type="gemma3_text", hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=512, vocab_size=1000)
    p = tmp_path / "g3.json"
    p.write_text(json.dumps(dict(gemma3, sliding_window_pattern=6, _sliding_window_pattern=6)))
    assert from_hf_config(p).full_attention_layers == (5, 11)
    p.write_text(json.dumps(dict(gemma3, sliding_window_pattern=6, _sliding_window_pattern=4)))
    with pytest.raises(ConfigError, match="_sliding_window_pattern=4 differs"):
        from_hf_config(p)


def test_gpt_oss_activation_constant(tmp_path):
    cfg = dict(model_type="gpt_oss", hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=64, intermediate_size=256, vocab_size=1000, num_local_experts=4, num_experts_per_tok=2)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    base = from_hf_config(p)
    p.write_text(json.dumps(dict(cfg, swiglu_alpha=1.702)))  # the SwiGLU's constant: no cost
    assert from_hf_config(p) == base


def test_bert_cross_attention_switch(tmp_path):
    cfg = dict(model_type="bert", hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
               vocab_size=1000, is_decoder=False)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    base = from_hf_config(p)
    p.write_text(json.dumps(dict(cfg, add_cross_attention=False)))
    assert from_hf_config(p) == base
    p.write_text(json.dumps(dict(cfg, add_cross_attention=True)))
    with pytest.raises(ConfigError, match="add_cross_attention=true: cross-attention layers"):
        from_hf_config(p)


#: small configs of every supported text model type transformers builds (module docstring's survey)
SMALL = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "gemma": {}, "gemma2": {}, "qwen3_moe": {}, "qwen2_moe": {},
    "mixtral": {}, "gpt_oss": dict(head_dim=64), "llama4_text": dict(head_dim=64, intermediate_size_mlp=512),
    "gemma3_text": dict(num_hidden_layers=6), "qwen3_next": {}, "qwen3_5_text": {}, "qwen3_5_moe_text": {},
    "deepseek_v3": dict(num_hidden_layers=3, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2,
                        first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=64, q_lora_rank=128,
                        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, num_nextn_predict_layers=0),
    "granitemoehybrid": dict(mamba_n_heads=16, num_local_experts=4, layer_types=["mamba", "attention"]),
    "gpt_neox": {}, "falcon": {}, "bert": {}, "roberta": {},
}


@pytest.mark.parametrize("mtype", sorted(SMALL))
def test_every_type_saved_by_transformers_reads_with_its_count(tmp_path, mtype):
    """Where transformers >= 5 is installed (not among ``make test``'s pins): the config it saves reads back,
    with the parameters its model has (MTP modules, which transformers does not build, left out above)."""
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("a transformers 5.x check")
    import torch

    fields = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                  intermediate_size=512, vocab_size=1000)
    if mtype in ("qwen3_5_moe_text", "falcon"):
        fields.pop("intermediate_size")
    if mtype in ("falcon", "gpt_neox", "bert", "roberta"):
        fields.pop("num_key_value_heads")
    config = transformers.AutoConfig.for_model(mtype, **{**fields, **SMALL[mtype]})
    config.save_pretrained(tmp_path)
    build = transformers.AutoModel if mtype in ("bert", "roberta") else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = build.from_config(config)
    assert from_hf_config(tmp_path).params == sum(p.numel() for p in model.parameters())
