"""How :mod:`perfsim.runtime.launch` starts a rank: by fork from a zygote, or a new interpreter.

A rank started as ``python -m perfsim.runtime.worker CONFIG`` spends ~2 CPU-s
importing torch and perfsim before it does any work (``benchmarks/bench_rank_start.py``).
The fast path instead asks a zygote (:mod:`perfsim.runtime.zygote`), a process that
imported them once, to fork the rank: the same rank (process group, log file,
environment, exit code, heartbeat), without the import. The zygote serves every run
the launching thread starts while the ranks' base environment, the interpreter and
the working directory stay the same (a change starts a new one, so nothing read at
import time is stale); it dies with its launcher and is stopped at exit.

``PERFSIM_RANK_START`` picks the method: ``fork`` (the default) or ``spawn`` (a new
interpreter per rank, ``subprocess.Popen``, as before). Ranks always ``spawn`` when
they run in emulated networks (each is started by ``ip netns exec`` in its own
namespace), under another interpreter than this one (``python=``), or off Linux.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from perfsim.errors import ConfigError

START_ENV = "PERFSIM_RANK_START"
METHODS = ("fork", "spawn")
# read by nothing at import (pytest sets its variable per test; this module reads START_ENV):
# a change does not need a new zygote
VOLATILE_ENV = ("PYTEST_CURRENT_TEST", START_ENV)


class ZygoteError(RuntimeError):
    """The zygote could not start or stopped answering; the message says why."""


def start_method(python: str, emulated: bool) -> str:
    """``fork`` or ``spawn`` for ranks started by ``python`` (see the module docstring)."""
    method = os.environ.get(START_ENV, "fork").strip().lower() or "fork"
    if method not in METHODS:
        raise ConfigError(f"{START_ENV}={os.environ[START_ENV]!r}: expected one of {', '.join(METHODS)}")
    if emulated or python != sys.executable or not sys.platform.startswith("linux"):
        return "spawn"
    return method


class ForkedRank:
    """A rank forked by a :class:`Zygote`, with the part of ``subprocess.Popen``'s
    interface the launcher uses (``pid``, ``returncode``, ``poll``, ``wait``,
    ``terminate``, ``kill``). ``returncode`` is negative for a signal, as Popen's."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, timeout=timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid the zygote already reaped
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """A running :mod:`perfsim.runtime.zygote` and the pipes to it."""

    def __init__(self, env: dict, python: str = sys.executable):
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([python, "-m", "perfsim.runtime.zygote", str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                     env=env, process_group=0)  # Ctrl-C at a terminal is the launcher's
        self.owner = os.getpid()
        self._buf, self._exits, self._eof = b"", {}, False
        self._lock = threading.Lock()
        # its torch import (~2.5 s) runs while the launcher goes on (its rendezvous store imports
        # torch too: on 2 cores the two overlap); the first start() waits for "ready"
        self.pid, self.startup_cpu_s = None, None

    def _wait_ready(self) -> None:
        if self.pid is not None:
            return
        try:
            first = self._reply(None)
        except BaseException:  # interrupted while it imports: leave nothing behind
            self.proc.kill()
            self.proc.wait()
            raise
        if not first.startswith("ready "):
            raise ZygoteError(self._why())
        _, self.pid, cpu = first.split()
        self.startup_cpu_s = float(cpu)

    def alive(self) -> bool:
        return not self._eof and self.proc.poll() is None and os.getpid() == self.owner

    def start(self, argv: list[str], env: dict, log: Path, pgid: int) -> ForkedRank:
        """Fork a rank running ``worker.main(argv)`` with ``env``, its stdout and stderr
        appended to ``log``, in process group ``pgid`` (0: a new group it leads)."""
        req = {"argv": argv, "env": env, "log": str(log), "pgid": pgid, "cwd": os.getcwd()}
        with self._lock:
            self._wait_ready()
            try:
                self.proc.stdin.write((json.dumps(req) + "\n").encode())
                self.proc.stdin.flush()
            except BrokenPipeError:
                self._eof = True
            line = self._reply(None)
        if not line.startswith("pid "):
            raise ZygoteError(self._why())
        return ForkedRank(self, int(line.split()[1]))

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The exit code of child ``pid`` once the zygote reported it (waiting up to
        ``timeout`` seconds, None: for ever). A zygote gone takes its children with it
        (``PR_SET_PDEATHSIG``): they count as SIGKILLed."""
        with self._lock:
            while pid not in self._exits:
                if self._eof:
                    return -signal.SIGKILL
                if not self._read(timeout):
                    return None
            return self._exits[pid]

    def close(self) -> None:
        """Stop the zygote (EOF on its requests) and reap it."""
        if os.getpid() != self.owner:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.errors.close()

    # -- the reply stream: "pid N" answers a request; "exit N CODE" lines come any time
    def _reply(self, timeout: float | None) -> str:
        while True:
            while b"\n" not in self._buf:
                if self._eof or not self._read_raw(timeout):
                    return ""
            line, self._buf = self._buf.split(b"\n", 1)
            text = line.decode()
            if text.startswith("exit "):
                _, pid, code = text.split()
                self._exits[int(pid)] = int(code)
            else:
                return text

    def _read(self, timeout: float | None) -> bool:
        """Take what the zygote wrote (exit reports); False when nothing came in time."""
        if b"\n" not in self._buf and (self._eof or not self._read_raw(timeout)):
            return False
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            kind, pid, *rest = line.decode().split()
            if kind == "exit":
                self._exits[int(pid)] = int(rest[0])
        return True

    def _read_raw(self, timeout: float | None) -> bool:
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], timeout)[0]:
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def _why(self) -> str:
        self.proc.kill()
        self.proc.wait()
        self.errors.seek(0)
        lines = [ln for ln in self.errors.read().decode(errors="replace").splitlines() if ln.strip()]
        detail = lines[-1] if lines else f"exit code {self.proc.returncode}"
        return f"the rank zygote stopped ({detail}); {START_ENV}=spawn starts each rank with its own interpreter"


_shared: dict = {}  # the main thread's zygote: {"key": ..., "zygote": Zygote}


def zygote_for(env: dict, python: str = sys.executable) -> tuple[Zygote, bool]:
    """A zygote for ranks whose environment is ``env`` (minus what changes per rank),
    and whether the caller owns it (must :meth:`Zygote.close` it when done). The main
    thread's zygote is shared by its runs; another thread gets one of its own, as a
    zygote dies with the thread that started it (``PR_SET_PDEATHSIG``)."""
    if threading.current_thread() is not threading.main_thread():
        return Zygote(env, python), True
    key = (python, os.getcwd(), sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV))
    held = _shared.get("zygote")
    if held is not None and (_shared["key"] != key or not held.alive()):
        _shared.clear()
        held.close()
        held = None
    if held is None:
        held = Zygote(env, python)
        _shared.update(key=key, zygote=held)
    return held, False


def _stop_shared() -> None:
    held = _shared.pop("zygote", None)
    if held is not None:
        held.close()


def _forget_in_child() -> None:  # a forked launcher must not talk to its parent's zygote
    held = _shared.pop("zygote", None)
    if held is not None:
        for f in (held.proc.stdin, held.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


atexit.register(_stop_shared)
os.register_at_fork(after_in_child=_forget_in_child)
