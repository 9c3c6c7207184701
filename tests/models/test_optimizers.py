"""The job's optimizer (``--optimizer``, :data:`perfsim.job.OPTIMIZERS`) priced by predict and
``perfsim memory``: its state (ZeRO's ``K``, arXiv:1910.02054 Sec. 3.1) and its step's bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

import perfsim
from perfsim.job import OPTIMIZERS

ROOT = Path(__file__).resolve().parents[2]
CPU = str(ROOT / "traces" / "cpu-2core.json")
#: a small GPU job whose memory and step the GPU model prices (no profile measurement)
GPU = dict(model="gpt:layers=4,hidden=1024,heads=16,seq=1024,vocab=32000", gpu="h100", pp=2, dp=2,
           global_batch=16, gpus_per_node=8, bandwidth="100Gbps")


def test_the_state_and_the_traffic_per_parameter():
    adam, sgd = OPTIMIZERS["adamw"], OPTIMIZERS["sgd"]
    # ZeRO's K: Adam's two fp32 moments (+ the fp32 master copy in mixed precision), SGD's one buffer
    assert [adam.state_bytes(p) for p in ("fp32", "bf16", "fp16", "fp8")] == [8, 12, 12, 12]
    assert [sgd.state_bytes(p) for p in ("fp32", "tf32", "bf16")] == [4, 4, 8]
    # read g, read and write p and each state; mixed precision + 8 (half gradient, weight copy, unscale)
    assert (adam.step_bytes("fp32"), adam.step_bytes("bf16"), sgd.step_bytes("fp32"), sgd.step_bytes("bf16")) \
        == (28, 36, 20, 28)
    # Megatron-LM's passes: + norm read (4); fp16 + gradient copy (6) and unscale (8); mixed + weight copy (6)
    assert [adam.step_bytes(p, "megatron") for p in ("fp32", "fp16", "bf16", "fp8")] == [32, 52, 38, 38]
    assert [sgd.step_bytes(p, "megatron") for p in ("fp32", "fp16", "bf16")] == [24, 44, 30]


def test_the_optimizer_step_is_priced_at_the_bytes_its_passes_move():
    """A GPU preset's step time scales with :meth:`Optimizer.step_bytes` as ``optimizer_step`` counts it
    (the step is memory-bound): 52 / 36 in fp16, 38 / 36 in bf16; nothing else moves."""
    kw = dict(model="gpt2-xl", gpu="a100-sxm4-80gb", pp=1, dp=1, micro_batch=1, global_batch=1)
    for precision, ratio in (("fp16", 52 / 36), ("bf16", 38 / 36)):
        fused, megatron = (perfsim.predict(**kw, precision=precision, optimizer_step=s).summary
                           for s in ("fused", "megatron"))
        kernels = 4 * perfsim.hardware.GPUS["a100-sxm4-80gb"].curve.kernel_s
        assert (megatron["optimizer_s"] - kernels) / (fused["optimizer_s"] - kernels) == pytest.approx(ratio)
        assert megatron["compute_s"] == fused["compute_s"]


@pytest.mark.parametrize("precision, zero", [("bf16", 0), ("bf16", 1), ("fp32", 0), ("fp32", 3)])
def test_memory_keeps_each_optimizers_state_sharded_by_zero(precision, zero):
    """``perfsim memory``'s worst stage: only the optimizer state differs, by K_sgd / K_adam,
    and it is K bytes per parameter over the ZeRO shards (weights: 2 or 4 bytes, sharded at 3)."""
    reports = {o: perfsim.memory_report(**GPU, precision=precision, zero=zero, optimizer=o).breakdown
               for o in ("adamw", "sgd")}
    adam, sgd = reports["adamw"], reports["sgd"]
    k = {o: OPTIMIZERS[o].state_bytes(precision) for o in OPTIMIZERS}
    assert sgd["optimizer state"] == pytest.approx(adam["optimizer state"] * k["sgd"] / k["adamw"], rel=1e-12)
    assert {n: v for n, v in sgd.items() if n != "optimizer state"} == \
        {n: v for n, v in adam.items() if n != "optimizer state"}
    params_per_gpu = sgd["weights"] / (2 if precision == "bf16" else 4)  # / 2 more at ZeRO-3
    state_shards = 1 if zero == 0 or zero >= 3 else 2  # ZeRO-3: the weights are sharded the same way
    assert sgd["optimizer state"] == pytest.approx(params_per_gpu * k["sgd"] / state_shards, rel=1e-12)


def test_the_step_is_priced_by_its_bytes():
    """GPU model: (bytes x params / achieved bandwidth) + launches; CPU profile: the measured
    AdamW step scaled by 20 / 28 (the profile timed adamw: its records say so)."""
    gpu = {o: perfsim.predict(**GPU, precision="bf16", optimizer=o).summary for o in ("adamw", "sgd")}
    assert gpu["adamw"]["optimizer"] == "adamw" and gpu["sgd"]["optimizer"] == "sgd"
    assert 28 / 36 < gpu["sgd"]["optimizer_s"] / gpu["adamw"]["optimizer_s"] < 1  # + the same launch time
    cpu = {o: perfsim.predict(model="gpt2-tiny", pp=2, profile=CPU, optimizer=o).summary for o in ("adamw", "sgd")}
    assert cpu["sgd"]["optimizer_s"] == pytest.approx(cpu["adamw"]["optimizer_s"] * 20 / 28, rel=1e-12)
    assert perfsim.load_profile(CPU).timed_optimizer() == "adamw"


def test_the_default_is_todays_adam():
    assert perfsim.predict().summary["optimizer"] == "adamw"
    assert perfsim.predict().summary["optimizer_s"] == perfsim.predict(optimizer="adamw").summary["optimizer_s"]
