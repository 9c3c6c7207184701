"""Any transformer: parameter counts against published sizes, inline specs, HF config.json."""

import json

import pytest

from perfsim.errors import ConfigError
from perfsim.models.hf_config import from_hf_config
from perfsim.models.registry import get_spec
from perfsim.models.transformer import parse_inline
from perfsim.workload import get_model

# published sizes: exact where the model card / HF checkpoint states them
EXACT = {
    "llama2-7b": 6_738_415_616,   # meta-llama/Llama-2-7b-hf
    "llama2-13b": 13_015_864_320,  # meta-llama/Llama-2-13b-hf
    "llama2-70b": 68_976_648_192,  # meta-llama/Llama-2-70b-hf (68.98 B)
    "bert-large": 335_141_888,    # bert-large-uncased (BertModel, with pooler)
    "bert-base": 109_482_240,     # bert-base-uncased
    "gpt2": 124_439_808,          # openai-community/gpt2
    "gpt2-xl": 1_557_611_200,     # openai-community/gpt2-xl
}


@pytest.mark.parametrize("name,params", sorted(EXACT.items()))
def test_parameter_counts_match_published_checkpoints(name, params):
    assert get_spec(name).params == params
    assert get_model(name).params == params  # the layers add up to it


def test_gpt3_175b_is_175b():
    # GPT-3 paper (Brown et al. 2020, Table 2.1) calls it 175.0 B
    assert get_spec("gpt3-175b").params == pytest.approx(175e9, rel=0.01)
    inline = parse_inline("gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=50257")
    assert inline.params == get_spec("gpt3-175b").params


def test_inline_spec_options_and_errors():
    s = parse_inline("llama:layers=2,hidden=64,heads=8,seq=16,vocab=100,ffn=96,kv_heads=2")
    assert (s.ffn, s.kv_heads, s.gated, s.kv_dim) == (96, 2, True, 16)
    # 2 x (attention 64*(64+32)+64*64, SwiGLU 3*64*96, 2 RMSNorms) + untied embed/head + final norm
    assert s.params == 2 * (64 * 96 + 64 * 64 + 3 * 64 * 96 + 2 * 64) + 2 * 100 * 64 + 64
    with pytest.raises(ConfigError, match="missing"):
        parse_inline("gpt:layers=2,hidden=64")
    with pytest.raises(ConfigError, match="bad item"):
        parse_inline("gpt:layers=2,hidden=64,heads=8,seq=16,vocab=100,depth=3")
    with pytest.raises(ConfigError, match="kv_heads"):
        parse_inline("gpt:layers=2,hidden=64,heads=8,seq=16,vocab=100,kv_heads=3")


@pytest.mark.parametrize("cfg,params", [
    ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
      "max_position_embeddings": 4096, "tie_word_embeddings": False}, 6_738_415_616),
    ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
      "max_position_embeddings": 32768, "tie_word_embeddings": False}, 7_241_732_096),  # Mistral-7B-v0.1
    ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
      "n_positions": 1024}, 124_439_808),
    ({"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
      "intermediate_size": 4096, "vocab_size": 30522, "max_position_embeddings": 512,
      "type_vocab_size": 2}, 335_141_888),
    ({"model_type": "gpt_neox", "hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8,
      "intermediate_size": 2048, "vocab_size": 50304, "max_position_embeddings": 2048,
      "tie_word_embeddings": False}, 70_426_624),  # EleutherAI/pythia-70m
])
def test_hf_config_json(tmp_path, cfg, params):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert from_hf_config(p).params == params


def test_hf_config_errors(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ConfigError, match="model_type"):
        from_hf_config(p)
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        from_hf_config(p)


def test_seq_len_for_every_transformer_preset():
    m = get_model("bert-large", seq_len=128)
    assert m.tokens_per_sample == 128 and m.layers[1].out_shape == (128, 1024)
    assert m.params == get_model("bert-large").params  # the position table is kept
    long = get_model("gpt2-xl", seq_len=2048)
    assert long.params > get_model("gpt2-xl").params  # GPT-2 learns one row per position
    with pytest.raises(ConfigError, match="not a transformer"):
        get_model("resnet50", seq_len=128)


def test_query_key_norms_add_their_weights_kernels_and_kept_inputs():
    """Qwen3's RMSNorm over each query and key head: 2 x head_dim weights per block (replicated
    across tensor-parallel ranks), one norm kernel reading and writing q and k, and its input kept
    for the backward; a model without them is unchanged."""
    import dataclasses

    from perfsim.memory import layer_activation_bytes
    from perfsim.models.ops import block_ops
    from perfsim.models.tensor_parallel import shard_block_params

    base = parse_inline("llama:layers=2,hidden=256,heads=8,seq=64,vocab=100,ffn=512,kv_heads=2")
    qk = dataclasses.replace(base, qk_norm=True)
    assert qk.block_params(0) - base.block_params(0) == 2 * base.head_dim
    assert qk.params - base.params == 2 * 2 * base.head_dim
    for tp in (1, 2):
        assert shard_block_params(qk, tp, 0) - shard_block_params(base, tp, 0) == 2 * base.head_dim
        ops = {o.name: o for o in block_ops(qk, 2, tp, False, 2)}
        assert ops["qk_norm"].bytes == 2 * 2 * (2 * 64) * (base.q_dim + base.kv_dim) // tp
        assert "qk_norm" not in {o.name for o in block_ops(base, 2, tp, False, 2)}
        kept = layer_activation_bytes(qk, 2, tp, False, "none", 2) - layer_activation_bytes(base, 2, tp, False, "none", 2)
        assert kept == pytest.approx(2 * 64 * 2 * (base.q_dim + base.kv_dim) / tp)
