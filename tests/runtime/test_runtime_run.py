"""Execute mode end to end: real ranks, real gloo p2p, on digits-mlp (seconds each)."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from perfsim.result import SUMMARY_COLUMNS, STAGE_COLUMNS
from perfsim.runtime import checkpoint
from perfsim.runtime import run
from perfsim.runtime.launch import RankFailure

from _helpers import PINNED_FLAGS, PIPE_JOB, assert_user_error, run_cli, run_cli_here

FAST = dict(model="digits-mlp", micro_batch=4, macro_batch=16, timeout="30s", schedule="1f1b")


def test_cli_writes_predict_schema(tmp_path):
    """(In this process: `perfsim run` in one of its own is test_under_torchrun's, the first bad
    argument's and test_reliability's.)"""
    out = tmp_path / "run"
    proc = run_cli_here("run", *PINNED_FLAGS, "--steps", "5", "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "result.json").read_text())
    assert list(data["summary"])[:len(SUMMARY_COLUMNS)] == SUMMARY_COLUMNS
    s = data["summary"]
    assert s["source"] == "measured" and s["pp"] == 2 and s["model"] == "digits-mlp"
    assert s["throughput_samples_per_s"] > 0 and s["iteration_s"] > 0
    # fp32 activations of 8 samples x 256 floats, 4 micro-batches, both directions
    assert s["pipeline_bytes"] == 2 * 4 * 8 * 256 * 4
    with open(out / "summary.csv") as f:
        header = next(csv.reader(f))
    assert header[:len(SUMMARY_COLUMNS)] == SUMMARY_COLUMNS
    with open(out / "stages.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["stage"] for r in rows] == ["0", "1"] and list(rows[0])[:len(STAGE_COLUMNS)] == STAGE_COLUMNS
    assert len(data["losses"]) == 5
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    names = {e["name"] for e in trace if e.get("ph") == "X"}
    assert {"0F0", "1B3", "recv act 0", "recv grad 3", "optimizer"} <= names
    # framing is traced (and counted as encode); each stage posts the next step's receives
    assert {"send act 0", "send grad 3", "post receives", "wait sends"} <= names
    posts = [e for e in trace if e.get("name") == "post receives"]
    assert {e["tid"] for e in posts} == {0, 1} and len(posts) == 2 * 4  # 5 steps: 4 have a next one


BAD_ARGS = [
    (["--pp", "0"], "--pp"),
    (["--compress", "bogus:3"], "bogus"),
    (["--micro-batch", "5", "--macro-batch", "32"], "micro_batch"),
    (["--pp", "9"], "pp=9"),
    (["--schedule", "interleaved-1f1b", "--virtual-stages", "3"], "virtual_stages=3"),
    (["--schedule", "interleaved-1f1b", "--pp", "4"], "interleaved-1f1b"),
]


def pinned_except(argv: list[str]) -> list[str]:
    """PINNED_FLAGS without the flags ``argv`` gives (a flag given twice is itself refused)."""
    given = set(argv[::2])
    pairs = zip(PINNED_FLAGS[::2], PINNED_FLAGS[1::2])
    return [x for flag, value in pairs if flag not in given for x in (flag, value)]


@pytest.mark.parametrize("argv, culprit", BAD_ARGS)
def test_bad_arguments_one_line_exit_2(argv, culprit, tmp_path):
    cli = run_cli if argv == BAD_ARGS[0][0] else run_cli_here  # the first in a real process
    proc = cli("run", "--out", str(tmp_path / "x"), *pinned_except(argv), *argv)
    assert_user_error(proc.returncode, proc.stderr, culprit)


def test_pipeline_equals_single_stage_and_schedules_agree(shared_run):
    """pp=2 with fp32 trains the same model as pp=1; GPipe and 1F1B give the same losses."""
    one = shared_run(**PIPE_JOB, pp=1, schedule="1f1b")[0].losses
    f1b = shared_run(**PIPE_JOB, pp=2, schedule="1f1b")[0].losses
    gp = shared_run(**PIPE_JOB, pp=2, schedule="gpipe")[0].losses
    assert f1b == gp
    assert list(one) == list(f1b) == [0, 1, 2, 3, 4, 5]
    for s in one:
        assert abs(one[s] - f1b[s]) < 1e-5


def test_killed_rank_stops_everyone_with_a_message(tmp_path):
    out = tmp_path / "k"
    with pytest.raises(RankFailure, match=r"rank 1 \(stage 1, replica 0\) died: killed by SIGKILL"):
        run(pp=2, steps=50, checkpoint_every=2, fail_rank=1, fail_step=3, out=out, **FAST)
    root, meta = checkpoint.find(out)
    assert meta["step"] == 2
    for r in range(2):
        assert checkpoint.load_rank(root, 2, r)["step"] == 2


def test_aqsgd_sender_and_receiver_buffers_identical(tmp_path):
    """After a real 3-stage run past the first epoch, each boundary's sender and
    receiver hold identical per-sample message buffers."""
    out = tmp_path / "aq"
    r = run(pp=3, steps=6, compress="aqsgd:fw3bw6", dataset_limit=32, out=out, **FAST)
    assert r.summary["measured_steps"] >= 1
    root, meta = checkpoint.find(out)
    states = [checkpoint.load_rank(root, meta["step"], k)["compressors"] for k in range(3)]
    for s in range(2):
        sent, got = states[s]["fw_send"], states[s + 1]["fw_recv"]
        assert _equal_states(sent, got, "state") > 0, "no buffer tensors in the AQ-SGD state"
        assert len(sent["slots"]) == 32  # every sample of the (limited) dataset has a buffer


def _equal_states(a, b, where) -> int:
    """Recursively compare two state dicts; returns the number of tensors compared."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
        return 1
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        return sum(_equal_states(a[k], b[k], f"{where}.{k}") for k in a)
    assert a == b, where
    return 0


def test_under_torchrun(tmp_path):
    """Across machines the ranks run under torchrun (standard rendezvous): the same
    command, each process is one rank, rank 0 writes the Result."""
    out = tmp_path / "tr"  # torchrun of this interpreter (a `torchrun` on PATH may be another install's)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "perfsim", "run",
                           "--model", "digits-mlp", "--pp", "2", "--schedule", "1f1b", "--steps", "3",
                           "--micro-batch", "4",
                           "--macro-batch", "16", "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]  # the ranks left without aborting
    s = json.loads((out / "result.json").read_text())["summary"]
    assert s["source"] == "measured" and s["pp"] == 2 and s["steps"] == 3
