"""Tensor parallelism predicted from a CPU profile's single-rank layer records."""

import pytest

from perfsim.api import build_configs, predict
from perfsim.models.ops import block_ops
from perfsim.errors import ConfigError
from perfsim.profile import load_profile
from perfsim.workload import get_model

PROFILE = "traces/cpu-2core.json"
ARGS = dict(model="gpt2-tiny", profile=PROFILE, pp=1, dp=1, micro_batch=8, bandwidth="1Gbps")


def _rec(prof, layer, op):
    return prof.compute_time("gpt2-tiny", layer, 8, op)


@pytest.mark.parametrize("sp", [False, True])
def test_cpu_profile_tp_split_closed_form(sp):
    """Blocks: measured time x (GEMM FLOPs / tp at the block's GEMM rate + memory-bound
    bytes, 1/tp only for what Megatron shards, at the embedding's memory rate); embedding
    and LM head as measured (replicated, as perfsim run --tp keeps them)."""
    prof = load_profile(PROFILE)
    b, s, h, tp = 8, 64, 128, 2  # gpt2-tiny: 4 heads, ffn = 4h
    # Megatron's forward FLOPs of a block (arXiv:1909.08053, App.): 24 b s h^2 + 4 b s^2 h
    flops = 24 * b * s * h * h + 4 * b * s * s * h
    ops = block_ops(get_model("gpt2-tiny").arch, b, 1, False, 4)
    attn_bytes = sum(o.bytes for o in ops if o.attention_core)  # softmax + dropout: per head, sharded
    act_bytes = sum(o.bytes for o in ops if not o.m and not o.attention_core and o.name != "activation")
    gelu_bytes = next(o.bytes for o in ops if o.name == "activation")  # on the ffn/tp columns: sharded
    assert flops == sum(o.flops for o in ops)
    # embedding: gather (2 x 4 B) + position add and dropout (13 B) per value of (b, s, h)
    mem_rate = (8 + 13) * b * s * h / _rec(prof, "embed", "fwd")
    blk = sum(_rec(prof, f"block{i}", "fwd") for i in range(4)) / 4
    mem_s = (attn_bytes + act_bytes + gelu_bytes) / mem_rate
    gemm_s = blk - mem_s
    replicated = act_bytes / mem_rate / (tp if sp else 1)  # norms, dropouts, residuals
    factor = (gemm_s / tp + (attn_bytes + gelu_bytes) / mem_rate / tp + replicated) / blk

    wl, *_ = build_configs(**ARGS, tp=tp, sequence_parallel=sp)
    assert wl.fwd_s[0] == pytest.approx(_rec(prof, "embed", "fwd"))
    assert wl.bwd_s[-1] == pytest.approx(_rec(prof, "head", "bwd"))
    for i in range(4):
        assert wl.fwd_s[1 + i] == pytest.approx(_rec(prof, f"block{i}", "fwd") * factor, rel=1e-9)
        assert wl.bwd_s[1 + i] == pytest.approx(_rec(prof, f"block{i}", "bwd") * factor, rel=1e-9)
    assert 0.5 < factor < 0.53 if not sp else factor == pytest.approx(0.5)
    assert "split for tp=2" in wl.compute_source


def test_cpu_profile_tp_predicts_over_the_measured_collective_link():
    res = predict(**ARGS, tp=2)
    s = res.summary
    assert s["collective_link_source"] == "profile allreduce gloo@1Gbps"
    # 4 blocks x 4 allreduces of the (8, 64, 128) fp32 activation, 4 micro-batches, 2 ranks
    assert s["tp_bytes"] == 4 * 4 * 4 * 2 * (8 * 64 * 128 * 4)
    assert s["tp_comm_s"] > 0 and s["iteration_s"] > s["tp_comm_s"]


def test_tp_without_layer_records_still_needs_a_gpu(tmp_path):
    import json

    d = json.loads(open(PROFILE).read())
    d["records"] = [r for r in d["records"] if not r["op"].startswith("layer_")]
    p = tmp_path / "p.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="give --gpu"):
        build_configs(**{**ARGS, "profile": str(p)}, tp=2)


def test_tp_bytes_cover_every_model_chunk():
    """Virtual stages move layers between chunks, never TP traffic: tp_bytes equal 1F1B's."""
    kw = {**ARGS, "pp": 2, "tp": 2, "gpus_per_node": 2}
    ref = predict(**kw, schedule="1f1b").summary["tp_bytes"]
    assert ref > 0
    for schedule in ("interleaved-1f1b", "zb-h1", "zb-v"):
        assert predict(**kw, schedule=schedule).summary["tp_bytes"] == ref


