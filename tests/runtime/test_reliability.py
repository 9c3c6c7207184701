"""Runs under faults: locks, signals, hung ranks, up-front validation."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.outputs import locked_dir
from perfsim.runtime import run
from perfsim.runtime.launch import RankFailure

from _helpers import run_cli_here

FAST = dict(model="digits-mlp", micro_batch=4, macro_batch=16, timeout="60s", schedule="1f1b")
RUN = [sys.executable, "-m", "perfsim", "run", "--model", "digits-mlp", "--pp", "2", "--schedule", "1f1b",
       "--micro-batch", "4", "--macro-batch", "16", "--no-progress"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _workers_of(out: Path) -> list[int]:
    """pids of the ranks of the run writing to ``out``: the processes whose stdout is one
    of its rank logs (so forked ranks, whose command line is their zygote's, count too)."""
    logs = {str(p.resolve()) for p in (out / ".ranks").glob("rank*.log")}
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stdout = os.readlink(d / "fd" / "1")
            except OSError:
                continue
            if stdout in logs:
                pids.append(int(d.name))
    return pids


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


def _start_long_run(out: Path, *extra) -> subprocess.Popen:
    proc = subprocess.Popen([*RUN, "--steps", "100000", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert _wait(lambda: (out / ".ranks" / "progress.json").exists() or proc.poll() is not None, 120)
    assert proc.poll() is None, proc.communicate()
    return proc


def _kill_all(proc, out):
    for pid in _workers_of(out):
        os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def test_second_run_on_the_same_folder_is_refused(tmp_path):
    """Two runs sharing --out interleaved; now the second is refused naming the pid."""
    out = tmp_path / "shared"
    first = _start_long_run(out)
    try:  # the second in this process: the lock names another process's pid either way
        second = run_cli_here(*RUN[3:], "--steps", "2", "--out", str(out))
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"pid {first.pid}" in second.stderr and len(second.stderr.strip().splitlines()) == 1
    finally:
        _kill_all(first, out)


def test_stale_lock_of_a_dead_process_does_not_block(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".perfsim.lock").write_text(f"{dead.pid}\n")
    with locked_dir(tmp_path):
        assert (tmp_path / ".perfsim.lock").read_text().strip() == str(os.getpid())
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from perfsim.outputs import locked_dir\n"
                               f"with locked_dir({str(tmp_path)!r}):\n print('ok', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            with locked_dir(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()


# SIGHUP is not among them: wherever perfsim handles it, it is registered with SIGTERM to the
# same handler (cli.py's _terminate and its ignore-after-interrupt tuple, launch.py's forward,
# netem's teardown), so a HUP cell ran the TERM cell's code; INT is Ctrl-C (Python's own
# handler outside a run), KILL leaves only PR_SET_PDEATHSIG.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_workers_die_with_their_launcher(tmp_path, sig):
    """TERM/HUP/KILL to the launcher orphaned its workers."""
    out = tmp_path / "run"
    proc = _start_long_run(out)
    workers = _workers_of(out)
    try:
        assert len(workers) == 2
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        assert _wait(lambda: not any(_alive(p) for p in workers), 30), \
            f"workers {[p for p in workers if _alive(p)]} outlived the launcher ({sig.name})"
        if sig != signal.SIGKILL:
            assert proc.returncode != 0
    finally:
        _kill_all(proc, out)


def test_hung_rank_is_named(tmp_path):
    """A stopped rank was found after 70 s and the wrong rank named."""
    with pytest.raises(RankFailure, match=r"rank 1 \(stage 1, replica 0\) stopped making progress"):
        run(pp=2, steps=200, fail_rank=1, fail_step=3, fail_signal="SIGSTOP", hang_timeout="3s",
            out=tmp_path / "h", **FAST)
    assert not _workers_of(tmp_path / "h")


BAD_VALUES = [
    (["--epochs", "inf"], "epochs"),
    (["--seed", str(2**70)], "seed"),
    (["--hang-timeout", "0s"], "hang"),
    (["--lr", "inf"], "lr=inf"),  # (before: trained, then "training diverged at step 1")
    (["--lr", "nan"], "lr=nan"),
]


@pytest.mark.parametrize("argv, culprit", BAD_VALUES)
def test_bad_run_values_rejected_up_front(tmp_path, argv, culprit):
    """Bad run values are refused before any rank starts."""
    args = [*RUN[3:], "--out", str(tmp_path / "x"), *argv]  # RUN without `python -m perfsim`
    if argv == BAD_VALUES[0][0]:  # the first in a real process
        proc = subprocess.run([*RUN[:3], *args], capture_output=True, text=True, timeout=120)
    else:
        proc = run_cli_here(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert culprit in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x" / ".ranks").exists()


def test_cuda_without_a_gpu_rejected_up_front(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="--device cuda"):
        run(device="cuda", pp=2, steps=1, out=tmp_path / "c", **FAST)
    assert not (tmp_path / "c" / ".ranks").exists()
