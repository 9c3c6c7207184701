"""A late receive while the sender computes (docs/validation.md, mechanism 6).

Two ranks in perfsim.netem namespaces (root) or over loopback ("lo"). Each
repeat: rank 0 sends one message through execute mode's Messenger and then
either computes (a 1-thread matmul, ~60 ms) or sleeps as long; rank 1 waits
3 ms and times its receive, which it either posts only then (``late``) or
posted before the send (``ahead``, what execute mode does since the stall was
found). Prints the receive's quantiles for each (sender, receive) pair.

    python traces/measured/late_receive_busy_sender.py 1e9 150           # 1 Gbps, 8 KB
    python traces/measured/late_receive_busy_sender.py 3e8 60 262144     # 300 Mbps, 256 KB
    python traces/measured/late_receive_busy_sender.py lo 150            # loopback
"""

import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from perfsim.compression.base import Payload
from perfsim.runtime import Messenger, header_capacity

POST_AFTER_S = 0.003


def worker(rank, ns, addr, port, repeats, sender, receive, nbytes, queue):
    if ns:
        from perfsim.calibrate.netlink import enter_namespace

        enter_namespace(ns)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
    msg = Messenger(torch.device("cpu"), header_capacity(8))
    payload, ids = Payload({"v": torch.ones(8, nbytes // 32)}, (8, nbytes // 32)), torch.arange(8)
    a = torch.randn(1600, 1600)
    t0 = time.perf_counter()
    torch.mm(a, a)
    busy_s = time.perf_counter() - t0
    if rank == 0:  # the link's self-describing first message, untimed
        msg.send(payload, ids, 1)
        msg.wait_all()
    else:
        msg.recv(0)
    waits = []
    for _ in range(repeats):
        if rank == 1 and receive == "ahead":
            msg.post(0, payload.nbytes)
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            msg.send(payload, ids, 1)
            torch.mm(a, a) if sender == "compute" else time.sleep(busy_s)
            msg.wait_all()
        else:
            while time.perf_counter() - start < POST_AFTER_S:
                pass
            t = time.perf_counter()
            msg.recv(0, payload.nbytes)
            waits.append(time.perf_counter() - t)
    if rank == 1:
        queue.put(waits)
    dist.barrier()
    dist.destroy_process_group()


def measure(where: str, repeats: int, sender: str, receive: str, nbytes: int, port: int) -> list[float]:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    names, addr, net = [None, None], "127.0.0.1", None
    if where != "lo":
        from perfsim.calibrate.netlink import emulated_ranks

        net = emulated_ranks(2, float(where))
        names, addrs = net.__enter__()
        addr = addrs[0]
    try:
        procs = [ctx.Process(target=worker, args=(r, names[r], addr, port, repeats, sender, receive,
                                                  nbytes, queue)) for r in range(2)]
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
    nbytes = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
    port = 29650
    for sender in ("compute", "sleep"):
        for receive in ("late", "ahead"):
            port += 1
            ms = np.array(measure(where, repeats, sender, receive, nbytes, port)) * 1e3
            q = np.quantile(ms, [0.1, 0.25, 0.5, 0.75, 0.9])
            print(f"{where} {nbytes} B, sender {sender:7s}, receive {receive:5s}: ms mean {ms.mean():.2f} "
                  f"median {statistics.median(ms):.2f} quantiles(10/25/50/75/90) {np.round(q, 2).tolist()}")


if __name__ == "__main__":
    main()
