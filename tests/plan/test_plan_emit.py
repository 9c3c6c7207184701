"""``perfsim plan --emit megatron|torchrun|perfsim``: the winner as a command to launch;
parsed back with Megatron-LM's flag names, it is the plan (issue 33)."""

import argparse
import json
import os
import shlex
import subprocess
import sys

import pytest

from perfsim.emit import emit, megatron_args
from perfsim.errors import ConfigError

LLAMA3_8B = os.path.join(os.path.dirname(__file__), "..", "data", "llama-3-8b-config.json")
BASE = dict(model=LLAMA3_8B, seq_len=8192, gpu="h100", gpus_per_node=8, bandwidth="100Gbps",
            intra_node_fabric="nvlink4")


def _megatron_parser() -> argparse.ArgumentParser:
    """The flags of Megatron-LM's megatron/training/arguments.py that the plan emits."""
    ap = argparse.ArgumentParser(allow_abbrev=False)
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--num-layers-per-virtual-pipeline-stage", "--micro-batch-size", "--global-batch-size",
                 "--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--seq-length",
                 "--max-position-embeddings", "--padded-vocab-size", "--num-query-groups",
                 "--recompute-num-layers", "--kv-channels", "--num-experts", "--moe-router-topk",
                 "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--expert-model-parallel-size"):
        ap.add_argument(flag, type=int)
    ap.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"))
    ap.add_argument("--position-embedding-type", choices=("learned_absolute", "rope", "none"))
    ap.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall", "flex"))
    ap.add_argument("--moe-expert-capacity-factor", type=float)
    ap.add_argument("--moe-layer-freq")
    ap.add_argument("--fp8-format", choices=("e4m3", "hybrid"))
    ap.add_argument("--fp8-amax-history-len", type=int)
    ap.add_argument("--fp8-amax-compute-algo", choices=("most_recent", "max"))
    ap.add_argument("--recompute-granularity", choices=("full", "selective"))
    ap.add_argument("--recompute-method", choices=("uniform", "block"))
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--use-torch-fsdp2", "--bf16", "--fp16", "--use-flash-attn",
                 "--group-query-attention", "--untie-embeddings-and-output-weights", "--overlap-grad-reduce",
                 "--swiglu", "--disable-bias-linear", "--add-qkv-bias", "--moe-grouped-gemm",
                 "--moe-pad-expert-input-to-capacity", "--moe-shared-expert-gate"):
        ap.add_argument(flag, action="store_true")
    return ap


def _check_megatron(ns, p, global_batch):
    from perfsim.api import build_configs

    _, st, _, _ = build_configs(**p)
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (st.tp, st.pp)
    assert ns.micro_batch_size == st.micro_batch and ns.global_batch_size == global_batch
    assert ns.global_batch_size == st.dp * st.macro_batch
    assert ns.sequence_parallel == st.sequence_parallel
    assert (ns.recompute_granularity or "none") == st.recompute
    assert ns.use_distributed_optimizer == (st.zero in (1, 2)) and ns.use_torch_fsdp2 == (st.zero == 3)
    assert ns.bf16 == (st.precision in ("bf16", "fp8")) and ns.fp16 == (st.precision == "fp16")
    assert (ns.fp8_format == "hybrid") == (st.precision == "fp8")
    assert ns.use_flash_attn == (st.attention == "flash")
    if st.schedule == "interleaved-1f1b":
        assert ns.num_layers_per_virtual_pipeline_stage * st.pp * st.virtual_stages == ns.num_layers
    else:
        assert ns.num_layers_per_virtual_pipeline_stage is None
    assert (ns.num_layers, ns.hidden_size, ns.num_attention_heads, ns.num_query_groups) == (32, 4096, 32, 8)
    assert ns.ffn_hidden_size == 14336 and ns.seq_length == 8192 and ns.untie_embeddings_and_output_weights
    # Llama's block, not Megatron-LM's GPT-2 default (before: LayerNorm, GELU, learned positions, biases)
    assert ns.swiglu and ns.normalization == "RMSNorm" and ns.position_embedding_type == "rope"
    assert ns.disable_bias_linear and not ns.add_qkv_bias and ns.num_experts is None


