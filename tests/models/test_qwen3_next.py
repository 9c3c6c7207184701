"""Qwen3-Next from config.json (Qwen Team 2025; transformers' ``modeling_qwen3_next.py``): Gated DeltaNet
blocks (Yang et al., arXiv:2412.06464) between gated-attention blocks, 512 experts with a gated shared
expert. The config is written here in transformers' field names (Qwen/Qwen3-Next-80B-A3B's shape, the
``Qwen3NextConfig`` defaults). Sizes are checked against the parameters transformers 4.57.1 builds for
the same config on the meta device (``Qwen3NextForCausalLM``, counted once, 2026-11-30): a Gated
DeltaNet block 1,648,531,648, a gated-attention block 1,642,076,672, four blocks with the embedding
and head 7,210,003,520. The chunked delta rule's cost mechanisms are checked against its algorithm;
no Gated DeltaNet kernel was timed. Qwen3.5's language models (the same blocks) against transformers
5.24.0's ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` on the meta device (counted once, 2026-11-30)."""

import dataclasses
import json

import pytest

import perfsim
from perfsim.engine.compute import op_time, ops_fwd_bwd
from perfsim.errors import ConfigError
from perfsim.hardware import curve_for, get_gpu
from perfsim.memory import layer_activation_bytes
from perfsim.models.delta_net import GatedDeltaNet
from perfsim.models.hf_config import from_hf_config
from perfsim.models.ops import block_ops
from perfsim.models.registry import get_spec
from perfsim.models.tensor_parallel import check_tp, shard_block_params
from perfsim.models.transformer import parse_inline

from _helpers import load_script, transformers_param_count

QWEN3_NEXT = dict(
    architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", attention_bias=False, attention_dropout=0.0,
    bos_token_id=151643, eos_token_id=151645, decoder_sparse_step=1, full_attention_interval=4, head_dim=256,
    hidden_act="silu", hidden_size=2048, initializer_range=0.02, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_value_head_dim=128, max_position_embeddings=262144,
    mlp_only_layers=[], moe_intermediate_size=512, norm_topk_prob=True, num_attention_heads=16, num_experts=512,
    num_experts_per_tok=10, num_hidden_layers=48, num_key_value_heads=2, output_router_logits=False,
    partial_rotary_factor=0.25, rms_norm_eps=1e-6, rope_scaling=None, rope_theta=10000000,
    router_aux_loss_coef=0.001, shared_expert_intermediate_size=512, tie_word_embeddings=False,
    torch_dtype="bfloat16", use_cache=True, vocab_size=151936)


def _config(tmp_path, **changes):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**QWEN3_NEXT, **changes}))
    return p


def _curve(gpu):
    curve = curve_for(gpu)
    return curve[0] if isinstance(curve, tuple) else curve


def test_sizes_are_transformers(tmp_path):
    spec = from_hf_config(_config(tmp_path))
    assert spec.linear_attention_layers == tuple(i for i in range(48) if i % 4 != 3)
    assert spec.linear_mixer == GatedDeltaNet(key_heads=16, value_heads=32, key_dim=128, value_dim=128, conv_kernel=4)
    assert spec.attention_output_gate and spec.qk_norm and spec.shared_gate and spec.mtp_layers == 0
    assert (spec.block_params(0), spec.block_params(3)) == (1_648_531_648, 1_642_076_672)
    assert from_hf_config(_config(tmp_path, num_hidden_layers=4)).params == 7_210_003_520
    assert spec.params == pytest.approx(80e9, rel=0.005)  # the release's "80B parameters in total"


def test_the_preset_is_the_config_with_its_mtp_module(tmp_path):
    spec = from_hf_config(_config(tmp_path, mtp_num_hidden_layers=1))
    assert dataclasses.replace(spec, name="qwen3-next-80b-a3b", from_config=False) == get_spec("qwen3-next-80b-a3b")
    assert from_hf_config(_config(tmp_path, num_nextn_predict_layers=1)).mtp_layers == 1  # vLLM's name for it
    # the MTP module's block is gated attention (block 48 is not a Gated DeltaNet block)
    assert not spec.is_linear_block(48) and spec.block_params(48) > spec.block_params(47)