def _with_tp_records(tmp_path, fwd=0.027, bwd=0.039, sp=False):
    """cpu-2core.json without its TP records, plus one TP stage measurement."""
    from perfsim.profile import Profile

    prof = load_profile(PROFILE)
    data = prof.to_dict()
    data["records"] = [r for r in data["records"] if not r.get("tp")]
    out = Profile.from_dict(data, where="test")
    for op, t in (("stage_fwd", fwd), ("stage_bwd", bwd)):
        out.add(op=op, model="gpt2-tiny", name="stage0", micro_batch=8, world_size=1, size_bytes=524288,
                dtype="float32", layers=[0, 5], tp=2, sequence_parallel=int(sp), time_s=t,
                source="calibrate --tp: test")
    path = tmp_path / "tp.json"
    out.save(path)
    return str(path)


def test_measured_tp_stage_wins_over_the_split(tmp_path):
    """A TP rank's compute measured by execute mode (perfsim calibrate --tp) replaces
    the split of the single-rank records, for that tp degree and sequence-parallel
    setting only; the collectives are still added by the simulator."""
    path = _with_tp_records(tmp_path)
    base = dict(ARGS, profile=path, macro_batch=32)
    r = predict(**base, tp=2)
    mb = r.microbatches[0]
    assert mb["fwd_compute_s"] == pytest.approx(0.027) and mb["bwd_compute_s"] == pytest.approx(0.039)
    assert r.summary["tp_comm_s"] > 0
    split = predict(**dict(base, profile=_with_tp_records(tmp_path, sp=True)), tp=2)
    assert split.microbatches[0]["fwd_compute_s"] < 0.01  # no record without sequence parallelism
    single = predict(**base, tp=1)  # a TP record is not a single rank's stage
    assert single.microbatches[0]["fwd_compute_s"] != pytest.approx(0.027)


def test_calibrate_tp_bad_degree_names_the_flag():
    from perfsim.calibrate.calibration import plan_calibration

    with pytest.raises(ConfigError, match="--tp 3"):
        plan_calibration(model="gpt2-tiny", tp="3", codecs="none", comm="none")
    with pytest.raises(ConfigError, match="--tp: needs a GPT model"):
        plan_calibration(model="digits-mlp", tp="2", codecs="none", comm="none")
    plan = plan_calibration(model="gpt2-tiny", micro_batch="8", tp="2", codecs="none", comm="none")
    assert [(c.tp, c.sequence_parallel) for c in plan.tensor_parallel] == [(2, False), (2, True)]


def test_calibrate_tp_times_a_real_tp_rank(tmp_path, monkeypatch):
    """perfsim calibrate --tp 2 runs execute mode and records one rank's compute per
    micro-batch without its collectives: positive, and what predict then uses. (Each TP
    run takes 2 steps here instead of TPStageConfig's 8: one warm-up, one measured -- what
    is checked is where the records come from and go, not their statistics.)"""
    from dataclasses import replace

    from perfsim.calibrate import calibration
    from perfsim.calibrate.calibration import calibrate

    planned = calibration._tp_configs
    monkeypatch.setattr(calibration, "_tp_configs", lambda *a: tuple(replace(c, steps=2) for c in planned(*a)))
    out = tmp_path / "tp.json"
    prof = calibrate(str(out), model="gpt2-tiny", micro_batch="8", stages="", codecs="none", comm="none",
                     tp="2", quick=True, progress=False)
    recs = {(r["op"], r["sequence_parallel"]): r for r in prof.records if r.get("tp") == 2}
    assert set(recs) == {("stage_fwd", 0), ("stage_bwd", 0), ("stage_fwd", 1), ("stage_bwd", 1)}
    assert all(r["time_s"] > 0 and r["layers"] == [0, 5] and r["repeats"] == 4 for r in recs.values())
    r = predict(model="gpt2-tiny", profile=str(out), pp=1, dp=1, tp=2, micro_batch=8, macro_batch=32,
                bandwidth="1Gbps")
    assert r.microbatches[0]["fwd_compute_s"] == pytest.approx(recs["stage_fwd", 0]["time_s"])


def _measured_allreduce(prof, size, name="gloo@1Gbps"):
    return next(r["time_s"] for r in prof.records if r["op"] == "allreduce" and r["name"] == name
                and r["size_bytes"] == size and not r.get("call"))


