"""Start the ranks of a job on this machine, watch them, stop them all on failure.

On one machine ``perfsim run`` starts ``pp * dp * tp`` worker processes
(``python -m perfsim.runtime.worker CONFIG``) with the standard
torch.distributed environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), optionally each inside its own network namespace
(:mod:`perfsim.netem`). Across machines the same worker code runs under
``torchrun``, which provides that environment; nothing here is needed then.
The launcher serves the ranks' rendezvous store itself, bound on a port the kernel
picks as it binds (:func:`perfsim.rank_store.hosted`; a port found free, released and
bound later by rank 0 could be taken in between); ranks in emulated networks meet
at port 29500 of rank 0's own namespace, which no other process shares.
Ranks in this machine's own network namespace are forked from a zygote that
imported torch once (:mod:`perfsim.runtime.rank_start`; ``PERFSIM_RANK_START=spawn``
starts a new interpreter per rank instead); both kinds are watched alike.

Failure handling: the parent polls its children. When one exits abnormally
(non-zero status or a signal), the others get ``grace_s`` seconds to notice
(gloo raises as soon as a peer's socket closes; the process-group timeout bounds
the rest), then the parent terminates them (SIGTERM, then SIGKILL) by pid, and
raises :class:`RankFailure` with one line naming the rank that failed first.
A rank that stops making progress (stopped, frozen, stuck holding the GIL) is
found by its heartbeat: every worker's heartbeat thread bumps its slot of the
shared file ``.ranks/heartbeat`` twice a second; a slot unchanged for
``cfg.hang_timeout_s`` (default 30 s) names that rank.

Workers die with their launcher: they share one process group (the launcher
forwards SIGTERM, SIGINT and SIGHUP to it, then stops them) and each asks the
kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), so even a
SIGKILLed launcher leaves no orphans.
Checkpoints are committed by rank 0 only after every rank saved
(:mod:`perfsim.runtime.checkpoint`), so the last one stays intact.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from perfsim import rank_store
from perfsim.errors import ConfigError
from perfsim.netem import EmulatedNetwork
from perfsim.result import atomic_write_text
from perfsim.runtime import rank_start


class RankFailure(RuntimeError):
    """A rank died or failed; the message names it."""


class TrainingDiverged(RuntimeError):
    """Activations, gradients or the loss became NaN/Inf (or too large to
    compress): not a usage error; the launcher reports the message as is. Defined here,
    beside :class:`RankFailure`, so that ``perfsim run``'s launcher, which catches both,
    does not import the worker (and torch: ~2.5 s) before its ranks start."""

    def __init__(self, step: int, stage: int):
        super().__init__(f"training diverged at step {step}, stage {stage}; try a lower learning rate")


def _first_report(ranks_dir: Path, world: int, kind: str) -> str | None:
    """The earliest ``kind: ...`` report (an error type written first in ``rank<r>.error``) of
    any of the ``world`` ranks, without its prefix; None if no rank made one."""
    reports = []
    for r in range(world):
        f = ranks_dir / f"rank{r}.error"
        try:
            line, when = f.read_text().partition("\n")[0], f.stat().st_mtime
        except OSError:
            continue
        if line.startswith(f"{kind}: "):
            reports.append((when, r, line[len(kind) + 2:]))
    return min(reports)[2] if reports else None


def _describe(rank: int, layout, code: int, err_file: Path) -> str:
    where = layout.describe(rank)
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        return f"{where} died: killed by {sig}"
    detail = ""
    if err_file.exists():
        detail = ": " + err_file.read_text().splitlines()[0]
    return f"{where} failed with exit code {code}{detail}"


HEARTBEAT_PERIOD_S = 0.5


def _heartbeats(path: Path) -> list[int]:
    data = path.read_bytes()
    return [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data) - 7, 8)]


@contextlib.contextmanager
def _forward_signals(procs: list[subprocess.Popen]):
    """While the ranks run, TERM/INT/HUP to the launcher go to their process
    group too, then unwind here as KeyboardInterrupt (so they are stopped and
    the namespaces removed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame):
        if procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(procs[0].pid, signum)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    old = {sig: signal.signal(sig, forward) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def launch_local(cfg, *, progress: Callable[[dict], None] | None = None, grace_s: float = 5.0,
                 python: str = sys.executable) -> None:
    """Run ``cfg`` with one process per rank on this machine; returns when all
    ranks finished successfully, raises :class:`RankFailure` otherwise."""
    method = rank_start.start_method(python, emulated=cfg.bandwidth_bps is not None)  # checked first
    out = Path(cfg.out)
    ranks_dir = out / ".ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    for f in ranks_dir.glob("rank*.error"):
        f.unlink()
    progress_file = ranks_dir / "progress.json"
    if progress_file.exists():
        progress_file.unlink()
    cfg_path = ranks_dir / "config.json"
    atomic_write_text(cfg_path, cfg.to_json())
    world = cfg.world_size
    heartbeat = ranks_dir / "heartbeat"
    heartbeat.write_bytes(bytes(8 * world))

    if cfg.bandwidth_bps is not None:
        net_ctx = EmulatedNetwork(world, cfg.bandwidth_bps, cfg.latency_s)
    else:
        net_ctx = contextlib.nullcontext(None)
    base_env = dict(os.environ)  # what every run's ranks share (a zygote's environment)
    base_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    base_env["PYTHONUNBUFFERED"] = "1"
    # the zygote first: it imports torch in its own process while this one serves the store
    zygote, own = rank_start.zygote_for(base_env) if method == "fork" else (None, False)
    procs: list = []  # subprocess.Popen, or rank_start.ForkedRank (the same interface)
    logs = []
    try:
        # emulated: rank 0 serves the store at a fixed port of its own namespace (env://); else this
        # process serves it, bound at a port the kernel picks as it binds (no window to lose it in)
        with net_ctx as net, (contextlib.nullcontext() if net else rank_store.hosted(world, cfg.timeout_s)) as host:
            run_env = dict(base_env, PERFSIM_LAUNCHER_PID=str(os.getpid()), PERFSIM_HEARTBEAT=str(heartbeat))
            rdzv_env = host.env() if host else {"MASTER_ADDR": net.address(0), "MASTER_PORT": "29500"}
            with _forward_signals(procs):
                _start_and_watch(procs, logs, cfg, world, run_env, rdzv_env, net,
                                 python, cfg_path, ranks_dir, progress, grace_s, zygote)
    except rank_start.ZygoteError as exc:
        _stop(procs, 0.0)
        raise RankFailure(f"{exc}; all {len(procs)} ranks started were stopped (logs: {ranks_dir})") from None
    except BaseException:
        _stop(procs, 0.0)
        raise
    finally:
        for log in logs:
            log.close()
        if own:
            zygote.close()


def _start_and_watch(procs, logs, cfg, world, base_env, rdzv_env, net, python,
                     cfg_path, ranks_dir, progress, grace_s, zygote=None) -> None:
    for r in range(world):
        env = dict(base_env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(world), **rdzv_env)
        if zygote is not None:  # forked: the same rank, the same group, without the torch import
            log = ranks_dir / f"rank{r}.log"
            log.write_bytes(b"")
            procs.append(zygote.start([str(cfg_path)], env, log, procs[0].pid if procs else 0))
            continue
        cmd = [python, "-m", "perfsim.runtime.worker", str(cfg_path)]
        if net:
            env["GLOO_SOCKET_IFNAME"] = net.ifname
            if net.app_latency_s:
                env["PERFSIM_APP_LATENCY_S"] = repr(net.app_latency_s)
                env["PERFSIM_APP_BANDWIDTH_BPS"] = repr(net.bandwidth_bps)
            cmd = net.wrap(r, cmd)
        log = open(ranks_dir / f"rank{r}.log", "wb")
        logs.append(log)
        # one process group for all ranks (pgid = rank 0's pid), apart from the terminal's
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      process_group=procs[0].pid if procs else 0))
    _watch(procs, cfg, ranks_dir, progress, grace_s)


