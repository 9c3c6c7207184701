"""Issue 39's hostile probes of ``perfsim run``, ``calibrate``, ``predict`` and the README,
kept as regression tests: no silently lost work, no silent wrong answer, hints that work.

Real runs are few and tiny (digits-mlp, 2 stages, 2-4 steps) and shared through
module-scoped fixtures; each test that changes a run's folder works on a copy.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from _helpers import assert_user_error, run_cli_here

JOB = ["--model", "digits-mlp", "--pp", "2", "--micro-batch", "4", "--macro-batch", "16",
       "--dataset-limit", "32", "--timeout", "60s", "--no-progress"]


def _losses(out: Path) -> dict[int, float]:
    data = json.loads((out / "result.json").read_text())
    return {int(d["step"]): d["loss"] for d in data["losses"]}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A finished 4-step run with a non-default pipeline compression, checkpointed at
    steps 2 and 4 (the folder every probe below starts from; never changed)."""
    out = tmp_path_factory.mktemp("hostile") / "first"
    proc = run_cli_here("run", *JOB, "--compress", "directq:fw4bw8", "--steps", "4",
                        "--checkpoint-every", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------ 1. no overwrite
def test_run_on_a_folder_holding_a_run_is_refused(first_run):
    before = {p.name: p.stat().st_mtime_ns for p in first_run.glob("[!.]*") if p.is_file()}
    proc = run_cli_here("run", *JOB, "--steps", "2", "--out", str(first_run))
    assert_user_error(proc.returncode, proc.stderr, "--overwrite")
    assert "--resume" in proc.stderr and "result.json" in proc.stderr and "ckpt/" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in first_run.glob("[!.]*") if p.is_file()} == before


@pytest.fixture(scope="module")
def overwritten(first_run, tmp_path_factory):
    """``--overwrite`` of a copy of the first run by a 2-step AQ-SGD run whose message
    buffers live on disk (``disk=PATH``)."""
    base = tmp_path_factory.mktemp("overwrite")
    out = _copy(first_run, base)
    buffers = base / "buffers"
    proc = run_cli_here("run", *JOB, "--compress", f"aqsgd:fw3bw6:disk={buffers}", "--steps", "3",
                        "--overwrite", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, buffers


def test_overwrite_removes_the_earlier_runs_checkpoints(overwritten):
    out, _ = overwritten
    # the first run's step 2 and 4 checkpoints are gone: only this run's step 3
    assert sorted(p.name for p in (out / "ckpt").glob("step*")) == ["step00000003"]
    assert sorted(_losses(out)) == [0, 1, 2]
    assert json.loads((out / "result.json").read_text())["summary"]["compress"].startswith("aqsgd")


# ------------------------------------------------------------ 3. disk buffers
def test_disk_buffers_are_removed_when_the_run_completes(overwritten):
    _, buffers = overwritten
    assert buffers.is_dir()  # the run used them (they were created there) ...
    assert list(buffers.iterdir()) == []  # ... and removed them once it completed


# ------------------------------------------------------------ 2. resume
def test_resume_flags_must_agree_with_the_checkpoint(first_run):
    proc = run_cli_here("run", "--resume", str(first_run), "--compress", "fp32", "--steps", "6",
                        "--no-progress")
    assert_user_error(proc.returncode, proc.stderr, "--compress 'fp32'")
    assert "'directq:fw4bw8'" in proc.stderr


def test_following_the_corrupt_checkpoint_hint_resumes_the_run_in_its_folder(first_run, tmp_path):
    out = _copy(first_run, tmp_path)
    bad = out / "ckpt" / "step00000004" / "rank1.pt"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated, as by a full disk
    proc = run_cli_here("run", "--resume", str(out), "--steps", "4", "--no-progress")
    assert proc.returncode == 2 and "corrupt" in proc.stderr, proc.stderr
    hint = re.search(r"(--resume \S+)$", proc.stderr.strip()).group(1).split()
    # the hint as given: no flag repeated (the model and --compress come from the checkpoint)
    proc = run_cli_here("run", *hint, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    step_dir = Path(hint[1])
    assert not (step_dir / "ckpt").exists() and not (step_dir / "result.json").exists()
    data = json.loads((out / "result.json").read_text())
    assert data["summary"]["start_step"] == 2 and data["summary"]["compress"] == "directq:fw4bw8"
    assert _losses(out) == _losses(first_run)  # bit-for-bit the uninterrupted run's losses


# ------------------------------------------------------------ 4. steps and epochs
def test_steps_and_epochs_together_are_refused(tmp_path):
    proc = run_cli_here("run", *JOB, "--steps", "5", "--epochs", "1", "--out", str(tmp_path / "r"))
    assert_user_error(proc.returncode, proc.stderr, "epochs")
    assert not (tmp_path / "r").exists()