@pytest.mark.parametrize("changes, needle", [
    (dict(layer_types=["linear_attention"] * 47), "layer_types="),
    (dict(layer_types=["sliding_attention"] * 48), "layer_types="),
    (dict(linear_num_key_heads=12), "linear_num_key_heads=12 must divide linear_num_value_heads=32"),
    (dict(attention_bias=True), "attention_bias=true"),
    (dict(mtp_use_dedicated_embeddings=True), "mtp_use_dedicated_embeddings=true"),
    (dict(mtp_num_hidden_layers=1, num_nextn_predict_layers=2), "differs from num_nextn_predict_layers=2"),
    (dict(linear_chunk_size=32), "'linear_chunk_size'"),
])
def test_refusals(tmp_path, changes, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        from_hf_config(_config(tmp_path, **changes))


def test_layer_types_and_interval(tmp_path):
    types = ["full_attention", "linear_attention"] * 24
    assert from_hf_config(_config(tmp_path, layer_types=types)).linear_attention_layers == tuple(range(1, 48, 2))
    assert from_hf_config(_config(tmp_path, full_attention_interval=2)).linear_attention_layers == tuple(range(0, 48, 2))
    dense = from_hf_config(_config(tmp_path, layer_types=["full_attention"] * 48))
    assert dense.linear_mixer is None and not dense.linear_attention_layers


def test_spec_rules():
    base = parse_inline("llama:layers=4,hidden=512,heads=8,seq=4096,vocab=1000")
    net = GatedDeltaNet(key_heads=4, value_heads=8, key_dim=64, value_dim=64)
    hybrid = dataclasses.replace(base, linear_attention_layers=(0, 1, 2), linear_mixer=net)
    with pytest.raises(ConfigError, match="go together"):
        dataclasses.replace(base, linear_attention_layers=(0,))
    with pytest.raises(ConfigError, match="linear_attention_layers: 4 is not a block"):
        dataclasses.replace(hybrid, linear_attention_layers=(4,))
    with pytest.raises(ConfigError, match="with a sliding window are not modelled"):
        dataclasses.replace(hybrid, sliding_window=256)
    with pytest.raises(ConfigError, match="key_heads=3 must divide value_heads=8"):
        GatedDeltaNet(key_heads=3, value_heads=8, key_dim=64, value_dim=64)
    with pytest.raises(ConfigError, match="Gated DeltaNet chunk=0: must be an integer >= 1"):
        GatedDeltaNet(key_heads=4, value_heads=8, key_dim=64, value_dim=64, chunk=0)
    from perfsim.models.mamba2 import Mamba2

    with pytest.raises(ConfigError, match="Mamba-2 head_dim=True: must be an integer >= 1"):
        Mamba2(heads=8, head_dim=True, state_dim=64)
    with pytest.raises(ConfigError, match="context parallelism are not modelled"):
        hybrid.context_shard(2)
    check_tp(hybrid, 4)
    with pytest.raises(ConfigError, match="Gated DeltaNet's key_heads=4"):
        check_tp(hybrid, 8)
    # one rank holds 1 / t of the mixer, the gated norm's weight whole (and the block's norms)
    whole = 2 * hybrid.norm_params() + net.replicated_params()
    assert shard_block_params(hybrid, 4, 0) - whole == (hybrid.block_params(0) - whole) // 4
    from perfsim.models.eager import check_eager

    with pytest.raises(ConfigError, match="kernels=eager"):
        check_eager(hybrid, "bf16")


def test_the_ops_count_the_rules_flops():
    """The chunk kernels' FLOPs are those of the algorithm (``GatedDeltaNet.core_flops``), the projections
    the mixer's weights, and the model's FLOPs per block the same two."""
    spec = get_spec("qwen3-next-80b-a3b")
    s, net = spec.seq_len, spec.linear_mixer
    ops = block_ops(spec, 1, 1, False, 2, "flash", moe=False, block=0)
    core = sum(o.flops for o in ops if o.name.startswith("delta_chunk"))
    proj = sum(o.flops for o in ops if o.name in ("delta_in_proj", "delta_gate_proj", "delta_out_proj"))
    assert core == net.core_flops(s) and proj == 2 * s * net.gemm_weights(spec.hidden)
    layer = next(layer for layer in spec.layers() if layer.name == "block0")
    assert layer.flops_fwd == 2 * s * spec.gemm_weights(0) + net.core_flops(s)
    assert "flash_attention" not in {o.name for o in ops}
    gated = {o.name: o for o in block_ops(spec, 1, 1, False, 2, "flash", moe=False, block=3)}
    assert gated["qkv"].n == 2 * spec.q_dim + 2 * spec.kv_dim  # the queries and their output gates
    assert {"attn_gate_sigmoid", "attn_gate_mul", "qk_norm"} <= set(gated)


def test_the_state_pass_is_sequential_and_recomputed():
    """The state pass runs one thread block per (sequence, value head, 64-wide value tile): at micro-batch 1
    its 64 blocks fill less than half of an H100's 132 SMs, and tensor parallelism, which splits the
    heads, does not shorten it; the projections do shrink. The backward recomputes the chunk kernels."""
    gpu = get_gpu("h100")
    curve = _curve(gpu)
    spec = get_spec("qwen3-next-80b-a3b")

    def times(tp):
        ops = {o.name: o for o in block_ops(spec, 1, tp, tp > 1, 2, "flash", moe=False, block=0)}
        return {k: op_time(ops[k], gpu, "bf16", curve, 2) for k in ("delta_chunk_state", "delta_in_proj")}, ops

    one, ops = times(1)
    four, _ = times(4)
    state = ops["delta_chunk_state"]
    assert state.ctas == 64 and gpu.sms == 132
    assert four["delta_chunk_state"] == pytest.approx(one["delta_chunk_state"], rel=0.05)
    assert four["delta_in_proj"] < one["delta_in_proj"] / 2.5
    no_sms = dataclasses.replace(gpu, sms=0)  # no SM count: priced as if the blocks filled the GPU
    assert op_time(state, no_sms, "bf16", curve, 2) < one["delta_chunk_state"] * 0.6
    fwd, bwd = ops_fwd_bwd([state], "none", gpu, "bf16", curve)
    assert bwd == pytest.approx(3 * fwd)  # two GEMMs per GEMM and the recomputed forward
    inter = ops["delta_chunk_inter"]  # the output kernel is not recomputed
    f, b = ops_fwd_bwd([inter], "none", gpu, "bf16", curve)
    assert b == pytest.approx(2 * f)


def test_memory_has_no_quadratic_term_in_a_delta_net_block():
    spec = get_spec("qwen3-next-80b-a3b")
    long = spec.with_seq_len(4 * spec.seq_len)

    def act(s, block):
        return layer_activation_bytes(s, 1, 1, False, "none", 2, "megatron", block=block)

    assert act(long, 0) == pytest.approx(4 * act(spec, 0))  # linear in the sequence
    assert act(long, 3) > 8 * act(spec, 3)  # the attention block's stored scores: quadratic
    assert act(spec, 0) != act(spec, 3)


def test_predict_and_emit(tmp_path):
    kw = dict(gpu="h100", gpus_per_node=8, tp=2, pp=1, dp=1, ep=1, micro_batch=1, global_batch=4, precision="bf16",
              recompute="full", attention="flash", sequence_parallel=True, allow_oom=True)
    hybrid = perfsim.predict(model=str(_config(tmp_path, num_hidden_layers=8)), **kw).summary
    assert "Gated DeltaNet in 6 of 8 blocks" in hybrid["model_note"]
    assert "gated attention" in hybrid["model_note"]
    attention = perfsim.predict(model=str(_config(tmp_path, num_hidden_layers=8, layer_types=["full_attention"] * 8)),
                                **kw).summary
    assert hybrid["iteration_s"] != attention["iteration_s"]
    with pytest.raises(ConfigError, match=r"linear-attention blocks \(GatedDeltaNet"):
        perfsim.predict(model=str(_config(tmp_path, num_hidden_layers=8)), seq_len=32768, cp=2, **kw)
    from perfsim.emit import architecture_args

    args, _ = architecture_args(get_spec("qwen3-next-80b-a3b"))
    assert args[args.index("--experimental-attention-variant") + 1] == "gated_delta_net"
    assert args[args.index("--linear-attention-freq") + 1] == "[" + ",".join(
        "0" if i % 4 == 3 else "1" for i in range(48)) + "]"
    assert args[args.index("--linear-num-value-heads") + 1] == "32" and "--attention-output-gate" in args


def test_sizes_match_transformers_meta_device(tmp_path):
    """Where transformers is installed: the whole model it builds."""
    fields = {k: v for k, v in QWEN3_NEXT.items() if k not in ("architectures", "model_type")}
    assert (from_hf_config(_config(tmp_path, num_hidden_layers=8)).params
            == transformers_param_count("qwen3_next", {**fields, "num_hidden_layers": 8}))


#: small Qwen3.5 text configs and the parameters transformers 5.24.0 builds for them (module docstring)
QWEN3_5 = {
    "qwen3_5_text": (dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                          intermediate_size=3072, vocab_size=248320, linear_num_value_heads=16,
                          linear_num_key_heads=16), 662_014_912),
    "qwen3_5_moe_text": (dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=2,
                              vocab_size=248320, num_experts=256, num_experts_per_tok=8), 7_745_818_752),
}


