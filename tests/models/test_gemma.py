"""Gemma 2 and Gemma 3's text model from config.json (Gemma Team, arXiv:2408.00118 and
arXiv:2503.19786): norms before and after each sub-block, local/global sliding-window blocks, logit
soft-capping, query/key norms. The configs are written here in transformers' field names (google/
gemma-2-9b, google/gemma-3-1b-it); sizes are checked against the papers' parameter tables."""

import dataclasses
import json

import pytest

import perfsim
from perfsim.errors import ConfigError
from perfsim.memory import layer_activation_bytes
from perfsim.models.hf_config import from_hf_config
from perfsim.models.ops import block_ops, head_ops

GEMMA2_9B = dict(architectures=["Gemma2ForCausalLM"], attention_bias=False, attention_dropout=0.0,
                 attn_logit_softcapping=50.0, cache_implementation="hybrid", final_logit_softcapping=30.0,
                 head_dim=256, hidden_activation="gelu_pytorch_tanh", hidden_size=3584, intermediate_size=14336,
                 max_position_embeddings=8192, model_type="gemma2", num_attention_heads=16, num_hidden_layers=42,
                 num_key_value_heads=8, query_pre_attn_scalar=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                 sliding_window=4096, sliding_window_size=4096, torch_dtype="float32", vocab_size=256000)
GEMMA3_1B = dict(architectures=["Gemma3ForCausalLM"], attention_bias=False, attn_logit_softcapping=None,
                 final_logit_softcapping=None, head_dim=256, hidden_activation="gelu_pytorch_tanh", hidden_size=1152,
                 intermediate_size=6912, max_position_embeddings=32768, model_type="gemma3_text",
                 num_attention_heads=4, num_hidden_layers=26, num_key_value_heads=1, query_pre_attn_scalar=256,
                 rope_local_base_freq=10000, rope_scaling=None, rope_theta=1000000, sliding_window=512,
                 sliding_window_pattern=6, torch_dtype="bfloat16", vocab_size=262144)


def _config(tmp_path, base, **changes):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(base, **changes)))
    return p


def test_sizes_are_the_papers(tmp_path):
    """Gemma 2 Table 2: 9B, 8,324,201,984 non-embedding parameters; Gemma 3 Table 1: 1B, 698 M
    non-embedding (its four norms a block, and the query and key norms, included)."""
    g2 = from_hf_config(_config(tmp_path, GEMMA2_9B), seq_len=8192)
    assert g2.params - g2.vocab * g2.hidden == 8_324_201_984
    assert (g2.norms_per_block, g2.tied, g2.gated, g2.qk_norm) == (4, True, True, False)
    g3 = from_hf_config(_config(tmp_path, GEMMA3_1B))
    assert round((g3.params - g3.vocab * g3.hidden) / 1e6) == 698 and g3.qk_norm


def test_local_and_global_blocks(tmp_path):
    g2 = from_hf_config(_config(tmp_path, GEMMA2_9B), seq_len=8192)
    assert g2.sliding_window == 4096 and g2.full_attention_layers == tuple(range(1, 42, 2))  # even blocks local
    assert sum(g2.is_window_block(i) for i in range(42)) == 21
    assert not any(g2.with_seq_len(4096).is_window_block(i) for i in range(42))  # the window holds it all
    g3 = from_hf_config(_config(tmp_path, GEMMA3_1B))
    assert g3.full_attention_layers == (5, 11, 17, 23)  # one global block in six
    types = ["sliding_attention"] * 25 + ["full_attention"]
    assert from_hf_config(_config(tmp_path, GEMMA3_1B, layer_types=types)).full_attention_layers == (25,)
    with pytest.raises(ConfigError, match="sliding_window_size=2048 differs from sliding_window=4096"):
        from_hf_config(_config(tmp_path, GEMMA2_9B, sliding_window_size=2048))
    with pytest.raises(ConfigError, match="final_logit_softcapping=-1 must be a number >= 0"):
        from_hf_config(_config(tmp_path, GEMMA2_9B, final_logit_softcapping=-1))


