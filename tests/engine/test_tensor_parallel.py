"""Tensor parallelism: Megatron's collectives per layer, placement, and the engine charging them."""

import pytest

from perfsim.api import build_configs, predict
from perfsim.config import Strategy
from perfsim.errors import ConfigError
from perfsim.models.tensor_parallel import shard_block_params, tp_layer_collectives
from perfsim.models.registry import get_spec
from perfsim.network import collective_cost

GPT = "gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=51200"


def test_megatron_two_allreduces_each_way():
    # b s h x 2 bytes = 4 x 1024 x 1024 x 2
    full = 4 * 1024 * 1024 * 2
    assert tp_layer_collectives(1024, 1024, 4, 8, False, 2) == (
        ("fwd", "allreduce", full), ("fwd", "allreduce", full),
        ("bwd", "allreduce", full), ("bwd", "allreduce", full))
    assert tp_layer_collectives(1024, 1024, 4, 1, False, 2) == ()


def test_sequence_parallel_same_ring_volume():
    full = 2 * 1024 * 1024 * 2
    sp = tp_layer_collectives(1024, 1024, 2, 4, True, 2)
    assert [k for _, k, _ in sp] == ["allgather", "reduce_scatter"] * 4
    assert [ph for ph, _, _ in sp] == ["fwd"] * 4 + ["bwd"] * 4
    assert {n for _, k, n in sp if k == "allgather"} == {full / 4}  # each rank's shard
    assert {n for _, k, n in sp if k == "reduce_scatter"} == {full}
    vol = lambda c: sum(collective_cost(k, n, 4)[0] for _, k, n in c)  # noqa: E731
    assert vol(sp) == pytest.approx(vol(tp_layer_collectives(1024, 1024, 2, 4, False, 2)))
    with pytest.raises(ConfigError, match="seq"):
        tp_layer_collectives(1024, 1023, 2, 4, True, 2)


def test_shard_params_and_divisibility():
    spec = get_spec("llama2-70b")
    per = shard_block_params(spec, 8)
    assert per * 8 > spec.block_params() > (per - 2 * spec.hidden) * 8  # only the norms are replicated
    with pytest.raises(ConfigError, match="heads"):
        predict(model="gpt:layers=2,hidden=96,heads=6,seq=64,vocab=128", gpu="a100", tp=4, pp=1)


def test_placement_tp_innermost_and_configurable():
    s = Strategy(pp=2, dp=2, tp=4, macro_batch=4, placement=("tp", "dp", "pp"))  # Megatron's
    assert [s.device(t, 0, 0) for t in range(4)] == [0, 1, 2, 3]
    assert s.device(0, 1, 0) == 4 and s.device(0, 0, 1) == 8
    s2 = Strategy(pp=2, dp=2, tp=4, macro_batch=4, placement=("dp", "tp", "pp"))
    assert [s2.device(t, 0, 0) for t in range(4)] == [0, 2, 4, 6]
    assert Strategy(pp=4, dp=2).device(0, 1, 2) == 1 * 4 + 2  # historic replica-major default
    _, st, _, _ = build_configs(model=GPT, gpu="a100", tp=2, pp=2, dp=2, global_batch=4)
    assert st.placement == ("tp", "dp", "pp") and st.schedule == "1f1b"
    with pytest.raises(ConfigError, match="placement"):
        Strategy(placement=("tp", "dp"))


def _run(**kw):
    # the nominal collective model: these tests check the phases' bytes and links against the plain
    # ring formulas (the default, auto, adds NCCL's protocol costs for a GPU preset: test_protocols.py),
    # at a stated intra-node rate (a GPU preset's default is its node's fabric: NODE_FABRIC)
    base = dict(model=GPT, gpu="a100-sxm4-80gb", pp=2, dp=2, micro_batch=1, global_batch=8, gpus_per_node=8,
                precision="bf16", bandwidth="100Gbps", collective_model="nominal", intra_node_bandwidth="300GB/s",
                attention="megatron")  # the unfused kernels these tests' figures count
    return predict(**{**base, **kw})


