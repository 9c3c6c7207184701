"""A NaN/Inf gradient on one rank under every perfsim.ddp gradient hook: every rank raises
the same one-line ConfigError naming the step, the bucket (its parameter names), the
parameter and the rank; nobody hangs; the hook's state (error feedback, random counters,
PowerSGD's memories, the step count) is exactly as before the refused step.

Two real gloo ranks, one spawn for every case. Casts (fp32/fp16/bf16) pass NaN/Inf
through like DDP's own allreduce (docs/ddp.md: torch.amp.GradScaler relies on it).
"""

from __future__ import annotations

import io

import pytest
import torch

from perfsim.errors import ConfigError

from _helpers import gloo_group, run_ranks, same_state, save_rank

WORLD = 2
GOOD_STEPS = 3          # the refused step is step GOOD_STEPS + 1
BAD_RANK = 1
NAN, INF, HUGE = "nan", "inf", "huge"  # 3e38 per value: finite, but an L2 norm overflows
VALUES = {NAN: float("nan"), INF: float("inf"), HUGE: 3e38}
# (spec, poisoned parameter, value); 2.weight lies in canonical bucket 0, 0.weight in bucket 1
CASES = [("qsgd-maxnorm:4", "2.weight", NAN), ("qsgd-maxnorm:2", "0.weight", INF),
         ("qsgd-maxnorm-multiscale:4", "2.weight", NAN), ("randk-maxnorm:0.25:4", "2.weight", NAN),
         ("ecq:4", "2.weight", INF), ("ecq:4", "2.weight", HUGE), ("qsgd:4", "2.weight", NAN),
         ("onebit", "2.weight", NAN), ("directq:4", "2.weight", NAN), ("topk:0.2:8", "2.weight", INF),
         ("powersgd:2:start=2", "2.weight", NAN),
         ("powersgd:2:start=9", "2.weight", NAN)]


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 24),
                               torch.nn.ReLU(), torch.nn.Linear(24, 4))


def _loss(model, step: int, rank: int):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 16, generator=g)
    return torch.nn.functional.cross_entropy(model(x), torch.randint(0, 4, (8,), generator=g))


def _copy(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _poison(model, name: str, value: float, rank: int):
    """A gradient hook putting ``value`` into parameter ``name``'s gradient on BAD_RANK
    (runs before DDP's reducer sees the gradient)."""
    p = dict(model.named_parameters())[name]

    def hook(grad):
        if rank != BAD_RANK:
            return grad
        grad = grad.clone()
        grad[1, 3] = VALUES[value]
        if value == HUGE:
            grad[1, :] = VALUES[value]  # finite, but the bucket's L2 norm overflows float32
        return grad
    return p.register_hook(hook)


def _worker(rank: int, port: int, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfsim import ddp as pddp

    res: dict = {}
    with gloo_group(rank, WORLD, port):
        for spec, name, value in CASES + [("fp16", "2.weight", NAN)]:
            model = _mlp()
            ddp = DDP(model, bucket_cap_mb=0.002)  # two canonical buckets
            state = pddp.CompressionState(spec, seed=3)
            ddp.register_comm_hook(state, pddp.hook)  # the torch convention: DDP's bucket cap
            for step in range(GOOD_STEPS):
                ddp.zero_grad(set_to_none=True)
                _loss(ddp, step, rank).backward()
            before = _copy(state.state_dict())
            handle = _poison(model, name, value, rank)
            ddp.zero_grad(set_to_none=True)
            try:
                _loss(ddp, GOOD_STEPS, rank).backward()
                msg = "no error"
            except ConfigError as exc:
                msg = str(exc)
            handle.remove()
            finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
            res[(spec, name, value)] = (msg, same_state(before, _copy(state.state_dict())), finite)
        # the pipeline-stage path (CompressionState.sync, no DDP): the same bucket code
        model = _mlp()
        state = pddp.CompressionState("qsgd-maxnorm:4")
        for step in range(GOOD_STEPS + 1):
            model.zero_grad(set_to_none=True)
            _loss(model, step, rank).backward()
            if step == GOOD_STEPS and rank == BAD_RANK:
                model[4].bias.grad[2] = float("nan")
            try:
                state.sync(model.named_parameters())
                msg = "no error"
            except ConfigError as exc:
                msg = str(exc)
        res["sync"] = msg
        save_rank(out_dir, rank, res)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(_worker, tmp_path_factory.mktemp("nonfinite"), world=WORLD)


@pytest.mark.parametrize("spec,name,value", CASES, ids=[f"{s}-{n}-{v}" for s, n, v in CASES])
def test_every_rank_raises_the_same_error_and_nothing_changes(ranks, spec, name, value):
    msgs = [ranks[r][(spec, name, value)][0] for r in range(WORLD)]
    assert msgs[0] == msgs[1], msgs  # one error, the same on every rank
    msg = msgs[0]
    assert msg.startswith(f"perfsim.ddp {spec}: gradient "), msg
    assert f"at step {GOOD_STEPS + 1}," in msg, msg
    bucket = "bucket 0 (4.bias..2.weight)" if name == "2.weight" else "bucket 1 (0.bias..0.weight)"
    assert bucket in msg, msg
    if value == HUGE:
        assert f"values too large to encode (a norm beyond float32) on rank {BAD_RANK}" in msg, msg
    else:
        shape = "(24, 24)" if name == "2.weight" else "(24, 16)"
        assert f"NaN/Inf in parameter {name} {shape} on rank {BAD_RANK}" in msg, msg
    assert "\n" not in msg
    if name == "2.weight":  # the first bucket: nothing of the step was kept
        for r in range(WORLD):
            assert ranks[r][(spec, name, value)][1], f"rank {r}: {spec} state changed by the refused step"


def test_casts_pass_nan_through_like_ddp(ranks):
    for r in range(WORLD):
        msg, _, finite = ranks[r][("fp16", "2.weight", NAN)]
        assert msg == "no error" and not finite  # every rank got the NaN, as with DDP


def test_pipeline_stage_sync_names_the_culprit(ranks):
    msgs = [ranks[r]["sync"] for r in range(WORLD)]
    assert msgs[0] == msgs[1], msgs
    assert f"at step {GOOD_STEPS + 1}, bucket 0 (4.bias..0.weight)" in msgs[0], msgs[0]
    assert f"NaN/Inf in parameter 4.bias (4,) on rank {BAD_RANK}" in msgs[0], msgs[0]
