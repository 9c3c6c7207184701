"""The nccl collective model: NCCL's protocols (LL, LL128, Simple) give the nccl-tests
bus-bandwidth curve -- latency-bound small messages, the full rate only for large ones."""

import pytest

from perfsim.api import predict
from perfsim.collectives import PROTOCOLS, GroupShape, plan, with_protocol
from perfsim.config import System
from perfsim.errors import ConfigError

NODE = dict(n=8, nodes=1, per_node=8, intra_bps=8 * 200e9, intra_latency_s=0.0, inter_bps=8 * 200e9,
            inter_latency_s=0.0)


def busbw(c, S, n=8):
    return 2 * (n - 1) / n * S / c.time()


def test_bus_bandwidth_rises_with_size_to_the_fabric_rate():
    g = GroupShape(**NODE, model="nccl")
    sizes = [2 ** k for k in range(10, 31, 2)]
    curve = [busbw(plan("allreduce", S, g), S) for S in sizes]
    assert curve == sorted(curve)  # monotone in the size, as nccl-tests print it
    assert curve[0] < 0.01 * 200e9 and 0.95 * 200e9 < curve[-1] <= 200e9
    # the nominal model moves every size at the full rate with zero-latency links
    nominal = GroupShape(**NODE)
    assert busbw(plan("allreduce", 1024, nominal), 1024) == pytest.approx(200e9)
    # the cheapest protocol per size: LL for tiny buffers, Simple for large ones
    assert plan("allreduce", 1024, g).algo.endswith("/LL")
    assert plan("allreduce", 2 ** 30, g).algo == "ring/Simple"


def test_protocol_costs_follow_ncclS_tuning_model():
    g = GroupShape(**NODE, model="nccl")
    ring = plan("allreduce", 1e6, GroupShape(**NODE), "ring")
    ll, ll128, simple = (with_protocol(ring, g, p) for p in PROTOCOLS)
    steps = 2 * 7
    assert ll.time() == pytest.approx(3.6e-6 + steps * 0.4e-6 + 2 * 7 / 8 * 1e6 * 8 / (8 * 200e9 / 4))
    assert simple.time() == pytest.approx(8.4e-6 + steps * 5.7e-6 + 2 * 7 / 8 * 1e6 * 8 / (8 * 200e9))
    assert ll128.phases[0][0].rate_bps == pytest.approx(8 * 200e9 * 120 / 128)
    # across nodes only the steps whose hop leaves a node pay the network's per-step latency (NCCL's
    # NET hwLat), 2 (nodes - 1) of an allreduce's 2 (ranks - 1), the rest NVLink's (ncclTopoTuneModel's
    # nInterSteps)
    two = GroupShape(16, 2, 8, 8 * 200e9, 0.0, 8 * 200e9, 0.0, model="nccl")
    r2 = plan("allreduce", 1e6, GroupShape(16, 2, 8, 8 * 200e9, 0.0, 8 * 200e9, 0.0), "ring")
    assert with_protocol(r2, two, PROTOCOLS[2]).time() - r2.time() == pytest.approx(8.4e-6 + 28 * 5.7e-6
                                                                                    + 2 * 6.6e-6)
    # PCIe: NCCL's PCI step latency, no LL128
    pcie = GroupShape(**dict(NODE, intra_bps=8 * 10e9), model="nccl", intra_pcie=True)
    assert not any(plan("allreduce", S, pcie).algo.endswith("LL128") for S in (1e5, 1e6, 1e7, 1e8))


def test_switch_and_effect_on_a_prediction():
    kw = dict(model="gpt2", gpu="a100", tp=4, pp=2, dp=2, gpus_per_node=8, micro_batch=1, global_batch=16,
              nic="8x200Gbps:infiniband", intra_node_fabric="nvlink3")
    nominal, nccl = predict(**kw, collective_model="nominal"), predict(**kw, collective_model="nccl")
    # GPT-2's TP all-reduces (1 x 1024 x 768 bf16 = 1.5 MB) are far from the fabric's peak
    assert nccl.stages[0]["tp_comm_s"] > 1.2 * nominal.stages[0]["tp_comm_s"]
    assert nccl.summary["iteration_s"] > nominal.summary["iteration_s"]
    with pytest.raises(ConfigError, match="collective_model='mpi'"):
        System(collective_model="mpi")