@pytest.mark.parametrize("strategy", [
    dict(tp=8, pp=2, dp=1, micro_batch=1, schedule="1f1b", attention="flash", recompute="none", precision="bf16"),
    dict(tp=4, pp=2, dp=2, micro_batch=2, schedule="interleaved-1f1b", virtual_stages=4, sequence_parallel=True,
         recompute="selective", zero=1, precision="bf16", attention="flash"),
    dict(tp=2, pp=4, dp=2, micro_batch=1, schedule="1f1b", recompute="full", zero=1, precision="fp16"),
    # fp8 (before: no precision flag at all, so Megatron-LM trained fp32)
    dict(tp=4, pp=2, dp=2, micro_batch=1, schedule="1f1b", sequence_parallel=True, zero=1, precision="fp8",
         attention="flash", recompute="none"),
])
def test_megatron_flags_parse_back_to_the_configuration(strategy):
    p = {**BASE, **strategy, "macro_batch": 64 // strategy["dp"]}
    args, notes = megatron_args(p, 64)
    ns = _megatron_parser().parse_args(args)  # every emitted flag is one Megatron-LM takes
    _check_megatron(ns, p, 64)
    assert notes == []


def test_what_megatron_cannot_say_is_a_comment():
    p = {**BASE, "tp": 8, "pp": 2, "dp": 1, "macro_batch": 64, "schedule": "zb-h1", "compress": "directq:fw4bw8"}
    text = emit(p, "megatron", nodes=2, global_batch=64)
    comments = [l for l in text.splitlines() if l.startswith("#")]
    assert any("zb-h1" in c for c in comments) and any("directq:fw4bw8" in c for c in comments)
    with pytest.raises(ConfigError, match="no perfsim run implementation"):
        emit(p, "perfsim", nodes=2, global_batch=64)
    with pytest.raises(ConfigError, match="--emit 'slurm'"):
        emit(p, "slurm", nodes=2, global_batch=64)


def test_plan_cli_emits_a_torchrun_line_that_is_the_winner(tmp_path):
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, "-m", "perfsim", "plan", "--model", LLAMA3_8B, "--gpu", "h100",
                           "--nodes", "2", "--gpus-per-node", "8", "--bandwidth", "100Gbps", "--global-batch", "64",
                           "--seq-len", "8192", "--micro-batch", "1", "--compress", "fp32", "--grad-compress", "none",
                           "--recompute", "none,selective", "--format", "json", "-o", str(out),
                           "--emit", "torchrun", "-q"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())[0]
    line = [l for l in proc.stdout.splitlines() if l.startswith("torchrun ")]
    assert len(line) == 1
    words = shlex.split(line[0])
    launcher = argparse.ArgumentParser(allow_abbrev=False)
    for flag in ("--nnodes", "--nproc-per-node", "--master-port"):
        launcher.add_argument(flag, type=int)
    launcher.add_argument("--node-rank")
    launcher.add_argument("--master-addr")
    launcher.add_argument("script")
    script_at = words.index("pretrain_gpt.py")
    ns_l = launcher.parse_args(words[1:script_at + 1])
    assert (ns_l.nnodes, ns_l.nproc_per_node, ns_l.script) == (2, 8, "pretrain_gpt.py")
    ns = _megatron_parser().parse_args(words[script_at + 1:])
    assert ns_l.nnodes * ns_l.nproc_per_node == row["tp"] * row["pp"] * row["dp"]
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (row["tp"], row["pp"])
    assert ns.micro_batch_size == row["micro_batch"] and ns.global_batch_size == 64
    assert ns.bf16 and ns.use_flash_attn == (row["attention"] == "flash")
    assert (ns.recompute_granularity or "none") == row["recompute"]
    assert ns.use_distributed_optimizer == (row["zero"] in (1, 2)) and ns.use_torch_fsdp2 == (row["zero"] == 3)
    assert ns.overlap_grad_reduce == bool(row["overlap"] and row["dp"] > 1)


def test_megatron_flags_say_what_the_prediction_assumed_of_the_head_and_the_split():
    """Without a GPU preset a prediction trains an untied head on the last stage and splits the
    layers by compute (perfsim's defaults): the Megatron-LM flags untie the output layer (a
    tied one all-reduces its gradient every step, which the prediction did not price) and a
    comment says the split differs. With the preset (Megatron-LM's defaults): neither.
    (Before: a tied head and no word on the split.)"""
    p = dict(model="gpt2-xl", pp=4, dp=1, schedule="1f1b", macro_batch=8)
    args, notes = megatron_args(p, 8)
    assert "--untie-embeddings-and-output-weights" in args
    assert [n for n in notes if n.startswith("partition balanced by compute")]
    args, notes = megatron_args({**p, "gpu": "a100"}, 8)
    assert "--untie-embeddings-and-output-weights" not in args and notes == []
    args, notes = megatron_args({**p, "partition": "uniform", "tied_embedding": "sync"}, 8)
    assert "--untie-embeddings-and-output-weights" not in args and notes == []
    args, notes = megatron_args({**p, "pp": 1}, 8)  # one stage: the head is the embedding
    assert "--untie-embeddings-and-output-weights" not in args and notes == []


