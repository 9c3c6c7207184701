"""Multi-token prediction modules (DeepSeek-V3, arXiv:2412.19437, Sec. 2.2; Megatron-Core's
``--mtp-num-layers``): parameters, layers, operators, tensor-parallel collectives, the last
pipeline stage, memory, the embedding copy and its gradient sync, config.json, the Megatron-LM
flag and refusals. Sizes are checked by hand from the module's shapes; no MTP step was timed."""

import dataclasses

import pytest

import perfsim
from perfsim.engine.compute import transformer_times
from perfsim.errors import ConfigError
from perfsim.hardware import curve_for, get_gpu
from perfsim.models.ops import head_ops, mtp_ops
from perfsim.models.registry import get_spec
from perfsim.models.specs import block_index, is_block
from perfsim.models.tensor_parallel import shard_block_params, tp_edge_collectives, tp_mtp_collectives
from perfsim.models.transformer import parse_inline
from perfsim.partition import partition_with_tail
from tests._helpers import run_cli_here

V2_LITE_PP2 = dict(model="deepseek-v2-lite", gpu="h100", gpus_per_node=8, precision="bf16", tp=2, pp=2, dp=1,
                   micro_batch=1, global_batch=8, seq_len=2048, bandwidth="400Gbps")


def test_a_module_is_its_block_projection_and_norms():
    """DeepSeek-V3's module (the checkpoint's ``model.layers.61``): block 61 is a MoE block like
    block 60, plus ``eh_proj`` (2 x 7168 -> 7168, no bias) and three RMSNorms (enorm, hnorm,
    shared_head.norm); the embedding and the LM head are the main model's."""
    v3 = get_spec("deepseek-v3")
    mtp = dataclasses.replace(v3, mtp_layers=1)
    d = v3.hidden
    assert mtp.is_mtp_block(61) and not mtp.is_mtp_block(60) and mtp.is_moe_block(61)
    assert mtp.block_params(61) == v3.block_params(60) + 2 * d * d + 3 * d
    assert mtp.params == v3.params + mtp.block_params(61)
    assert mtp.gemm_weights(61) == v3.gemm_weights(60) + 2 * d * d
    names = [layer.name for layer in mtp.layers()]
    assert names[-3:] == ["block60", "mtp61", "head"] and len(names) == 64
    layer = mtp.layers()[-2]
    head = mtp.layers()[-1]
    body = dataclasses.replace(v3, mtp_layers=0).layers()[-2]  # block 60
    assert layer.flops_fwd == pytest.approx(body.flops_fwd + 2 * v3.seq_len * 2 * d * d + head.flops_fwd)


def test_block_names_and_inline_specs():
    assert [block_index(n) for n in ("block3", "mtp61", "embed", "head", "blockx")] == [3, 61, None, None, None]
    assert is_block("mtp2") and is_block("block0") and not is_block("head") and not is_block("mtp")
    spec = parse_inline("llama:layers=2,hidden=64,heads=4,seq=16,vocab=32,mtp=2")
    assert [layer.name for layer in spec.layers()] == ["embed", "block0", "block1", "mtp2", "mtp3", "head"]
    for bad, needle in (("mtp=-1", "mtp_layers=-1: must be an integer >= 0"), ("mtp=x", "must be an integer")):
        with pytest.raises(ConfigError, match=needle):
            parse_inline(f"llama:layers=2,hidden=64,heads=4,seq=16,vocab=32,{bad}")
    with pytest.raises(ConfigError, match="needs an LM head"):
        dataclasses.replace(get_spec("bert-large"), mtp_layers=1)


