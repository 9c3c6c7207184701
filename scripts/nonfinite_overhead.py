"""What the NaN/Inf refusal of ``powersgd`` costs a step that trains (docs/ddp.md).

PowerSGD is torch's hook, so its refusal signal is a finiteness check of the averaged
bucket it returns (one sum; identical on every rank) plus a snapshot of the bucket's P/Q
memories; the other methods check only their few norms or scales. One process, a one-rank
gloo group, a 24 MiB bucket (six 1024x1024 parameters), ``powersgd:4:start=2`` (compressing),
one thread: prints the median of 7 calls of the bucket reduction and of the check alone.

    python scripts/nonfinite_overhead.py
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    from perfsim.runtime import grad_sync as gs

    params = [torch.nn.Parameter(torch.randn(1024, 1024)) for _ in range(6)]
    state = gs.GradSync("powersgd:4:start=2")
    state.bind([(f"p{i}", p) for i, p in enumerate(params)])
    flat0 = torch.randn(sum(p.numel() for p in params))

    def reduce() -> float:
        flat = flat0.clone()
        t = time.perf_counter()
        gs.reduce_bucket(state, 0, 1, params, flat, True)
        return time.perf_counter() - t

    def check() -> float:
        t = time.perf_counter()
        bool(torch.isfinite(flat0.sum()))
        return time.perf_counter() - t

    for fn in (reduce, reduce, reduce, check):  # past the vanilla-allreduce iterations
        fn()
    a = sorted(reduce() for _ in range(7))[3]
    b = sorted(check() for _ in range(7))[3]
    print(f"powersgd:4 bucket of {flat0.numel()} floats: reduce_bucket {a * 1e3:.1f} ms (median of 7), "
          f"the finiteness check of its output {b * 1e3:.2f} ms ({100 * b / a:.1f} %)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
