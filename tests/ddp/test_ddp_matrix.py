"""The perfsim.ddp convergence matrix: every method x {fp32 model, bf16 model, resumed
halfway, an unused parameter, momentum SGD} trains to within 2x of its own uncompressed
baseline's loss, and the two replicas end bit-identical. The fp32 cells run 2 seeds (the
convergence claim must not rest on one lucky draw); the other conditions run seed 0: a
second seed takes exactly the code path of the first (only the weights, the data and the
compressor's random stream differ), and test_ddp_convergence.py holds every method to 2x
over 150 steps of digits with Adam and with momentum SGD as well.

One 2-rank gloo job runs the whole matrix (about 55 small trainings of a 16-32-4 MLP on
a synthetic 4-class task) and returns every cell's figures; a module-scoped fixture
caches them and one parametrized test per cell asserts. Baselines: DDP's own fp32
allreduce with the same optimizer (Adam, or SGD with momentum 0.9), model dtype and
seed; for 1-bit Adam ``torch.optim.Adam``, for 1-bit LAMB LAMB itself (1-bit LAMB whose
warm-up never ends: fp32 allreduce all along). 1-bit optimizers warm up for 20 % of the
run (``total_steps=``, the papers' 15-20 %); momentum SGD does not apply to them. The
resumed cell saves model, optimizer and hook state halfway, reloads them into fresh
objects and must also end bit-identical to the uninterrupted run of the same method.
"""

from __future__ import annotations

import io

import pytest
import torch

from _helpers import gloo_group, load_ranks, save_rank, spawn_ranks

WORLD, STEPS, BATCH = 2, 40, 16
GRAD_METHODS = ["qsgd-maxnorm:2", "qsgd-maxnorm:4", "qsgd-maxnorm-multiscale:4", "ecq:4",
                "randk-maxnorm:0.25:4", "powersgd:2"]
OPT_METHODS = ["onebit-adam", "onebit-lamb"]
CONDITIONS = ["fp32", "bf16", "resumed", "unused", "sgd"]
SEEDS = (0, 1)  # of the fp32 cells; the other conditions take SEEDS[0]
LR = {"adam": 1e-2, "sgd": 0.05, "onebit-adam": 1e-2, "onebit-lamb": 0.1}


def cells() -> list[tuple[str, str, int]]:
    """(method, condition, seed) of every cell (momentum SGD: gradient compressors only)."""
    return [(m, c, s) for m in GRAD_METHODS + OPT_METHODS for c in CONDITIONS
            for s in (SEEDS if c == "fp32" else SEEDS[:1]) if not (c == "sgd" and m in OPT_METHODS)]


def _baseline_of(method: str, condition: str) -> str:
    optim = {"onebit-adam": "adam", "onebit-lamb": "lamb"}.get(method, "sgd" if condition == "sgd" else "adam")
    return f"{optim}/{'fp32' if condition in ('resumed', 'sgd') else condition}"


class _Net(torch.nn.Module):
    def __init__(self, seed: int, unused: bool):
        super().__init__()
        torch.manual_seed(seed)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.spare = torch.nn.Linear(16, 4) if unused else None  # never in the forward pass

    def forward(self, x):
        return self.body(x)


def _batch(step: int, rank: int, seed: int, n: int = BATCH):
    g = torch.Generator().manual_seed(100_000 * seed + 1000 * step + rank)
    x = torch.randn(n, 16, generator=g)
    return x, (x[:, :4].argmax(1) + (torch.rand(n, generator=g) < 0.1).long()) % 4


def _eval_set():
    g = torch.Generator().manual_seed(999)
    x = torch.randn(512, 16, generator=g)
    return x, x[:, :4].argmax(1)


