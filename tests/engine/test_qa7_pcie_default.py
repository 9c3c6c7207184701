"""A PCIe GPU's node defaults to its PCIe fabric, not an NVLink-class 300 GB/s (qa7 finding F5).

``predict --gpu v100-pcie-32gb --gpus-per-node 8`` priced the node's all-reduces at the
300 GB/s default intra-node rate, which no PCIe link carries (PCIe 3.0 x16: 15.75 GB/s per
direction): BERT-Large dp 8 read 0.847 s an iteration (dp sync 9.6 ms) where its own fabric
(``--intra-node-fabric pcie3``, 10 GB/s busbw) gives 1.076 s (238 ms); H100-PCIe llama2-7b
tp 2 dp 4: 5.76 s vs 7.93 s. ``perfsim plan`` already priced the node's fabric for the same
job, so the two commands disagreed. The same held for NVLink parts (session 20): predict kept
300 GB/s where plan priced the node's NVLink generation (A100 llama2-7b tp 8: plan +7.0 %, V100-SXM2
+10.2 %, H100 -3.8 % against predict); every GPU preset's node now defaults to its own fabric."""

import pytest

import perfsim
from perfsim.fabrics import FABRICS

BERT = dict(model="bert-large", gpu="v100-pcie-32gb", precision="fp32", dp=8, pp=1, gpus_per_node=8,
            micro_batch=8, global_batch=64)


@pytest.mark.parametrize("gpu, fabric", [("v100-pcie-32gb", "pcie3"), ("a100-pcie-80gb", "pcie4"),
                                         ("h100-pcie-80gb", "pcie5"), ("v100-sxm2-32gb", "nvlink2"),
                                         ("a100-sxm4-80gb", "nvlink3"), ("h100-sxm5-80gb", "nvlink4")])
def test_a_gpus_node_defaults_to_its_own_fabric(gpu, fabric):
    job = dict(BERT, gpu=gpu, precision="fp16")
    dflt = perfsim.predict(**job).row()
    given = perfsim.predict(**job, intra_node_fabric=fabric).row()
    assert dflt["intra_node_bandwidth_bps"] == FABRICS[fabric].bandwidth_bps
    assert dflt["iteration_s"] == given["iteration_s"]
    # a rate given by the user still wins
    assert perfsim.predict(**job, intra_node_bandwidth="300GB/s").row()["intra_node_bandwidth_bps"] == 8 * 300e9


@pytest.mark.parametrize("gpu, fabric", [("v100-pcie-32gb", "pcie3"), ("a100-sxm4-80gb", "nvlink3")])
def test_predict_and_plan_price_a_node_alike(gpu, fabric):
    plan = perfsim.plan(model="bert-large", gpu=gpu, precision="fp32", nodes=1, gpus_per_node=8,
                        global_batch=64, pp=1, dp=8, tp=1, micro_batch=8, zero=0, recompute="none",
                        compress="fp32", grad_compress="none", attention="megatron", overlap=False, top=1)
    row = plan.to_frame().iloc[0]
    mine = perfsim.predict(**dict(BERT, gpu=gpu), zero=0, recompute="none", schedule=row["schedule"], attention="megatron").row()
    assert row["intra_node_bandwidth_bps"] == mine["intra_node_bandwidth_bps"] == FABRICS[fabric].bandwidth_bps
    assert row["iteration_s"] == pytest.approx(mine["iteration_s"], rel=1e-12)