def test_module_operators_and_its_tensor_parallel_share():
    """Its own operators: the embedding rows of the tokens k ahead, two norms, the 2h-wide
    concatenation, the projection split over TP, and one more pass through the head."""
    spec = dataclasses.replace(get_spec("deepseek-v2-lite"), mtp_layers=1)
    tok, h, tp = 2 * spec.seq_len, spec.hidden, 2
    ops = {op.name: op for op in mtp_ops(spec, 2, tp, False, 2)}
    assert (ops["mtp_eh_proj"].m, ops["mtp_eh_proj"].n, ops["mtp_eh_proj"].k) == (tok, h // tp, 2 * h)
    assert ops["mtp_concat"].bytes == 4 * 2 * tok * h and ops["mtp_enorm"].bytes == 2 * 2 * tok * h
    assert {op.name for op in head_ops(spec, 2, tp, False, 2)} <= set(ops)
    assert ops["embed_grad_zero"].bwd_bytes > 0  # the embedding's second use has a gradient of its own
    i = spec.n_layer
    assert (shard_block_params(spec, tp, i) - shard_block_params(spec, tp, i - 1)
            == 2 * h * h // tp + 3 * h)  # projection split, norms whole
    # its collectives: the projection's, then the embedding's and the head's as those edges add them
    edges = tp_edge_collectives(h, spec.seq_len, 2, tp, False, 2, True, True, vocab_parallel=True,
                                learned_positions=False)
    full = 2 * spec.seq_len * h * 2
    assert tp_mtp_collectives(h, spec.seq_len, 2, tp, False, 2, vocab_parallel=True, learned_positions=False) == (
        ("fwd", "allgather", full / tp), ("bwd", "allreduce", 2 * full)) + edges
    assert tp_mtp_collectives(h, spec.seq_len, 2, 1, False, 2) == ()


def test_compute_prices_the_module_as_its_block_plus_its_own_operators():
    spec = dataclasses.replace(get_spec("deepseek-v2-lite"), mtp_layers=2)
    plain = dataclasses.replace(spec, mtp_layers=0)
    gpu = get_gpu("h100")
    curve = curve_for(gpu, None)[0]
    fwd, bwd = transformer_times(spec, gpu, "bf16", 1, 1, False, "none", curve)
    f0, b0 = transformer_times(plain, gpu, "bf16", 1, 1, False, "none", curve)
    assert len(fwd) == len(spec.layers()) == len(f0) + 2
    assert fwd[:-3] == f0[:-1] and fwd[-1] == f0[-1]  # every other layer as before
    assert fwd[-3] == fwd[-2] > f0[-2] + f0[-1]  # more than a block and a head pass: the projection too
    assert bwd[-3] > b0[-2]


def test_the_last_stage_holds_the_modules_and_the_embedding_copy():
    """Megatron-Core builds the modules, and an embedding for them, on the post-process stage:
    the uniform split gives the other stages the main blocks alone; a balanced split keeps the
    modules with the head; the copy's gradient is all-reduced with the first stage's."""
    base = perfsim.predict(**V2_LITE_PP2)
    mtp = perfsim.predict(**V2_LITE_PP2, mtp_layers=1)
    assert [st["layers"] for st in base.stages] == ["0-14", "15-28"]
    assert [st["layers"] for st in mtp.stages] == ["0-14", "15-29"]  # blocks 14-26, mtp27, head
    first, last = mtp.stages
    spec = get_spec("deepseek-v2-lite")
    copy = -(-spec.vocab * spec.hidden // 2)
    assert first["params"] == base.stages[0]["params"]
    assert last["params"] > base.stages[1]["params"] + copy
    assert last["fwd_s_per_mb"] > base.stages[1]["fwd_s_per_mb"]
    assert mtp.summary["iteration_s"] > base.summary["iteration_s"]
    assert last["weights_gib"] > base.stages[1]["weights_gib"]
    assert last["activations_gib"] > base.stages[1]["activations_gib"]
    balanced = perfsim.predict(**dict(V2_LITE_PP2, pp=4, partition="balanced"), mtp_layers=2)
    assert balanced.stages[-1]["layers"].endswith("-30")  # 27 blocks, 2 modules, embed, head: 31 layers
    start = int(balanced.stages[-1]["layers"].split("-")[0])
    assert start <= 28  # mtp28, mtp29 and the head together
    with pytest.raises(ConfigError, match="partition 29,1: the last stage holds the multi-token prediction"):
        perfsim.predict(**dict(V2_LITE_PP2, partition="29,1"), mtp_layers=1)
    last = perfsim.predict(**dict(V2_LITE_PP2, partition="28,2", allow_oom=True), mtp_layers=1).stages[-1]
    assert last["layers"] == "28-29"


def test_partition_with_tail_merges_the_last_layers():
    costs = [1.0] * 6 + [5.0, 1.0]
    assert partition_with_tail(costs, 2, None, 2) == [(0, 6), (6, 8)]
    assert partition_with_tail(costs, 3, None, 1) == partition_with_tail(costs, 3, None, 0)
    bounds = partition_with_tail([1.0] * 10, 4, None, 3)
    assert bounds[-1][1] == 10 and bounds[-1][0] <= 7


def test_config_json_megatron_flag_and_refusals(tmp_path):
    from perfsim.emit import architecture_args

    args, _ = architecture_args(dataclasses.replace(get_spec("deepseek-v3"), mtp_layers=1))
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    assert "--mtp-num-layers" not in architecture_args(get_spec("deepseek-v3"))[0]
    with pytest.raises(ConfigError, match="mtp_layers=1: model 'digits-mlp' is not a decoder transformer"):
        perfsim.predict(model="digits-mlp", mtp_layers=1)
    with pytest.raises(ConfigError, match="kernels=eager: .* multi-token prediction"):
        perfsim.predict(model="llama:layers=2,hidden=64,heads=4,seq=16,vocab=32,mtp=1", gpu="h100",
                        gpus_per_node=1, pp=1, kernels="eager")
    r = run_cli_here("predict", "--model", "deepseek-v2-lite", "--gpu", "h100", "--mtp-layers", "-1")
    assert r.returncode == 2 and "mtp" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # the model's own count is kept when the flag is left out, and 0 turns it off
    spec = perfsim.predict(**V2_LITE_PP2, mtp_layers=0)
    assert spec.summary["iteration_s"] == perfsim.predict(**V2_LITE_PP2).summary["iteration_s"]
