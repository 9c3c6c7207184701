"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1; DeepSeek-V3,
arXiv:2412.19437): parameters, operators, tensor parallelism, memory, config.json, refusals.

Sizes are checked against the papers' totals and by hand from the projections' shapes; the
stored DeepSeek-V2-Lite config.json is the published file (tests/data/configs)."""

import dataclasses
import json
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.models.hf_config import from_hf_config
from perfsim.models.ops import block_ops, fp8_cast_ops
from perfsim.models.registry import get_spec
from perfsim.models.tensor_parallel import (block_gemm_params, rank_gemm_params, shard_block_params,
                                            tp_layer_collectives)
from perfsim.models.transformer import parse_inline
from tests._helpers import run_cli_here

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"

# (total, activated, source): the papers' "activated" counts leave out the token embedding table
# (a lookup, no FLOPs): the specs' active_params minus vocab x hidden match them all
PUBLISHED = {
    "deepseek-v2-lite": (15.7e9, 2.4e9, "arXiv:2405.04434 Appendix B: 15.7 B total, 2.4 B activated"),
    "deepseek-v2": (236e9, 21e9, "arXiv:2405.04434 abstract: 236 B total, 21 B activated"),
    "deepseek-v3": (671e9, 37e9, "arXiv:2412.19437 abstract: 671 B total, 37 B activated"),
    "kimi-k2": (1e12, 32e9, "arXiv:2507.20534 abstract: 1 trillion total, 32 billion activated (rounded)"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_have_the_published_sizes(name):
    total, activated, _ = PUBLISHED[name]
    s = get_spec(name)
    assert s.mla and s.params == pytest.approx(total, rel=0.005 if total < 1e12 else 0.03)  # "1 trillion"
    assert s.active_params - s.vocab * s.hidden == pytest.approx(activated, rel=0.03)


def test_v3_attention_is_counted_projection_by_projection():
    s = get_spec("deepseek-v3")
    d, h = 7168, 128
    by_hand = (d * 1536 + 1536            # query down projection, its latent's RMSNorm
               + 1536 * h * (128 + 64)    # query up projection: non-rotary and rotary parts per head
               + d * (512 + 64) + 512     # key/value down projection with the shared rotary key; norm
               + 512 * h * (128 + 128)    # keys' non-rotary part and values, per head
               + h * 128 * d)             # output projection from the 128-wide value heads
    assert s.attention_params() == by_hand == 187_107_328
    assert (s.q_dim, s.kv_dim, s.v_dim, s.out_dim) == (h * 192, h * 192, h * 128, h * 128)
    # a standard model's widths are unchanged: values as wide as keys, output as wide as queries
    llama = get_spec("llama2-70b")
    assert (llama.v_dim, llama.out_dim, llama.attention_gather_widths()) == (llama.kv_dim, llama.q_dim, (8192,))


def test_block_flops_count_the_narrower_value_heads():
    s = get_spec("deepseek-v3")
    T = s.seq_len
    block = s.layers()[1 + 5]  # a MoE block
    assert block.flops_fwd == T * (2 * s.gemm_weights(5) + 2 * T * (s.q_dim + s.out_dim))
    assert 2 * T * (s.q_dim + s.out_dim) < 4 * T * s.q_dim  # values 128 wide, not 192


def test_the_v2_lite_config_json_is_the_preset():
    spec = from_hf_config(CONFIGS / "deepseek-v2-lite.json")
    preset = get_spec("deepseek-v2-lite")
    assert dataclasses.replace(spec, name=preset.name, from_config=False) == preset
    assert spec.q_lora_rank == 0 and [g.name for g in spec.attention_gemms()] == ["q", "kv_down", "kv_up"]


def _v3_config(tmp_path, **changes) -> Path:
    """DeepSeek-V3's config.json fields (deepseek-ai/DeepSeek-V3), written here in transformers'
    field names; ``changes`` override them."""
    cfg = json.loads((CONFIGS / "deepseek-v2-lite.json").read_text())
    cfg.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=7168,
               num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432,
               moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
               first_k_dense_replace=3, q_lora_rank=1536, vocab_size=129280, n_group=8, topk_group=4,
               topk_method="noaux_tc", routed_scaling_factor=2.5, scoring_func="sigmoid", norm_topk_prob=True,
               ep_size=1, num_nextn_predict_layers=1,
               quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [128, 128]})
    cfg.update(changes)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_kimi_k2_config_is_deepseek_v3s_architecture(tmp_path):
    """moonshotai/Kimi-K2-Base's config.json fields (model_type kimi_k2), written in transformers'
    names: the preset, read by the same reader as DeepSeek-V3's."""
    p = _v3_config(tmp_path, model_type="kimi_k2", num_attention_heads=64, num_key_value_heads=64,
                   n_routed_experts=384, first_k_dense_replace=1, vocab_size=163840, n_group=1, topk_group=1,
                   routed_scaling_factor=2.827, max_position_embeddings=131072, num_nextn_predict_layers=0)
    spec = from_hf_config(p)
    assert dataclasses.replace(spec, name="kimi-k2", from_config=False) == get_spec("kimi-k2")


