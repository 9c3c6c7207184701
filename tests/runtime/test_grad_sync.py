"""Data-parallel gradient sync: DDP hooks and pipeline-stage sync over real gloo.

Two ranks are spawned (gloo over 127.0.0.1; the store is the test process's). Every rank saves what
it saw; the checks run in the parent, so a failure names the spec and step.
"""

from __future__ import annotations

import io
import os

import pytest
import torch

from perfsim.errors import ConfigError
from perfsim.compression import check_spec
from perfsim.compression.spec import parse_spec
from perfsim.runtime.grad_sync import GradSync, make_buckets, sync_gradients

from _helpers import RANK_TIMEOUT_S, run_ranks
from perfsim import rank_store

WORLD = 2
CANDIDATES = ["fp32", "fp16", "bf16", "qsgd-maxnorm:4", "qsgd-maxnorm-multiscale:4",
              "randk-maxnorm:0.25:4", "ecq:2", "ecq:4", "qsgd:4"]
# relative L2 error of the hook's average against the exact mean. Casts round
# to their mantissa; the quantizers must at least beat "send nothing" (1.0) by
# a clear margin on a real MLP gradient.
TOL = {"fp32": 1e-6, "fp16": 2e-3, "bf16": 2e-2}
TOL_QUANT = 10.0      # one exchange of a 2-4 bit quantizer: noisy (QSGD variance ~ sqrt(n)/s^2) but bounded
TOL_REPEATED = 0.6    # mean of REPEATS exchanges: noise shrinks ~ 1/sqrt(REPEATS)
REPEATS = 32
# GlobalRandKMaxNorm sends the selected values unscaled (multiscale paper,
# Sec. 3.3): one exchange from a fresh state has expectation FRACTION * mean.
EXPECTED_SCALE = {"randk-maxnorm:0.25:4": 0.25}


def repeated_scale(spec: str, repeats: int) -> float:
    """Expected mean output / exact mean over ``repeats`` exchanges of one fixed
    gradient from a fresh state. GlobalRandK's memory (ECQ-SGD recursion with
    compensation alpha, perfsim.compression.randk): per coordinate, selected with
    probability p, E h_{t+1} = (1 - p alpha) E h_t + (1 - p) g and E sent_t =
    p (g + alpha E h_t), so the average rises from p towards 1."""
    from perfsim.compression import make_compressor

    if spec not in EXPECTED_SCALE:
        return 1.0
    c = make_compressor(spec)
    p, a = c.fraction, c.alpha
    h, sent = 0.0, 0.0
    for _ in range(repeats):
        sent += p * (1 + a * h)
        h = (1 - p * a) * h + (1 - p)
    return sent / repeats


def available_specs() -> list[str]:
    return list(CANDIDATES)


