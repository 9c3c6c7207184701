"""Compute slowdown while communication runs on the same device.

Communication that overlaps compute takes resources from it: NCCL kernels
occupy SMs and memory bandwidth, gloo takes host cores and memory bandwidth.
Each rank times the same compute kernel (a ``KERNEL_N`` x ``KERNEL_N`` fp32
matmul) alone, then while a background thread runs ``COMM_CALLS`` allreduces of
``COMM_BYTES`` on every rank at once; only the kernel samples that finished
while the allreduces were running count. Two records (op ``interference``):
``<backend> alone`` and ``<backend> allreduce``, whose ratio minus one is the
slowdown the engine applies while a device's compute and communication overlap
(:func:`perfsim.engine.plan.comm_slowdown`).
"""

from __future__ import annotations

import threading
import time

KERNEL_N = 384
COMM_BYTES = 4 * 2**20
COMM_CALLS = 40
#: kernel samples alone: as many as under traffic would give on a fast link, so the
#: baseline's median is as steady as the other's (15 let one slow phase of a 2-core
#: VM move it by 40 %)
SAMPLES = 60


def measure(rank: int, device, world: int, backend: str) -> list[dict]:
    """Run on every rank (inside an initialised process group); returns raw items
    ``{"op": "interference", "name": ..., "samples": [...]}`` for both conditions."""
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

    for _ in range(3):
        kernel()
    dist.barrier()  # every rank done with the previous op's traffic: "alone" is alone
    alone = [kernel() for _ in range(SAMPLES)]
    buf = torch.ones(COMM_BYTES // 4, device=device)
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def comm() -> None:
        if stream is not None:
            with torch.cuda.stream(stream):
                for _ in range(COMM_CALLS):
                    dist.all_reduce(buf)
                stream.synchronize()
        else:
            for _ in range(COMM_CALLS):
                dist.all_reduce(buf)

    dist.barrier()
    worker = threading.Thread(target=comm, daemon=True)
    worker.start()
    busy = []
    while worker.is_alive():
        t = kernel()
        if worker.is_alive():
            busy.append(t)
    worker.join()
    dist.barrier()
    size = 3 * 4 * KERNEL_N * KERNEL_N
    return [{"op": "interference", "name": f"{backend} alone", "size_bytes": size, "samples": alone},
            {"op": "interference", "name": f"{backend} allreduce", "size_bytes": COMM_BYTES,
             "samples": busy or alone}]
