"""Checkpoints: a stopped run resumes to the uninterrupted run's losses; a corrupt file is one
line and the previous one resumes; no shared filesystem needed."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from perfsim import rank_store
from perfsim.errors import ConfigError
from perfsim.runtime import checkpoint
from perfsim.runtime import RankFailure, run
from perfsim.runtime.config import RunConfig

from _helpers import PIPE_JOB

#: 6 steps of 2 stages; AQ-SGD compresses from step 2 (its state is part of every checkpoint)
AQ = dict(PIPE_JOB, pp=2, schedule="1f1b", compress="aqsgd:fw3bw6")


def assert_no_abort(out) -> None:
    """No rank log of the run in ``out`` tells of a C++ thread destroyed while joinable
    ("terminate called without an active exception": a rank leaving with gloo's threads
    alive, perfsim.procs.exit_rank)."""
    logs = {p.name: p.read_text(errors="replace") for p in (out / ".ranks").glob("rank*.log")}
    assert logs and not any("terminate called" in t for t in logs.values()), logs


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """``(losses of the 6 steps in one go, folder of the same job stopped after 4 steps with
    checkpoints at steps 2 and 4)``: both tests below resume that one stopped run (one run
    fewer than a stopped run each; neither test changes the folder)."""
    full = run(**AQ, out=tmp_path_factory.mktemp("full") / "run").losses
    part = tmp_path_factory.mktemp("stopped") / "part"
    run(**dict(AQ, steps=4), checkpoint_every=2, out=part)
    return full, part


def test_resume_equals_uninterrupted(stopped, tmp_path):
    """Stop after 4 steps, resume to 6: the same losses as 6 steps in one go
    (model, optimizer, compressor state and data order restored; --steps grows on resume)."""
    full, part = stopped
    assert list(full) == [0, 1, 2, 3, 4, 5]
    result = run(**AQ, resume=part, out=tmp_path / "part2")
    assert result.summary["start_step"] == 4
    resumed = result.losses  # history from the checkpoint + the resumed steps
    assert list(resumed) == list(full)
    for s in resumed:
        assert resumed[s] == full[s], (s, resumed[s], full[s])


def test_corrupt_checkpoint_is_one_line_and_the_previous_resumes(stopped, tmp_path):
    full, part = stopped
    out = tmp_path / "c"
    shutil.copytree(part, out)  # the stopped run stays intact for the other test
    root, meta = checkpoint.find(out)
    assert meta["step"] == 4 and sorted(p.name for p in root.glob("step*")) == ["step00000002", "step00000004"]
    bad = root / "step00000004" / "rank1.pt"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated, as by a full disk or a crash
    with pytest.raises(ConfigError, match=r"step00000004/rank1.pt: corrupt or unreadable.*"
                                          r"--resume .*step00000002"):
        run(resume=out, out=tmp_path / "r1", **AQ)
    assert_no_abort(tmp_path / "r1")  # a ConfigError inside a rank: both leave cleanly
    result = run(resume=root / "step00000002", out=tmp_path / "r2", **AQ)
    assert result.summary["start_step"] == 2
    assert result.losses == full


def test_killed_before_its_results_resume_writes_them(stopped, tmp_path):
    """A run killed after its final checkpoint but while writing its results (``result.json``,
    written last, and others missing): ``--resume`` restores that checkpoint and writes the
    uninterrupted run's results, training no step; a second ``--resume`` has nothing left to do.
    (Before: "nothing left to do" on the first, and only ``--overwrite`` and a new run helped.)"""
    _, part = stopped
    out = tmp_path / "killed"
    shutil.copytree(part, out)  # the stopped run stays intact for the other tests
    whole = json.loads((out / "result.json").read_text())
    for name in ("result.json", "losses.csv", "trace.json"):  # summary.csv ... were written
        (out / name).unlink()
    ckpt = {p.relative_to(out): p.read_bytes() for p in (out / "ckpt").rglob("*") if p.is_file()}
    result = run(resume=out)
    again = json.loads((out / "result.json").read_text())
    assert again["losses"] == whole["losses"] and len(again["losses"]) == 4
    for key in ("stages", "microbatches", "links"):
        assert again[key] == whole[key], key
    loadavg = "load_average_1m"  # the machine's load when the results are written
    assert {k: v for k, v in again["summary"].items() if k != loadavg} == \
        {k: v for k, v in whole["summary"].items() if k != loadavg}
    assert result.summary["start_step"] == 0 and result.summary["pipeline_bytes"] > 0
    assert (out / "losses.csv").read_text() == (part / "losses.csv").read_text()
    assert (out / "trace.json").read_text() == (part / "trace.json").read_text()
    # no step trained: no checkpoint written or pruned
    assert {p.relative_to(out): p.read_bytes() for p in (out / "ckpt").rglob("*") if p.is_file()} == ckpt
    with pytest.raises(ConfigError, match="checkpoint is at step 4, nothing left to do"):
        run(resume=out)


def test_disk_buffers_resume_as_they_were_at_the_checkpoint(stopped, tmp_path):
    """AQ-SGD's ``disk=`` buffers change in place at every step: a run killed one step after
    its step-2 checkpoint resumes from that step's buffers (the checkpoint's own copy), so its
    losses are the uninterrupted run's; and the completed run, whose live buffer files are
    removed, still extends from its last checkpoint. (Before: the buffers of step 3 were read
    back, loss of step 3 2.2745 instead of 2.2621, silently.)"""
    full, _ = stopped
    job = dict(AQ, compress=f"aqsgd:fw3bw6:disk={tmp_path / 'buffers'}")
    out = tmp_path / "killed"
    with pytest.raises(RankFailure):
        run(**job, checkpoint_every=2, fail_rank=1, fail_step=3, out=out)
    assert_no_abort(out)  # rank 1 killed: rank 0 fails on the closed connection and leaves cleanly
    assert checkpoint.find(out)[1]["step"] == 2
    result = run(**job, resume=out)
    assert result.summary["start_step"] == 2
    assert result.losses == full
    assert not list((tmp_path / "buffers").iterdir())  # the completed run removed its live files
    longer = run(**dict(job, steps=7), resume=out)
    assert longer.summary["start_step"] == 6 and list(longer.losses) == list(range(7))


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare (private mounts)")


def _launch_private_disks(cfg: RunConfig, out, disks) -> list[subprocess.CompletedProcess]:
    """Start the ranks by hand (as torchrun would), each in its own mount
    namespace where OUT/ckpt is that rank's private disk: nodes without a
    shared filesystem."""
    cfg_path = out / "config.json"
    cfg_path.write_text(cfg.to_json())
    (out / "ckpt").mkdir(exist_ok=True)
    procs, done = [], []
    with rank_store.hosted(cfg.world_size, cfg.timeout_s) as host:  # the ranks join this process's store
        for r in range(cfg.world_size):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(cfg.world_size), LOCAL_RANK="0",
                       PERFSIM_THREADS="1", **host.env())
            script = (f"mount --bind {disks[r]} {out / 'ckpt'} && "
                      f"exec {sys.executable} -m perfsim.runtime.worker {cfg_path}")
            procs.append(subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        try:
            for p in procs:
                stdout, _ = p.communicate(timeout=180)
                done.append((p.returncode, stdout))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return done


@pytest.mark.netns
@needs_root
def test_checkpoints_without_a_shared_filesystem(tmp_path):
    out = tmp_path / "run"
    (out / ".ranks").mkdir(parents=True)
    disks = [tmp_path / f"node{r}" for r in range(2)]
    for d in disks:
        d.mkdir()
    cfg = RunConfig(pp=2, schedule="1f1b", steps=4, checkpoint_every=2, out=str(out), model="digits-mlp", micro_batch=4,
                    macro_batch=16, timeout_s=30.0)
    for code, log in _launch_private_disks(cfg, out, disks):
        assert code == 0, log[-2000:]
    for r, d in enumerate(disks):  # each node holds its own files and its own commit
        assert sorted(p.name for p in (d / "step00000004").iterdir()) == ["commit.json", f"rank{r}.pt"]
        assert checkpoint.latest(d)["step"] == 4
    resumed = cfg.replace(steps=6, resume=str(out))
    for code, log in _launch_private_disks(resumed, out, disks):
        assert code == 0, log[-2000:]
    for d in disks:
        assert checkpoint.latest(d)["step"] == 6
        assert sorted(p.name for p in d.glob("step*")) == ["step00000004", "step00000006"]


def test_pruning_survives_a_peer_removing_the_folder_first(tmp_path, monkeypatch):
    """On a shared disk two ranks prune the same old checkpoint: when the other rank removes the
    folder just as this rank looks for files left in it (it exists, then scandir fails), the
    commit goes on. Before, the rank died of FileNotFoundError (a CI run of the disk-buffer
    test above, 2026-11-29)."""
    root = tmp_path / "ckpt"
    old, kept, new = (checkpoint.step_dir(root, s) for s in (2, 4, 6))
    for d in (old, kept):
        d.mkdir(parents=True)
        for r in (0, 1):
            (d / f"rank{r}.pt").write_bytes(b"x")
    new.mkdir(parents=True)
    real_scandir = os.scandir

    def peer_removes_it_now(path="."):
        if not isinstance(path, int) and os.fspath(path) == os.fspath(old):  # rank 1 removes it now
            shutil.rmtree(old)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", peer_removes_it_now)
    checkpoint.commit(root, 6, 2, {}, rank=0, previous={"step": 4})
    assert not old.exists() and (kept / "rank0.pt").exists() and checkpoint.latest(root)["step"] == 6