@pytest.mark.parametrize("mtype", sorted(QWEN3_5))
def test_qwen3_5_text_models_are_transformers(tmp_path, mtype):
    fields, params = QWEN3_5[mtype]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(model_type=mtype, **fields)))
    spec = from_hf_config(p)
    assert spec.params == params and spec.linear_attention_layers == (0, 1, 2, 4, 5, 6)
    assert spec.moe == (mtype == "qwen3_5_moe_text") and not spec.dense_layers
    # the multimodal wrapper, as save_pretrained writes it: its language model, the vision tower left out
    wrapper = dict(model_type=mtype.removesuffix("_text"), image_token_id=248056, video_token_id=248057,
                   vision_start_token_id=248053, vision_end_token_id=248054, tie_word_embeddings=False,
                   transformers_version="5.24.0", vision_config={"model_type": "qwen3_5", "depth": 27},
                   text_config=dict(model_type=mtype, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
                                    **fields))
    p.write_text(json.dumps(wrapper))
    read = from_hf_config(p)
    assert read.mtp_layers == 1 and "vision tower" in read.left_out
    assert read.params == params + read.block_params(8)  # and the MTP module (block, projection, norms)
    with pytest.raises(ConfigError, match="'decoder_sparse_step'"):  # Qwen3.5 has no such field
        p.write_text(json.dumps(dict(model_type=mtype, decoder_sparse_step=2, **fields)))
        from_hf_config(p)