def test_operators_and_memory_of_the_extra_norms_and_the_soft_caps(tmp_path):
    g2 = from_hf_config(_config(tmp_path, GEMMA2_9B), seq_len=8192)
    plain = dataclasses.replace(g2, norms_per_block=2, final_logit_softcap=0.0, attn_logit_softcap=0.0)
    tok, h, bpv, tp = g2.seq_len, g2.hidden, 2, 2
    names = [op.name for op in block_ops(g2, 1, tp, False, bpv, "megatron")]
    assert {"norm_post_attn", "norm_post_mlp", "scores_softcap"} <= set(names)
    assert names.index("norm_post_attn") < names.index("dropout_residual1") < names.index("norm2")
    flash = {op.name for op in block_ops(g2, 1, tp, False, bpv, "flash")}
    assert "scores_softcap" not in flash and "norm_post_mlp" in flash  # the flash kernel caps inside
    cap = {op.name: op for op in head_ops(g2, 1, tp, False, bpv)}["logit_softcap"]
    assert cap.bytes == 6 * bpv * tok * (g2.vocab // tp) and cap.bwd_bytes == 7 * bpv * tok * (g2.vocab // tp)
    assert "logit_softcap" not in {op.name for op in head_ops(plain, 1, tp, False, bpv)}
    more = (layer_activation_bytes(dataclasses.replace(plain, norms_per_block=4), 1, tp, False, "none", bpv, "flash")
            - layer_activation_bytes(plain, 1, tp, False, "none", bpv, "flash"))
    assert more == 4 * tok * h  # two more norm inputs, 2 bytes a value


def test_predict_notes_emit_and_refusals(tmp_path):
    p = _config(tmp_path, GEMMA2_9B)
    kw = dict(model=str(p), gpu="h100", gpus_per_node=8, tp=1, pp=1, dp=8, micro_batch=1, global_batch=64,
              seq_len=8192, precision="bf16", recompute="full", allow_oom=True)
    r = perfsim.predict(**kw)
    note = r.summary["model_note"]
    assert "the LM head's logits at 30, three passes over them, the scores at 50, inside the flash kernel" in note
    assert "sliding-window attention (4096 tokens) in 21 of 42 blocks" in note
    assert perfsim.predict(**dict(kw, seq_len=4096)).summary["iteration_s"] < r.summary["iteration_s"]
    from perfsim.emit import architecture_args

    args, notes = architecture_args(from_hf_config(p, seq_len=8192))
    assert args[args.index("--window-attn-skip-freq") + 1] == "[" + ",".join(["1", "0"] * 21) + "]"
    assert any("soft-capping" in n for n in notes) and not any("parallel attention" in n for n in notes)
    with pytest.raises(ConfigError, match="kernels=eager"):
        perfsim.predict(**dict(kw, kernels="eager"))
    with pytest.raises(ConfigError, match="norms_per_block=4 .* parallel block"):
        dataclasses.replace(from_hf_config(p), parallel_block=True)


GEMMA3_27B_WRAPPER = dict(
    architectures=["Gemma3ForConditionalGeneration"], boi_token_index=255999, eoi_token_index=256000,
    image_token_index=262144, initializer_range=0.02, mm_tokens_per_image=256, model_type="gemma3",
    text_config=dict(head_dim=128, hidden_size=5376, intermediate_size=21504, model_type="gemma3_text",
                     num_attention_heads=32, num_hidden_layers=62, num_key_value_heads=16, query_pre_attn_scalar=168,
                     rope_scaling={"factor": 8.0, "rope_type": "linear"}, sliding_window=1024, vocab_size=262208),
    torch_dtype="bfloat16", vision_config=dict(hidden_size=1152, image_size=896, intermediate_size=4304,
                                               model_type="siglip_vision_model", num_attention_heads=16,
                                               num_hidden_layers=27, patch_size=14, vision_use_head=False))


def test_the_multimodal_wrapper_prices_its_language_model(tmp_path):
    """google/gemma-3-27b-it's config.json (model_type gemma3): its text_config, the defaults of
    Gemma3TextConfig where it leaves a field out; Gemma 3 Table 1: 25,600 M non-embedding parameters."""
    spec = from_hf_config(_config(tmp_path, GEMMA3_27B_WRAPPER))
    assert round((spec.params - spec.vocab * spec.hidden) / 1e6) == 25600
    assert spec.max_positions == 131072 and spec.full_attention_layers[:2] == (5, 11) and spec.qk_norm
    assert spec.left_out == "the vision tower (vision_config) is not priced: a text-only job"
    r = perfsim.predict(model=str(tmp_path / "config.json"), gpu="h100", gpus_per_node=8, tp=8, pp=1, dp=1,
                        micro_batch=1, global_batch=8, seq_len=8192, precision="bf16", allow_oom=True)
    assert r.summary["model_note"].startswith("the vision tower (vision_config) is not priced")
    for changes, needle in (({"text_config": None}, "without a 'text_config' object"),
                            ({"text_config": dict(GEMMA3_27B_WRAPPER["text_config"], model_type="llama")},
                             "text_config.model_type=\"llama\": 'gemma3_text' expected"),
                            ({"audio_config": {}}, "field 'audio_config'={} is not modelled")):
        with pytest.raises(ConfigError, match=needle):
            from_hf_config(_config(tmp_path, GEMMA3_27B_WRAPPER, **changes))


def test_the_presets_are_the_configs(tmp_path):
    from perfsim.models.registry import get_spec

    for base, preset in ((GEMMA2_9B, "gemma-2-9b"), (GEMMA3_27B_WRAPPER, "gemma-3-27b")):
        spec = from_hf_config(_config(tmp_path, base), seq_len=get_spec(preset).seq_len)
        assert dataclasses.replace(spec, name=preset, from_config=False, left_out="") == get_spec(preset)