def test_engine_charges_tp_collectives_on_the_group_links(monkeypatch):
    import dataclasses

    from perfsim import hardware

    r = _run(tp=4)
    s = r.summary
    st0 = r.stages[0]
    # 4 all-reduces of b s h x 2 bytes per block, ring on 4 GPUs of one node (300 GB/s, 5 us),
    # and the vocabulary-parallel embedding's forward all-reduce of the same size (a GPU preset:
    # Megatron's layout, tensor_parallel.tp_edge_collectives)
    first, last = map(int, st0["layers"].split("-"))
    blocks = last - first  # layer 0 is the embedding
    calls = blocks * 4 + 1
    nbytes = 1024 * 1024 * 2
    per_ar = 2 * 3 / 4 * nbytes * 8 / 2.4e12 + 6 * 5e-6
    # ... but a call costs at least the host's time to issue it (the GPU curve's collective_s)
    host = hardware.A100_CURVE.collective_s
    assert 0 < per_ar < host
    assert st0["tp_bytes_per_mb"] == pytest.approx(calls * 2 * 3 / 4 * nbytes)
    m = s["macro_batch"] // s["micro_batch"]
    assert st0["tp_comm_s"] == pytest.approx(m * calls * host, rel=1e-9)
    no_floor = dataclasses.replace(hardware.A100_CURVE, collective_s=0.0)
    monkeypatch.setitem(hardware.GPUS, "a100-sxm4-80gb", dataclasses.replace(hardware.GPUS["a100-sxm4-80gb"], curve=no_floor))
    assert _run(tp=4).stages[0]["tp_comm_s"] == pytest.approx(m * calls * per_ar, rel=1e-9)
    monkeypatch.undo()
    # full recomputation runs the layers' two forward all-reduces again in the backward, not the
    # embedding's (Megatron checkpoints the transformer layers only)
    rec = _run(tp=4, recompute="full").stages[0]
    assert rec["tp_bytes_per_mb"] == pytest.approx((blocks * 6 + 1) * 2 * 3 / 4 * nbytes)
    # TP across nodes (2 GPUs per node), flat ring: its slowest hop is the inter-node link
    # (100 Gbps at the NIC's payload efficiency, 0 latency)
    slow = _run(tp=4, gpus_per_node=2, collective_algo="ring")
    rate = slow.summary["collective_link_rate_bps"]
    assert rate < 100e9
    per_ar_slow = 2 * 3 / 4 * nbytes * 8 / rate
    assert slow.stages[0]["tp_comm_s"] == pytest.approx(m * calls * per_ar_slow, rel=1e-9)
    assert slow.summary["iteration_s"] > s["iteration_s"]
    # NCCL-like selection never picks an algorithm slower than the ring
    assert _run(tp=4, gpus_per_node=2).stages[0]["tp_comm_s"] <= slow.stages[0]["tp_comm_s"]


def test_pipeline_activation_divided_by_tp():
    """Megatron-LM's scatter/gather (the gpu preset's tp_send): each TP rank sends 1/t."""
    one, four = _run(tp=1), _run(tp=4)
    assert one.stages[0]["fw_bytes_per_mb"] == 1024 * 1024 * 2  # bf16 on the wire, no codec
    assert four.stages[0]["fw_bytes_per_mb"] == one.stages[0]["fw_bytes_per_mb"] // 4


