"""Compute slowdown while communication runs on the same device.

Communication that overlaps compute takes resources from it: NCCL kernels
occupy SMs and memory bandwidth, gloo takes host cores and memory bandwidth, and
over a shaped link the kernel's veth / qdisc path (a timer and a wakeup per paced
packet) runs on the same cores. Each rank times the same compute kernel (a
``KERNEL_N`` x ``KERNEL_N`` fp32 matmul) alone and while a background thread runs
allreduces of ``COMM_BYTES`` on every rank at once (only the kernel samples that
finished while the allreduces were running count), in ``ROUNDS`` alternating
windows, one median each: a shared machine's slow phases then fall on both
conditions alike, and the records' median over windows leaves a slow window out (one
block of each let such a phase swing the ratio between -43 % and +27 %;
docs/validation.md). Each busy window carries about ``BUSY_S`` of traffic at the
link's rate. Two records (op ``interference``): ``<backend> alone`` and
``<backend> allreduce``, whose ratio minus one is the slowdown the engine applies
while a device's compute and communication overlap
(:func:`perfsim.engine.plan.comm_slowdown`).
"""

from __future__ import annotations

import math
import statistics
import threading
import time

KERNEL_N = 384
#: one allreduce's buffer: a pipeline message's size (gpt2-tiny's 256 KB activation)
COMM_BYTES = 256 * 2**10
#: alternating (alone, busy) windows
ROUNDS = 12
#: kernel samples per alone window
ALONE_SAMPLES = 12
#: seconds of traffic per busy window at the link's rate (loopback: as if 10 Gbps)
BUSY_S = 0.15
LOOPBACK_BPS = 10e9


def calls_per_window(link_bps: float | None, world: int) -> int:
    """Allreduces per busy window: about ``BUSY_S`` of a ring allreduce's bytes
    (``2 (n-1)/n`` of the buffer per rank) at ``link_bps``; the same on every rank."""
    per_call = 2 * (world - 1) / world * COMM_BYTES * 8 / (link_bps or LOOPBACK_BPS)
    return max(2, min(400, math.ceil(BUSY_S / per_call)))


def measure(rank: int, device, world: int, backend: str, link_bps: float | None = None,
            rounds: int | None = None) -> list[dict]:
    """Run on every rank (inside an initialised process group); returns raw items
    ``{"op": "interference", "name": ..., "samples": [...]}`` for both conditions, one
    sample per window of ``rounds`` (None: :data:`ROUNDS`)."""
    import torch
    import torch.distributed as dist

    a = torch.randn(KERNEL_N, KERNEL_N, device=device)
    b = torch.randn(KERNEL_N, KERNEL_N, device=device)

    def kernel() -> float:
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    buf = torch.ones(COMM_BYTES // 4, device=device)
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    calls = calls_per_window(link_bps, world)

    def comm() -> None:
        if stream is not None:
            with torch.cuda.stream(stream):
                for _ in range(calls):
                    dist.all_reduce(buf)
                stream.synchronize()
        else:
            for _ in range(calls):
                dist.all_reduce(buf)

    for _ in range(3):
        kernel()
    alone, busy = [], []  # one median per window
    for _ in range(ROUNDS if rounds is None else rounds):
        dist.barrier()  # every rank done with the last window's traffic: "alone" is alone
        alone.append(statistics.median(kernel() for _ in range(ALONE_SAMPLES)))
        dist.barrier()
        worker = threading.Thread(target=comm, daemon=True)
        worker.start()
        window = []
        while worker.is_alive():
            t = kernel()
            if worker.is_alive():
                window.append(t)
        worker.join()
        if window:
            busy.append(statistics.median(window))
    dist.barrier()
    size = 3 * 4 * KERNEL_N * KERNEL_N
    return [{"op": "interference", "name": f"{backend} alone", "size_bytes": size, "samples": alone},
            {"op": "interference", "name": f"{backend} allreduce", "size_bytes": COMM_BYTES,
             "samples": busy or alone}]
