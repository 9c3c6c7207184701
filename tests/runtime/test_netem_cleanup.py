"""Emulated networks leave nothing behind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from perfsim import netem
from perfsim.cli import main

from _helpers import PINNED_FLAGS, assert_user_error, run_cli_here

needs_netns = pytest.mark.skipif(not netem.netns_available(), reason="needs root + ip netns + tc")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.netns
@needs_netns
def test_cleanup_kills_what_runs_in_namespaces_of_dead_runs():
    """--cleanup removed the names but left the processes inside running."""
    dead = f"{netem.PREFIX}{_dead_pid()}-0-r0"
    alive = f"{netem.PREFIX}1-0-r0"  # pid 1 is alive and older than the namespace: not stale
    sleeper = None
    try:
        for ns in (dead, alive):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        sleeper = subprocess.Popen(["ip", "netns", "exec", dead, "sleep", "600"], start_new_session=True)
        time.sleep(0.3)
        assert netem.main(["--cleanup"]) == 0
        names = netem.list_namespaces()
        assert dead not in names and alive in names
        sleeper.wait(timeout=10)  # killed, not left behind
        assert sleeper.returncode == -signal.SIGKILL
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
        for ns in (dead, alive):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_cleanup_without_root_says_it_could_not_act(monkeypatch, capsys):
    monkeypatch.setattr(netem.os, "geteuid", lambda: 1000)
    assert netem.main(["--cleanup"]) == 1
    err = capsys.readouterr()
    assert "could not clean up" in err.err and "needs root" in err.err and "removed" not in err.out


@pytest.mark.netns
@needs_netns
def test_repeated_interrupts_leave_no_namespace(tmp_path):
    """A burst of Ctrl-C during teardown left perfsim-<pid>-0-br behind."""
    for attempt in range(2):
        out = tmp_path / f"i{attempt}"
        proc = subprocess.Popen([sys.executable, "-m", "perfsim", "run", "--model", "digits-mlp", "--pp", "2",
                                 "--schedule", "1f1b", "--micro-batch", "8",
                                 "--steps", "100000", "--emulate-bandwidth", "20Mbps", "--out", str(out),
                                 "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        mine = f"{netem.PREFIX}{proc.pid}-"
        try:
            deadline = time.monotonic() + 120
            while not (out / ".ranks" / "progress.json").exists():
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            while proc.poll() is None and time.monotonic() < deadline + 60:  # Ctrl-C, again and again
                proc.send_signal(signal.SIGINT)
                time.sleep(0.01)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        left = [n for n in netem.list_namespaces() if n.startswith(mine)]
        for ns in left:  # never leave them for the next test
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        assert not left


@pytest.mark.parametrize("rate", ["10Tbps", "1bps"])
def test_emulated_rate_outside_tc_range_refused_up_front(tmp_path, rate):
    """tc tracebacks after namespaces were built. Only this run's namespaces are looked at
    (named after the pid that builds them): other tests may build theirs meanwhile."""
    args = ("run", *PINNED_FLAGS, "--emulate-bandwidth", rate, "--out", str(tmp_path / "x"), "--steps", "1")
    if rate == "10Tbps":  # the first in a real process
        child = subprocess.Popen([sys.executable, "-m", "perfsim", *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        out, err = child.communicate(timeout=300)
        proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
        pid = child.pid
    else:
        proc, pid = run_cli_here(*args), os.getpid()
    assert_user_error(proc.returncode, proc.stderr, "tc shapes")
    if netem.netns_available():
        assert not [n for n in netem.list_namespaces() if n.startswith(f"{netem.PREFIX}{pid}-")]


def test_calibrate_checks_stages_and_root_before_measuring(monkeypatch, capsys):
    """Root was checked after minutes of measuring; --stages 99 ignored."""
    from perfsim.calibrate import compute

    def measured(*a, **k):
        raise AssertionError("measured before checking the arguments")

    monkeypatch.setattr(compute, "measure_compute", measured)
    monkeypatch.setattr(compute, "measure_compute_concurrent", measured)
    assert main(["calibrate", "--model", "digits-mlp", "--stages", "99", "--output", "/tmp/x.json"]) == 2
    assert "--stages 99" in capsys.readouterr().err
    monkeypatch.setattr(netem.os, "geteuid", lambda: 1000)
    assert main(["calibrate", "--model", "digits-mlp", "--emulate-bandwidth", "100Mbps",
                 "--output", "/tmp/x.json"]) == 2
    assert "needs root" in capsys.readouterr().err