def _build(method: str, optim: str, dtype, seed: int, unused: bool):
    """(module, DDP model, optimizer, hook state or None)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfsim import ddp as pddp

    net = _Net(seed, unused).to(dtype)
    model = DDP(net, find_unused_parameters=unused)
    if method in OPT_METHODS or optim == "lamb":
        spec = "onebit-lamb" if optim == "lamb" else method
        kwargs = {"warmup": 10 * STEPS} if optim == "lamb" else {"total_steps": STEPS}
        return net, model, pddp.onebit_optimizer(model, spec, LR[spec if optim != "lamb" else "onebit-lamb"],
                                                 **kwargs), None
    state = pddp.attach(model, method, seed=seed)
    opt = (torch.optim.SGD(model.parameters(), lr=LR["sgd"], momentum=0.9) if optim == "sgd"
           else torch.optim.Adam(model.parameters(), lr=LR["adam"]))
    return net, model, opt, state


def _train(model, opt, dtype, rank, seed, start, steps):
    for step in range(start, start + steps):
        x, y = _batch(step, rank, seed)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x.to(dtype)).float(), y).backward()
        opt.step()


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _run(method: str, condition: str, seed: int, rank: int) -> dict:
    import torch.distributed as dist

    dtype = torch.bfloat16 if condition == "bf16" else torch.float32
    optim = "sgd" if condition == "sgd" else "adam"  # gradient compressors' optimizer
    unused = condition == "unused"
    net, model, opt, state = _build(method, optim, dtype, seed, unused)
    if condition == "resumed":
        _train(model, opt, dtype, rank, seed, 0, STEPS // 2)
        saved = _roundtrip({"model": net.state_dict(), "opt": opt.state_dict(),
                            "comm": state.state_dict() if state else None})
        net, model, opt, state = _build(method, optim, dtype, seed + 1000, unused)  # other weights
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        if state is not None:
            state.load_state_dict(saved["comm"])
        _train(model, opt, dtype, rank, seed, STEPS // 2, STEPS - STEPS // 2)
    else:
        _train(model, opt, dtype, rank, seed, 0, STEPS)
    x, y = _eval_set()
    with torch.no_grad():
        loss = float(torch.nn.functional.cross_entropy(net(x.to(dtype)).float(), y))
    flat = torch.cat([p.detach().float().reshape(-1) for p in net.parameters()])
    both = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(both, flat)
    out = {"loss": loss, "identical": all(torch.equal(both[0], b) for b in both[1:]), "params": flat}
    if unused:
        out["spare_unchanged"] = torch.equal(net.spare.weight.detach().float(),
                                             _Net(seed, True).to(dtype).spare.weight.float())
    return out


def _baseline_run(name: str, seed: int, rank: int) -> dict:
    optim, cond = name.split("/")
    dtype = torch.bfloat16 if cond == "bf16" else torch.float32
    unused = cond == "unused"
    if optim == "lamb":
        net, model, opt, _ = _build("onebit-lamb", "lamb", dtype, seed, unused)
    else:
        net, model, opt, _ = _build("fp32", optim, dtype, seed, unused)
    _train(model, opt, dtype, rank, seed, 0, STEPS)
    x, y = _eval_set()
    with torch.no_grad():
        return {"loss": float(torch.nn.functional.cross_entropy(net(x.to(dtype)).float(), y))}


def _worker(rank: int, port: int, out_dir: str) -> None:
    res: dict = {}
    with gloo_group(rank, WORLD, port):
        for base, seed in sorted({(_baseline_of(m, c), s) for m, c, s in cells()}):
            res[("baseline", base, seed)] = _baseline_run(base, seed, rank)
        for method, condition, seed in cells():
            res[(method, condition, seed)] = _run(method, condition, seed, rank)
    if rank == 0:
        save_rank(out_dir, rank, res)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_matrix")
    spawn_ranks(_worker, str(out), world=WORLD)  # one job for the whole matrix
    return load_ranks(out, 1)[0]  # what rank 0 saved


def test_baselines_learn(matrix):
    """The comparison means something: every baseline ends well below ln 4 = 1.39."""
    for key, r in matrix.items():
        if key[0] == "baseline":
            assert r["loss"] < 0.9, (key, r["loss"])


@pytest.mark.parametrize("method,condition,seed", cells(), ids=lambda v: str(v))
def test_cell_trains_like_its_baseline(matrix, method, condition, seed):
    r = matrix[(method, condition, seed)]
    base = matrix[("baseline", _baseline_of(method, condition), seed)]["loss"]
    assert r["identical"], "replicas differ"
    assert r["loss"] <= 2.0 * base, f"loss {r['loss']:.4f} vs baseline {base:.4f} ({r['loss'] / base:.2f}x)"
    if condition == "resumed":  # exact resume: the same parameters as without the interruption
        assert torch.equal(r["params"], matrix[(method, "fp32", seed)]["params"])
    if condition == "unused":
        assert r["spare_unchanged"]
