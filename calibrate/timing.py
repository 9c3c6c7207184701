"""Timing one operation robustly: warm-up, repeats, median and spread.

On a GPU the time of each repeat comes from a pair of CUDA events recorded
around the operation on the current stream (kernel time, not launch time);
on the CPU from ``time.perf_counter`` around the call. The median is robust to
the occasional preemption of a shared machine; the spread is the inter-quartile
range, so a reader sees how noisy the machine was.
"""

from __future__ import annotations

import queue as queue_mod
import statistics
import time
from dataclasses import dataclass
from typing import Callable

from perfsim.errors import ConfigError


@dataclass(frozen=True)
class Timing:
    """Summary of repeated measurements of one operation (seconds)."""

    median_s: float
    spread_s: float  # inter-quartile range
    repeats: int
    samples: tuple[float, ...] = ()

    @property
    def min_s(self) -> float:
        return min(self.samples) if self.samples else self.median_s

    def record(self) -> dict:
        """The profile columns this timing fills (``time_s`` = the statistic chosen
        with :func:`set_statistic`: the median by default)."""
        t = self.min_s if STATISTIC == "min" else self.median_s
        return {"time_s": t, "spread_s": self.spread_s, "repeats": self.repeats}


#: which statistic ``Timing.record`` reports as ``time_s``: ``median`` (default) or
#: ``min`` -- on a machine shared with other jobs, interference only ever adds
#: time, so the minimum of the repeats estimates the undisturbed cost (the
#: advice of Python's ``timeit``); the profile's metadata records the choice.
STATISTIC = "median"
STATISTICS = ("median", "min")


def set_statistic(name: str) -> None:
    global STATISTIC
    if name not in STATISTICS:
        raise ConfigError(f"statistic {name!r}: choose from {', '.join(STATISTICS)}")
    STATISTIC = name


def summarize(samples: list[float]) -> Timing:
    """Median and IQR of raw samples."""
    if not samples:
        raise ValueError("summarize: no samples")
    xs = sorted(samples)
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = xs[-1] - xs[0]
    return Timing(statistics.median(xs), iqr, len(xs), tuple(samples))


_FLUSH: dict[str, object] = {}

#: bytes of the fresh mapping :func:`flush_caches` writes and unmaps on the CPU
CPU_FLUSH_BYTES = 8 * 2**20


def flush_caches(device: str = "cpu") -> None:
    """Leave the caches (and, on the CPU, the address translations) as a training
    step leaves them before a codec call.

    GPU: write a buffer twice the L2 (at least 256 MB), as Triton's ``do_bench``
    does before each timed kernel. CPU: map, write and unmap a fresh anonymous
    8 MB region (four times a core's L2). What a codec after a step pays is the
    step's freed mappings (the unmap drops the TLB entries, costly under nested
    paging) and an evicted L2, not a cold last-level cache (the measurements behind
    this choice: docs/validation.md, step 12 and "Measurement notes")."""
    import mmap

    import torch

    if device.startswith("cuda"):
        buf = _FLUSH.get(device)
        if buf is None:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 * 2**20
            nbytes = max(2 * l2, 256 * 2**20)
            buf = _FLUSH[device] = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        buf.zero_()
        return
    src = _FLUSH.get("cpu")
    if src is None:
        src = _FLUSH["cpu"] = b"\1" * CPU_FLUSH_BYTES
    region = mmap.mmap(-1, CPU_FLUSH_BYTES)  # a fresh mapping: every page faults in
    try:
        region.write(src)
    finally:
        region.close()  # munmap: its translations leave the TLB


def time_op(fn: Callable[[], object], *, warmup: int = 2, repeats: int = 5,
            setup: Callable[[], object] | None = None, device: str = "cpu",
            max_seconds: float | None = None, cold: bool = False,
            rel_spread: float | None = None) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    ``setup()`` runs untimed before every call (e.g. a forward pass before a
    timed backward); its return value is passed to ``fn`` when ``fn`` takes
    one argument (``fn(setup())``). ``cold`` flushes the caches
    (:func:`flush_caches`) after ``setup`` and before every call. On
    ``device="cuda"`` CUDA events time the call. ``max_seconds`` stops
    repeating early (keeping at least 3 samples) once the timed calls have used
    that much wall time -- big tensors on a slow machine would otherwise take
    minutes. ``rel_spread`` stops repeating once 3 or more samples agree: their
    inter-quartile range (range below 4 samples) is at most that fraction of
    their median -- repeats chosen by the measured spread.
    """
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats={repeats}, warmup={warmup}: need repeats >= 1, warmup >= 0")
    use_cuda = device.startswith("cuda")
    if use_cuda:
        import torch

        sync = torch.cuda.synchronize
    else:
        def sync():
            return None

    def prepare():
        arg = setup() if setup is not None else None
        if cold:
            flush_caches(device)
        return arg

    for _ in range(warmup):
        arg = prepare()
        fn(arg) if setup is not None else fn()
    sync()
    samples: list[float] = []
    begin = time.perf_counter()
    for _ in range(repeats):
        arg = prepare()
        if use_cuda:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            sync()
            start.record()
            fn(arg) if setup is not None else fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(arg) if setup is not None else fn()
            samples.append(time.perf_counter() - t0)
        if len(samples) >= 3:
            if max_seconds is not None and time.perf_counter() - begin > max_seconds:
                break
            if rel_spread is not None:
                t = summarize(samples)
                if t.spread_s <= rel_spread * t.median_s:
                    break
    return summarize(samples)


def _concurrent_worker(fn, arg, queue, barrier, statistic: str) -> None:  # pragma: no cover - subprocess
    set_statistic(statistic)
    barrier.wait()
    queue.put(fn(arg))


def measure_concurrently(fn: Callable, arg, ranks: int, timeout_s: float = 600.0) -> list[dict]:
    """Run ``fn(arg)`` (a module-level function returning timing records) in ``ranks``
    spawned processes released together, as co-located ranks run, and merge their
    records row by row: the mean of their ``time_s`` and ``spread_s`` (the processes
    are symmetric, so none of them is "the" rank), with ``concurrent_ranks`` = ``ranks``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(ranks)
    procs = [ctx.Process(target=_concurrent_worker, args=(fn, arg, queue, barrier, STATISTIC), daemon=True)
             for _ in range(ranks)]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < ranks:
            try:
                results.append(queue.get(timeout=0.5))
            except queue_mod.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (0, None)]
                if dead or time.monotonic() > deadline:
                    raise ConfigError(f"concurrent timing ({getattr(fn, '__name__', fn)} in {ranks} processes): "
                                      + (f"a process died (exit codes {dead})" if dead
                                         else f"timed out after {timeout_s:.0f} s")) from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    merged = []
    for rows in zip(*results):
        n = len(rows)
        merged.append({**rows[0], "time_s": sum(r["time_s"] for r in rows) / n,
                       "spread_s": sum(r["spread_s"] for r in rows) / n, "concurrent_ranks": ranks})
    return merged