def test_ring_steps_across_nodes_pay_the_network_latency_and_the_others_the_nvlink_one():
    """NCCL's tuning model (tuning.cc, ncclTopoTuneModel; torch/_inductor/comm_analysis.py):
    ``(nsteps - nInterSteps) intraLat + nInterSteps interLat`` with ``nInterSteps`` 2 (nodes - 1)
    for an allreduce and nodes - 1 for an allgather or reduce-scatter; a broadcast's steps and a
    p2p pay the network's; one GPU per node: every step crosses nodes."""
    shape = dict(intra_bps=8 * 200e9, intra_latency_s=0.0, inter_bps=4 * 200e9, inter_latency_s=0.0)
    g = GroupShape(24, 3, 8, **shape, model="nccl")
    (nvl, net), simple = (5.7e-6, 6.6e-6), PROTOCOLS[2]
    for kind, steps, inter in (("allreduce", 46, 4), ("allgather", 23, 2), ("reduce_scatter", 23, 2),
                               ("broadcast", 23, 23), ("p2p", 1, 1)):
        c = plan(kind, 64e6, GroupShape(24, 3, 8, **shape), "ring")
        (ph,), = c.phases
        assert (ph.steps_in, ph.steps_out) == (steps - inter, inter), kind
        assert with_protocol(c, g, simple).time() - c.time() == pytest.approx(
            simple.base_ring_s + (steps - inter) * nvl + inter * net), kind
    # PCIe inside the node: its steps pay NCCL's PCI latency
    pci = GroupShape(24, 3, 8, **shape, model="nccl", intra_pcie=True)
    c = plan("allreduce", 64e6, GroupShape(24, 3, 8, **shape), "ring")
    assert with_protocol(c, pci, PROTOCOLS[0]).time() - 4 * c.time() == pytest.approx(3.6e-6 + 42 * 1.0e-6
                                                                                      + 4 * 0.9e-6)
    # one GPU per node: every step crosses nodes
    lone = plan("allreduce", 64e6, GroupShape(3, 3, 1, **shape), "ring")
    assert (lone.phases[0][0].steps_in, lone.phases[0][0].steps_out) == (0, 4)


def test_pipelined_steps_overlap_their_data():
    """collective_model pipelined: NCCL's protocols and choice, each step's latency overlapped by the
    data before it (NCCL_STEPS slots, prims_simple.h waitPeer): T = base + sum_{k<n} max(d, h_k) + d +
    h_last with d the step's share of the transfer. Large messages pay one step's latency, small ones
    every step's (as the additive nccl model) plus one step's data."""
    from perfsim.collectives import overlapped_steps_s

    shape = dict(intra_bps=8 * 200e9, intra_latency_s=0.0, inter_bps=4 * 200e9, inter_latency_s=0.0)
    nominal = GroupShape(24, 3, 8, **shape)
    simple = PROTOCOLS[2]
    (nvl, net) = (5.7e-6, 6.6e-6)
    for S in (64e6, 4e3):
        ring = plan("allreduce", S, nominal, "ring")
        (ph,), = ring.phases
        additive = with_protocol(ring, GroupShape(24, 3, 8, **shape, model="nccl"), simple)
        piped = with_protocol(ring, GroupShape(24, 3, 8, **shape, model="pipelined"), simple, pipelined=True)
        transfer = ph.volume_bytes * 8 / ph.rate_bps
        d = transfer / 46
        assert piped.time() == pytest.approx(simple.base_ring_s + transfer + overlapped_steps_s(transfer, 42, nvl, 4, net))
        if d > net:  # 64 MB: every step's data outlasts its latency -- one network step's latency is left
            assert piped.time() == pytest.approx(simple.base_ring_s + transfer + net)
        else:  # 4 kB: latency-bound, the tuner's sum of latencies plus one step's data
            assert d < nvl and piped.time() == pytest.approx(simple.base_ring_s + 42 * nvl + 4 * net + d)
        assert piped.time() <= additive.time()
    assert overlapped_steps_s(1.0, 0, 1e-6, 0, 1e-6) == 0.0
    # the protocol is the one NCCL's tuner picks (the additive model's cheapest), then priced pipelined
    for S in (1e3, 1e5, 1e7, 1e9):
        tuner = plan("allreduce", S, GroupShape(24, 3, 8, **shape, model="nccl"))
        piped = plan("allreduce", S, GroupShape(24, 3, 8, **shape, model="pipelined"))
        assert piped.algo == tuner.algo and piped.time() <= tuner.time()


def test_auto_prices_a_gpu_presets_collectives_as_nccl_and_the_rest_nominal():
    from perfsim.collectives import resolve_model

    assert System().collective_model == "auto"
    assert [resolve_model("auto", nccl) for nccl in (True, False)] == ["pipelined", "nominal"]
    assert resolve_model("nccl", False) == "nccl"
    with pytest.raises(ConfigError, match="collective_model='mpi'"):
        resolve_model("mpi", True)
    kw = dict(model="gpt2", gpu="a100", tp=4, pp=2, dp=2, gpus_per_node=8, micro_batch=1, global_batch=16,
              nic="8x200Gbps:infiniband", intra_node_fabric="nvlink3")
    auto, piped = predict(**kw), predict(**kw, collective_model="pipelined")
    assert auto.summary["iteration_s"] == piped.summary["iteration_s"]
    assert "/" in auto.summary["collective_algo"]  # ring/Simple, ...: a protocol was chosen
    # no GPU preset (the profile's CPUs, gloo): nominal
    cpu = dict(model="gpt2", pp=2, dp=2, micro_batch=1, global_batch=8, bandwidth="1Gbps")
    assert predict(**cpu).summary["iteration_s"] == predict(**cpu, collective_model="nominal").summary["iteration_s"]