def test_who_sends_what_across_a_pipeline_boundary():
    """tp_send: ``full`` -- every TP rank sends the whole activation (perfsim run, Megatron-Core);
    ``scatter-gather`` -- 1/t each, then the receivers all-gather it over NVLink before the
    next stage computes, once per message (arXiv:2104.04473 Sec. 4.1); sequence parallelism
    sends 1/t and gathers nothing."""
    from perfsim.models.tensor_parallel import pipeline_send

    assert pipeline_send(8 * 1024, 1024, 4, False, "full") == (None, False)
    assert pipeline_send(8 * 1024, 1024, 4, False, "scatter-gather") == ((2048,), True)
    assert pipeline_send(8 * 1024, 1024, 4, True, "full") == ((2048,), False)
    assert pipeline_send(8 * 1024, 1024, 1, False, "scatter-gather") == (None, False)
    with pytest.raises(ConfigError, match="tp_send='both'"):
        pipeline_send(8, 8, 2, False, "both")
    kw = dict(tp=8, dp=1, global_batch=4)  # 4 micro-batches, stage 1 -> 2 crosses the 2 nodes
    full, sg, sp = _run(**kw, tp_send="full"), _run(**kw), _run(**kw, sequence_parallel=True)
    assert sg.summary["tp_send"] == "scatter-gather" and full.summary["tp_send"] == "full"
    msg = 1024 * 1024 * 2
    assert full.stages[0]["fw_bytes_per_mb"] == msg
    assert sg.stages[0]["fw_bytes_per_mb"] == sp.stages[0]["fw_bytes_per_mb"] == msg // 8
    # the gather: one all-gather of the 1/8 slices in the node per received message (fwd on
    # stage 1, bwd on stage 0), at least the curve's host time of a collective
    from perfsim.hardware import curve_for, get_gpu
    from perfsim.network import Network

    system = build_configs(model=GPT, gpu="a100-sxm4-80gb", tp=8, pp=2, dp=1, gpus_per_node=8)[2]
    ag = max(Network(system, 16).collective_time("allgather", msg // 8, list(range(8)), lockstep=True),
             curve_for(get_gpu("a100-sxm4-80gb"))[0].collective_s)
    extra = sum(r["encode_s"] for r in sg.stages) - sum(r["encode_s"] for r in sp.stages)
    assert extra == pytest.approx(2 * 4 * ag, rel=1e-6)
    assert sg.summary["iteration_s"] < full.summary["iteration_s"]  # 8x less through the NICs


def test_tp_lanes_share_a_nic():
    # stages in different nodes (gpus_per_node = tp): 4 lanes share the node's NIC
    base = dict(pp=2, dp=1, global_batch=1, compress="fp32", precision="fp32", recompute="none")
    slow = _run(tp=4, gpus_per_node=4, bandwidth="1Gbps", **base)
    comm = slow.microbatches[0]["fwd_comm_s"]
    rate = slow.summary["link_rate_bps"]  # 1 Gbps at the NIC's payload efficiency
    assert rate == pytest.approx(1e9 * 0.941, rel=1e-3)
    assert comm == pytest.approx(4 * slow.stages[0]["fw_bytes_per_mb"] * 8 / rate, rel=1e-6)


def test_tp_splits_compute_and_memory():
    one, four = _run(tp=1, micro_batch=8, global_batch=16), _run(tp=4, micro_batch=8, global_batch=16)
    # not 4x: at hidden 1024 the per-operator host floor is a large share of a TP 4 rank's time
    assert four.stages[0]["fwd_s_per_mb"] < one.stages[0]["fwd_s_per_mb"] / 2.4
    assert four.stages[0]["weights_gib"] < one.stages[0]["weights_gib"] / 3.5
    w, _, _, _ = build_configs(model=GPT, gpu="a100", tp=4, pp=2, dp=2, global_batch=8)
    a = w.arch  # replicated on every rank: position table, norms, row-parallel biases
    replicated = a.max_positions * a.hidden + a.n_layer * (2 * a.norm_params() + 2 * a.hidden) + a.norm_params()
    assert sum(w.rank_params) * 4 == a.params + 3 * replicated


def test_sequence_parallel_edges_gather_the_sequence_once_each_way():
    """Under SP the stage with the embedding all-gathers its output gradient backward,
    the stage with the LM head its input forward (the runtime's layout: both replicated),
    one sequence shard each per micro-batch; nothing without SP. (The GPU presets' vocabulary-
    parallel edges add their own collectives: test_vocab_parallel_edges_launch_megatrons_collectives.)"""
    from perfsim.models.tensor_parallel import tp_edge_collectives

    shard = 2 * 1024 * 1024 * 2 / 4
    assert tp_edge_collectives(1024, 1024, 2, 4, True, 2, embed=True, head=True) == \
        (("fwd", "allgather", shard), ("bwd", "allgather", shard))
    assert tp_edge_collectives(1024, 1024, 2, 4, False, 2, embed=True, head=True) == ()
    sp, plain = _run(tp=4, sequence_parallel=True), _run(tp=4)
    # micro-batch 1 x seq 1024 x hidden 1024 bf16 in 4 shards; each rank's wire bytes: 3 other shards
    ag = collective_cost("allgather", 1024 * 1024 * 2 / 4, 4)[0]
    # replica 0's stages (both replicas share node 0's NICs, so both are simulated)
    sp_stages, plain_stages = ([row for row in r.stages if row["replica"] == 0] for r in (sp, plain))
    first, last = sp_stages[0], sp_stages[-1]
    assert first["tp_bytes_per_mb"] - plain_stages[0]["tp_bytes_per_mb"] == pytest.approx(ag)
    # the GPU preset's head is vocabulary-parallel: without SP its input gradient is all-reduced
    # backward; with SP an all-gather forward and a reduce-scatter backward move the same bytes
    assert last["tp_bytes_per_mb"] == pytest.approx(plain_stages[-1]["tp_bytes_per_mb"])
    for mid, ref in zip(sp_stages[1:-1], plain_stages[1:-1]):
        assert mid["tp_bytes_per_mb"] == pytest.approx(ref["tp_bytes_per_mb"])


def test_vocab_parallel_edges_launch_megatrons_collectives():
    """Megatron-LM's vocabulary-parallel embedding all-reduces its output forward, its head's input
    gradient is all-reduced backward, the cross entropy all-reduces three fp32 values a token;
    under sequence parallelism the head's backward is a reduce-scatter, and the embedding's forward
    one too when no learned positions are added first (Megatron-Core's reduce_scatter_embeddings)."""
    from perfsim.models.tensor_parallel import tp_edge_collectives

    full, loss = 2 * 1024 * 1024 * 2, 4.0 * 2 * 1024
    edges = tp_edge_collectives(1024, 1024, 2, 4, False, 2, embed=True, head=True, vocab_parallel=True)
    assert sorted(edges) == sorted([("fwd", "allreduce", full)] + [("fwd", "allreduce", loss)] * 3
                                   + [("bwd", "allreduce", full)])
    sp = tp_edge_collectives(1024, 1024, 2, 4, True, 2, embed=True, head=False, vocab_parallel=True)
    assert sorted(sp) == sorted([("fwd", "allreduce", full), ("bwd", "allgather", full / 4)])
    rope = tp_edge_collectives(1024, 1024, 2, 4, True, 2, embed=True, head=True, vocab_parallel=True,
                               learned_positions=False)
    assert ("fwd", "reduce_scatter", full) in rope and ("bwd", "reduce_scatter", full) in rope
    assert tp_edge_collectives(1024, 1024, 2, 1, False, 2, embed=True, head=True, vocab_parallel=True) == ()
    # in the engine, with a GPU preset: the last stage (its blocks and the head) adds the head's
    # backward all-reduce and the loss's three, each rank's ring bytes 2 (t - 1) / t of the buffer
    last = _run(tp=4).stages[-1]
    first_layer, last_layer = map(int, last["layers"].split("-"))
    blocks = last_layer - first_layer  # the last layer is the head
    ring = 2 * 3 / 4
    assert last["tp_bytes_per_mb"] == pytest.approx(ring * ((blocks * 4 + 1) * 1024 * 1024 * 2 + 3 * 4 * 1024))