def _init(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    rank_store.init_group("gloo", rank, WORLD, RANK_TIMEOUT_S,
                          rank_store.join("127.0.0.1", port, WORLD, RANK_TIMEOUT_S))


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(24, 64, generator=g), torch.randint(0, 10, (24,), generator=g)


def _backward(models, rank: int, step: int) -> None:
    """Fresh gradients of batch ``step`` on every model."""
    x, y = _batch(rank, step)
    for m in models:
        m.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()


def _local_grads(rank: int) -> list[torch.Tensor]:
    model = _mlp()
    x, y = _batch(rank, 0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return _grads(model)


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # checkpoints must load without pickle


def _worker(rank: int, port: int, specs: list[str], out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfsim.ddp import attach, onebit_optimizer

    _init(rank, port)
    results = {}
    for spec in specs:
        model = _mlp()
        ddp = DDP(model)
        state = attach(ddp, spec)
        ref = _mlp()                    # local gradients -> exact mean with plain allreduce
        stage = _mlp()                  # the pipeline-stage path on the same local grads
        stage_sync = GradSync(spec)
        steps = []
        for step in range(4):
            _backward((ddp, ref, stage), rank, step)
            hook_stats = state.pop_stats()
            if step == 3:               # resume check: a restored state continues identically
                restored = GradSync(spec)
                restored.load_state_dict(_roundtrip(stage_sync.state_dict()))
                resumed = _mlp()
                for p, q in zip(resumed.parameters(), stage.parameters()):
                    p.grad = q.grad.clone()
                sync_gradients(resumed.named_parameters(), restored)
            stage_stats = sync_gradients(stage.named_parameters(), stage_sync)
            mean = []
            for g in _grads(ref):
                dist.all_reduce(g)
                mean.append(g / WORLD)
            steps.append({"hook": _grads(model), "stage": _grads(stage), "mean": mean,
                          "hook_stats": hook_stats, "stage_stats": stage_stats})
        # Repeated exchange of one fixed gradient: the time-average of the
        # outputs converges to the exact mean (unbiased rounding, or error
        # feedback telescoping) -- "within quantization error" made testable.
        fixed, repeat = steps[0]["mean"], GradSync(spec)
        local = [g.clone() for g in _local_grads(rank)]
        acc = [torch.zeros_like(g) for g in local]
        for _ in range(REPEATS):
            twin = _mlp()
            for p, g in zip(twin.parameters(), local):
                p.grad = g.clone()
            sync_gradients(twin.named_parameters(), repeat)
            for a, p in zip(acc, twin.parameters()):
                a += p.grad / REPEATS
        results[spec] = {"steps": steps, "repeated": acc, "fixed_mean": fixed, "resumed": _grads(resumed), "keys": sorted(state.compressors),
                         "wire": sum(s.nbytes for s in stage_sync.compressor(
                             sorted(stage_sync.compressors)[0]).dp_plan((2410,), WORLD))}

    # powersgd:RANK must be torch's own hook: compare with registering it by hand.
    ours, theirs = DDP(_mlp()), DDP(_mlp())
    st = attach(ours, "powersgd:1:start=2")
    theirs.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, random_seed=0), powerSGD_hook)
    stage, stage_sync = _mlp(), GradSync("powersgd:1:start=2")   # pipeline-stage path
    psgd = []
    for step in range(4):
        _backward((ours, theirs, stage), rank, step)
        sync_gradients(stage.named_parameters(), stage_sync)
        psgd.append((_grads(ours.module), _grads(theirs.module), st.pop_stats(), _grads(stage)))
    saved = _roundtrip(st.state_dict())
    again = GradSync("powersgd:1:start=2")
    again.load_state_dict(saved)
    results["powersgd"] = {"steps": psgd, "iter": again.powersgd.iter,
                           "errors": [sorted(v) for v in again._ps_pending.values()]}

    # 1-bit optimizer specs: the hook the optimizer installs must leave local gradients alone.
    model, ref = _mlp(), _mlp()
    ddp_noop = DDP(model)
    onebit_optimizer(ddp_noop, "onebit-lamb:warmup=3", lr=1e-3)
    _backward((ddp_noop, ref), rank, 0)
    results["noop"] = (_grads(model), _grads(ref))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()  # no rank tears gloo down while its peer is mid-collective
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def dp_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("grad_sync")
    specs = available_specs()
    return specs, run_ranks(_worker, out, specs, world=WORLD)


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = sum(float((x - y).pow(2).sum()) for x, y in zip(a, b))
    den = sum(float(y.pow(2).sum()) for y in b)
    return (num / den) ** 0.5


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------------ unit
def test_grad_spec_values():
    def grad_value(text):  # the grammar, then the compressor's own arguments
        return check_spec(parse_spec(text, "grad"))

    assert grad_value("none").compressor.text == "fp32"
    assert grad_value("FP16").compressor.text == "fp16"
    ps = grad_value("powersgd:2:start=5")
    assert (ps.family, ps.rank, ps.start_iter) == ("hook", 2, 5)
    ob = grad_value("onebit-lamb:warmup=7")
    assert (ob.family, ob.optimizer, ob.warmup, ob.compressor.text) == ("optimizer", "onebit-lamb", 7, "onebit")
    assert grad_value("onebit-adam").warmup is None
    for bad, culprit in [("", "empty"), ("powersgd", "rank"), ("powersgd:x", "rank"),
                         ("powersgd:1:start=1", "start"), ("onebit-adam:foo=1", "foo"),
                         ("onebit-adam:warmup=x", "warmup"), ("nosuch:4", "nosuch"),
                         ("fp16:3", "fp16")]:
        with pytest.raises(ConfigError, match=culprit):
            grad_value(bad)


def test_buckets_reverse_order_and_cap():
    sizes = [("a", 10, 4), ("b", 20, 4), ("c", 5, 4), ("d", 30, 4)]
    assert make_buckets(sizes, cap_bytes=10**6) == [[3, 2, 1, 0]]
    assert make_buckets(sizes, cap_bytes=100) == [[3], [2, 1], [0]]
    with pytest.raises(ConfigError):
        make_buckets(sizes, cap_bytes=0)


def test_single_process_is_identity():
    model = _mlp()
    x, y = _batch(0, 0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    before = _grads(model)
    stats = sync_gradients(model.named_parameters(), GradSync("fp16"))
    assert _same(_grads(model), before) and stats["bytes"] == 0


def test_state_rejects_other_spec():
    with pytest.raises(ConfigError, match="fp16"):
        GradSync("fp32").load_state_dict(GradSync("fp16").state_dict())
    with pytest.raises(ConfigError, match="perfsim-gradsync"):
        GradSync("fp32").load_state_dict({"buckets": {}})


# ------------------------------------------------------------------ multi-process
def test_hook_average_matches_allreduce(dp_results):
    specs, ranks = dp_results
    assert "fp32" in specs and "fp16" in specs
    for spec in specs:
        tol = TOL.get(spec, TOL_QUANT)
        for step, rec in enumerate(ranks[0][spec]["steps"]):
            err = _rel(rec["hook"], rec["mean"])
            assert err <= tol, f"{spec} step {step}: relative error {err:.3g} > {tol}"
            other = ranks[1][spec]["steps"][step]
            assert _same(rec["hook"], other["hook"]), f"{spec} step {step}: ranks disagree"
            assert _same(rec["mean"], other["mean"])
        res = ranks[0][spec]
        expected = [g * EXPECTED_SCALE.get(spec, 1.0) for g in res["fixed_mean"]]
        single = _rel(res["steps"][0]["hook"], expected)
        avg = _rel(res["repeated"], [g * repeated_scale(spec, REPEATS) for g in res["fixed_mean"]])
        print(f"{spec}: one exchange {single:.3g}, mean of {REPEATS} exchanges {avg:.3g}")
        # an unbiased (or error-compensated) exchange averages its noise down like
        # 1/sqrt(REPEATS); a biased one stalls at its bias.
        bound = 2.5 * single / REPEATS ** 0.5 + 0.02
        assert avg <= min(bound, tol), f"{spec}: {REPEATS}-exchange mean off by {avg:.3g} > {bound:.3g}"


def test_hook_equals_pipeline_stage_sync(dp_results):
    """DDP hook and sync_gradients use the same buckets, layout, seeds and
    per-bucket compressors: bit-identical averages, also after DDP's bucket
    rebuild (step 0 uses DDP's initial bucket order)."""
    specs, ranks = dp_results
    for spec in specs:
        for r in range(WORLD):
            res = ranks[r][spec]
            assert len(res["keys"]) == 1, f"{spec}: bucket keys {res['keys']} (layout not canonical)"
            for step, rec in enumerate(res["steps"]):
                assert _same(rec["hook"], rec["stage"]), f"{spec} step {step} rank {r}"


def test_bytes_follow_dp_plan(dp_results):
    specs, ranks = dp_results
    fp32 = ranks[0]["fp32"]["steps"][1]["hook_stats"]["bytes"]
    assert fp32 == 2410 * 4
    for spec in specs:
        res = ranks[0][spec]
        for rec in res["steps"]:
            assert rec["hook_stats"]["bytes"] == rec["stage_stats"]["bytes"] == res["wire"]
        if spec != "fp32":
            assert res["wire"] < fp32, f"{spec}: {res['wire']} bytes is no compression"


def test_state_round_trip_resumes_identically(dp_results):
    specs, ranks = dp_results
    for spec in specs:
        for r in range(WORLD):
            res = ranks[r][spec]
            assert _same(res["resumed"], res["steps"][3]["stage"]), f"{spec} rank {r}: resume differs"


def test_powersgd_is_torch_hook(dp_results):
    _, ranks = dp_results
    for r in range(WORLD):
        res = ranks[r]["powersgd"]
        for step, (ours, theirs, stats, stage) in enumerate(res["steps"]):
            assert _same(ours, theirs), f"powersgd step {step} rank {r}"
            torch.testing.assert_close(stage, ours, rtol=1e-5, atol=1e-7,
                                       msg=f"powersgd sync_gradients step {step} rank {r}")
            assert stats["bytes"] == (2410 * 4 if step < 2 else stats["bytes"])
        assert res["steps"][3][2]["bytes"] < 2410 * 4  # rank-1 factors once compressing
        # torch's error and P/Q memories, held by bucket name until the hook meets that bucket
        assert res["iter"] == 4 and res["errors"] == [["error_dict", "p_memory_dict", "q_memory_dict"]]
    assert _same(ranks[0]["powersgd"]["steps"][3][0], ranks[1]["powersgd"]["steps"][3][0])


def test_onebit_specs_do_not_average(dp_results):
    _, ranks = dp_results
    for r in range(WORLD):
        got, local = ranks[r]["noop"]
        assert _same(got, local)
    assert not _same(ranks[0]["noop"][0], ranks[1]["noop"][0])
