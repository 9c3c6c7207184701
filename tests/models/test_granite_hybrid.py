"""IBM Granite 4.0-H from config.json (``granitemoehybrid``; transformers' ``modeling_granitemoehybrid.py``):
Mamba-2 blocks (Dao and Gu, arXiv:2405.21060) between attention blocks, a shared SwiGLU MLP in every
block beside optional experts. Sizes are checked against the parameters transformers 5.24.0 builds for
the same configs on the meta device (counted once, 2026-11-30): the MoE config 523,281,472, the dense
one (two groups, projection and attention biases) 195,909,376. The chunked scan's cost is checked
against its algorithm; no Mamba kernel was timed."""

import dataclasses
import json

import pytest

import perfsim
from perfsim.engine.compute import ops_fwd_bwd
from perfsim.errors import ConfigError
from perfsim.hardware import curve_for, get_gpu
from perfsim.memory import layer_activation_bytes
from perfsim.models.hf_config import from_hf_config
from perfsim.models.mamba2 import Mamba2
from perfsim.models.ops import block_ops
from perfsim.models.tensor_parallel import check_tp, shard_block_params

from _helpers import transformers_param_count

TYPES = ["mamba"] * 3 + ["attention"] + ["mamba"] * 3 + ["attention"]
MOE = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, vocab_size=49160,
           intermediate_size=512, shared_intermediate_size=1024, num_local_experts=32, num_experts_per_tok=4,
           mamba_n_heads=32, mamba_d_state=128, mamba_n_groups=1, layer_types=TYPES, tie_word_embeddings=True,
           position_embedding_type="nope", embedding_multiplier=12.0, residual_multiplier=0.22,
           attention_multiplier=0.0078125, logits_scaling=4.0)
DENSE = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, vocab_size=49160,
             shared_intermediate_size=2048, num_local_experts=0, mamba_n_heads=32, mamba_d_state=64, mamba_n_groups=2,
             mamba_d_head=64, layer_types=TYPES, mamba_proj_bias=True, attention_bias=True)


def _config(tmp_path, fields, **changes):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "granitemoehybrid", **fields, **changes}))
    return p


@pytest.mark.parametrize("fields, params", [(MOE, 523_281_472), (DENSE, 195_909_376)])
def test_sizes_are_transformers(tmp_path, fields, params):
    spec = from_hf_config(_config(tmp_path, fields))
    assert spec.params == params and spec.linear_attention_layers == (0, 1, 2, 4, 5, 6)
    assert isinstance(spec.linear_mixer, Mamba2) and spec.linear_mixer.inner == 2 * 1024
    # transformers 5.x's names of the same kinds
    renamed = ["linear_attention" if t == "mamba" else "full_attention" for t in TYPES]
    assert from_hf_config(_config(tmp_path, fields, layer_types=renamed)).params == params


def test_moe_and_dense_blocks(tmp_path):
    moe, dense = from_hf_config(_config(tmp_path, MOE)), from_hf_config(_config(tmp_path, DENSE))
    assert (moe.experts, moe.top_k, moe.expert_ffn, moe.shared_ffn, moe.shared_gate) == (32, 4, 512, 1024, False)
    assert not dense.moe and dense.ffn == 2048 and dense.linear_mixer.groups == 2 and dense.linear_mixer.proj_bias


@pytest.mark.parametrize("changes, needle", [
    (dict(layer_types=["mamba"] * 7), "layer_types="),
    (dict(layer_types=["sliding_attention"] * 8), "layer_types="),
    (dict(mamba_d_head=48), "mamba_d_head=48"),
    (dict(mamba_n_groups=3), "mamba_n_groups=3 must divide mamba_n_heads=32"),
    (dict(position_embedding_type="alibi"), "position_embedding_type="),
    (dict(mamba_rmsnorm=True), "'mamba_rmsnorm'"),
])
def test_refusals(tmp_path, changes, needle):
    with pytest.raises(ConfigError, match=needle):
        from_hf_config(_config(tmp_path, MOE, **changes))


def test_the_ops_count_the_scans_flops_and_tp_splits_heads_and_groups(tmp_path):
    spec = from_hf_config(_config(tmp_path, DENSE))
    net, s = spec.linear_mixer, spec.seq_len
    ops = {o.name: o for o in block_ops(spec, 1, 1, False, 2, "flash", block=0)}
    core = sum(o.flops for name, o in ops.items() if name in ("mamba_chunk_state", "mamba_bmm", "mamba_chunk_scan"))
    assert core == net.core_flops(s)
    assert ops["mamba_in_proj"].flops + ops["mamba_out_proj"].flops == 2 * s * net.gemm_weights(spec.hidden)
    layer = next(layer for layer in spec.layers() if layer.name == "block0")
    assert layer.flops_fwd == 2 * s * spec.gemm_weights(0) + net.core_flops(s)
    check_tp(spec, 2)
    with pytest.raises(ConfigError, match="Mamba-2 groups=2"):
        check_tp(spec, 4)
    whole = 2 * spec.norm_params() + spec.hidden  # the block's norms and out_proj's bias stay whole
    assert shard_block_params(spec, 2, 0) - whole == (spec.block_params(0) - whole) // 2
    gpu = get_gpu("h100")
    curve = curve_for(gpu)
    curve = curve[0] if isinstance(curve, tuple) else curve
    f, b = ops_fwd_bwd([ops["mamba_chunk_state"]], "none", gpu, "bf16", curve)
    assert b == pytest.approx(3 * f)  # the backward recomputes the chunk states
    f, b = ops_fwd_bwd([ops["mamba_chunk_scan"]], "none", gpu, "bf16", curve)
    assert b == pytest.approx(2 * f)


def test_memory_and_predict(tmp_path):
    spec = from_hf_config(_config(tmp_path, MOE))
    long = spec.with_seq_len(4 * spec.seq_len)

    def act(s, block):
        return layer_activation_bytes(s, 1, 1, False, "none", 2, "megatron", block=block)

    assert act(long, 0) == pytest.approx(4 * act(spec, 0)) and act(long, 3) > 8 * act(spec, 3)
    kw = dict(gpu="h100", gpus_per_node=8, tp=1, pp=1, dp=1, ep=1, micro_batch=1, global_batch=4,
              precision="bf16", recompute="full", attention="flash", allow_oom=True)
    summary = perfsim.predict(model=str(_config(tmp_path, MOE)), **kw).summary
    assert "Mamba-2 in 6 of 8 blocks (32 heads of 64, state 128" in summary["model_note"]
    attention = perfsim.predict(model=str(_config(tmp_path, MOE, layer_types=["attention"] * 8)), **kw).summary
    assert summary["iteration_s"] != attention["iteration_s"]
    from perfsim.emit import architecture_args

    args, notes = architecture_args(spec)
    assert "--experimental-attention-variant" not in args and any("pretrain_mamba.py" in n for n in notes)
    # Mamba-2 blocks take context parallelism (tests/models/test_nemotron_h.py); windows beside them do not
    assert dataclasses.replace(spec, context_shards=2).context_shards == 2
    with pytest.raises(ConfigError, match=r"linear-attention blocks \(Mamba2, linear_attention_layers\) with a sliding"):
        dataclasses.replace(spec, sliding_window=256)


def test_sizes_match_transformers_meta_device(tmp_path):
    """Where transformers >= 5 is installed: the whole model it builds (4.x names the blocks otherwise)."""
    assert from_hf_config(_config(tmp_path, MOE)).params == transformers_param_count("granitemoehybrid", MOE, 5)
