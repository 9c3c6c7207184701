"""The interface the blind checks use: perfsim predict with --gpu/--tp/--global-batch/--precision."""

import json

import pytest

from perfsim.api import predict
from perfsim.cli import main
from perfsim.errors import ConfigError

from _helpers import assert_user_error

GPT = "gpt:layers=24,hidden=2048,heads=16,seq=2048,vocab=51200"
ARGS = ["predict", "--model", GPT, "--gpu", "a100-sxm4-80gb", "--tp", "4", "--pp", "2", "--dp", "2",
        "--micro-batch", "1", "--global-batch", "16", "--gpus-per-node", "8", "--bandwidth", "200Gbps",
        "--precision", "bf16", "--recompute", "full", "--format", "json"]


def test_blind_check_command_json(capsys):
    assert main(ARGS) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["iteration_s"] > 0 and s["fits"] is True and 0 < s["peak_memory_gib"] < 80
    assert s["params"] == 24 * (12 * 2048**2 + 13 * 2048) + 51200 * 2048 + 2048 * 2048 + 2 * 2048
    assert (s["tp"], s["pp"], s["dp"], s["gpus"], s["global_batch"], s["macro_batch"]) == (4, 2, 2, 16, 16, 8)
    assert s["precision"] == "bf16" and s["recompute"] == "full" and s["schedule"] == "1f1b"


def test_table_says_how_the_nodes_nics_are_shared(capsys):
    table = [a for a in ARGS if a not in ("--format", "json")]
    assert main(table) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "network: 8 GPUs per node share 1 NIC(s) of 200Gbps between nodes" in out
    assert main(table[:-4] + ["--nic", "8x200Gbps"] + table[-4:]) == 0
    assert "share 8 NIC(s) of 200Gbps" in " ".join(capsys.readouterr().out.split())


def test_table_shows_plain_specs_as_the_training_dtype(capsys):
    """Under bf16 the default --compress fp32 / --grad-compress none send bf16: the table says so."""
    table = [a for a in ARGS if a not in ("--format", "json")]
    assert main(table) == 0
    rows = [" ".join(line.strip("│ ").split()) for line in capsys.readouterr().out.splitlines()]
    assert any(r.startswith("compress │ none (bf16)") for r in rows)
    assert any(r.startswith("grad │ none (bf16)") for r in rows)
    i = table.index("bf16")
    assert main(table[:i] + ["fp32"] + table[i + 1:]) == 0
    rows = [" ".join(line.strip("│ ").split()) for line in capsys.readouterr().out.splitlines()]
    assert any(r.startswith("compress │ fp32") for r in rows)


def test_does_not_fit_exits_2_naming_stage_and_shortfall(capsys):
    big = ["predict", "--model", "llama2-70b", "--gpu", "a100-sxm4-40gb", "--tp", "2", "--pp", "2",
           "--global-batch", "8", "--gpus-per-node", "8", "--precision", "bf16", "--format", "json"]
    assert main(big) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "memory" in err and "stage 0" in err and "short by" in err
    assert "Traceback" not in err and "perfsim memory with the same flags" in err  # where to look next
    assert main(["memory", *big[1:-2]]) == 0 and "single changes that lower the peak" in capsys.readouterr().out
    assert main(big + ["--allow-oom"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["fits"] is False and s["peak_memory_gib"] > 40


@pytest.mark.parametrize("extra,msg", [
    ("--global-batch 15", "global_batch=15"),
    ("--global-batch 16 --macro-batch 4", "disagrees"),
    ("--precision fp8", "precision"),
    ("--recompute some", "recompute"),
    ("--gpu tpu-v4", "gpu"),
    ("--tp 3", "tp=3"),
    ("--placement tp,pp", "placement"),
])
def test_bad_input_one_line(capsys, extra, msg):
    extra = extra.split()
    args = [a for a in ARGS]
    for flag in [a for a in extra if a.startswith("--")] + ["--global-batch"]:  # extra's value replaces ARGS's
        if flag in args:                                                        # (a flag given twice is refused)
            i = args.index(flag)
            del args[i:i + 2]
    if "--global-batch" not in extra:
        args += ["--global-batch", "16"]
    code = main(args + extra)
    assert_user_error(code, capsys.readouterr().err, msg)


def test_api_and_comma_lists(capsys):
    r = predict(model=GPT, gpu="h100", tp=8, pp=1, dp=1, global_batch=4, gpus_per_node=8, precision="bf16",
                sequence_parallel=True, recompute="selective")
    assert r.summary["sequence_parallel"] is True and r.summary["tp_comm_s"] > 0
    assert main(["predict", "--model", f"gpt2-medium,{GPT}", "--gpu", "a100", "--tp", "1,2", "--pp", "2",
                 "--global-batch", "8", "--precision", "bf16", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5 and "peak_memory_gib" in lines[0]


def test_a_sweep_table_names_the_gpu_axes_that_vary(capsys):
    assert main(["predict", "--model", "gpt2-medium", "--gpu", "h100", "--pp", "2", "--global-batch", "8",
                 "--precision", "bf16", "--attention", "megatron,flash", "--recompute", "none,full"]) == 0
    out = capsys.readouterr().out
    assert "attention" in out and "recompute" in out and out.count("flash") == 2 and "precision" not in out


def test_seq_len_and_global_batch_error_without_gpu():
    r = predict(model="bert-large", seq_len=128, pp=1, micro_batch=8, global_batch=64, dp=2)
    assert r.summary["macro_batch"] == 32 and r.summary["throughput_tokens_per_s"] > 0
    with pytest.raises(ConfigError, match="seq_len"):
        predict(model="resnet50", seq_len=128)
