"""``kernels`` (fused | eager) as a job dimension, and the allocator-pressure warning (issue 37)."""

from __future__ import annotations

import pytest

import perfsim
from perfsim.errors import ConfigError
from perfsim.job import MEGATRON, PERFSIM, Job

LLAMA = "llama:layers=4,hidden=1024,heads=16,kv_heads=4,seq=1024,vocab=32000,ffn=2816"
ONE_GPU = dict(gpu="h100-sxm5-80gb", tp=1, pp=1, dp=1, micro_batch=4, global_batch=4, precision="bf16",
               attention="flash")


def test_megatrons_preset_is_fused_perfsims_and_the_jobs_eager():
    assert MEGATRON.kernels == "fused" and PERFSIM.kernels == "eager" == Job().kernels
    assert perfsim.predict(model=LLAMA, **ONE_GPU).summary["kernels"] == "fused"  # a GPU preset: Megatron's


def test_eager_kernels_cost_more_and_are_carried_by_the_summary():
    fused = perfsim.predict(model=LLAMA, kernels="fused", **ONE_GPU).summary
    eager = perfsim.predict(model=LLAMA, kernels="eager", **ONE_GPU).summary
    assert eager["kernels"] == "eager"
    assert eager["compute_s"] > 1.1 * fused["compute_s"]
    # full recomputation re-runs the eager forward kernels too
    full = perfsim.predict(model=LLAMA, kernels="eager", recompute="full", **ONE_GPU).summary
    assert full["compute_s"] > eager["compute_s"]


def test_bad_kernels_values_are_one_line_errors():
    with pytest.raises(ConfigError, match="kernels='triton'"):
        perfsim.predict(model=LLAMA, kernels="triton", **ONE_GPU)
    with pytest.raises(ConfigError, match="kernels=eager.*mixtral"):
        perfsim.predict(model="mixtral-8x7b", kernels="eager", **dict(ONE_GPU, tp=8, allow_oom=True))
    from perfsim.runtime.config import RunConfig

    with pytest.raises(ConfigError, match="kernels='fused'.*perfsim run"):
        RunConfig(model="gpt2-tiny", pp=1, kernels="fused")


def test_memory_pressure_is_said_never_silent():
    near = perfsim.predict(model="gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=50304", gpu="h100",
                           tp=1, pp=1, dp=1, micro_batch=16, global_batch=16, precision="bf16", attention="megatron",
                           allow_oom=True).summary  # the s x s scores stored: close to capacity
    assert near["memory_pressure"] == pytest.approx(near["peak_memory_gib"] / near["memory_capacity_gib"])
    assert near["memory_pressure"] > 0.8 and "caching allocator" in near["memory_warning"]
    low = perfsim.predict(model=LLAMA, **ONE_GPU).summary
    assert low["memory_pressure"] < 0.8 and "memory_warning" not in low


def test_eager_pure_drops_autocasts_traffic_and_equals_eager_in_fp32():
    kw = dict(ONE_GPU, model=LLAMA)
    eager, pure = (perfsim.predict(kernels=k, **kw).summary["compute_s"] for k in ("eager", "eager-pure"))
    fused = perfsim.predict(kernels="fused", **kw).summary["compute_s"]
    assert fused < pure < eager
    fp32 = dict(kw, precision="fp32", attention="megatron")
    assert perfsim.predict(kernels="eager", **fp32).summary["compute_s"] == \
        perfsim.predict(kernels="eager-pure", **fp32).summary["compute_s"]


def test_eager_sequence_parallel_splits_the_norms_and_residuals_not_the_gemms():
    from perfsim.models.eager import eager_block_ops
    from perfsim.models.registry import get_spec

    spec = get_spec("llama2-7b")
    full, sp = (eager_block_ops(spec, 1, 4, s, 2) for s in (False, True))
    by = lambda ops: {o.name: o for o in ops}  # noqa: E731
    full, sp = by(full), by(sp)
    assert sp["residual1"].bytes == full["residual1"].bytes / 4 and sp["norm1_pow"].bytes == full["norm1_pow"].bytes / 4
    assert sp["q_proj"] == full["q_proj"] and sp["q_proj_input_cast"] == full["q_proj_input_cast"]
