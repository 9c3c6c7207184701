"""The rank zygote: ``python -m perfsim.runtime.zygote LAUNCHER_PID``.

Imports torch and the worker once (what every ``python -m perfsim.runtime.worker``
pays again, ~2 CPU-s), then forks one child per request of its launcher
(:mod:`perfsim.runtime.rank_start`); each child becomes the rank the plain start
would have made -- its own process group, its log file on stdout and stderr, its
environment, :func:`perfsim.runtime.worker.main` -- the way multiprocessing's
forkserver (and Android's zygote) serve forks from a process that has already
loaded the heavy modules.

Fork safety: nothing here runs a torch operation, so torch's intra-op (OpenMP)
pool has never started; the only thread besides this one is OpenBLAS's (loaded by
numpy), which stops its workers around ``fork`` (``pthread_atfork``). The zygote
starts with the ranks' own environment (``OMP_NUM_THREADS`` included, which libgomp
reads when torch is loaded), and each child sets its environment before the worker
runs any torch code.

Protocol, one line each: the launcher writes a JSON request (``argv``, ``env``,
``log``, ``pgid``, ``cwd``) on the zygote's stdin; the zygote answers on its stdout
``ready PID CPU_S`` once (CPU_S: what its start-up cost), ``pid PID`` per request,
and ``exit PID CODE`` (``waitstatus_to_exitcode``: negative for a signal) when a
child ends. The zygote dies with its launcher (``PR_SET_PDEATHSIG``) and exits at
EOF on stdin; its children die with it in turn (``PERFSIM_LAUNCHER_PID`` names the
zygote to :func:`perfsim.runtime.worker.die_with_launcher`).
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import sys
import threading
import time
import traceback

import torch  # noqa: F401 -- the point: loaded once here, inherited by every child
import torch._dynamo  # noqa: F401 -- torch.optim imports it when a rank builds its optimizer (~1.2 CPU-s)
import torch.distributed  # noqa: F401

from perfsim.procs import die_with_parent, exit_rank
from perfsim.runtime import worker


def _write(fd: int, text: str) -> None:
    data = (text + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _become_rank(req: dict, zygote: int, private_fds: list[int]) -> None:
    """In the forked child: become the rank of ``req``; never returns."""
    code = 1
    try:
        with_pgid = int(req["pgid"])
        os.setpgid(0, with_pgid)  # rank 0 leads a new group; the others join it
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in private_fds:
            os.close(fd)
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"], PERFSIM_LAUNCHER_PID=str(zygote))
        sys.argv = [worker.__file__, *req["argv"]]
        print(f"perfsim: rank pid {os.getpid()} (process group {os.getpgrp()}) forked from the rank zygote "
              f"(pid {zygote}), started in {time.process_time():.3f} CPU-s: torch was already imported", flush=True)
        code = worker.main(list(req["argv"]))
    except BaseException:  # what an uncaught exception does to a fresh interpreter
        traceback.print_exc()
        code = 1
    finally:
        exit_rank(code)


def serve(launcher: int) -> None:
    die_with_parent(launcher)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to forward
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # stray output must not garble the replies
    os.close(devnull)
    if threading.active_count() != 1:
        raise RuntimeError(f"rank zygote: {threading.active_count()} Python threads before fork")
    gc.freeze()  # the children's collections skip what was imported: no copy-on-write of those pages
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    private = [requests, replies, wake_r, wake_w]
    me = os.getpid()
    _write(replies, f"ready {me} {time.process_time():.3f}")
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(requests, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        while True:
            ready = {key.fd for key, _ in sel.select()}
            if wake_r in ready:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                _reap(replies)
            if requests in ready:
                chunk = os.read(requests, 65536)
                if not chunk:  # the launcher is done (or gone): the children go with us
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    req = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        _become_rank(req, me, private)
                    try:  # also from here, so the group exists before the launcher hears the pid
                        os.setpgid(pid, int(req["pgid"]) or pid)
                    except OSError:
                        pass  # the child did it first (or is already gone: its exit follows)
                    _write(replies, f"pid {pid}")


def _reap(replies: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _write(replies, f"exit {pid} {os.waitstatus_to_exitcode(status)}")


if __name__ == "__main__":
    serve(int(sys.argv[1]))
