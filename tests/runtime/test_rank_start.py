"""How ranks start: forked from a zygote that imported torch once, or (PERFSIM_RANK_START=spawn)
a new interpreter each; both make the same ranks, fail the same way, leave nothing behind."""

import os
import re
import sys
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.runtime import rank_start, run
from perfsim.runtime.launch import RankFailure

FAST = dict(model="digits-mlp", pp=2, micro_batch=4, macro_batch=16, dataset_limit=32, timeout="60s",
            schedule="1f1b")
FORKED = re.compile(r"perfsim: rank pid (\d+) \(process group (\d+)\) forked from the rank zygote \(pid (\d+)\)")


def _forks(out: Path) -> list:
    """(pid, process group, zygote pid) from each rank log's first line; None for a rank
    that was not forked."""
    logs = [(out / ".ranks" / f"rank{r}.log").read_text() for r in range(2)]
    return [tuple(map(int, m.groups())) if (m := FORKED.match(text)) else None for text in logs]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_crashed_rank_is_named_whichever_way_ranks_start(tmp_path, monkeypatch, method):
    """Rank 1 SIGKILLs itself at its first step: both start methods report that rank, in
    the same words; forked ranks share one process group (led by rank 0, apart from the
    launcher's), their zygote is not the launcher, and every rank is gone afterwards."""
    monkeypatch.setenv(rank_start.START_ENV, method)
    out = tmp_path / method
    with pytest.raises(RankFailure, match=r"^rank 1 \(stage 1, replica 0\) died: killed by SIGKILL; all 2 ranks stopped"):
        run(steps=3, fail_rank=1, fail_step=0, out=out, **FAST)
    forks = _forks(out)
    if method == "spawn":
        assert forks == [None, None]
        return
    (pid0, group0, zygote0), (pid1, group1, zygote1) = forks
    assert group0 == group1 == pid0 != os.getpgrp()
    assert zygote0 == zygote1 != os.getpid()
    assert _gone(pid0) and _gone(pid1)
    assert b"perfsim.runtime.zygote" in Path(f"/proc/{zygote0}/cmdline").read_bytes()


def test_the_zygote_serves_the_next_run_too(tmp_path):
    """Two runs from one thread: both trained, and their ranks came from the same zygote
    (torch imported once for both)."""
    zygotes = []
    for name in ("a", "b"):
        result = run(steps=1, out=tmp_path / name, **FAST)
        assert list(result.losses) == [0]
        forks = _forks(tmp_path / name)
        assert None not in forks, (tmp_path / name / ".ranks" / "rank0.log").read_text()[:300]
        zygotes += [z for _, _, z in forks]
    assert len(set(zygotes)) == 1


def test_which_ranks_are_forked(monkeypatch):
    """fork by default; spawn when asked, for emulated networks (ip netns exec) and for
    another interpreter; any other value is refused naming the variable."""
    monkeypatch.delenv(rank_start.START_ENV, raising=False)
    assert rank_start.start_method(sys.executable, emulated=False) == "fork"
    assert rank_start.start_method(sys.executable, emulated=True) == "spawn"
    assert rank_start.start_method("/usr/bin/python3-other", emulated=False) == "spawn"
    monkeypatch.setenv(rank_start.START_ENV, "spawn")
    assert rank_start.start_method(sys.executable, emulated=False) == "spawn"
    monkeypatch.setenv(rank_start.START_ENV, "forkserver")
    with pytest.raises(ConfigError, match=r"^PERFSIM_RANK_START='forkserver': expected one of fork, spawn$"):
        rank_start.start_method(sys.executable, emulated=False)


def test_the_launcher_starts_the_zygote_before_it_imports_torch():
    """perfsim run's launcher checked its job (RunConfig, the rank layout) and caught its errors
    through modules that import torch (~2.5 s), and only then started the zygote, whose own torch
    import followed. Now the job's checks are torch-free and the zygote is started first, so the
    launcher's one torch import (the rendezvous store's) overlaps the zygote's."""
    import subprocess

    probe = (
        "import sys\n"
        "from perfsim.runtime import RankFailure, TrainingDiverged, make_config, run, under_torchrun\n"
        "from perfsim.runtime import launch, rank_start\n"
        "cfg = make_config(model='digits-mlp', pp=2, dp=2, out=sys.argv[1])\n"
        "assert cfg.layout.describe(3) == 'rank 3 (stage 1, replica 1)', cfg.layout.describe(3)\n"
        "calls = []\n"
        "class Stop(Exception):\n"
        "    pass\n"
        "def zygote_for(env, *a):\n"
        "    calls.append(('zygote', 'torch' in sys.modules))\n"
        "    raise Stop\n"
        "rank_start.zygote_for = zygote_for\n"
        "try:\n"
        "    launch.launch_local(cfg)\n"
        "except Stop:\n"
        "    pass\n"
        "print(calls)\n")
    out = subprocess.run([sys.executable, "-c", probe, os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                                    f"perfsim-zygote-probe-{os.getpid()}")],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PERFSIM_RANK_START="fork"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[('zygote', False)]", out.stdout + out.stderr[-2000:]
