"""NVIDIA Nemotron-H from config.json (``nemotron_h``; arXiv:2504.03624; transformers'
``modeling_nemotron_h.py``): every layer one pre-norm, one sub-block (a Mamba-2 mixer, attention, a
non-gated MLP or experts) and a residual add. Sizes are checked against the parameters transformers
5.24.0 builds for the same configs on the meta device (counted once, 2026-11-30): 118,702,464 (dense,
with biases), 119,635,072 (with experts), 118,664,480 (the legacy ``hybrid_override_pattern`` spelling).
Blocks of one sub-block are checked to be exactly the halves of a two-sub-block block."""

import dataclasses
import json

import pytest

import perfsim
from perfsim.errors import ConfigError
from perfsim.memory import layer_activation_bytes
from perfsim.models.hf_config import from_hf_config
from perfsim.models.mamba2 import Mamba2
from perfsim.models.ops import block_ops
from perfsim.models.tensor_parallel import shard_block_params, tp_layer_collectives
from perfsim.models.transformer import parse_inline

from _helpers import transformers_param_count

BASE = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128, vocab_size=32000,
            intermediate_size=3072)
DENSE = dict(BASE, mamba_num_heads=32, mamba_head_dim=64, ssm_state_size=128, n_groups=8, mlp_bias=True, use_bias=True,
             layers_block_type=["linear_attention", "mlp", "linear_attention", "mlp", "full_attention", "mlp",
                                "linear_attention", "mlp"])
MOE = dict(BASE, mamba_num_heads=16, mamba_head_dim=64, ssm_state_size=64, n_groups=4, n_routed_experts=16,
           num_experts_per_tok=4, moe_intermediate_size=512, moe_shared_expert_intermediate_size=1024, use_bias=True,
           layers_block_type=["linear_attention", "moe", "linear_attention", "moe", "full_attention", "mlp"])
LEGACY = dict(BASE, mamba_num_heads=32, mamba_head_dim=64, ssm_state_size=128, mamba_n_groups=8,
              hybrid_override_pattern="M-M-*-M-", num_hidden_layers=8)


def _config(tmp_path, fields, **changes):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "nemotron_h", **fields, **changes}))
    return p


@pytest.mark.parametrize("fields, params", [(DENSE, 118_702_464), (MOE, 119_635_072), (LEGACY, 118_664_480)])
def test_sizes_are_transformers(tmp_path, fields, params):
    spec = from_hf_config(_config(tmp_path, fields))
    assert spec.params == params and spec.norms_per_block == 1 and not spec.gated
    assert isinstance(spec.linear_mixer, Mamba2)


def test_layers_of_one_sub_block(tmp_path):
    spec = from_hf_config(_config(tmp_path, MOE))
    assert spec.mlp_free_layers == (0, 2, 4) and spec.mixer_free_layers == (1, 3, 5)
    assert spec.linear_attention_layers == (0, 2) and spec.dense_layers == (5,)
    assert [spec.is_moe_block(i) for i in range(6)] == [False, True, False, True, False, False]
    assert (spec.experts, spec.top_k, spec.expert_ffn, spec.shared_ffn, spec.shared_gate) == (16, 4, 512, 1024, False)
    names = {i: {o.name for o in block_ops(spec, 1, 1, False, 2, "flash", spec.is_moe_block(i), block=i)}
             for i in (0, 1, 4, 5)}
    assert "mamba_in_proj" in names[0] and not names[0] & {"mlp_up", "expert_up", "dropout_residual2"}
    assert "flash_attention" in names[4] and "mlp_up" not in names[4]
    assert "mlp_up" in names[5] and not names[5] & {"qkv", "flash_attention", "dropout_residual1", "mamba_in_proj"}
    assert any("expert" in n for n in names[1]) and "dropout_residual1" not in names[1]


def test_one_sub_block_each_is_half_of_a_whole_block():
    """An attention-only block and an MLP-only block together hold, keep and exchange exactly what one
    attention + MLP block of two norms does: parameters, activations, tensor-parallel collectives."""
    whole = parse_inline("llama:layers=2,hidden=1024,heads=8,seq=2048,vocab=1000,kv_heads=2")
    halves = dataclasses.replace(whole, norms_per_block=1, mlp_free_layers=(0,), mixer_free_layers=(1,))
    assert halves.block_params(0) + halves.block_params(1) == whole.block_params(0)
    for tp in (1, 2):
        assert shard_block_params(halves, tp, 0) + shard_block_params(halves, tp, 1) == shard_block_params(whole, tp, 0)
    for sp in (False, True):
        for recompute in ("none", "selective"):
            act = [layer_activation_bytes(s, 2, 2, sp, recompute, 2, "flash", block=0) for s in (halves, whole)]
            act[0] += layer_activation_bytes(halves, 2, 2, sp, recompute, 2, "flash", block=1)
            assert act[0] == pytest.approx(act[1])
        one = tp_layer_collectives(1024, 2048, 2, 2, sp, 2, mlp=False) + tp_layer_collectives(1024, 2048, 2, 2, sp, 2,
                                                                                               mixer=False)
        assert sorted(one) == sorted(tp_layer_collectives(1024, 2048, 2, 2, sp, 2))
    with pytest.raises(ConfigError, match="must make every block"):
        dataclasses.replace(halves, mixer_free_layers=())
    with pytest.raises(ConfigError, match="norms_per_block=1; got 2"):
        dataclasses.replace(halves, norms_per_block=2)
    with pytest.raises(ConfigError, match="block 0 in both"):
        dataclasses.replace(halves, mixer_free_layers=(0, 1))


