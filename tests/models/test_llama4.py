"""Llama 4 from config.json (Meta AI 2025, "The Llama 4 herd"; transformers' ``modeling_llama4.py``):
MoE blocks with a shared expert, Maverick's interleaved dense blocks, NoPE blocks of full attention
between rotary blocks attending in 8192-token chunks, weightless L2 query/key norms, the multimodal
wrapper read for its language model. The config is written here in transformers' field names
(meta-llama/Llama-4-Scout-17B-16E); sizes are checked against Meta's totals and by hand; chunked
attention against its geometry. No Llama 4 step was timed."""

import dataclasses
import json

import pytest

import perfsim
from perfsim.engine.compute import flash_time
from perfsim.errors import ConfigError
from perfsim.hardware import curve_for, get_gpu
from perfsim.models.hf_config import from_hf_config
from perfsim.models.ops import Op, block_ops
from perfsim.models.registry import get_spec
from perfsim.models.transformer import parse_inline

SCOUT_TEXT = dict(
    model_type="llama4_text", attention_bias=False, attention_chunk_size=8192, attention_dropout=0.0,
    bos_token_id=200000, eos_token_id=[200001, 200007, 200008], head_dim=128, hidden_act="silu",
    hidden_size=5120, initializer_range=0.02, interleave_moe_layer_step=1, intermediate_size=8192,
    intermediate_size_mlp=16384, max_position_embeddings=10485760, num_attention_heads=40,
    num_experts_per_tok=1, num_hidden_layers=48, num_key_value_heads=8, num_local_experts=16,
    output_router_logits=False, pad_token_id=200018, rms_norm_eps=1e-5,
    rope_scaling={"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    rope_theta=500000.0, router_aux_loss_coef=0.001, router_jitter_noise=0.0, use_cache=True, use_qk_norm=True,
    vocab_size=202048)
SCOUT = dict(architectures=["Llama4ForConditionalGeneration"], model_type="llama4", boi_token_index=200080,
             eoi_token_index=200081, image_token_index=200092, tie_word_embeddings=False, torch_dtype="bfloat16",
             vision_config={"model_type": "llama4_vision_model", "hidden_size": 1408, "num_hidden_layers": 34},
             text_config=SCOUT_TEXT)
MAVERICK = dict(interleave_moe_layer_step=2, num_local_experts=128, use_qk_norm=False, max_position_embeddings=1048576)


def _config(tmp_path, wrapper: dict | None = None, **text):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(SCOUT, **(wrapper or {}), text_config=dict(SCOUT_TEXT, **text))))
    return p


def test_sizes_are_meta_s(tmp_path):
    """Meta: Scout 17 B active of 109 B, Maverick 17 B active of 400 B (the vision tower included, which
    is left out here); a MoE block by hand: attention, 16 experts, the shared expert, the router."""
    scout = from_hf_config(_config(tmp_path))
    maverick = from_hf_config(_config(tmp_path, **MAVERICK))
    assert round(scout.params / 1e7) == 10777 and round(scout.active_params / 1e7) == 1717
    assert round(maverick.params / 1e7) == 40071 and round(maverick.active_params / 1e7) == 1718
    d, q, kv, f = 5120, 40 * 128, 8 * 128, 8192
    attention = d * (q + 2 * kv) + q * d  # no biases; the L2 norms have no weights
    assert scout.block_params(0) == attention + 16 * 3 * d * f + 3 * d * f + 16 * d + 2 * d
    assert maverick.block_params(0) == attention + 3 * d * 16384 + 2 * d  # a dense block
    assert maverick.block_params(1) == attention + 128 * 3 * d * f + 3 * d * f + 128 * d + 2 * d


def test_blocks_chunks_and_norms(tmp_path):
    spec = from_hf_config(_config(tmp_path), seq_len=32768)
    nope = tuple(range(3, 48, 4))  # no_rope_layer_interval 4: every fourth block
    assert spec.nope_layers == nope and spec.full_attention_layers == nope and spec.attention_chunk == 8192
    assert spec.block_kind(0) == (True, 0, 8192, True, False, True, True)  # rotary: chunks and the L2 norms
    assert spec.block_kind(3) == (True, 0, 0, False, False, True, True)  # NoPE: the whole prefix, no norm
    assert spec.dense_layers == () and spec.shared_ffn == 8192 and spec.ffn == 16384
    assert spec.keys_per_query(0) == 8192 and spec.keys_per_query(3) == 32768
    short = from_hf_config(_config(tmp_path), seq_len=8192)  # one chunk: no chunking
    assert not any(short.is_chunked_block(i) for i in range(48))
    maverick = from_hf_config(_config(tmp_path, **MAVERICK))
    assert maverick.dense_layers == tuple(range(0, 48, 2)) and not maverick.qk_l2_norm
    explicit = from_hf_config(_config(tmp_path, moe_layers=[5, 7], no_rope_layers=[1] * 48,
                                                               layer_types=["chunked_attention"] * 48), seq_len=32768)
    assert len(explicit.dense_layers) == 46 and explicit.nope_layers == () and explicit.full_attention_layers == ()


