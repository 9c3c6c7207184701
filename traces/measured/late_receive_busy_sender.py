"""A late receive while the sender computes (docs/validation.md, mechanism 6).

Two ranks in perfsim.netem namespaces (root) or over loopback ("lo"). Each
repeat: rank 0 sends one 8 KB message through execute mode's Messenger and then
either computes (a 1-thread matmul, ~60 ms) or sleeps as long; rank 1 posts its
receive 3 ms later and times it. Prints the receive's quantiles for both.

    python traces/measured/late_receive_busy_sender.py 1e9 150    # 1 Gbps link
    python traces/measured/late_receive_busy_sender.py lo 150      # loopback
"""

import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from perfsim.compression.base import Payload
from perfsim.runtime.pipeline import Messenger

POST_AFTER_S = 0.003


def worker(rank, ns, addr, port, repeats, mode, queue):
    if ns:
        from perfsim.calibrate.netlink import enter_namespace

        enter_namespace(ns)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
    msg = Messenger(torch.device("cpu"))
    payload, ids = Payload({"v": torch.ones(8, 256)}, (8, 256)), torch.arange(8)
    a = torch.randn(1600, 1600)
    t0 = time.perf_counter()
    torch.mm(a, a)
    busy_s = time.perf_counter() - t0
    waits = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            msg.send(payload, ids, 1)
            torch.mm(a, a) if mode == "compute" else time.sleep(busy_s)
            msg.wait_all()
        else:
            while time.perf_counter() - start < POST_AFTER_S:
                pass
            t = time.perf_counter()
            msg.recv(0)
            waits.append(time.perf_counter() - t)
    if rank == 1:
        queue.put(waits)
    dist.barrier()
    dist.destroy_process_group()


def measure(where: str, repeats: int, mode: str, port: int) -> list[float]:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    names, addr, net = [None, None], "127.0.0.1", None
    if where != "lo":
        from perfsim.calibrate.netlink import emulated_ranks

        net = emulated_ranks(2, float(where))
        names, addrs = net.__enter__()
        addr = addrs[0]
    try:
        procs = [ctx.Process(target=worker, args=(r, names[r], addr, port, repeats, mode, queue))
                 for r in range(2)]
        for p in procs:
            p.start()
        waits = queue.get()
        for p in procs:
            p.join()
    finally:
        if net is not None:
            net.__exit__(None, None, None)
    return waits


def main():
    where, repeats = sys.argv[1], int(sys.argv[2])
    for i, mode in enumerate(("compute", "sleep")):
        ms = np.array(measure(where, repeats, mode, 29650 + i)) * 1e3
        q = np.quantile(ms, [0.1, 0.25, 0.5, 0.75, 0.9])
        print(f"{where} sender {mode:7s}: receive ms mean {ms.mean():.2f} median {statistics.median(ms):.2f} "
              f"quantiles(10/25/50/75/90) {np.round(q, 2).tolist()}")


if __name__ == "__main__":
    main()
