"""Progress on stderr: a tqdm bar on a terminal, one line per stage in logs and CI."""

import fcntl
import io
import os
import pty
import struct
import termios

from perfsim.progress import Progress


def test_log_gets_one_line_per_stage_and_no_bar():
    out = io.StringIO()  # not a TTY: a log file, a CI job
    p = Progress(5, enabled=True, prefix="x: ", stream=out)
    p.stage("first")
    p("a")
    p("b")
    p.stage("second")
    p.advance(3)
    p.note("a note")
    p.close()
    lines = out.getvalue().splitlines()
    assert p.bar is None and "\r" not in out.getvalue()
    assert lines[0] == "x: first ..."
    assert lines[1].startswith("x: first: 2 points in ") and lines[1].endswith(" s (2/5)")
    assert lines[2] == "x: second ..."
    assert lines[3] == "a note"
    assert lines[4].startswith("x: second: 3 points in ") and lines[4].endswith(" s (5/5)")
    assert len(lines) == 5


def test_no_progress_prints_only_notes():
    out = io.StringIO()
    p = Progress(2, enabled=False, stream=out)
    p.stage("s")
    p("a")
    p.note("kept")
    p.close()
    assert out.getvalue() == "kept\n"


def test_terminal_gets_a_tqdm_bar():
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    with os.fdopen(slave, "w") as tty:
        p = Progress(4, unit="pt", enabled=True, stream=tty)
        assert p.bar is not None
        p.stage("s")
        p("point one")
        p.close()
        tty.flush()
        drawn = os.read(master, 65536).decode()
    os.close(master)
    assert "\r" in drawn and "point one" in drawn and "s ..." not in drawn  # the bar, no stage lines


def _plan_piped(tmp_path, *extra, every="0"):
    """``perfsim plan ... 2>log </dev/null | cat``: stderr a file, stdout a pipe."""
    import subprocess
    import sys

    log = tmp_path / "log"
    cpu = os.path.join(os.path.dirname(__file__), "..", "..", "traces", "cpu-2core.json")
    with open(log, "w") as err, open(os.devnull) as devnull:
        proc = subprocess.run([sys.executable, "-m", "perfsim", "plan", "--model", "gpt2-tiny", "--nodes", "2",
                               "--global-batch", "8", "--profile", cpu, "--bandwidth", "100Mbps", *extra],
                              stdin=devnull, stdout=subprocess.PIPE, stderr=err, text=True, timeout=300,
                              env={**os.environ, "PERFSIM_PROGRESS_EVERY": every})
    return proc, log.read_text()


def test_plan_writes_progress_lines_into_a_log(tmp_path):
    import re

    proc, log = _plan_piped(tmp_path)
    assert proc.returncode == 0 and "candidates:" in proc.stdout
    lines = [l for l in log.splitlines() if l.startswith("perfsim plan: ")]
    assert len(lines) >= 2 and "\r" not in log  # plain lines, no bar
    counts = [re.match(r"perfsim plan: (\d+)/(\d+) configurations \(\d+%\), \d+ s", l) for l in lines]
    assert all(counts), lines
    done = [int(m.group(1)) for m in counts]
    assert done == sorted(done) and len({m.group(2) for m in counts}) == 1  # one total, advancing
    quiet, qlog = _plan_piped(tmp_path, "-q")
    assert quiet.returncode == 0 and qlog == ""  # -q silences it
    _, slow = _plan_piped(tmp_path, every="3600")  # the interval bounds the number of lines
    assert "configurations" not in slow
    bad, blog = _plan_piped(tmp_path, every="soon")
    assert bad.returncode == 2 and "PERFSIM_PROGRESS_EVERY='soon'" in blog