def test_v3_config_is_the_preset_with_its_multi_token_prediction_module(tmp_path):
    spec = from_hf_config(_v3_config(tmp_path))
    assert spec.mtp_layers == 1  # num_nextn_predict_layers (tests/models/test_mtp.py prices it)
    assert dataclasses.replace(spec, name="deepseek-v3", from_config=False, mtp_layers=0) == get_spec("deepseek-v3")


@pytest.mark.parametrize("changes,needle", [
    ({"topk_method": "random"}, "topk_method=\"random\": routing 'random' is not modelled"),
    ({"n_group": 7}, "n_group=7, topk_group=4: the groups must split n_routed_experts=256"),
    ({"num_key_value_heads": 16}, "num_key_value_heads=16 must equal num_attention_heads=128"),
    ({"qk_rope_head_dim": None}, "lacks 'qk_rope_head_dim'"),
    ({"qk_rope_head_dim": 0}, "qk_rope_head_dim=0 must be an integer from 1"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "field 'quantization_config'=.* is not modelled"),
])
def test_bad_latent_attention_configs_name_the_field(tmp_path, changes, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        from_hf_config(_v3_config(tmp_path, num_nextn_predict_layers=0, **changes))


@pytest.mark.parametrize("inline,needle", [
    ("llama:layers=2,hidden=64,heads=4,seq=16,vocab=32,kv_lora_rank=16,rope_head_dim=16", "rope_head_dim=16 must be"),
    ("llama:layers=2,hidden=64,heads=4,seq=16,vocab=32,kv_lora_rank=16,rope_head_dim=4,kv_heads=2",
     "kv_heads=2 must equal heads=4"),
    ("llama:layers=2,hidden=64,heads=4,seq=16,vocab=32,q_lora_rank=16", "need multi-head latent attention"),
    ("llama:layers=2,hidden=64,heads=4,seq=16,vocab=32,v_head_dim=8", "need multi-head latent attention"),
])
def test_inconsistent_latent_attention_specs_are_refused(inline, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_inline(inline)


def test_tensor_parallel_ranks_hold_the_down_projections_whole():
    s = get_spec("deepseek-v3")
    whole = 7168 * 1536 + 7168 * 576 + 1536 + 512  # down projections and latent norms
    assert s.attention_replicated_weights() == whole
    block, tp = 0, 8  # a dense block: no experts in the way
    split = s.block_params(block) - whole - 2 * 7168  # minus the replicated down projections and block norms
    assert shard_block_params(s, tp, block) == split // tp + whole + 2 * 7168
    assert rank_gemm_params(s, tp, block) == (block_gemm_params(s, block) - 7168 * (1536 + 576)) // tp \
        + 7168 * (1536 + 576)
    llama = get_spec("llama2-70b")
    assert rank_gemm_params(llama, 8) == -(-block_gemm_params(llama) // 8)


def test_ops_on_one_tensor_parallel_rank():
    s = get_spec("deepseek-v3")
    mb, tp, tok = 1, 8, 4096
    ops = {o.name: o for o in block_ops(s, mb, tp, sp=True, bpv=2, attention="flash", moe=False)}
    # the down projections on the rank's own sequence shard, whole; the up projections on every token,
    # for the rank's 16 heads
    assert (ops["q_down"].m, ops["q_down"].n, ops["q_down"].k) == (tok // tp, 1536, 7168)
    assert (ops["kv_down"].m, ops["kv_down"].n, ops["kv_down"].k) == (tok // tp, 576, 7168)
    assert (ops["q_up"].m, ops["q_up"].n, ops["q_up"].k) == (tok, 16 * 192, 1536)
    assert (ops["kv_up"].m, ops["kv_up"].n, ops["kv_up"].k) == (tok, 16 * 256, 512)
    assert (ops["proj"].n, ops["proj"].k) == (7168, 16 * 128)
    assert "qkv" not in ops and {"q_latent_norm", "kv_latent_norm", "qk_rope_concat"} <= set(ops)
    fa = ops["flash_attention"]
    assert (fa.k, fa.v_dim, fa.batch) == (192, 128, 16)
    assert fa.flops == 2 * tok * tok * (192 + 128) * 16 * 0.5  # causal: half the scores
    unfused = {o.name: o for o in block_ops(s, mb, tp, sp=True, bpv=2, attention="megatron", moe=False)}
    assert (unfused["scores"].k, unfused["attn_v"].n) == (192, 128)
    # fp8: every projection's gradient cast; the down projections cast their plain input, the up
    # projections' latents come transposed out of their fused norms
    casts = {o.name for o in fp8_cast_ops(s, tok, tp, 2)}
    assert {"fp8_q_down_input_cast_transpose", "fp8_q_up_input_transpose", "fp8_kv_up_grad_cast_transpose",
            "fp8_kv_down_input_cast_transpose"} <= casts and "fp8_qkv_grad_cast_transpose" not in casts


def test_tensor_parallel_collectives_exchange_the_latents_not_the_hidden_state():
    s = get_spec("deepseek-v3")
    widths = s.attention_gather_widths()
    assert widths == (1536, 512, 64)  # query latent, key/value latent, shared rotary key
    args = (7168, 4096, 1, 8)
    plain = tp_layer_collectives(*args, False, 2, attn_widths=widths)
    assert [k for _, k, _ in plain] == ["allreduce"] * 6  # 2 forward; the MLP's and 3 attention inputs' backward
    assert [n for ph, _, n in plain if ph == "bwd"] == [4096 * 7168 * 2, *(4096 * w * 2 for w in widths)]
    sp = tp_layer_collectives(*args, True, 2, attn_widths=widths)
    fwd_gathers = [n for ph, k, n in sp if ph == "fwd" and k == "allgather"]
    assert fwd_gathers[:3] == [4096 * w * 2 / 8 for w in widths]  # the attention's, then the MLP's
    # standard attention: what it was, one collective of the hidden state each way
    assert tp_layer_collectives(*args, True, 2) == tp_layer_collectives(*args, True, 2, attn_widths=(7168,))


def test_cost_paths_refuse_what_they_do_not_model():
    from perfsim.models.eager import check_eager
    from perfsim.models.transformer import arch_spec
    from perfsim.runtime.models import check_gpt

    tiny = parse_inline("llama:layers=2,hidden=64,heads=4,seq=16,vocab=32,head_dim=16,kv_lora_rank=16,rope_head_dim=4")
    with pytest.raises(ConfigError, match="kernels=eager: .* latent attention"):
        check_eager(tiny, "bf16")
    # a GPT-2-shaped block in every other respect: the runtime's modules would build another model
    gpt = arch_spec("gpt", "tiny-mla", n_layer=2, hidden=64, heads=4, seq_len=16, vocab=32, bias=False,
                    kv_lora_rank=16, rope_head_dim=4)
    with pytest.raises(ConfigError, match="GPT-2-style decoders only"):
        check_gpt(gpt)
    check_gpt(dataclasses.replace(gpt, kv_lora_rank=0, rope_head_dim=0))  # the same block without MLA builds


def test_predict_memory_and_megatron_flags_end_to_end(tmp_path):
    common = ("--model", "deepseek-v2-lite", "--gpu", "h100", "--precision", "bf16", "--tp", "2", "--ep", "2",
              "--dp", "2", "--pp", "2", "--micro-batch", "1", "--global-batch", "8", "--sequence-parallel",
              "--gpus-per-node", "8")
    r = run_cli_here("predict", *common, "--format", "json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    assert summary["iteration_s"] > 0
    assert "multi-head latent attention (key/value latent 512, heads 192/128 wide)" in summary["model_note"]
    assert "no MLA step was timed" in summary["model_note"]
    r = run_cli_here("memory", *common)
    assert r.returncode == 0 and "peak" in r.stdout, r.stderr
    from perfsim.emit import architecture_args

    args, _ = architecture_args(get_spec("deepseek-v3"))
    text = " ".join(args)
    assert ("--multi-latent-attention --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 "
            "--v-head-dim 128 --qk-layernorm --q-lora-rank 1536") in text and "--kv-channels" not in text