@pytest.mark.parametrize("changes, needle", [
    (dict(num_nextn_predict_layers=1), "num_nextn_predict_layers=1"),
    (dict(moe_latent_size=256), "moe_latent_size=256"),
    (dict(sliding_window=1024), "sliding_window=1024"),
    (dict(mlp_bias=True), "mlp_bias=true"),
    (dict(num_hidden_layers=7), "num_hidden_layers=7 differs"),
    (dict(layers_block_type=["linear_attention", "sliding_attention"]), "layers_block_type="),
    (dict(n_groups=4, mamba_n_groups=4), "n_groups and mamba_n_groups both given"),
    (dict(mamba_rms_norm=True), "'mamba_rms_norm'"),
])
def test_refusals(tmp_path, changes, needle):
    with pytest.raises(ConfigError, match=needle):
        from_hf_config(_config(tmp_path, MOE, **changes))


def test_predict_with_tensor_and_pipeline_parallelism(tmp_path):
    kw = dict(gpu="h100", gpus_per_node=8, tp=2, pp=2, dp=1, micro_batch=1, global_batch=8, precision="bf16",
              attention="flash", sequence_parallel=True, allow_oom=True)
    result = perfsim.predict(model=str(_config(tmp_path, DENSE)), **kw).summary
    assert "4 a token mixer alone, 4 an MLP alone" in result["model_note"]
    assert "Mamba-2 in 3 of 8 blocks" in result["model_note"]
    with pytest.raises(ConfigError, match="Mamba-2 groups=4"):  # Megatron-Core splits the groups too
        perfsim.predict(model=str(_config(tmp_path, MOE)), **dict(kw, tp=8, pp=1))
    from perfsim.emit import architecture_args

    assert any("pretrain_mamba.py" in n for n in architecture_args(from_hf_config(_config(tmp_path, DENSE)))[1])


def test_sizes_match_transformers_meta_device(tmp_path):
    """Where transformers >= 5 is installed: the whole model it builds (4.x has no layers_block_type)."""
    assert from_hf_config(_config(tmp_path, MOE)).params == transformers_param_count("nemotron_h", MOE, 5)


def test_context_parallelism_shards_the_mamba_heads(tmp_path):
    """Megatron-Core's MambaContextParallel: a Mamba-2 block sends two all-to-alls each way (in_proj's output for
    the whole sequence of its share of the heads, and the scan's output back), an attention block its ring, an
    MLP-only block nothing; a mixer whose heads or groups do not split over tp x cp is refused."""
    from perfsim.config import Strategy
    from perfsim.engine.context_parallel import cp_collectives, mamba_cp_collectives

    spec = from_hf_config(_config(tmp_path, DENSE), seq_len=8192).context_shard(2)
    strategy = Strategy(tp=2, cp=2, micro_batch=1, precision="bf16", attention="flash")
    net = spec.linear_mixer
    pre = 4096 * (2 * net.inner + 2 * net.groups * net.state_dim + net.heads) // 2 * 2
    assert mamba_cp_collectives(spec, strategy) == [("fwd", "alltoall", float(pre), False),
                                                    ("fwd", "alltoall", float(4096 * net.inner // 2 * 2), False),
                                                    ("bwd", "alltoall", float(pre), False),
                                                    ("bwd", "alltoall", float(4096 * net.inner // 2 * 2), False)]
    assert cp_collectives(spec, strategy)[0][3]  # the attention block's ring runs beside its steps
    kw = dict(gpu="h100", gpus_per_node=8, nic="8x400Gbps:infiniband", tp=2, pp=1, micro_batch=1, global_batch=8,
              precision="bf16", attention="flash", sequence_parallel=True, recompute="full", seq_len=16384)
    one = perfsim.predict(model=str(_config(tmp_path, DENSE)), cp=1, dp=4, **kw).summary
    two = perfsim.predict(model=str(_config(tmp_path, DENSE)), cp=2, dp=2, **kw).summary
    assert two["tp_bytes"] > one["tp_bytes"] and two["peak_memory_gib"] < one["peak_memory_gib"]
    with pytest.raises(ConfigError, match="Mamba-2 groups=8 do not split over tp x cp = 16"):
        perfsim.predict(model=str(_config(tmp_path, DENSE)), cp=8, dp=1, **dict(kw, tp=2))
    granite = dict(model_type="granitemoehybrid", hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                   vocab_size=1000, num_local_experts=0, mamba_n_heads=32, mamba_n_groups=1)
    p = tmp_path / "granite.json"
    p.write_text(json.dumps(granite))
    with pytest.raises(ConfigError, match="Mamba-2 groups=1"):
        perfsim.predict(model=str(p), cp=2, dp=1, **dict(kw, tp=1, sequence_parallel=False))


def test_fp8_state_follows_each_blocks_gemms():
    """fp8's scaling state and weight copies count the GEMMs a block has: an attention-only and an MLP-only
    block together hold what one whole block of the same sizes does."""
    from perfsim.memory import fp8_bytes

    whole = parse_inline("llama:layers=2,hidden=1024,heads=8,seq=2048,vocab=1000,kv_heads=2")
    halves = dataclasses.replace(whole, norms_per_block=1, mlp_free_layers=(0,), mixer_free_layers=(1,))
    assert fp8_bytes(halves, [0, 1], 2) == fp8_bytes(whole, [0], 2)
