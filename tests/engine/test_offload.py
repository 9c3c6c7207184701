"""CPU offload of the optimizer (``--offload optimizer``, ZeRO-Offload arXiv:2101.06840):
its memory, its step time, ``perfsim memory``'s suggestion and the refusals."""

import pytest

from perfsim.analysis.memory_fit import memory_report
from perfsim.api import predict
from perfsim.engine.offload import CPU_ADAM_PARAMS_PER_S, offload_step_time
from perfsim.hardware import GPUS, HOST_LINK, get_gpu, host_link_Bps
from perfsim.memory import GIB
from _helpers import run_cli, run_cli_here

# llama2-7b on 8 H100s of one node, ZeRO-2, bf16: the paper's setting (ZeRO-Offload runs on ZeRO-2)
JOB = dict(model="llama2-7b", gpu="h100", tp=1, pp=1, dp=8, gpus_per_node=8, micro_batch=1, global_batch=64,
           precision="bf16", bandwidth="400Gbps", zero=2, recompute="full")


def test_every_gpu_preset_has_a_host_link():
    assert set(HOST_LINK) == set(GPUS)
    # PCIe 5.0 x16: 63 GB/s per direction x 0.8
    assert host_link_Bps(get_gpu("h100")) == pytest.approx(50.4e9)
    assert host_link_Bps(get_gpu("v100")) == pytest.approx(12.6e9)


def test_step_time_by_hand():
    """1e9 parameters on 4 ranks: a 2.5e8 shard; 16-bit copies of 5e8 B at 50 GB/s = 10 ms,
    Adam at 4e9/s shared by 8 GPUs = 0.5 s; the copy down hides behind a 20 ms backward."""
    assert offload_step_time(1e9, 2, 4, 0.020, 3, 50e9, 4e9, 8) == pytest.approx(2.5e8 / 5e8)
    # a backward shorter than the copy down exposes the rest, once per micro-batch
    assert offload_step_time(1e9, 2, 4, 0.004, 3, 50e9, 4e9, 8) == pytest.approx(3 * 0.006 + 0.5)
    # a fast host: the copy up bounds the step
    assert offload_step_time(1e9, 2, 1, 1.0, 1, 50e9, 1e12, 1) == pytest.approx(2e9 / 50e9)


def test_memory_moves_the_optimizer_state_to_the_host():
    """GPU: 16-bit weights, no gradient shard (streamed to the host), one layer's 16-bit gradient
    before its copy, no optimizer state; host: 16 bytes per parameter of the rank's shard (fp32
    weights, momentum, variance, gradient)."""
    base = predict(**JOB).stages[0]
    off = predict(**JOB, offload="optimizer")
    st, psi = off.stages[0], off.stages[0]["params"]
    assert st["optimizer_state_gib"] == 0 and base["optimizer_state_gib"] * GIB == pytest.approx(12 * psi / 8)
    assert st["weights_gib"] == base["weights_gib"]
    assert st["grads_gib"] == 0 and base["grads_gib"] * GIB == pytest.approx(4 * psi / 8)  # Megatron's fp32
    # ZeRO-2's working gradient of one layer: 16-bit instead of the fp32 buffer's
    assert st["sharding_buffers_gib"] == pytest.approx(base["sharding_buffers_gib"] / 2)
    assert off.summary["host_memory_gib"] * GIB == pytest.approx(16 * psi / 8)
    assert off.summary["offload"] == "optimizer" and predict(**JOB).summary["host_memory_gib"] == 0
    assert st["memory_gib"] < base["memory_gib"]


