"""An offloaded optimizer's state lives in the node's RAM (ZeRO-Offload, arXiv:2101.06840):
``host_memory`` bounds it per node as the GPU's capacity bounds a stage (before: no RAM
parameter, so plan could pick an offload no node can hold)."""

import subprocess
import sys

import pytest

import perfsim
from perfsim.errors import ConfigError

JOB = dict(model="llama2-7b", gpu="h100", pp=1, zero=2, offload="optimizer", micro_batch=1, precision="bf16",
           recompute="full")


def test_a_node_short_of_ram_is_refused_naming_node_need_and_capacity():
    one = perfsim.predict(**JOB, dp=1, macro_batch=4)
    per_gpu = one.summary["host_memory_gib"]
    with pytest.raises(ConfigError, match=r"host memory: node 0 needs 100\.4 GiB .* short by"):
        perfsim.predict(**JOB, dp=1, macro_batch=4, host_memory="64GB")
    assert perfsim.predict(**JOB, dp=1, macro_batch=4, host_memory="2TB").summary["host_memory_gib"] == per_gpu
    # --allow-oom predicts anyway, as for GPU memory
    perfsim.predict(**JOB, dp=1, macro_batch=4, host_memory="64GB", allow_oom=True)


def test_a_node_holds_the_shards_of_its_own_gpus():
    """ZeRO-2 over 4 replicas, 2 GPUs per node: each node keeps two quarter shards, half the
    one-GPU state; 60 GiB per node is enough then, though one GPU's whole state is not."""
    one = perfsim.predict(**JOB, dp=1, macro_batch=4).summary["host_memory_gib"]
    four = perfsim.predict(**JOB, dp=4, gpus_per_node=2, macro_batch=1, host_memory=f"{0.55 * one}GiB")
    assert four.summary["host_memory_gib"] == pytest.approx(one / 4, rel=1e-6)
    with pytest.raises(ConfigError, match="host memory: node"):
        perfsim.predict(**JOB, dp=4, gpus_per_node=4, macro_batch=1, host_memory=f"{0.55 * one}GiB")


def test_without_offload_host_memory_bounds_nothing():
    perfsim.predict(model="gpt2", gpu="h100", pp=1, dp=1, macro_batch=4, precision="bf16", host_memory="1GB")


def test_plan_leaves_out_the_offload_a_node_cannot_hold():
    """llama2-7b on one H100 fits only with its optimizer offloaded (100 GiB of host state)."""
    one_gpu = dict(model="llama2-7b", gpu="h100", gpus_per_node=1, nodes=1, global_batch=8, jobs=1, top=3)
    assert perfsim.plan(**one_gpu, host_memory="2TB").rows()[0]["offload"] == "optimizer"
    with pytest.raises(ConfigError, match="fits"):
        perfsim.plan(**one_gpu, host_memory="64GB")


def test_bad_host_memory_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "perfsim", "predict", "--model", "gpt2", "--host-memory", "lots"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "host-memory" in proc.stderr.replace("_", "-") and "Traceback" not in proc.stderr