def test_tp_collectives_run_in_lockstep():
    """TP allreduces come back to back with both ranks in step: the emulated link's rate,
    the loopback per-step cost (no late-receive waits), a ring of 2 steps each -- unless
    the profile timed the allreduce of that size on that link, which then prices it."""
    from perfsim.link import Link, resolve_link
    from perfsim.network import lockstep_link

    prof = load_profile(PROFILE)
    coll = resolve_link(prof, 1e9, 0.0, op="allreduce")
    loop = Link.calibrated(prof, None, 0.0, op="allreduce")
    ls = lockstep_link(coll, prof)
    assert ls.overhead_s == loop.overhead_s < coll.overhead_s and ls.rate_bps == coll.rate_bps
    assert lockstep_link(Link.nominal(1e9), prof) == Link.nominal(1e9)  # nothing calibrated: as it is
    size = 8 * 64 * 128 * 4  # an fp32 (micro-batch, seq, hidden) activation
    r = predict(**ARGS, tp=2, macro_batch=32)
    # 4 micro-batches x 4 blocks x 4, each the allreduce the profile measured at that size
    assert r.summary["tp_comm_s"] == pytest.approx(4 * 16 * _measured_allreduce(prof, size))
    # between measured sizes: log-log interpolation; beyond them the ring model
    assert prof.measured_allreduce_s(2 * size, 2, 1e9) == pytest.approx(
        (_measured_allreduce(prof, size) * _measured_allreduce(prof, 4 * size)) ** 0.5)
    assert prof.measured_allreduce_s(size, 3, 1e9) is None and prof.measured_allreduce_s(size, 2, 5e8) is None
    data = prof.to_dict()  # without the emulated sweep's raw points: the ring on the lockstep link
    data["records"] = [x for x in data["records"] if not (x["op"] == "allreduce" and x["name"] == "gloo@1Gbps")]
    from perfsim.profile import Profile

    bare = Profile.from_dict(data, where="test")
    from perfsim.network import Network

    wl, st, sy, _ = build_configs(**ARGS, tp=2, macro_batch=32)
    net = Network(sy, st.devices, bare)
    per = size * 8 / net.lockstep_link.rate_bps + 2 * net.lockstep_link.one_way_s  # the buffer once, 2 steps
    assert net.collective_time("allreduce", size, [0, 1], lockstep=True, call="all_reduce") == pytest.approx(per)
    # beside a GPU preset (no call: the profile's backend is not the run's) the measurement stays out
    full = Network(sy, st.devices, prof)
    assert full.collective_time("allreduce", size, [0, 1], lockstep=True) == pytest.approx(
        size * 8 / full.lockstep_link.rate_bps + 2 * full.lockstep_link.one_way_s)
    assert full.collective_time("allreduce", size, [0, 1], lockstep=True, call="all_reduce") == pytest.approx(
        _measured_allreduce(prof, size))


def _without_tensor_kinds(prof):
    """``prof`` less its measurements of the calls TP issues other than the allreduce."""
    from perfsim.profile import Profile

    data = prof.to_dict()
    data["records"] = [r for r in data["records"] if "call" not in r and "reduce_scatter" not in r["op"]]
    return Profile.from_dict(data, where="test")


