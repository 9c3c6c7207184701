"""Emulated slow links (network namespaces + tc). Needs root, iproute2 and tc."""

import pytest

from perfsim import netem
from perfsim.errors import ConfigError
from perfsim.runtime import run

needs_netns = pytest.mark.skipif(not netem.netns_available(), reason="needs root + ip netns + tc")


def _ours():
    """Namespaces made by this process (other perfsim users may run beside us)."""
    import os

    return [n for n in netem.list_namespaces() if n.startswith(f"{netem.PREFIX}{os.getpid()}-")]


def test_clear_error_without_privileges(monkeypatch):
    monkeypatch.setattr(netem.os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="needs root"):
        with netem.EmulatedNetwork(2, 1e8):
            pass


@pytest.mark.netns
@needs_netns
def test_links_are_shaped_and_always_removed(tmp_path):
    before = _ours()
    assert before == []
    r = run(model="digits-mlp", pp=2, schedule="1f1b", steps=4, micro_batch=8, macro_batch=32,
            emulate_bandwidth="20Mbps", emulate_latency="2ms", out=tmp_path / "n", timeout="30s")
    assert r.summary["bandwidth_bps"] == 20e6 and r.summary["emulated"]
    # stage 0 sends 4 micro-batch messages of 8 x 256 fp32 = 8 KiB per step through its
    # 20 Mbit/s uplink: a step cannot be shorter than their serialisation (13 ms)
    assert r.summary["iteration_s"] >= 4 * 8192 * 8 / 20e6
    assert r.summary["comm_s"] > 0
    assert _ours() == before
    # and on failure too: a rank killed inside the namespaces
    with pytest.raises(Exception, match="rank 0"):
        run(model="digits-mlp", pp=2, schedule="1f1b", steps=20, micro_batch=8, macro_batch=32, fail_rank=0,
            fail_step=2,
            emulate_bandwidth="50Mbps", out=tmp_path / "f", timeout="30s")
    assert _ours() == before


@pytest.mark.netns
@needs_netns
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupt_removes_namespaces(tmp_path, sig):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "i"
    proc = subprocess.Popen([sys.executable, "-m", "perfsim", "run", "--model", "digits-mlp", "--pp", "2",
                             "--schedule", "1f1b", "--micro-batch", "8",
                             "--steps", "100000", "--emulate-bandwidth", "20Mbps", "--out", str(out),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mine = f"{netem.PREFIX}{proc.pid}-"
    try:
        deadline = time.monotonic() + 90
        while not (out / ".ranks" / "progress.json").exists():  # training is under way
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert any(n.startswith(mine) for n in netem.list_namespaces())
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert not [n for n in netem.list_namespaces() if n.startswith(mine)]
