"""A user's DDP training script on perfsim.ddp, run by tests/ddp/test_ddp.py under torchrun.

    torchrun --nproc_per_node 2 tests/ddp/ddp_script.py MODE[,MODE...] OUT_DIR

MODE: ``first`` (for every method: 2N steps straight, then N steps + checkpoint),
``resume`` (fresh processes: load each checkpoint, N more steps), ``features``
(find_unused_parameters, bf16/fp16 parameters, no_sync, two DDP models),
``errors`` (wrong use), ``world1`` (loads the 2-rank checkpoints into states of a
1-rank data-parallel group).
Several modes run one after the other in the same processes (one job start for all).
Every rank writes ``OUT_DIR/<mode>-rank<r>.pt``; the test compares them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from perfsim import ddp as pddp
from perfsim.errors import ConfigError

GRAD_METHODS = ["fp32", "fp16", "bf16", "qsgd-maxnorm:4", "qsgd-maxnorm:2", "qsgd-maxnorm-multiscale:4",
                "randk-maxnorm:0.25:4", "ecq:4", "qsgd:4", "powersgd:2"]
OPT_METHODS = ["onebit-adam", "onebit-lamb"]
N = 5


def mlp(width: int = 24, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 4))


def batch(step: int, rank: int, n: int = 16):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(n, 16, generator=g)
    return x, (x[:, :4].argmax(1) + (torch.rand(n, generator=g) < 0.1).long()) % 4


def build(method: str, model: torch.nn.Module):
    """DDP model + optimizer + state for ``method`` (small buckets: several per model)."""
    ddp = DDP(model, bucket_cap_mb=0.002)
    if method in OPT_METHODS:
        return ddp, pddp.onebit_optimizer(ddp, method, lr=1e-2, warmup=3), None
    state = pddp.CompressionState(method, seed=3)
    ddp.register_comm_hook(state, pddp.hook)  # the torch convention
    return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-2), state


def train(ddp, opt, start: int, steps: int, rank: int) -> None:
    for step in range(start, start + steps):
        x, y = batch(step, rank)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def mode_first(out: Path, rank: int) -> dict:
    res = {}
    for method in GRAD_METHODS + OPT_METHODS:
        ddp, opt, state = build(method, mlp())
        train(ddp, opt, 0, 2 * N, rank)
        res[method] = {"straight": params(ddp.module),
                       "wire_bytes": (state or opt).wire_bytes}
        ddp, opt, state = build(method, mlp())
        train(ddp, opt, 0, N, rank)
        ckpt = {"model": ddp.module.state_dict(), "optim": opt.state_dict(),
                "comm": state.state_dict() if state else None, "rng": torch.get_rng_state()}
        torch.save(ckpt, out / f"ckpt-{method.replace(':', '_')}-{rank}.pt")
    return res


def mode_resume(out: Path, rank: int) -> dict:
    res = {}
    for method in GRAD_METHODS + OPT_METHODS:
        ddp, opt, state = build(method, mlp(seed=99))  # other initial values: the load must restore all
        ckpt = torch.load(out / f"ckpt-{method.replace(':', '_')}-{rank}.pt", weights_only=True)
        ddp.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        if state:
            state.load_state_dict(ckpt["comm"])
        torch.set_rng_state(ckpt["rng"])
        train(ddp, opt, N, N, rank)
        res[method] = {"resumed": params(ddp.module), "wire_bytes": (state or opt).wire_bytes}
    return res


def mode_features(out: Path, rank: int) -> dict:
    res = {}

    class Branchy(torch.nn.Module):  # one branch never used: find_unused_parameters=True
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.used = torch.nn.Linear(16, 4)
            self.unused = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.used(x)

    for method in ("qsgd-maxnorm:4", "ecq:4", "powersgd:2"):
        model = DDP(Branchy(), find_unused_parameters=True)
        state = pddp.attach(model, method)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        init = model.module.unused.weight.detach().clone()
        train(model, opt, 0, 4, rank)
        res[("unused", method)] = (params(model.module), torch.equal(model.module.unused.weight, init))
    for dtype in (torch.bfloat16, torch.float16):
        for method in ("qsgd-maxnorm:4", "powersgd:2", "onebit-adam"):
            net = mlp().to(dtype)
            model = DDP(net)
            if method == "onebit-adam":
                opt = pddp.onebit_optimizer(model, method, lr=1e-2, warmup=2)
            else:
                pddp.attach(model, method)
                opt = torch.optim.SGD(model.parameters(), lr=0.05)
            for step in range(5):
                x, y = batch(step, rank)
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x.to(dtype)).float(), y).backward()
                opt.step()
            res[(str(dtype), method)] = params(net)
    # no_sync accumulation: 2 micro-batches, the second synchronises; with fp32 this is
    # DDP's own result (no hook) on the same micro-batches
    for method in ("fp32", "qsgd-maxnorm:4"):
        for hooked in (True, False) if method == "fp32" else (True,):
            model = DDP(mlp())
            state = pddp.attach(model, method) if hooked else None
            for step in range(3):
                with model.no_sync():
                    x, y = batch(step, rank)
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                x, y = batch(step + 100, rank)
                torch.nn.functional.cross_entropy(model(x), y).backward()
            res[("no_sync", method, hooked)] = [p.grad.clone() for p in model.module.parameters()]
            if state is not None:
                res[("no_sync_bytes", method)] = state.wire_bytes
    # two DDP models in one process, each with its own state, trained in alternation
    a, b = DDP(mlp(seed=1)), DDP(mlp(width=12, seed=2))
    sa, sb = pddp.attach(a, "ecq:4"), pddp.CompressionState("qsgd-maxnorm:2")
    b.register_comm_hook(sb, pddp.hook)
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    for step in range(4):
        train(a, oa, step, 1, rank)
        train(b, ob, step, 1, rank)
    res["two_models"] = (params(a.module), params(b.module), sorted(sa.compressors), sorted(sb.compressors))
    return res


def _error(fn) -> str:
    try:
        fn()
    except ConfigError as exc:
        return str(exc)
    return "no error"


def mode_errors(out: Path, rank: int) -> dict:
    res = {"unknown": _error(lambda: pddp.CompressionState("qsgd-maxnrom:4")),
           "optimizer_as_state": _error(lambda: pddp.CompressionState("onebit-adam")),
           "not_optimizer": _error(lambda: pddp.onebit_optimizer(DDP(mlp()), "qsgd-maxnorm:4", lr=1e-3))}

    def no_hook():  # the 1-bit optimizer on the inner module of a DDP model that still allreduces
        model = DDP(mlp())
        opt = pddp.onebit_optimizer(model.module, "onebit-adam", lr=1e-3)
        train(model, opt, 0, 1, rank)
    res["onebit_without_hook"] = _error(no_hook)

    def twice():
        model = DDP(mlp())
        pddp.attach(model, "fp16")
        pddp.onebit_optimizer(model, "onebit-lamb", lr=1e-3)
    res["second_hook"] = _error(twice)
    return res


def mode_world1(out: Path, rank: int) -> dict:
    """Each rank's 2-rank checkpoint loaded by a state whose data-parallel group is that rank
    alone (as in a job with one replica): refused where the state is per rank."""
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]  # every rank makes every group
    res = {}
    for method in ("ecq:4", "powersgd:2", "fp16"):  # fp16: a cast has no per-rank state
        ckpt = torch.load(out / f"ckpt-{method.replace(':', '_')}-{rank}.pt", weights_only=True)
        state = pddp.CompressionState(method, groups[rank], seed=3)
        res[method] = _error(lambda: state.load_state_dict(ckpt["comm"]))
    return res


def run_modes(modes: str, out: Path) -> None:
    """The comma-separated ``modes``, one after the other, in this rank (group initialised)."""
    rank = dist.get_rank()
    table = {"first": mode_first, "resume": mode_resume, "features": mode_features,
             "errors": mode_errors, "world1": mode_world1}
    for mode in modes.split(","):
        torch.save(table[mode](out, rank), out / f"{mode}-rank{rank}.pt")
        dist.barrier()  # every rank done with this mode's collectives before the next mode


def forked_rank(rank: int, port: int, modes: str, out: str) -> None:
    """:func:`run_modes` in a rank of ``_helpers.spawn_ranks`` (a fresh process forked from
    the tests' preloaded forkserver) instead of a torchrun job."""
    from _helpers import gloo_group

    with gloo_group(rank, 2, port):
        run_modes(modes, Path(out))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("modes", help="comma-separated")
    ap.add_argument("out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    run_modes(args.modes, Path(args.out))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from perfsim.procs import exit_rank

    exit_rank(main())  # a finished rank: no interpreter finalization (gloo threads can abort it)
