"""A SIGKILLed sweep leaves no pool workers and no temp folders."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perfsim import batch


def _children(pid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.add(int(d.name))
    return out


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        kids = _children(todo.pop())
        found |= kids
        todo.extend(kids)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killed_sweep_leaves_no_pool_and_no_temp_folder(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "perfsim", "sweep", "--pp", "2,4,8",
                             "--bandwidth", ",".join(f"{b}Mbps" for b in range(10, 400, 10)),
                             "--compress", "fp32,directq:fw4bw8,aqsgd:fw3bw6", "--out", str(tmp_path / "s.csv"),
                             "-j", "2", "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pool = set()
    try:
        deadline = time.monotonic() + 120
        while len(pool) < 2 and time.monotonic() < deadline:  # 2 forked workers
            assert proc.poll() is None, proc.communicate()
            pool = _descendants(proc.pid)
            time.sleep(0.2)
        assert len(pool) >= 2
        leftovers = list(Path(tempfile.gettempdir()).glob(f"{batch.POOL_DIR_PREFIX}{proc.pid}-*"))
        assert leftovers  # the pool's temp folder, named after the sweep (multiprocessing's goes inside)
        proc.kill()
        proc.wait()
        end = time.monotonic() + 30
        while any(_alive(p) for p in pool) and time.monotonic() < end:
            time.sleep(0.2)
        assert not [p for p in pool if _alive(p)], "pool processes outlived the killed sweep"
    finally:
        for p in _descendants(proc.pid) | pool:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    batch.remove_stale_pool_dirs()  # what the next pool (plan or sweep) does first
    assert not list(Path(tempfile.gettempdir()).glob(f"{batch.POOL_DIR_PREFIX}{proc.pid}-*"))
