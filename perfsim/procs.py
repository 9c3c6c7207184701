"""Child processes that never outlive their parent, and leftovers of dead ones.

:func:`die_with_parent` asks Linux for SIGKILL when the parent dies
(``prctl(PR_SET_PDEATHSIG)``, prctl(2)), used by ``perfsim run``'s ranks and
``perfsim sweep``'s pool workers. :func:`exit_rank` ends a finished rank without
interpreter finalization. :func:`provably_dead` tells whether the
process that made a leftover (named with its pid) is gone, so that cleanup
never touches a live run's files.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path


def die_with_parent(expected_parent: int | None = None) -> None:
    """SIGKILL this process when its parent dies; exit at once if the parent
    (``expected_parent``) is already gone. No-op outside Linux."""
    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def exit_rank(code: int) -> None:
    """Leave a finished torch.distributed rank without interpreter finalization: its
    process group is destroyed and its outputs written, but gloo's C++ threads may
    still hold finished work whose tensors need the GIL while the interpreter is torn
    down -- std::terminate ("terminate called without an active exception"), SIGABRT,
    and a completed rank reported as dead. Flushes stdout and stderr first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_time(pid: int) -> float | None:
    """Wall-clock start time of process ``pid`` (None when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def provably_dead(pid: int, made_at: float) -> bool:
    """True when the process ``pid`` that made something at time ``made_at``
    is gone: no process has that pid, or the one that has it started later."""
    if not pid_alive(pid):
        return True
    started = start_time(pid)
    return started is not None and started > made_at + 1.0  # btime has 1 s precision