def test_the_step_runs_on_the_host():
    """The optimizer column becomes the host's Adam over the shard at the node rate shared by
    its 8 GPUs (the copies, 2 bytes x shard over PCIe 5.0, are shorter and overlap), and the
    iteration grows by the difference to the GPU's own step."""
    base, off = predict(**JOB), predict(**JOB, offload="optimizer")
    psi = off.stages[0]["params"]
    adam = (psi / 8) / (CPU_ADAM_PARAMS_PER_S / 8)
    assert off.stages[0]["optimizer_s"] == pytest.approx(adam, rel=1e-9)
    grew = off.summary["iteration_s"] - base.summary["iteration_s"]
    assert grew == pytest.approx(adam - base.stages[0]["optimizer_s"], rel=1e-6)
    # a faster host (the system's rate) shortens it in proportion
    fast = predict(**JOB, offload="optimizer", cpu_adam_rate=8e9)
    assert fast.stages[0]["optimizer_s"] == pytest.approx(adam / 2, rel=1e-9)


def test_perfsim_memory_suggests_offload_where_it_makes_the_job_fit():
    job = dict(model="llama2-13b", gpu="a100-40gb", tp=1, pp=1, dp=8, gpus_per_node=8, micro_batch=1,
               global_batch=64, precision="bf16", recompute="full", zero=2)
    rep = memory_report(**job)
    assert rep.fits is False
    opts = {flags: (peak, fits) for flags, peak, fits in rep.options}
    peak, fits = opts["--offload optimizer"]
    assert fits and peak == pytest.approx(predict(**job, offload="optimizer").summary["peak_memory_gib"] * GIB)
    # a job that fits is not offered it (it slows the step)
    assert not any("--offload" in f for f, _, _ in memory_report(**{**job, "gpu": "a100"}).options)
    off = memory_report(**job, offload="optimizer")
    assert off.fits and off.host_bytes > 0


def test_refusals_are_one_line():
    r = run_cli("predict", "--model", "gpt2", "--offload", "optimizer", "--zero", "2")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "needs a GPU preset" in r.stderr
    r = run_cli_here("predict", "--model", "gpt2", "--gpu", "h100", "--offload", "cpu")
    assert r.returncode == 2 and "offload" in r.stderr and "optimizer" in r.stderr
    r = run_cli_here("run", "--model", "digits-mlp", "--pp", "1", "--dp", "2", "--offload", "optimizer",
                     "--zero", "3")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "predict only" in r.stderr


def test_offload_with_a_one_bit_optimizer_is_refused():
    """(by ZeRO-2's own refusal: a 1-bit optimizer exchanges the whole momentum)"""
    r = run_cli_here("predict", "--model", "gpt2", "--gpu", "h100", "--pp", "1", "--dp", "2", "--offload",
                     "optimizer", "--zero", "2", "--grad-compress", "onebit-adam")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "onebit-adam" in r.stderr


def test_a_13b_model_fits_one_v100_as_the_paper_says():
    """ZeRO-Offload's headline (arXiv:2101.06840, abstract: "over 13 billion parameters on a single
    GPU", a 32 GB V100): a 13B GPT with fp16 weights only on the GPU fits; without offload its
    model states alone (16 bytes per parameter) are 6x the GPU. On one GPU the unit's gradient
    waits for its copy down (the ZeRO buffer), and the 13B shard is the whole model."""
    job = dict(model="gpt:layers=40,hidden=5120,heads=40,seq=1024,vocab=50257", gpu="v100", tp=1, pp=1, dp=1,
               zero=2, micro_batch=1, global_batch=1, precision="fp16", recompute="full")
    off = predict(**job, offload="optimizer")
    psi = off.stages[0]["params"]
    assert 12.5e9 < psi < 13e9 and off.summary["fits"]
    assert off.summary["host_memory_gib"] * GIB == pytest.approx(16 * psi)
    assert off.stages[0]["sharding_buffers_gib"] > 0
    assert not memory_report(**job).fits


def test_offload_needs_zero_2_or_3():
    r = run_cli_here("predict", "--model", "gpt2", "--gpu", "h100", "--pp", "1", "--dp", "2", "--offload",
                     "optimizer", "--zero", "1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "needs zero 2 or 3" in r.stderr