def test_sequence_parallel_prices_a_measured_slow_reduce_scatter(tmp_path):
    """A profile whose reduce_scatter_tensor measures k times its allreduce (at the
    link's rate) makes every SP reduce-scatter k ring allreduces of the same buffer on
    the lockstep link instead of a ring reduce-scatter; nothing else moves."""
    from perfsim.link import resolve_link
    from perfsim.network import lockstep_link

    prof = _without_tensor_kinds(load_profile(PROFILE))
    ring = tmp_path / "ring.json"
    prof.save(ring)
    k = 3.0
    for name in ("gloo@1Gbps", "gloo"):
        fit = [r for r in prof.records if r["op"] == "fit_allreduce" and r["name"] == name][0]
        for s in (65536, 262144, 1048576):  # k x the allreduce of its sweep at every size
            ref = fit["alpha_s"] + s * fit["beta_s_per_byte"]
            prof.add(op="reduce_scatter", name=name, call="reduce_scatter_tensor", size_bytes=s, world_size=2,
                     time_s=k * ref, allreduce_s=ref, source="test")
    slow = tmp_path / "slow.json"
    prof.save(slow)
    assert prof.collective_ratio("reduce_scatter", "reduce_scatter_tensor", 262144, 1e9) == pytest.approx(k)

    kw = dict(ARGS, macro_batch=32, tp=2, sequence_parallel=True)
    base, rs = predict(**dict(kw, profile=str(ring))), predict(**dict(kw, profile=str(slow)))
    ls = lockstep_link(resolve_link(prof, 1e9, 0.0, op="allreduce"), prof)
    size = 8 * 64 * 128 * 4  # the (micro-batch, seq, hidden) fp32 input of each reduce-scatter
    ring_rs = size / 2 * 8 / ls.rate_bps + ls.one_way_s  # 2 ranks: half the buffer, one step
    measured_rs = k * _measured_allreduce(prof, size)  # k times the allreduce measured at that size
    n_rs = 4 * 4 * 4  # 4 micro-batches x 4 blocks x 4 reduce-scatters (2 forward, 2 backward)
    assert rs.summary["tp_comm_s"] - base.summary["tp_comm_s"] == pytest.approx(n_rs * (measured_rs - ring_rs))
    assert rs.summary["tp_bytes"] == base.summary["tp_bytes"]  # the ring's bytes, as the runtime counts
    assert rs.summary["iteration_s"] > base.summary["iteration_s"]
    plain = dict(ARGS, macro_batch=32, tp=2)  # no SP: allreduces only, unchanged
    assert predict(**dict(plain, profile=str(slow))).summary["iteration_s"] == \
        pytest.approx(predict(**dict(plain, profile=str(ring))).summary["iteration_s"])


def test_calibrate_times_the_calls_tensor_parallelism_issues():
    """A real 2-rank gloo run times reduce_scatter_tensor and all_gather_into_tensor:
    records of their kinds naming the call with their allreduce reference, one
    alpha-beta fit each (apart from the list all-gather's), and the ratio the profile
    then gives is the record's."""
    from perfsim.calibrate.comm import CommConfig, measure_comm
    from perfsim.calibrate.profile_io import build_profile

    recs = measure_comm(CommConfig(ops=("allreduce", "allgather", "reduce_scatter", "allgather_tensor"),
                                   sizes=(4096, 65536, 262144), repeats=3, warmup=1, max_seconds=0.5,
                                   backend="gloo"))
    by = {}
    for r in recs:
        by.setdefault((r["op"], r.get("call")), []).append(r)
    assert [r["size_bytes"] for r in by["reduce_scatter", "reduce_scatter_tensor"]] == [4096, 65536, 262144]
    assert len(by["allgather", "all_gather_into_tensor"]) == 3 and len(by["allgather", None]) == 3
    for r in by["reduce_scatter", "reduce_scatter_tensor"] + by["allgather", "all_gather_into_tensor"]:
        assert r["time_s"] > 0 and r["allreduce_s"] > 0  # its own back-to-back allreduce reference
    for kind, call in (("fit_reduce_scatter", "reduce_scatter_tensor"), ("fit_allgather", "all_gather_into_tensor"),
                       ("fit_allgather", None), ("fit_allreduce", None)):
        (fit,) = by[kind, call]
        assert fit["points"] == 3 and fit["name"] == "gloo"
    prof = build_profile(recs, {"backend": "gloo"})
    rs = by["reduce_scatter", "reduce_scatter_tensor"][-1]
    assert prof.collective_ratio("reduce_scatter", "reduce_scatter_tensor", 262144) == \
        pytest.approx(rs["time_s"] / rs["allreduce_s"])
    assert prof.fit("allgather", "gloo", "all_gather_into_tensor").alpha_s != prof.fit("allgather", "gloo").alpha_s


def test_measured_kinds_are_the_profiles_backend_only():
    """With a GPU preset (NCCL) beside the CPU profile (gloo), gloo's measured
    reduce-scatter does not price the GPU's: the prediction is the same as from the
    profile without those records."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        bare = f"{tmp}/bare.json"
        _without_tensor_kinds(load_profile(PROFILE)).save(bare)
        kw = dict(ARGS, macro_batch=32, tp=2, sequence_parallel=True, gpu="a100-sxm4-80gb")
        gpu = predict(**kw).summary["tp_comm_s"]
        assert gpu == pytest.approx(predict(**dict(kw, profile=bare)).summary["tp_comm_s"])
        cpu = dict(ARGS, macro_batch=32, tp=2, sequence_parallel=True)  # the profile's own device: they do
        assert predict(**cpu).summary["tp_comm_s"] > predict(**dict(cpu, profile=bare)).summary["tp_comm_s"]