def test_qwen3_5_presets():
    dense, moe = get_spec("qwen3.5-9b"), get_spec("qwen3.5-35b-a3b")
    assert dense.params == pytest.approx(9.2e9, rel=0.01) and not dense.moe  # "9B" with its MTP module
    assert moe.params == pytest.approx(35.5e9, rel=0.01) and moe.active_params == pytest.approx(3.5e9, rel=0.01)
    assert (moe.experts, moe.top_k, moe.vocab, dense.kv_heads) == (256, 8, 248320, 4)


def test_the_gpu_check_prices_the_rules_kernels(tmp_path, capsys):
    """scripts/gpu_delta_net.py's perfsim side (its GPU side times fla's kernels where a GPU is lent):
    one row a shape, the forward and forward + backward of the rule's own ops."""
    script = load_script("gpu_delta_net")
    assert script.main(["--model-only", "--csv", str(tmp_path / "rows.csv")]) == 0
    rows = (tmp_path / "rows.csv").read_text().splitlines()
    assert len(rows) == 1 + len(script.SHAPES) and rows[0].startswith("micro_batch,seq,value_heads,model_fwd_ms")
    fwd, total = script.modelled_ms("h100", 1, 4096, 32)
    assert 0 < fwd < total and f"{fwd:8.3f}" in capsys.readouterr().out


def test_a_ranks_parameters_are_its_blocks_own():
    """Each block's share of one tensor-parallel rank is its own kind's: a Gated DeltaNet block's differs from
    a gated-attention block's (a share cached by experts alone gave every block the first one's)."""
    from perfsim.api import _rank_params
    from perfsim.workload import get_model

    model = get_model("qwen3-next-80b-a3b")
    spec = model.arch
    shares = dict(zip((layer.name for layer in model.layers), _rank_params(model, 2, 4)))
    assert shares["block0"] == shard_block_params(spec, 2, 0, 4) != shares["block3"] == shard_block_params(spec, 2, 3, 4)


def test_the_planner_does_not_search_context_parallelism_it_cannot_price():
    """At 16,384 tokens the planner searches cp for attention models; for a Gated DeltaNet hybrid it says why
    it does not (every such candidate would be refused)."""
    res = perfsim.plan(model="qwen3.5-9b", seq_len=16384, gpu="h100", nodes=1, gpus_per_node=8, global_batch=16,
                       tp=[1, 2], pp=1, micro_batch=1, zero=1, recompute="full")
    assert any("context parallelism not searched (not modelled with GatedDeltaNet blocks)" in n for n in res.notes)
    assert {c.params.get("cp", 1) for c in res.all_evaluated} == {1}
