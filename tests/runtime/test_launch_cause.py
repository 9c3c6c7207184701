"""The launcher reports the cause of a failed run, not its consequence.

A rank that refuses a corrupt checkpoint (a ``ConfigError``) can still be exiting when its peer,
mid-exchange, dies of the closed connection and exits first; the user must read the refusal.
Real processes stand in for the two ranks, so the order of their exits is the one that raced
in ``test_checkpoints.py::test_corrupt_checkpoint_is_one_line_and_the_previous_resumes``."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

from perfsim.errors import ConfigError
from perfsim.runtime import launch

GLOO = ("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:7554. "
        "This is typically caused by a remote worker crashing.")
REFUSAL = "checkpoint c/ckpt/step00000004/rank1.pt: corrupt or unreadable (RuntimeError)"


def rank(ranks_dir, r, text, delay_s, code):
    """A process that writes ``text`` as rank ``r``'s error report after ``delay_s``, then
    lingers (the refusing rank still unwinding) or exits at once with ``code``."""
    script = (f"import time, pathlib; time.sleep({delay_s}); "
              f"pathlib.Path({str(ranks_dir / f'rank{r}.error')!r}).write_text({text!r}); "
              f"time.sleep({1.0 if r == 1 else 0}); raise SystemExit({code})")
    return subprocess.Popen([sys.executable, "-c", script])


def test_a_ranks_refusal_is_reported_even_when_its_peer_exits_first(tmp_path):
    (tmp_path / "heartbeat").write_bytes(b"")
    # rank 1 refuses first but is still exiting when rank 0 dies of the closed connection
    procs = [rank(tmp_path, 0, GLOO + "\n", 0.3, 1), rank(tmp_path, 1, f"ConfigError: {REFUSAL}\n", 0.0, 2)]
    cfg = SimpleNamespace(hang_timeout_s=60.0, layout=SimpleNamespace(describe=lambda r: f"rank {r}"))
    with pytest.raises(ConfigError) as err:
        launch._watch(procs, cfg, tmp_path, None, grace_s=5.0)
    assert str(err.value) == REFUSAL


def test_without_a_refusal_the_first_failure_is_named(tmp_path):
    (tmp_path / "heartbeat").write_bytes(b"")
    procs = [rank(tmp_path, 0, GLOO + "\n", 0.0, 1), rank(tmp_path, 1, "RuntimeError: later\n", 0.5, 1)]
    cfg = SimpleNamespace(hang_timeout_s=60.0, layout=SimpleNamespace(describe=lambda r: f"rank {r}"))
    with pytest.raises(launch.RankFailure, match="rank 0 failed with exit code 1: RuntimeError: \\[gloo"):
        launch._watch(procs, cfg, tmp_path, None, grace_s=5.0)
