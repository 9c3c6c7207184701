"""perfsim.ddp, the public DDP compression API, driven as a user would: a training
script (tests/ddp/ddp_script.py) under torchrun with 2 gloo ranks.

The properties: 1 exact resume, 2 honest bytes, 3 wrong use is an error,
4 convergence (test_ddp_convergence.py), 5 find_unused_parameters / bf16 / fp16 /
no_sync / several models, 6 ``perfsim run`` on the same API.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _helpers import spawn_ranks
from perfsim import ddp as pddp
from perfsim.errors import ConfigError

SCRIPT = Path(__file__).with_name("ddp_script.py")
sys.path.insert(0, str(SCRIPT.parent))
import ddp_script as script  # noqa: E402


def torchrun(modes: str, out: Path, nproc: int = 2) -> dict[str, list]:
    """Run the script's ``modes`` (comma-separated, in one job) under torchrun; returns
    every rank's saved results per mode."""
    # --standalone: torchrun's agent serves the store on localhost:0, bound as created (a
    # --master_port found free beforehand could be taken before rank 0 binds it)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(SCRIPT), modes, str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=out)
    assert proc.returncode == 0, f"torchrun {modes} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {m: [torch.load(out / f"{m}-rank{r}.pt", weights_only=False) for r in range(nproc)]
            for m in modes.split(",")}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Two jobs: the first, under torchrun as a user runs it, writes checkpoints (and runs
    the features and wrong-use modes in the same processes); the second is fresh processes
    (forked from the tests' preloaded forkserver: no torchrun launcher, no torch import)
    loading them, then loading them again into states of a 1-rank data-parallel group."""
    out = tmp_path_factory.mktemp("ddp")
    res = torchrun("first,features,errors", out)
    spawn_ranks(script.forked_rank, "resume,world1", str(out))  # loading first's checkpoints
    res.update({m: [torch.load(out / f"{m}-rank{r}.pt", weights_only=False) for r in range(2)]
                for m in ("resume", "world1")})
    return res


@pytest.fixture(scope="module")
def runs(jobs):
    return {k: jobs[k] for k in ("first", "resume", "world1")}


METHODS = script.GRAD_METHODS + script.OPT_METHODS


# ------------------------------------------------------------------ 1. exact resume
@pytest.mark.parametrize("method", METHODS)
def test_resume_is_bit_identical(runs, method):
    """N steps, save, fresh processes, load, N more == 2N straight, bit for bit, on
    both ranks -- with the hook registered the torch way (the state never saw the
    model) and DDP buckets of ~2 kB, which DDP regroups after its first iteration."""
    for r in range(2):
        straight = runs["first"][r][method]["straight"]
        resumed = runs["resume"][r][method]["resumed"]
        assert all(torch.equal(a, b) for a, b in zip(straight, resumed)), f"{method} rank {r}"
        assert runs["first"][r][method]["wire_bytes"] == runs["resume"][r][method]["wire_bytes"]
    assert all(torch.equal(a, b) for a, b in zip(runs["first"][0][method]["straight"],
                                                 runs["first"][1][method]["straight"]))


# ------------------------------------------------------------------ 2. honest bytes
def _canonical_buckets():
    from perfsim.runtime.grad_sync import make_buckets

    named = list(script.mlp().named_parameters())
    cap = int(0.002 * 1024 * 1024)  # DistributedDataParallel(bucket_cap_mb=0.002)
    return [sum(named[i][1].numel() for i in b)
            for b in make_buckets([(n, p.numel(), 4) for n, p in named], cap)]


@pytest.mark.parametrize("method", [m for m in script.GRAD_METHODS if not m.startswith("powersgd")])
def test_wire_bytes_are_the_dp_plan_the_simulator_charges(runs, method):
    """state.wire_bytes == steps x the compressor's dp_plan over the canonical buckets --
    the function the simulator's plan calls (engine/buckets.py) and `perfsim compressors`
    prints as dp_bytes."""
    from perfsim.compression.catalog import rows
    from perfsim.compression import make_compressor
    from perfsim.engine.buckets import _grad_steps

    class Layer:  # what the simulator's planner sees of one bucket
        def __init__(self, n):
            self.params, self.out_shape = n, (n,)

    comp = make_compressor(method)
    per_step = sum(sum(s.nbytes for s in comp.dp_plan((n,), 2)) for n in _canonical_buckets())
    sim = sum(sum(s.nbytes for s in _grad_steps(comp, [Layer(n)], 2)) for n in _canonical_buckets())
    assert runs["first"][0][method]["wire_bytes"] == 2 * script.N * per_step == 2 * script.N * sim
    n = _canonical_buckets()[0]
    row = next(r for r in rows((n,), 2) if r["name"] == comp.name)  # the class's example spec
    assert row["dp_bytes"] == sum(s.nbytes for s in make_compressor(row["spec"]).dp_plan((n,), 2))


def test_low_bit_allreduce_is_low_bit():
    """4-bit codes over 2 ranks cost 64/12 = 5.33 bits each on the wire (not an int8 carrier)."""
    from perfsim.compression import make_compressor

    plan = make_compressor("qsgd-maxnorm:4").dp_plan((1_200_000,), 2)
    codes = plan[-1].nbytes * 8 / 1_200_000
    assert codes == pytest.approx(64 / 12) and codes < 8
    assert plan[0].nbytes == 4 * (1_200_000 // 512 + 1)  # one norm per 512-value chunk


def test_onebit_wire_bytes(runs):
    """1-bit optimizers: warm-up steps send fp32 gradients, then the 3-phase exchange."""
    from perfsim.compression import make_compressor

    n = sum(p.numel() for p in script.mlp().parameters())
    onebit = sum(s.nbytes for s in make_compressor("onebit").dp_plan((n,), 2))
    expect = 3 * 4 * n + (2 * script.N - 3) * onebit  # warmup=3 in the script
    assert runs["first"][0]["onebit-adam"]["wire_bytes"] == expect
    assert runs["first"][0]["onebit-lamb"]["wire_bytes"] == expect


# ------------------------------------------------------------------ 3. wrong use
@pytest.fixture(scope="module")
def errors(jobs):
    return jobs["errors"][0]


@pytest.mark.parametrize("case,needle", [
    ("unknown", "'qsgd-maxnrom:4': unknown"),
    ("optimizer_as_state", "use perfsim.ddp.onebit_optimizer"),
    ("not_optimizer", "'qsgd-maxnorm:4' is not a 1-bit optimizer"),
    ("onebit_without_hook", "allreduces every gradient in fp32"),
    ("second_hook", "already has a communication hook"),
])
def test_wrong_use_is_a_one_line_error(errors, case, needle):
    assert needle in errors[case] and "\n" not in errors[case]


def test_checkpoint_from_another_world_size_is_refused(runs):
    for res in runs["world1"]:  # each rank's 2-rank checkpoint in a group of that rank alone
        for method in ("ecq:4", "powersgd:2"):
            assert "saved with 2 data-parallel ranks, this run has 1" in res[method]
        assert res["fp16"] == "no error"  # a cast has no per-rank state


# ------------------------------------------------------------------ 5. DDP features
@pytest.fixture(scope="module")
def features(jobs):
    return jobs["features"]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_find_unused_parameters(features):
    for method in ("qsgd-maxnorm:4", "ecq:4", "powersgd:2"):
        params, unused_unchanged = features[0][("unused", method)]
        assert _same(params, features[1][("unused", method)][0]) and unused_unchanged, method


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
@pytest.mark.parametrize("method", ["qsgd-maxnorm:4", "powersgd:2", "onebit-adam"])
def test_low_precision_parameters(features, dtype, method):
    a, b = features[0][(dtype, method)], features[1][(dtype, method)]
    assert _same(a, b) and all(str(p.dtype) == dtype and bool(torch.isfinite(p).all()) for p in a)
    init = [p.to(getattr(torch, dtype.split(".")[1])) for p in script.mlp().parameters()]
    assert not _same(a, init)  # it trained


def test_no_sync_accumulation(features):
    """Two micro-batches per step, the first under no_sync: the hook runs once per step
    and, with fp32, gives DDP's own accumulated gradient."""
    ours, torchs = features[0][("no_sync", "fp32", True)], features[0][("no_sync", "fp32", False)]
    for a, b in zip(ours, torchs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    n = sum(p.numel() for p in script.mlp().parameters())
    assert features[0][("no_sync_bytes", "fp32")] == 3 * 4 * n  # 3 synchronised steps, not 6
    assert _same(features[0][("no_sync", "qsgd-maxnorm:4", True)],
                 features[1][("no_sync", "qsgd-maxnorm:4", True)])


def test_two_ddp_models_in_one_process(features):
    a0, b0, keys_a, keys_b = features[0]["two_models"]
    a1, b1, _, _ = features[1]["two_models"]
    assert _same(a0, a1) and _same(b0, b1)
    assert keys_a and keys_b and not set(keys_a) & set(keys_b) or keys_a != keys_b


# ------------------------------------------------------------------ 6. perfsim run
def test_perfsim_run_uses_the_public_api():
    """The runtime worker builds its gradient state and 1-bit optimizers through
    perfsim.ddp (no second path): the objects it makes are perfsim.ddp's."""
    import inspect

    from perfsim import ddp as pddp
    from perfsim.runtime import worker
    from perfsim.runtime.config import RunConfig

    src = inspect.getsource(worker.train)
    assert "pddp.CompressionState(" in src and "grad_state.sync(" in src
    cfg = RunConfig.from_dict({"model": "digits-mlp", "pp": 2, "micro_batch": 8, "schedule": "1f1b", "dp": 1,
                               "grad_compress": "onebit-lamb:warmup=7"})
    opt = worker.make_optimizer(cfg, script.mlp(), None, 0, 20)
    assert opt.warmup == 7 and hasattr(opt, "wire_bytes")
    cfg = RunConfig.from_dict({"model": "digits-mlp", "pp": 2, "micro_batch": 8, "schedule": "1f1b", "dp": 1,
                               "grad_compress": "onebit-adam"})
    assert worker.make_optimizer(cfg, script.mlp(), None, 0, 1000).warmup == pddp.DEFAULT_WARMUP


@pytest.mark.slow
def test_perfsim_run_onebit_warmup_is_a_setting(tmp_path):
    """1-bit warm-up is the spec's step count -- in the run header and the
    results -- and a resumed run with more --steps keeps it (nothing frozen from --steps)."""
    from perfsim.runtime import run

    kw = dict(model="digits-mlp", pp=1, dp=2, micro_batch=4, macro_batch=16, timeout="30s",
              grad_compress="onebit-adam:warmup=3")
    full = run(steps=6, out=tmp_path / "full", **kw)
    run(steps=2, out=tmp_path / "part", **kw)
    resumed = run(steps=6, resume=tmp_path / "part", out=tmp_path / "part2", **kw)
    assert full.summary["onebit_warmup"] == resumed.summary["onebit_warmup"] == 3
    assert resumed.losses == full.losses
    # the CLI's default warm-up (no warmup= in the spec), on the small job above (the
    # default model, gpt2-small-byte, costs twice the CPU and says the same)
    proc = subprocess.run([sys.executable, "-m", "perfsim", "run", "--model", "digits-mlp", "--micro-batch", "4",
                           "--macro-batch", "16", "--pp", "1", "--dp", "2", "--steps", "1",
                           "--grad-compress", "onebit-lamb", "--out", str(tmp_path / "cli"), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "onebit-lamb warm-up 100 steps" in proc.stderr and "1-bit warm-up 100 steps" in proc.stdout


@pytest.mark.parametrize("make, needle", [
    (lambda: pddp.CompressionState(5), r"^grad compression 5: a spec is text such as 'qsgd:4', not int$"),
    (lambda: pddp.CompressionState(None), r"^grad compression None: a spec is text"),
    (lambda: pddp.CompressionState("qsgd:4", seed="x"), r"^seed='x': must be an integer"),
    (lambda: pddp.CompressionState("qsgd:4", seed=1.5), r"^seed=1.5: must be an integer"),
])
def test_a_wrong_type_is_a_config_error_naming_it(make, needle):
    """(Before: ``CompressionState(5)`` said "5: empty"; ``seed="x"`` raised an untyped
    ValueError from int(), ``seed=1.5`` was truncated silently.)"""
    with pytest.raises(ConfigError, match=needle):
        make()
