"""Mixture of experts: FLOPs, operators, capacity factor, memory and predictions."""

from dataclasses import replace
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.hardware import get_gpu
from perfsim.memory import GIB, layer_activation_bytes
from perfsim.models.hf_config import from_hf_config
from perfsim.models.moe import expert_rows, moe_ops
from perfsim.models.tensor_parallel import shard_block_params, tp_layer_collectives
from perfsim.models.transformer import parse_inline

CONFIGS = Path(__file__).parent / "data" / "configs"
MIXTRAL = str(CONFIGS / "mixtral-8x7b.json")
H100 = "h100-sxm5-80gb"


def test_block_flops_count_the_active_experts_and_the_router():
    s = from_hf_config(MIXTRAL, seq_len=1024)
    T = 1024
    layers = s.layers()
    norms = s.norms_per_block * s.norm_params()
    # the GEMM weights a token meets = its active parameters less the norms (no biases)
    assert s.gemm_weights(0) == s.active_block_params(0) - norms
    assert layers[1].flops_fwd == T * (2 * s.gemm_weights(0) + 4 * T * s.q_dim)
    # a dense model of the same attention and an MLP as wide as two experts costs the
    # same but for the router's 2 x hidden x experts per token
    dense = replace(s, experts=0, top_k=0, expert_ffn=0, ffn=2 * 14336)
    assert layers[1].flops_fwd - dense.layers()[1].flops_fwd == T * 2 * 4096 * 8


def test_moe_ops_flops_and_capacity_factor():
    s = from_hf_config(MIXTRAL, seq_len=1024)
    tok = 1024
    ops = moe_ops(s, tok, 1, 2)
    gemm = {op.name: op for op in ops if op.m}
    assert gemm["router"].flops == 2 * tok * 4096 * 8
    expert = gemm["expert_up"].flops + gemm["expert_down"].flops
    assert expert == 2 * tok * 2 * 3 * 4096 * 14336  # top-2, three matrices, dropless
    padded = {op.name: op for op in moe_ops(s, tok, 1, 2, capacity_factor=1.25) if op.m}
    assert padded["expert_up"].flops / gemm["expert_up"].flops == pytest.approx(1.25)
    assert expert_rows(s, tok, None) == 256 and expert_rows(s, tok, 1.25) == 320
    # tensor parallelism splits every expert's FFN
    tp8 = {op.name: op for op in moe_ops(s, tok, 8, 2) if op.m}
    assert tp8["expert_up"].flops * 8 == gemm["expert_up"].flops


def test_moe_block_time_prices_experts_router_and_permutation():
    from perfsim.engine import compute

    s = from_hf_config(MIXTRAL, seq_len=4096)
    gpu = get_gpu(H100)
    curve = compute.curve_for(gpu)[0]
    moe_f, moe_b = compute.transformer_times(s, gpu, "bf16", 1, 8, False, "none", curve)
    dense = replace(s, experts=0, top_k=0, expert_ffn=0, ffn=2 * 14336)
    den_f, _ = compute.transformer_times(dense, gpu, "bf16", 1, 8, False, "none", curve)
    assert den_f[1] < moe_f[1] < 1.5 * den_f[1]  # same FLOPs + routing, permutation, smaller GEMMs
    cf_f, _ = compute.transformer_times(s, gpu, "bf16", 1, 8, False, "none", curve, capacity_factor=2.0)
    assert cf_f[1] > moe_f[1]
    # DeepSeekMoE: the first block keeps its dense MLP and is priced as one
    ds = from_hf_config(CONFIGS / "deepseek-moe-16b.json")
    f, _ = compute.transformer_times(ds, gpu, "bf16", 1, 1, False, "none", curve)
    assert f[1] != f[2] and f[2] == f[3]


def test_tp_shards_every_expert_and_keeps_the_router():
    s = from_hf_config(MIXTRAL)
    per = shard_block_params(s, 8, 0)
    router, norms = 4096 * 8, 2 * 4096
    assert (per - router - norms) * 8 == s.block_params(0) - router - norms


def test_parallel_block_has_one_forward_reduction():
    both = tp_layer_collectives(4544, 2048, 1, 2, False, 2)
    one = tp_layer_collectives(4544, 2048, 1, 2, False, 2, parallel_block=True)
    assert [ph for ph, _, _ in both] == ["fwd", "fwd", "bwd", "bwd"]
    assert [ph for ph, _, _ in one] == ["fwd", "bwd", "bwd"]


def test_expert_activations_in_the_memory_model():
    s = from_hf_config(MIXTRAL, seq_len=1024)
    dense = replace(s, experts=0, top_k=0, expert_ffn=0)
    moe = layer_activation_bytes(s, 1, 1, False, "none", 2)
    one = layer_activation_bytes(dense, 1, 1, False, "none", 2)
    # top-2: two copies of each token's expert activations (3 x 14336 values) and hidden state
    extra = 2 * (1024 * 14336 * 3 + 2 * 1024 * 4096 + 2 * 1024 * 8)
    assert moe - one == pytest.approx(extra)
    assert layer_activation_bytes(s, 1, 1, False, "none", 2, capacity_factor=1.5) > moe


def test_predict_prices_mixtral_as_a_mixture():
    from perfsim.api import predict

    r = predict(model=MIXTRAL, gpu=H100, tp=8, pp=4, gpus_per_node=8, precision="bf16",
                nic="8x400Gbps:infiniband", micro_batch=1, global_batch=32)
    s = r.summary
    assert s["params"] == 46_702_792_704 and s["active_params"] == 12_879_925_248
    assert "12.88 B active" in s["model_note"] and "dropless" in s["model_note"]
    assert "sequence 4096 tokens" in s["model_note"]
    # every expert's weights are in memory: bf16 weights of a quarter of the blocks, split 8 ways
    stage = r.stages[1]
    spec = from_hf_config(MIXTRAL)
    assert stage["weights_gib"] * GIB == pytest.approx(2 * 8 * shard_block_params(spec, 8, 8), rel=1e-9)
    cf = predict(model=MIXTRAL, gpu=H100, tp=8, pp=4, gpus_per_node=8, precision="bf16",
                 nic="8x400Gbps:infiniband", micro_batch=1, global_batch=32, moe_capacity_factor=1.25)
    assert cf.summary["iteration_s"] > s["iteration_s"]
    assert "capacity factor 1.25" in cf.summary["model_note"]


def test_capacity_factor_needs_experts_and_a_positive_value():
    from perfsim.api import predict

    with pytest.raises(ConfigError, match="has no experts"):
        predict(model="llama2-7b", gpu=H100, pp=1, precision="bf16", moe_capacity_factor=1.25)
    with pytest.raises(ConfigError, match="moe_capacity_factor"):
        predict(model=MIXTRAL, gpu=H100, pp=1, precision="bf16", moe_capacity_factor=0)


def test_inline_moe_spec():
    s = parse_inline("llama:layers=2,hidden=64,heads=8,seq=16,vocab=100,ffn=96,experts=4,top_k=2")
    assert s.moe and s.expert_ffn == 96
    mlp = 3 * 64 * 96
    assert s.params - s.active_params == 2 * 2 * mlp  # 2 blocks x 2 idle experts
    with pytest.raises(ConfigError, match="top_k=5"):
        parse_inline("llama:layers=2,hidden=64,heads=8,seq=16,vocab=100,experts=4,top_k=5")
