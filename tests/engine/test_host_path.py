"""Intra-node traffic without peer-to-peer: NCCL's SHM transport through host memory
(perfsim.fabrics.HostPath, the ``pcieN-shm`` fabrics; a GPU preset without P2P defaults to it)."""

import pytest

from perfsim.api import predict
from perfsim.collectives import GroupShape, plan
from perfsim.fabrics import (FABRICS, HOST_MEMORY_SHARE, HOST_PATHS, PCIE_LANE_BPS, SHM_PCIE_SHARE, HostPath,
                             get_fabric)
from perfsim.hardware import GPUS, NODE_FABRIC


def test_pcie_lane_rates_are_the_spec_ones():
    # PCI-SIG: 8 / 16 / 32 GT/s, 128b/130b -> 15.75 / 31.5 / 63 GB/s per direction on x16
    assert [round(16 * PCIE_LANE_BPS[g] / 1e9, 2) for g in (3, 4, 5)] == [15.75, 31.51, 63.02]


def test_each_bound_of_the_host_path_binds_where_its_part_is_the_narrowest():
    link = 16 * PCIE_LANE_BPS[4]
    alone = HostPath(4, 16, 1, 2, 204.8e9, None, "")
    assert alone.busbw_Bps() == pytest.approx(SHM_PCIE_SHARE * link)            # the GPU's own link
    shared = HostPath(4, 16, 2, 2, 204.8e9, None, "")
    assert shared.busbw_Bps() == pytest.approx(alone.busbw_Bps() / 2)           # two GPUs per uplink
    crowded = HostPath(4, 16, 1, 8, 204.8e9, None, "")                          # 8 GPUs on one socket's DRAM
    assert crowded.busbw_Bps() == pytest.approx(HOST_MEMORY_SHARE * 204.8e9 / 16)
    narrow = HostPath(4, 16, 1, 2, 204.8e9, 10e9, "")                          # a slow CPU-to-CPU link
    assert narrow.busbw_Bps() == 10e9
    x8 = HostPath(4, 8, 1, 2, 204.8e9, None, "")
    assert x8.busbw_Bps() == pytest.approx(alone.busbw_Bps() / 2)


def test_shm_fabrics_are_slower_than_p2p_of_their_generation_and_cite_nccl():
    assert set(HOST_PATHS) <= set(FABRICS)
    for name, path in HOST_PATHS.items():
        f = get_fabric(name)
        assert f.bandwidth_bps == pytest.approx(8 * path.busbw_Bps())
        assert f.bandwidth_bps < FABRICS[f"pcie{path.gen}"].bandwidth_bps
        assert "NCCL_P2P_DISABLE" in f.source and "PCIe" in f.source
    # the 8-GPU PCIe 3.0 server: two GPUs per 48-lane switch uplink -> 0.57 x 15.75 / 2 = 4.5 GB/s
    assert FABRICS["pcie3-shm"].bandwidth_bps / 8e9 == pytest.approx(4.49, abs=0.01)
    assert FABRICS["pcie4-shm"].bandwidth_bps / 8e9 == pytest.approx(17.96, abs=0.01)


def test_a_gpu_without_p2p_ships_with_a_host_memory_fabric():
    without = [g.name for g in GPUS.values() if not g.p2p]
    assert without == ["rtx-4090"]
    for name in without:
        assert NODE_FABRIC[name] in HOST_PATHS
    for name, fabric in NODE_FABRIC.items():
        assert GPUS[name].p2p or fabric in HOST_PATHS


def test_predict_defaults_a_gpu_without_p2p_to_its_host_path_and_a_given_rate_wins():
    base = dict(model="gpt2-xl", gpu="rtx-4090", dp=8, pp=1, gpus_per_node=8, global_batch=64, micro_batch=8,
                allow_oom=True)
    dflt = predict(**base).summary
    p2p = predict(**base, intra_node_fabric="pcie4").summary
    given = predict(**base, intra_node_bandwidth="300GB/s").summary
    assert dflt["intra_node_bandwidth_bps"] == FABRICS["pcie4-shm"].bandwidth_bps
    assert given["intra_node_bandwidth_bps"] == 8 * 300e9
    assert dflt["dp_sync_s"] > p2p["dp_sync_s"] > given["dp_sync_s"]
    # a GPU with P2P: its node's NVLink fabric, as plan prices it
    a100 = predict(**dict(base, gpu="a100-sxm4-80gb")).summary
    assert a100["intra_node_bandwidth_bps"] == FABRICS["nvlink3"].bandwidth_bps


def test_v100_pcie_allreduce_of_340m_fp32_with_and_without_p2p():
    """docs/model.md: 8 x V100-PCIe, ring all-reduce of 340 M fp32 parameters."""
    def ms(name):
        f = FABRICS[name]
        g = GroupShape(8, 1, 8, f.bandwidth_bps, f.latency_s, f.bandwidth_bps, f.latency_s, intra_pcie=True)
        return 1e3 * plan("allreduce", 340e6 * 4, g).time()
    assert ms("pcie3") == pytest.approx(238.1, abs=0.1)
    assert ms("pcie3-shm") == pytest.approx(530.2, abs=0.1)