def _watch(procs, cfg, ranks_dir: Path, progress, grace_s: float) -> None:
    progress_file = ranks_dir / "progress.json"
    last_seen = None
    beats = [0] * len(procs)
    changed = [time.monotonic()] * len(procs)
    while True:
        now = time.monotonic()
        for r, b in enumerate(_heartbeats(ranks_dir / "heartbeat")[:len(procs)]):
            if b != beats[r]:
                beats[r], changed[r] = b, now
        stalled = [r for r in range(len(procs)) if beats[r] and procs[r].poll() is None
                   and now - changed[r] > cfg.hang_timeout_s]
        if stalled:
            r = min(stalled, key=lambda x: changed[x])
            _stop(procs, 0.0)
            raise RankFailure(f"{cfg.layout.describe(r)} stopped making progress (no heartbeat for "
                              f"{now - changed[r]:.0f} s, --hang-timeout {cfg.hang_timeout_s:g}s); "
                              f"all {len(procs)} ranks stopped (logs: {ranks_dir})")
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            # prefer the rank killed by a signal, then the earliest error report
            def when(rc):
                r, c = rc
                f = ranks_dir / f"rank{r}.error"
                return (0 if c < 0 else 1, f.stat().st_mtime if f.exists() else float("inf"), r)

            first_rank, first_code = min(failed, key=when)
            _stop(procs, grace_s)
            diverged = _first_report(ranks_dir, len(procs), "TrainingDiverged")
            if diverged:
                raise RankFailure(diverged)
            # a user's mistake (a ConfigError), read once every rank has stopped, is the cause
            # whichever rank exited first: a rank refusing a corrupt checkpoint may still be
            # exiting when its peer, mid-exchange, dies of the closed connection
            user_error = _first_report(ranks_dir, len(procs), "ConfigError")
            if user_error:
                raise ConfigError(user_error)
            msg = _describe(first_rank, cfg.layout, first_code, ranks_dir / f"rank{first_rank}.error")
            raise RankFailure(f"{msg}; all {len(procs)} ranks stopped (logs: {ranks_dir})")
        if progress and progress_file.exists():
            try:
                info = json.loads(progress_file.read_text())
            except (OSError, json.JSONDecodeError):
                info = None
            if info and info != last_seen:
                last_seen = info
                progress(info)
        if all(c == 0 for c in codes):
            return
        time.sleep(0.1)