def test_a_chunked_flash_kernel_is_one_kernel_per_chunk():
    """Causal attention within chunks of ``c``: the pairs of ``s // c`` whole chunks and the rest,
    at the rate of a kernel over sequences of ``c`` -- the same time as running each chunk as a
    sequence of its own."""
    s, c, b = 32768, 8192, 40
    chunked = Op("a", m=s, n=s, k=128, batch=b, flash=True, chunk=c)
    assert chunked.attended_pairs == 4 * c * c / 2
    assert dataclasses.replace(chunked, m=20000, n=20000).attended_pairs == (2 * c * c + 3616 ** 2) / 2
    assert dataclasses.replace(chunked, chunk=s).attended_pairs == s * s / 2  # no shorter than s: none
    gpu = get_gpu("h100")
    curve = curve_for(gpu, None)[0]
    as_sequences = Op("a", m=c, n=c, k=128, batch=b * s // c, flash=True)
    for backward in (False, True):
        assert flash_time(chunked, gpu, "bf16", curve, backward=backward) == pytest.approx(
            flash_time(as_sequences, gpu, "bf16", curve, backward=backward))
    spec = get_spec("llama-4-scout")
    long = dataclasses.replace(spec, seq_len=s)
    ops = {o.name: o for o in block_ops(long, 1, 8, True, 2, "flash", block=0)}
    assert ops["flash_attention"].chunk == c and "qk_norm" in ops
    ops = {o.name: o for o in block_ops(long, 1, 8, True, 2, "flash", block=3)}
    assert ops["flash_attention"].chunk == 0 and "qk_norm" not in ops


def test_chunks_price_long_sequences_and_say_so(tmp_path):
    kw = dict(gpu="h100", gpus_per_node=8, tp=8, pp=1, dp=1, ep=1, micro_batch=1, global_batch=8,
              precision="bf16", recompute="full", attention="flash", sequence_parallel=True, allow_oom=True)
    p = _config(tmp_path)
    chunked = perfsim.predict(model=str(p), seq_len=32768, **kw).summary
    full = perfsim.predict(model=str(_config(tmp_path, layer_types=["full_attention"] * 48)), seq_len=32768,
                           **kw).summary
    assert chunked["iteration_s"] < full["iteration_s"]
    assert "chunked attention (8192-token chunks) in 36 of 48 blocks" in chunked["model_note"]
    assert "the vision tower" in chunked["model_note"] and "temperature tuning" in chunked["model_note"]
    short = perfsim.predict(model=str(p), seq_len=8192, **kw).summary
    same = perfsim.predict(model=str(_config(tmp_path, layer_types=["full_attention"] * 48)), seq_len=8192,
                           **kw).summary
    assert short["iteration_s"] == same["iteration_s"]  # one chunk covers the sequence
    assert "chunked attention" not in short["model_note"]


def test_megatron_flags(tmp_path):
    from perfsim.emit import architecture_args

    args, notes = architecture_args(from_hf_config(_config(tmp_path)))
    assert "--qk-l2-norm" in args and "--qk-layernorm" not in args
    pattern = args[args.index("--no-rope-freq") + 1]
    assert pattern == "[" + ",".join("1" if i % 4 == 3 else "0" for i in range(48)) + "]"
    assert any("chunked attention (8192-token chunks" in n for n in notes)
    assert "--qk-layernorm" in architecture_args(get_spec("qwen3-8b"))[0]  # an RMSNorm over q and k


def test_the_presets_are_the_configs(tmp_path):
    for preset, changes in (("llama-4-scout", {}), ("llama-4-maverick", MAVERICK)):
        spec = from_hf_config(_config(tmp_path, **changes), seq_len=8192)
        assert dataclasses.replace(spec, name=preset, from_config=False, left_out="") == get_spec(preset)


@pytest.mark.parametrize("wrapper, text, needle", [
    ({}, dict(no_rope_layers=[1, 0]), "no_rope_layers=[1, 0] must be a list of 48"),
    ({}, dict(no_rope_layers=[2] * 48), "no_rope_layers="),
    ({}, dict(layer_types=["sliding_attention"] * 48), "layer_types="),
    ({}, dict(moe_layers=[48]), "moe_layers="),
    ({}, dict(attention_chunk_size=0), "attention_chunk_size=0"),
    ({}, dict(mlp_bias=True), "'mlp_bias'"),
    (dict(tie_word_embeddings=True), dict(tie_word_embeddings=False), "tie_word_embeddings=true differs"),
    (dict(vision_tokens=4), {}, "'vision_tokens'"),
])
def test_refusals(tmp_path, wrapper, text, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        from_hf_config(_config(tmp_path, wrapper, **text))


def test_spec_rules():
    base = parse_inline("llama:layers=4,hidden=512,heads=8,seq=4096,vocab=1000,chunk=1024")
    assert base.attention_chunk == 1024 and base.is_chunked_block(3)
    with pytest.raises(ConfigError, match="sliding_window=512 with attention_chunk=1024"):
        dataclasses.replace(base, sliding_window=512)
    with pytest.raises(ConfigError, match="qk_l2_norm with qk_norm"):
        dataclasses.replace(base, qk_l2_norm=True, qk_norm=True)
    with pytest.raises(ConfigError, match="nope_layers: 4 is not a block"):
        dataclasses.replace(base, nope_layers=(4,))
    from perfsim.models.eager import check_eager

    check_eager(dataclasses.replace(base, attention_chunk=0), "bf16")  # a plain Llama block is listed
    with pytest.raises(ConfigError, match="kernels=eager"):
        check_eager(base, "bf16")


@pytest.mark.parametrize("extra", ["window=256", "chunk=256", "mtp=1"])
def test_the_runtime_refuses_what_it_would_not_build(extra):
    """``perfsim run`` builds GPT-2 blocks over the whole prefix, without MTP modules: a window, chunks
    or a module would train another model than the one predicted."""
    from perfsim.runtime.models import check_gpt

    check_gpt(parse_inline("gpt:layers=2,hidden=64,heads=4,seq=512,vocab=100"))
    with pytest.raises(ConfigError, match="GPT-2-style decoders only"):
        check_gpt(parse_inline(f"gpt:layers=2,hidden=64,heads=4,seq=512,vocab=100,{extra}"))