@pytest.mark.parametrize("job,setting", [
    (dict(pp=2, dp=2, zero=1), "zero=1"),
    (dict(pp=1, dp=4, zero=2, offload="optimizer"), "zero=2"),
    (dict(pp=2, dp=1, tp=2, tp_send="scatter-gather"), "tp_send='scatter-gather'"),
])
def test_emitted_run_command_says_up_front_what_run_cannot_train(job, setting, tmp_path):
    """``plan --emit perfsim`` of a GPU plan whose job perfsim run refuses (ZeRO-1/2, an
    offload, scatter-gather sends with tp and pp > 1 without sequence parallelism): a first
    ``#`` line names the setting and says the command states the prediction's settings, with
    run's own refusal, which parsing the command with run's flags gives word for word. (Before:
    the bare command, refused only when launched.)"""
    from perfsim.commands import run as run_cmd
    from perfsim.runtime import make_config

    p = dict(model="gpt2-tiny", gpu="a100", gpus_per_node=4, bandwidth="100Gbps", schedule="1f1b",
             compress="fp32", grad_compress="none", micro_batch=2, macro_batch=8, **job)
    text = emit(p, "perfsim", nodes=1, global_batch=8 * p["dp"])
    note, command = text.split("\n")
    assert note.startswith(f"# perfsim run cannot train {setting}; this command states the prediction's settings")
    assert command.startswith("perfsim run --model gpt2-tiny") and not command.startswith("#")
    ap = argparse.ArgumentParser()
    run_cmd.add_arguments(ap)
    args = ap.parse_args([*shlex.split(command, comments=True)[2:], "--out", str(tmp_path / "r")])
    with pytest.raises(ConfigError) as refused:
        make_config(**run_cmd.run_params(args))
    assert note.endswith(f"(perfsim run: {refused.value})")
    # a job run trains: the bare command, no comment line
    plain = emit({**p, **dict(pp=2, dp=2, tp=1, zero=0, offload="none")}, "perfsim", nodes=1, global_batch=16)
    assert not plain.startswith("#") and "\n" not in plain


def test_megatron_flags_train_the_predicted_moe_model():
    """A MoE plan's command trains the MoE model (before: a dense model of the same widths,
    no expert flag); Megatron-LM's refusal of MoE with TP and no sequence parallelism is said."""
    p = dict(model="mixtral-8x7b", gpu="h100", gpus_per_node=8, tp=2, pp=4, dp=8, ep=8, micro_batch=1,
             macro_batch=8, sequence_parallel=True, moe_capacity_factor=1.25)
    args, notes = megatron_args(p, 64)
    ns = _megatron_parser().parse_args(args)
    assert (ns.num_experts, ns.moe_router_topk, ns.moe_ffn_hidden_size) == (8, 2, 14336)
    assert ns.expert_model_parallel_size == 8 and ns.moe_token_dispatcher_type == "alltoall"
    assert ns.moe_expert_capacity_factor == 1.25 and ns.moe_pad_expert_input_to_capacity
    assert ns.swiglu and ns.normalization == "RMSNorm" and notes == []
    _, notes = megatron_args({**p, "sequence_parallel": False}, 64)
    assert len(notes) == 1 and "refuses" in notes[0] and "--sequence-parallel" in notes[0]


def test_megatron_flags_of_dense_layers_shared_experts_and_qkv_biases():
    """DeepSeekMoE-style dense first blocks and a gated shared expert; Qwen2's qkv-only biases."""
    from perfsim.emit import architecture_args, moe_args_of
    from perfsim.config import Strategy
    from perfsim.models.transformer import TransformerSpec

    moe = TransformerSpec("m", n_layer=4, hidden=256, heads=4, seq_len=128, vocab=1000, arch="llama", gated=True,
                          bias=False, norm="rmsnorm", learned_positions=False, tied=False, experts=8, top_k=2,
                          expert_ffn=128, shared_ffn=256, shared_gate=True, dense_layers=(0,))
    args, notes = moe_args_of(moe, Strategy(dp=2, ep=2))
    ns = _megatron_parser().parse_args(args)
    assert ns.moe_layer_freq == "[0,1,1,1]" and ns.moe_shared_expert_intermediate_size == 256
    assert ns.moe_shared_expert_gate and ns.expert_model_parallel_size == 2 and notes == []
    qwen = TransformerSpec("q", n_layer=2, hidden=256, heads=4, seq_len=128, vocab=1000, bias=False, qkv_bias=True,
                           head_dim=128)
    args, notes = architecture_args(qwen)
    ns = _megatron_parser().parse_args(args)
    assert ns.disable_bias_linear and ns.add_qkv_bias and ns.kv_channels == 128 and notes == []


def test_zero_2_says_megatron_syncs_once_a_step():
    p = {**BASE, "tp": 8, "pp": 1, "dp": 2, "micro_batch": 1, "macro_batch": 32, "zero": 2, "precision": "bf16"}
    args, notes = megatron_args(p, 64)
    assert "--use-distributed-optimizer" in args and any(n.startswith("zero 2:") for n in notes)
    assert not megatron_args({**p, "zero": 1}, 64)[1]
