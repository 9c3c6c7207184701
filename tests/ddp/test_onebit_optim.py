"""1-bit Adam / 1-bit LAMB: algorithm checks in one process, training over real
gloo with two ranks (sklearn digits MLP), checkpoint round-trip."""

from __future__ import annotations

import io

import pytest
import torch

from perfsim.errors import ConfigError
from perfsim.ddp import DEFAULT_WARMUP, onebit_optimizer
from perfsim.runtime.onebit_optim import OneBitAdam, OneBitLamb

from _helpers import gloo_group, run_ranks, save_rank

WORLD = 2
STEPS, WARMUP, RESUME_AT, TAIL = 50, 10, 30, 5
LR = {"onebit-adam": 0.01, "onebit-lamb": 0.05, "onebit-lamb:exchange=preconditioned": 0.05}
NAMES = list(LR)


def _mlp(hidden: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def _digits():
    from perfsim.runtime.data import digits_arrays

    x, y = digits_arrays()
    x = x * 16.0  # back to the 0..16 pixel counts (exact), then standardised
    x = (x - x.mean(0)) / (x.std(0) + 1e-3)
    return x, y


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _random_grads(model, step):
    g = torch.Generator().manual_seed(step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


# ------------------------------------------------------------------ one process
def test_onebit_optimizer_specs():
    model = _mlp()
    opt = onebit_optimizer(model, "onebit-adam:warmup=5", 1e-3)
    assert isinstance(opt, OneBitAdam) and opt.warmup == 5
    opt = onebit_optimizer(model, "onebit-lamb", 1e-3)
    assert isinstance(opt, OneBitLamb) and opt.warmup == DEFAULT_WARMUP  # a fixed number of steps
    assert opt.exchange == "preconditioned"
    assert onebit_optimizer(model, "onebit-lamb:warmup=5", 1e-3, warmup=7).warmup == 7  # argument wins
    assert onebit_optimizer(model, "onebit-adam:exchange=momentum", 1e-3).exchange == "momentum"
    for bad, culprit in [("onebit-adam:warmup=0", "warmup"), ("onebit-lamb:warmup=x", "warmup"),
                         ("onebit-adam:lr=1", "lr"), ("fp16", "not a 1-bit optimizer"),
                         ("onebit-lamb:exchange=signs", "exchange"), ("nosuch", "nosuch")]:
        with pytest.raises(ConfigError, match=culprit):
            onebit_optimizer(model, bad, 1e-3)
    with pytest.raises(ConfigError, match="lr"):
        onebit_optimizer(model, "onebit-adam", 0.0)
    with pytest.raises(ConfigError, match="betas"):
        OneBitLamb(model.parameters(), betas=(0.9, 1.0))


@pytest.mark.parametrize("spec,kwargs,culprit", [
    ("onebit-adam", dict(lr="1e-3"), r"onebit-adam: lr='1e-3' must be a number"),  # argparse text
    ("onebit-adam", dict(lr=1e-3, eps="1e-8"), r"eps='1e-8' must be a number"),
    ("onebit-lamb", dict(lr=1e-3, betas=("0.9", "0.999")), r"betas=\('0.9', '0.999'\) must be two numbers"),
    ("onebit-lamb", dict(lr=1e-3, betas=(0.9,)), r"betas=\(0.9,\) must be two numbers"),
    ("onebit-lamb", dict(lr=1e-3, weight_decay=None), r"weight_decay=None must be a number"),
    ("onebit-lamb", dict(lr=1e-3, ratio_threshold="0.1"), r"ratio_threshold='0.1' must be a number"),
    ("onebit-lamb", dict(lr=1e-3, coef_beta=0.9), r"onebit-lamb: unknown options \['coef_beta'\] \(it takes coeff_beta"),
    ("onebit-adam", dict(lr=1e-3, coeff_beta=0.9), r"onebit-adam: unknown options \['coeff_beta'\]"),
])
def test_bad_hyper_parameters_are_one_line_errors_naming_them(spec, kwargs, culprit):
    """Not a TypeError out of a comparison, naming nothing (qa9)."""
    with pytest.raises(ConfigError, match=culprit) as e:
        onebit_optimizer(_mlp(8), spec, **kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cls", [OneBitAdam, OneBitLamb])
def test_warmup_is_this_runs_setting_not_the_checkpoints(cls):
    """Resuming with another warm-up uses the new one; a warm-up that is
    already over in the checkpoint freezes on load; extending a finished one is refused."""
    def run(opt, model, steps, start):
        for step in range(start, start + steps):
            _random_grads(model, step)
            opt.step()

    model = _mlp(8)
    opt = cls(model.parameters(), warmup=10, compressor="fp32")
    run(opt, model, 4, 0)
    saved = _roundtrip(opt.state_dict())
    longer = cls(model.parameters(), warmup=6, compressor="fp32")
    longer.load_state_dict(saved)
    assert longer.warmup == 6 and not longer.compressing
    run(longer, model, 2, 4)
    assert longer.global_state["freeze_step"] == 6 and longer.compressing
    shorter = cls(model.parameters(), warmup=3, compressor="fp32")
    shorter.load_state_dict(saved)  # step 4 >= 3: the variance freezes now
    assert shorter.global_state["freeze_step"] == 4 and shorter.compressing
    run(shorter, model, 1, 4)
    frozen = _roundtrip(longer.state_dict())
    with pytest.raises(ConfigError, match="froze the variance at step 6"):
        cls(model.parameters(), warmup=20, compressor="fp32").load_state_dict(frozen)


def test_warmup_is_adamw_exactly():
    """1-bit Adam's warm-up stage is AdamW (bias-corrected, decoupled decay)."""
    a, b = _mlp(), _mlp()
    ours = OneBitAdam(a.parameters(), lr=0.01, weight_decay=0.1, warmup=6)
    ref = torch.optim.AdamW(b.parameters(), lr=0.01, weight_decay=0.1, foreach=False)
    for step in range(6):
        _random_grads(a, step)
        _random_grads(b, step)
        ours.step()
        ref.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_compression_stage_freezes_variance():
    """After warm-up: Adam's variance stops changing; LAMB keeps the frozen copy
    fixed, updates the fresh one, and its scaling ratio obeys the clips (Alg. 1
    lines 16-19)."""
    for cls in (OneBitAdam, OneBitLamb):
        model = _mlp(16)
        opt = cls(model.parameters(), lr=0.01, warmup=3)
        for step in range(3):
            _random_grads(model, step)
            opt.step()
        first = next(model.parameters())
        frozen = opt.state[first]["exp_avg_sq"].clone()
        ratios = []
        for step in range(3, 12):
            _random_grads(model, step)
            opt.step()
            if cls is OneBitLamb:
                ratios.append(float(opt.state[first]["last_ratio"]))
        st = opt.state[first]
        if cls is OneBitAdam:
            assert torch.equal(st["exp_avg_sq"], frozen)
        else:
            assert torch.equal(st["exp_avg_sq_frozen"], frozen)
            assert not torch.equal(st["exp_avg_sq"], frozen)
            prev = 1.0
            for r in ratios:
                assert 0.5 <= r <= 4.0 and prev * 0.9 - 1e-6 <= r <= prev * 1.1 + 1e-6
                prev = r
            assert float(st["coeff_frozen"]) > 0


def test_state_dict_requires_matching_optimizer():
    model = _mlp(8)
    adam = OneBitAdam(model.parameters(), warmup=2, compressor="fp32")
    with pytest.raises(ConfigError, match="onebit-adam"):
        OneBitLamb(model.parameters(), warmup=2, compressor="fp32").load_state_dict(adam.state_dict())
    with pytest.raises(ConfigError, match="onebit"):
        adam.load_state_dict(torch.optim.Adam(model.parameters()).state_dict())


# ------------------------------------------------------------------ two ranks
def _compressor() -> str:
    return "onebit"


def _train(rank, model, ddp, opt, x, y, steps, start, losses):
    import torch.distributed as dist

    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(10_000 * step + rank)   # same batches after a resume
        idx = torch.randint(0, len(x), (32,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx])
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / WORLD)


def _worker(rank: int, port: int, compressor: str, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfsim.ddp import onebit_optimizer

    with gloo_group(rank, WORLD, port):
        x, y = _digits()
        out = {}
        for name in NAMES:
            spec = f"{name}:warmup={WARMUP}"
            model = _mlp()
            ddp = DDP(model)
            opt = onebit_optimizer(ddp, spec, LR[name], compressor=compressor)  # + its no-op hook
            losses: list[float] = []
            _train(rank, model, ddp, opt, x, y, RESUME_AT, 0, losses)
            saved = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
            stats = opt.pop_stats()
            _train(rank, model, ddp, opt, x, y, STEPS - RESUME_AT, RESUME_AT, losses)

            twin = _mlp()
            with torch.no_grad():
                for p in twin.parameters():
                    p.add_(1.0)                                 # load_state_dict must overwrite this
            twin.load_state_dict(saved["model"])
            twin_ddp = DDP(twin)
            twin_opt = onebit_optimizer(twin_ddp, spec, LR[name], compressor=compressor)
            twin_opt.load_state_dict(saved["opt"])
            resumed: list[float] = []
            _train(rank, twin, twin_ddp, twin_opt, x, y, TAIL, RESUME_AT, resumed)
            with torch.no_grad():
                full = float(torch.nn.functional.cross_entropy(model(x), y))
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            out[name] = {"losses": losses, "resumed": resumed, "full_loss": full, "params": flat,
                         "compressed_bytes": stats["bytes"],
                         "comp_state": saved["opt"]["onebit"]["compressor"]}
        save_rank(out_dir, rank, out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("onebit")
    comp = _compressor()
    return comp, run_ranks(_worker, out, comp, world=WORLD)


@pytest.mark.parametrize("name", NAMES)
def test_training_after_warmup_still_learns(trained, name):
    comp, ranks = trained
    res = ranks[0][name]
    losses = res["losses"]
    early = sum(losses[WARMUP:WARMUP + 10]) / 10         # first compressed steps
    late = sum(losses[-10:]) / 10
    print(f"{name} ({comp}): loss {losses[0]:.3f} -> {early:.3f} (after warm-up) -> {late:.3f}; "
          f"full-data {res['full_loss']:.3f}")
    assert late < 0.5 * early, f"{name}: compressed stage stalls ({early:.3f} -> {late:.3f})"
    assert res["full_loss"] < 0.3


@pytest.mark.parametrize("name", NAMES)
def test_ranks_stay_identical(trained, name):
    _, ranks = trained
    assert torch.equal(ranks[0][name]["params"], ranks[1][name]["params"])


@pytest.mark.parametrize("name", NAMES)
def test_resume_continues_identically(trained, name):
    """Model + optimizer state (moments, frozen variance, LAMB coefficients and
    the compressor's error buffers) restored from a checkpoint: same losses."""
    _, ranks = trained
    for r in range(WORLD):
        res = ranks[r][name]
        assert res["resumed"] == res["losses"][RESUME_AT:RESUME_AT + TAIL], f"{name} rank {r}"


def test_error_buffers_are_checkpointed(trained):
    comp, ranks = trained
    assert comp == "onebit"
    state = ranks[0]["onebit-adam"]["comp_state"]
    tensors = [v for v in _leaves(state) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert tensors and any(float(t.abs().sum()) > 0 for t in tensors), state.keys()


def test_compressed_bytes_smaller_than_fp32(trained):
    comp, ranks = trained
    n = ranks[0]["onebit-adam"]["params"].numel()
    warm = WARMUP * n * 4                                 # fp32 allreduce during warm-up
    compressed = ranks[0]["onebit-adam"]["compressed_bytes"] - warm
    per_step = compressed / (RESUME_AT - WARMUP)
    assert 0 < per_step < (n * 4) / 8


def _leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def test_divergence_is_reported_clearly():
    model = _mlp(8)
    opt = OneBitAdam(model.parameters(), warmup=2, compressor="fp32")
    for step in range(3):
        _random_grads(model, step)
        if step == 2:
            next(model.parameters()).grad[0, 0] = float("nan")
        if step < 2:
            opt.step()
    with pytest.raises(ConfigError, match="diverged.*warm-up"):
        opt.step()
