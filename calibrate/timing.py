"""Timing one operation robustly: warm-up, repeats, median and spread.

On a GPU the time of each repeat comes from a pair of CUDA events recorded
around the operation on the current stream (kernel time, not launch time);
on the CPU from ``time.perf_counter`` around the call. The median is robust to
the occasional preemption of a shared machine; the spread is the inter-quartile
range, so a reader sees how noisy the machine was.
"""

from __future__ import annotations

import os
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


def last_level_cache_bytes(default: int = 32 * 2**20) -> int:
    """Size of the CPU's largest cache (Linux sysfs), or ``default``."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(base, entry, "size")) as fh:
                text = fh.read().strip().upper()
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
    except (OSError, ValueError):
        pass
    return best or default


_FLUSH: dict[str, object] = {}


def flush_caches(device: str = "cpu") -> None:
    """Leave the caches (and, on the CPU, the address translations) as a training
    step leaves them before a codec call.

    GPU: write a buffer twice the L2 (at least 256 MB), as Triton's ``do_bench``
    does before each timed kernel. CPU: allocate, write and free a fresh buffer
    twice the last-level cache -- what a forward or backward does with its
    activations. Rewriting one persistent buffer is not enough on the CPU:
    measured on this 2-core VM, ``directq:4`` of a (8, 64, 128) activation takes
    0.25 ms hot, 0.25 ms after rewriting a persistent buffer, but 0.51 ms after a
    GPT stage's forward and backward and 0.51 ms after a fresh buffer (the
    freed mapping also drops the TLB entries, which nested paging makes costly);
    inside ``perfsim run`` the same call takes 0.48 ms."""
    import torch

    if device.startswith("cuda"):
        buf = _FLUSH.get(device)
        if buf is None:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 * 2**20
            nbytes = max(2 * l2, 256 * 2**20)
            buf = _FLUSH[device] = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        buf.zero_()
        return
    torch.zeros(2 * last_level_cache_bytes() // 4, dtype=torch.float32, device=device)


def time_op(fn: Callable[[], object], *, warmup: int = 2, repeats: int = 5,
            setup: Callable[[], object] | None = None, device: str = "cpu",
            max_seconds: float | None = None, cold: bool = False) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    ``setup()`` runs untimed before every call (e.g. a forward pass before a
    timed backward); its return value is passed to ``fn`` when ``fn`` takes
    one argument (``fn(setup())``). ``cold`` flushes the caches
    (:func:`flush_caches`) after ``setup`` and before every call. On
    ``device="cuda"`` CUDA events time the call. ``max_seconds`` stops
    repeating early (keeping at least 3 samples) once the timed calls have used
    that much wall time -- big tensors on a slow machine would otherwise take
    minutes.
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
        if max_seconds is not None and len(samples) >= 3 and time.perf_counter() - begin > max_seconds:
            break
    return summarize(samples)
