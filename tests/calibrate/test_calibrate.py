"""perfsim calibrate: measurement modules, fits, profile round-trip, CLI."""

import json
import math

import pytest

from perfsim.calibrate.codecs import CodecConfig, _candidates, measure_codecs
from perfsim.calibrate.compute import ComputeConfig, measure_compute
from perfsim.calibrate.fit import fit_alpha_beta, fit_records
from perfsim.calibrate.profile_io import build_profile, to_profile_record
from perfsim.calibrate.timing import summarize, time_op
from perfsim.errors import ConfigError
from perfsim.profile import Profile
from perfsim.tcp import read_host as read_tcp_host

from _helpers import run_cli, run_cli_here


def test_fit_recovers_alpha_beta():
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    times = [5e-5 + s * 1e-9 for s in sizes]
    f = fit_alpha_beta(sizes, times)
    assert f.alpha_s == pytest.approx(5e-5, rel=1e-6)
    assert f.beta_s_per_byte == pytest.approx(1e-9, rel=1e-6)
    assert f.max_rel_error < 1e-6


def test_fit_is_non_negative_and_relative():
    # decreasing times would give a negative beta: clipped to a pure latency
    f = fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3])
    assert f.alpha_s > 0 and f.beta_s_per_byte == 0
    # a pure bandwidth line through the origin
    g = fit_alpha_beta([1e3, 1e4, 1e5], [1e-6, 1e-5, 1e-4])
    assert g.alpha_s == pytest.approx(0, abs=1e-12) and g.beta_s_per_byte == pytest.approx(1e-9)


def test_fit_records_groups_by_name():
    recs = [{"op": "encode", "name": n, "size_bytes": s, "time_s": a + s * b}
            for n, a, b in (("x", 1e-5, 1e-9), ("y", 2e-5, 3e-9)) for s in (1e3, 1e5, 1e7)]
    fits = {f["name"]: f for f in fit_records(recs, "encode")}
    assert fits["x"]["alpha_s"] == pytest.approx(1e-5) and fits["y"]["beta_s_per_byte"] == pytest.approx(3e-9)


def test_timing_median_and_iqr():
    t = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert t.median_s == 3.0 and t.repeats == 5 and 0 < t.spread_s < 97
    calls = []
    time_op(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(calls) == 5
    with pytest.raises(ConfigError):
        time_op(lambda: None, repeats=0)


def test_compute_records_every_layer():
    cfg = ComputeConfig("digits-mlp", micro_batches=(2,), warmup=1, repeats=3, stages=(2,))
    recs = measure_compute(cfg)
    layers = [lay.name for lay in cfg.spec.layers()]
    for op in ("layer_fwd", "layer_bwd", "optimizer"):
        assert sorted(r["name"] for r in recs if r["op"] == op) == sorted(layers)
    assert {r["name"] for r in recs if r["op"] == "stage_fwd"} == {"stage0", "stage1"}
    assert all(r["time_s"] > 0 and r["repeats"] >= 3 for r in recs)
    assert all(r["threads"] >= 1 for r in recs)
    stage = [r for r in recs if r["op"] in ("stage_fwd", "stage_bwd")]
    # timed as a pipeline rank runs them: every F/B of the timed 1F1B steps (at least
    # 3, for 3 optimizer samples) is a sample
    assert all(r["schedule"] == "1f1b" and r["microbatches"] == 4 and r["repeats"] == 12 for r in stage)
    assert {r["layers"] for r in stage} == {"0-1", "2-3"}
    opt = [r for r in recs if r["op"] == "stage_optimizer"]
    assert {(r["name"], r["layers"], r["repeats"]) for r in opt} == {("stage0", "0-1", 3), ("stage1", "2-3", 3)}
    assert [r["size_bytes"] for r in opt] == [4 * r["params"] for r in opt]


def test_compute_config_checks_stage_timing():
    with pytest.raises(ConfigError, match="stage_microbatches"):
        ComputeConfig("digits-mlp", stage_microbatches=0)
    with pytest.raises(ConfigError, match="schedule"):
        ComputeConfig("digits-mlp", stage_schedule="zigzag")


def test_compute_config_rejects_bad_input():
    with pytest.raises(ConfigError, match="micro_batches"):
        ComputeConfig("digits-mlp", micro_batches=(0,))
    with pytest.raises(ConfigError, match="unknown"):
        ComputeConfig("no-such-model")
    with pytest.raises(ConfigError, match="stages"):
        ComputeConfig("digits-mlp", stages=(9,))


def test_codec_candidates_from_syntax():
    assert _candidates("qsgd-maxnorm", "qsgd-maxnorm:BITS")[:2] == ["qsgd-maxnorm:1", "qsgd-maxnorm:2"]
    assert _candidates("randk-maxnorm", "randk-maxnorm:FRACTION:BITS[:scaled]")[0] == "randk-maxnorm:0.1:1"
    assert _candidates("fp32", "fp32") == ["fp32"]
    assert _candidates("aqsgd", "aqsgd:BITS[:m8|m4|m2][:disk=PATH]")[2] == "aqsgd:3"
    assert _candidates("qsgd", "qsgd:BITS[:bucket=D] | qsgd:s=LEVELS[:bucket=D]")[3] == "qsgd:4"
    assert _candidates("powersgd", "powersgd:RANK[:start=ITER]") == []


def test_codecs_points_and_fits():
    recs = measure_codecs(CodecConfig(specs=("fp32", "qsgd-maxnorm:4"), sizes=(4096, 65536),
                                      warmup=1, repeats=3))
    raw = [r for r in recs if r["op"] == "encode" and r["name"] == "qsgd-maxnorm:4"]
    assert [r["size_bytes"] for r in raw] == [4096, 65536]
    assert all(r["wire_bytes"] < r["size_bytes"] / 4 for r in raw)  # 4 bits < 1/8 of fp32 + scales
    fits = {(r["op"], r["name"]) for r in recs if r["op"].startswith("fit_")}
    assert fits == {(f"fit_{o}", n) for o in ("encode", "decode") for n in ("fp32", "qsgd-maxnorm:4")}
    with pytest.raises(ConfigError, match="nosuch"):
        CodecConfig(specs=("nosuch:4",)).resolved_specs()


@pytest.mark.parametrize("ranks", [1, 2])
def test_codecs_time_the_data_parallel_path_of_compressors_that_have_one(ranks):
    """MaxNorm's all-reduce runs its own lane path (Compressor.dp_codec): dp_encode /
    dp_decode points and fits, timed in ``ranks`` processes at once; DirectQ (allgather of
    compress payloads) has none."""
    recs = measure_codecs(CodecConfig(specs=("directq:4", "qsgd-maxnorm:4"), sizes=(4096, 65536),
                                      warmup=1, repeats=3, threads=1, dp_world=2, dp_ranks=ranks))
    dp = [r for r in recs if r["op"] in ("dp_encode", "dp_decode")]
    assert sorted((r["op"], r["size_bytes"]) for r in dp) == [(o, b) for o in ("dp_decode", "dp_encode")
                                                              for b in (4096, 65536)]
    assert all(r["name"] == "qsgd-maxnorm:4" and r["world_size"] == 2 and r["concurrent_ranks"] == ranks
               and r["time_s"] > 0 for r in dp)
    fits = {(r["op"], r["name"]) for r in recs if r["op"].startswith("fit_dp")}
    assert fits == {("fit_dp_encode", "qsgd-maxnorm:4"), ("fit_dp_decode", "qsgd-maxnorm:4")}
    with pytest.raises(ConfigError, match="dp_world=1"):
        CodecConfig(dp_world=1)


def test_codecs_at_pipeline_boundaries_are_timed_in_situ():
    """A boundary point: the stage's real output shape, timed right after that stage's
    forward and backward; it stays out of the per-byte fit, carries shape and model,
    and the profile prefers it for that boundary (the same model's first)."""
    from perfsim.calibrate.profile_io import build_profile
    from perfsim.models.registry import get_model_spec

    shape = (4, *get_model_spec("gpt2-tiny").layers()[1].out_shape)
    recs = measure_codecs(CodecConfig(specs=("directq:4",), sizes=(4096, 16384, 65536),
                                      boundaries=(("gpt2-tiny", 2, 0, 4),), warmup=1, repeats=3))
    enc = [r for r in recs if r["op"] == "encode"]
    situ = [r for r in enc if "shape" in r]
    text = "x".join(map(str, shape))
    assert [(r["shape"], r["model"], r["size_bytes"]) for r in situ] == [(text, "gpt2-tiny", 4 * math.prod(shape))]
    fit = next(r for r in recs if r["op"] == "fit_encode")
    assert fit["points"] == 3  # the sweep only
    prof = build_profile(recs, {})
    n = 4 * math.prod(shape)
    assert prof.encode_time("directq:4", n, shape, "gpt2-tiny") == pytest.approx(situ[0]["time_s"])
    assert prof.encode_time("directq:4", n, shape) == pytest.approx(situ[0]["time_s"])  # any model
    # a shape never calibrated falls back to the fit
    assert prof.encode_time("directq:4", n, (4, n // 16)) == prof.encode_time("directq:4", n)
    with pytest.raises(ConfigError, match="boundary"):
        CodecConfig(boundaries=(("gpt2-tiny", 2, 1, 8),))  # the last stage ends no boundary


LOOPBACK_OPS = {"p2p": ("p2p",), "allreduce": ("allreduce",), "messenger": ("p2p",), "late": ("p2p",),
                "framing": ("frame_send", "frame_recv")}  # op asked -> the records it writes


@pytest.fixture(scope="module")
def loopback_records():
    """:func:`measure_comm` of every loopback op that the two tests below read, in one
    spawn of 2 gloo ranks (each op is timed on its own, one after the other)."""
    from perfsim.calibrate.comm import CommConfig, measure_comm

    return measure_comm(CommConfig(ops=tuple(LOOPBACK_OPS), sizes=(1024, 262144), warmup=1, repeats=3,
                                   max_seconds=0.5, timeout_s=120, small_repeats=6, small_bytes=4096))


def test_comm_loopback_two_ranks(loopback_records):
    from perfsim.calibrate.comm import CommConfig

    recs = loopback_records
    raw = [r for r in recs if r["op"] in ("p2p", "allreduce")]
    # small messages get more repeats; every point carries its mean (expected cost)
    assert {r["repeats"] for r in raw if r["size_bytes"] == 1024} == {6}
    assert {r["repeats"] for r in raw if r["size_bytes"] == 262144} == {3}
    assert all(r["mean_s"] > 0 for r in raw)
    with pytest.raises(ConfigError, match="small_repeats"):
        CommConfig(small_repeats=-1)
    assert {(r["op"], r["name"], r["size_bytes"]) for r in raw} == {
        (o, n, s) for o, n in (("p2p", "gloo"), ("allreduce", "gloo"), ("p2p", "messenger"),
                               ("p2p", "messenger-late")) for s in (1024, 262144)}
    assert all(r["time_s"] > 0 for r in raw)
    # one fit per op and link, nothing else (framing's two: the test below)
    assert {(r["op"], r["name"]) for r in recs if r["op"].startswith("fit_")} == {
        ("fit_p2p", "gloo"), ("fit_p2p", "messenger"), ("fit_p2p", "messenger-late"),
        ("fit_allreduce", "gloo"), ("fit_frame_send", "messenger"), ("fit_frame_recv", "messenger")}
    assert {r["op"] for r in recs} == {o for ops in LOOPBACK_OPS.values() for o in ops} | {
        f"fit_{o}" for ops in LOOPBACK_OPS.values() for o in ops}


def test_profile_record_folding_round_trip(tmp_path):
    rec = {"op": "encode", "name": "fp32", "size_bytes": 4096, "time_s": 1e-5, "spread_s": 1e-6,
           "repeats": 3, "wire_bytes": 4096, "device": "cpu"}
    out = to_profile_record(rec)
    assert out["wire_bytes"] == 4096 and out["device"] == "cpu" and out["source"] == "calibrate"
    with pytest.raises(ValueError, match="colour"):  # a fact the format has no field for
        to_profile_record({**rec, "colour": 1})
    prof = build_profile([rec, {"op": "p2p", "skipped": "no"}], {"device": "cpu"})
    path = tmp_path / "p.json"
    prof.save(path)
    back = Profile.load(path)
    assert back.records == prof.records and back.metadata["device"] == "cpu"
    assert back.encode_time("fp32", 4096) == pytest.approx(1e-5, rel=1e-12)  # fp32's copy costs its measurement


def test_profile_wrong_version_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "perfsim-profile", "version": 99, "metadata": {}, "records": []}))
    with pytest.raises(ConfigError, match="version"):
        Profile.load(path)
    path.write_text(json.dumps({"format": "something-else", "version": 1, "records": []}))
    with pytest.raises(ConfigError, match="format"):
        Profile.load(path)


def test_cli_quick_writes_a_profile(tmp_path):
    out = tmp_path / "prof.json"
    r = run_cli("calibrate", "--quick", "--model", "digits-mlp", "--micro-batch", "2", "--stages", "2",
                "--codecs", "fp32,qsgd-maxnorm:4", "--comm", "p2p", "--output", str(out))
    assert r.returncode == 0, r.stderr
    # stderr is a pipe here, as in a log or CI: no bar, one line per stage (started, done),
    # after the estimate of how long the calibration takes
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr and "pt/s" not in r.stderr
    assert lines[0].startswith("calibrate: ") and "about" in lines[0] and "GFLOP/s" in lines[0]
    assert [ln.split(":")[1].strip() for ln in lines[1:]] == [
        "compute digits-mlp ...", "compute digits-mlp", "codecs (2 specs) ...", "codecs (2 specs)",
        "comm loopback (p2p) ...", "comm loopback (p2p)"]
    prof = Profile.load(out)
    ops = {rec["op"] for rec in prof.records}
    assert {"layer_fwd", "layer_bwd", "stage_fwd", "encode", "decode", "fit_encode", "p2p",
            "fit_p2p"} <= ops
    meta = prof.metadata
    for key in ("device_name", "cores", "torch", "date", "perfsim", "git_commit", "calibration"):
        assert key in meta
    assert set(meta["calibration"]["stage_wall_s"]) == {"compute digits-mlp", "codecs", "comm loopback (p2p)"}
    # --comm records the host's TCP sysctls (/proc/sys/net/ipv4), which predict's window reads
    host = read_tcp_host()
    if host is not None:
        assert meta["tcp"] == host and len(meta["tcp"]["tcp_rmem"]) == 3
    assert prof.compute_time("digits-mlp", "fc0", 2, "fwd") > 0
    assert prof.collective_fit("p2p", "gloo").alpha_s >= 0
    assert prof.encode_time("qsgd-maxnorm:4", 65536) > 0


BAD_INPUT = [
    (["--micro-batch", "0"], "--micro-batch"),
    (["--model", "nosuch"], "nosuch"),
    (["--codecs", "nosuch:4"], "nosuch"),
    (["--emulate-bandwidth", "100furlongs"], "--emulate-bandwidth"),
]


@pytest.mark.parametrize("args,culprit", BAD_INPUT)
def test_cli_bad_input_one_line(tmp_path, args, culprit):
    cli = run_cli if args == BAD_INPUT[0][0] else run_cli_here  # the first in a real process
    r = cli("calibrate", "--quick", "--no-progress", "--comm", "none", "--output", str(tmp_path / "x.json"),
                *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0]
    assert not (tmp_path / "x.json").exists()


def test_comm_framing_is_each_side_host_time(loopback_records):
    """framing: rank 0's send call and rank 1's post + unpack, both per wire byte;
    the profile hands them to the plan as part of each message's encode/decode."""
    from perfsim.calibrate.profile_io import build_profile

    recs = [r for r in loopback_records if r["op"] in ("frame_send", "frame_recv", "fit_frame_send",
                                                       "fit_frame_recv")]
    raw = {(r["op"], r["size_bytes"]): r for r in recs if r["op"] in ("frame_send", "frame_recv")}
    assert set(raw) == {(o, s) for o in ("frame_send", "frame_recv") for s in (1024, 262144)}
    # (how long framing takes, beside a link's transfer time: benchmarks/bench_messenger.py)
    assert all(r["time_s"] > 0 and r["repeats"] >= 3 for r in raw.values())
    assert {r["op"] for r in recs if r["op"].startswith("fit_")} == {"fit_frame_send", "fit_frame_recv"}
    prof = build_profile(recs, {})
    assert prof.framing_time("send", 1024) > 0 and prof.framing_time("recv", 1024) > 0
    assert prof.framing_time("recv", 0) == 0.0


def test_interference_alternates_windows_on_every_rank(interference_records):
    """Compute alone and under allreduces, in alternating windows on both ranks: each
    record holds one median per window and rank, its time the mean of the ranks'."""
    from _helpers import INTERFERENCE_ROUNDS
    from perfsim.engine.plan import comm_slowdown

    recs = interference_records
    got = {r["name"]: r for r in recs if r["op"] == "interference"}
    assert set(got) == {"gloo alone", "gloo allreduce"}
    assert got["gloo alone"]["repeats"] == 2 * INTERFERENCE_ROUNDS
    assert 0 < got["gloo alone"]["time_s"] < 1 and got["gloo allreduce"]["time_s"] > 0
    assert comm_slowdown(build_profile(recs, {})) >= 0


def test_comm_ranks_leave_without_aborting(interference_run):
    """The comm ranks tear their group down after a barrier and leave without interpreter
    finalization (perfsim.procs.exit_rank): nothing on their stderr of a C++ thread destroyed
    while joinable ("terminate called without an active exception", gloo's at a rank's exit),
    nor of a failure."""
    records, err = interference_run
    assert records and "terminate called" not in err and "Traceback" not in err, err[-3000:]


def test_interference_traffic_scales_with_the_link():
    """A busy window carries about BUSY_S of allreduces at the link's rate."""
    from perfsim.calibrate.comm import CommConfig
    from perfsim.calibrate.interference import BUSY_S, COMM_BYTES, calls_per_window

    with pytest.raises(ConfigError, match="^interference_rounds=0: must be >= 1$"):
        CommConfig(ops=("interference",), interference_rounds=0)

    assert calls_per_window(1e8, 2) == math.ceil(BUSY_S / (COMM_BYTES * 8 / 1e8))
    assert calls_per_window(1e9, 2) == math.ceil(BUSY_S / (COMM_BYTES * 8 / 1e9))
    assert calls_per_window(1e5, 2) == 2 and calls_per_window(None, 2) == 400


def test_fit_shaped_link_recovers_token_bucket():
    from perfsim.link import fit_token_bucket as fit_shaped_link

    rate, burst, alpha = 12.0e6, 50_000, 1e-4  # ~96 Mbps payload, tbf burst 50 KB
    sizes = [1024, 4096, 65536, 262144, 1048576, 4194304]
    times = [alpha + max(0, s - burst) / rate for s in sizes]
    link = fit_shaped_link(sizes, times)
    assert link.rate_Bps == pytest.approx(rate, rel=1e-6)
    assert link.burst_bytes == pytest.approx(burst, rel=1e-3)
    assert link.alpha_s == pytest.approx(alpha)
    # never bandwidth-bound -> no estimate
    assert fit_shaped_link([1024, 4096, 16384], [1e-4, 1e-4, 1.1e-4]) is None


@pytest.mark.netns
def test_comm_over_emulated_link():
    from perfsim.calibrate.comm import CommConfig, measure_comm
    from perfsim.netem import netns_available

    if not netns_available():
        pytest.skip("network namespaces / tc unusable here")
    recs = measure_comm(CommConfig(ops=("p2p",), sizes=(1024, 1048576), warmup=1, repeats=3,
                                   max_seconds=0.5, emulate_bandwidth=1e8, timeout_s=120))
    raw = {r["size_bytes"]: r for r in recs if r["op"] == "p2p"}
    assert raw[1024]["name"] == "gloo@100Mbps"
    # 1 MiB over a 100 Mbps tbf: at least (1 MiB - 50 KB burst) at the nominal rate
    assert raw[1048576]["time_s"] > (1048576 - 50_000) * 8 / 1e8  # a floor load cannot break


def test_stage_timing_refuses_split_or_multi_chunk_schedules():
    """Whole-stage timing replays one stage per rank with whole backwards."""
    from perfsim.calibrate.compute import ComputeConfig
    from perfsim.errors import ConfigError

    for name in ("zb-h1", "interleaved-1f1b", "zb-v"):
        with pytest.raises(ConfigError, match=f"stage_schedule='{name}'"):
            ComputeConfig(model="gpt2-tiny", stage_schedule=name)


def test_time_op_repeats_until_the_samples_agree(monkeypatch):
    """rel_spread: at least 3 samples, then stop once their IQR (range below 4) is
    within that fraction of the median; a noisy op runs all repeats."""
    from perfsim.calibrate import timing

    durations = iter([1.0, 1.0, 1.02, 1.0] + [1.0, 2.0, 1.0, 3.0, 1.0, 2.0, 1.0, 3.0] + [1.0] * 8)
    now = [0.0]

    def op():
        now[0] += next(durations)

    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    t = timing.time_op(op, warmup=1, repeats=8, rel_spread=0.05)
    assert t.repeats == 3 and t.median_s == 1.0  # 1.0, 1.02, 1.0 agree within 5 %
    t = timing.time_op(op, warmup=0, repeats=8, rel_spread=0.05)
    assert t.repeats == 8  # 1, 2, 1, 3...: never within 5 %
    t = timing.time_op(op, warmup=0, repeats=8)
    assert t.repeats == 8  # without rel_spread: every repeat


def test_codec_config_rejects_a_bad_rel_spread():
    with pytest.raises(ConfigError, match="rel_spread"):
        CodecConfig(rel_spread=0)


def test_estimate_counts_points_and_quick_is_shorter():
    from perfsim.calibrate import codecs as cc
    from perfsim.calibrate.comm import CommConfig
    from perfsim.calibrate.calibration import SECONDS_PER_COMM_SWEEP, SECONDS_PER_POINT, estimate_seconds

    one = [ComputeConfig(model="digits-mlp", micro_batches=(8,))]
    two = [ComputeConfig(model="digits-mlp", micro_batches=(8, 16))]
    codecs = cc.CodecConfig(specs=("fp32", "fp16"))
    comm = [CommConfig(ops=("p2p",)), CommConfig(ops=("p2p",), emulate_bandwidth=1e8)]
    for i, (quick, sizes) in enumerate(((True, cc.QUICK_SIZES), (False, cc.FULL_SIZES))):
        base = estimate_seconds(one, None, [], quick)
        assert base > 0 and estimate_seconds(two, None, [], quick) == pytest.approx(2 * base)
        codec_s = SECONDS_PER_POINT["codec"][i] * 2 * len(sizes) * 2  # 2 specs, encode + decode
        comm_s = SECONDS_PER_COMM_SWEEP["loopback"][i] + SECONDS_PER_COMM_SWEEP["emulated"][i]
        assert estimate_seconds(one, codecs, comm, quick) == pytest.approx(base + codec_s + comm_s)
    assert estimate_seconds(one, codecs, comm, True) < estimate_seconds(one, codecs, comm, False)


def test_compare_profiles_reports_drift_per_group():
    """Records are paired by what they measured (every field but the measurement); the
    ratio per group is the median of new / old, and a group off by > 10 % is named."""
    from perfsim.calibrate.compare import compare_profiles, comparison_text

    def rec(op, layer, t, **kw):
        return {"op": op, "model": "gpt2-tiny", "micro_batch": 8, "layer_index": layer, "time_s": t,
                "spread_s": 0.0, "repeats": 5, **kw}

    old = Profile(records=[rec("layer_fwd", i, 1.0) for i in range(3)]
                  + [{"op": "encode", "name": "directq:fw4bw8", "size_bytes": 1024, "time_s": 2.0}])
    new = Profile(records=[rec("layer_fwd", 0, 1.3, repeats=15), rec("layer_fwd", 1, 1.25), rec("layer_fwd", 2, 0.1),
                           rec("layer_fwd", 9, 5.0),  # no partner: not compared
                           {"op": "encode", "name": "directq:fw4bw8", "size_bytes": 1024, "time_s": 2.1}])
    result = compare_profiles(new, old)
    assert result["compute"][:2] == (pytest.approx(1.25), 3) and result["codecs"][:2] == (pytest.approx(1.05), 1)
    # the record furthest from its partner (log scale), named: a median hides it
    assert result["compute"][2] == (pytest.approx(0.1), "layer_fwd gpt2-tiny mb 8")
    assert "communication" not in result
    text = comparison_text(result, "old.json")
    assert "compute 1.25x (3)" in text and "compute differ by more than 10%" in text and "codecs" not in text.split("--")[1]
    assert "furthest: layer_fwd gpt2-tiny mb 8 0.10x" in text
    # groups within tolerance, one record off: still named
    assert "within 10%; furthest: stage_fwd m stage0 mb 8 pp 2 1.47x" in comparison_text(
        {"compute": (1.0, 9, (1.47, "stage_fwd m stage0 mb 8 pp 2"))}, "old.json")
    assert "within 10%" in comparison_text({"compute": (1.02, 4)}, "old.json")
    assert "no measurement in common" in comparison_text({}, "old.json")


def test_drift_check_times_the_stages_a_pipeline_prediction_reads(tmp_path):
    """With pp > 1 the drift check re-times the profile's whole-stage records of that
    degree (a pipeline prediction reads them before the layers), as they were timed."""
    from perfsim.calibrate.calibration import calibrate
    from perfsim.calibrate.compare import drift_check

    prof = calibrate(str(tmp_path / "p.json"), progress=False, model="digits-mlp", micro_batch="8", stages="2",
                     stage_microbatches=2, codecs="none", comm="none", quick=True)
    result = drift_check(prof, "digits-mlp", 8, str(tmp_path / "now.json"), pp=2)
    now = Profile.load(tmp_path / "now.json")
    stages = [r for r in now.records if r["op"] == "stage_fwd"]
    assert stages and all(r["world_size"] == 2 and r["microbatches"] == 2 for r in stages)
    layers_only = drift_check(prof, "digits-mlp", 8, str(tmp_path / "now1.json"), pp=3)  # no 3-stage records
    assert result["compute"][1] > layers_only["compute"][1]


def test_stage_timing_run_times_stages_inside_a_real_run(tmp_path):
    """--stage-timing run (the CPU default): a short execute-mode run of the pipeline
    times each stage; its records are the ones a 2-stage prediction of that split reads."""
    from perfsim.calibrate.calibration import calibrate, plan_calibration

    plan = plan_calibration(model="digits-mlp", micro_batch="8", stages="2", codecs="none", comm="none",
                            device="cpu")
    assert [(c.pp, c.dp) for c in plan.run_stages] == [(2, 1)] and plan.compute[0].stages == ()
    assert plan_calibration(model="digits-mlp", stages="2", stage_timing="harness", codecs="none",
                            comm="none", device="cpu").run_stages == ()
    prof = calibrate(str(tmp_path / "p.json"), progress=False, model="digits-mlp", micro_batch="8", stages="2",
                     codecs="none", comm="none", quick=True, stage_timing="run")
    recs = {(r["op"], r["name"]): r for r in prof.records if r["op"].startswith("stage_")}
    assert set(recs) == {(op, f"stage{k}") for op in ("stage_fwd", "stage_bwd", "stage_optimizer") for k in (0, 1)}
    fwd = recs[("stage_fwd", "stage0")]
    assert fwd["world_size"] == 2 and "perfsim run --pp 2" in fwd["source"] and fwd["time_s"] > 0
    a, b = fwd["layers"]
    assert prof.stage_measured("digits-mlp", 0, a, b, 8, "fwd", 2) == fwd["time_s"]


def test_stage_schedules_each_get_a_run_of_their_own():
    """--stage-schedule is a list: with --stage-timing run one run per schedule and
    pipeline degree (multi-chunk and split-backward schedules only where pp > 1); the
    harness times one plain schedule and says so otherwise."""
    from perfsim.calibrate.calibration import plan_calibration
    from perfsim.errors import ConfigError

    plan = plan_calibration(model="gpt2-tiny", micro_batch="8", stages="1,2", codecs="none", comm="none",
                            device="cpu", stage_timing="run", stage_schedule="1f1b,interleaved-1f1b,zb-h1")
    assert [(c.pp, c.schedule) for c in plan.run_stages] == [(1, "1f1b"), (2, "1f1b"), (2, "interleaved-1f1b"),
                                                             (2, "zb-h1")]
    assert plan.settings["stage_schedules"] == ["1f1b", "interleaved-1f1b", "zb-h1"]
    only = plan_calibration(model="gpt2-tiny", micro_batch="8", stages="2", codecs="none", comm="none",
                            device="cpu", stage_timing="run", stage_schedule="zb-h1")
    assert [(c.pp, c.schedule) for c in only.run_stages] == [(2, "zb-h1")]
    with pytest.raises(ConfigError, match="--stage-schedule 1f1b,zb-h1: the harness"):
        plan_calibration(model="gpt2-tiny", stages="2", codecs="none", comm="none", device="cpu",
                         stage_timing="harness", stage_schedule="1f1b,zb-h1")
    with pytest.raises(ConfigError, match="--stage-schedule 'zz': unknown"):
        plan_calibration(model="gpt2-tiny", stages="2", codecs="none", comm="none", device="cpu",
                         stage_timing="run", stage_schedule="1f1b,zz")


def test_chunk_compute_sums_a_split_backward_per_micro_batch():
    from perfsim.calibrate.run_stages import chunk_compute

    ev = [dict(name=n, cat="compute", pid=0, dur=d, args=dict(step=s))
          for n, d, s in (("1F0", 2000, 0), ("1F0", 1000, 1), ("1I0", 1500, 1), ("1W0", 500, 1), ("0B3", 9, 1))]
    ev.append(dict(name="send fwd 0", cat="encode", pid=0, dur=7, args=dict(step=1)))
    got = chunk_compute(ev, first_step=1)
    assert got[1] == ([pytest.approx(1e-3)], [pytest.approx(2e-3)]) and got[0] == ([], [pytest.approx(9e-6)])


def test_interleaved_chunks_timed_inside_a_real_run():
    """An interleaved 1F1B run of 2 ranks times its 4 chunks: records a prediction of
    that schedule (4 stages) reads, each chunk's optimizer step a share of its rank's."""
    from perfsim.calibrate.run_stages import RunStageConfig, measure_run_stages
    from perfsim.profile import Profile

    recs = measure_run_stages(RunStageConfig("gpt2-tiny", 2, 2, schedule="interleaved-1f1b", steps=3))
    fwd = [r for r in recs if r["op"] == "stage_fwd"]
    assert [r["name"] for r in fwd] == [f"stage{k}" for k in range(4)]
    assert all(r["world_size"] == 4 and r["pp"] == 2 and r["time_s"] > 0 for r in recs)
    assert {r["op"] for r in recs} == {"stage_fwd", "stage_bwd", "stage_optimizer"}
    prof = Profile.from_dict({"format": "perfsim-profile", "version": 1, "records": recs})
    a, b = (int(x) for x in fwd[2]["layers"].split("-"))
    assert prof.stage_measured("gpt2-tiny", 2, a, b, 2, "fwd", 4, schedule="interleaved-1f1b") == fwd[2]["time_s"]


def test_compare_with_a_missing_profile_fails_before_measuring():
    from _helpers import assert_user_error

    r = run_cli("calibrate", "--quick", "--codecs", "none", "--comm", "none", "--compare", "/nonexistent/p.json",
                "--no-progress")
    assert_user_error(r.returncode, r.stderr, "/nonexistent/p.json")
    assert "wrote" not in r.stdout


def test_an_existing_profile_is_not_replaced_without_overwrite(tmp_path):
    """`perfsim calibrate --output traces/cpu-2core.json --quick` replaced the shipped profile (the
    one the validation grids re-predict) after 66 s of measuring, without a word; so did a second
    `perfsim calibrate` on its default traces/calibrated.json. A file there is refused before any
    measurement unless --overwrite (perfsim.calibrate(..., overwrite=True))."""
    import perfsim

    out = tmp_path / "mine.json"
    out.write_text("measured yesterday")
    nothing = ["--model", "", "--stages", "", "--comm", "none", "--codecs", "none", "--no-progress"]
    r = run_cli_here("calibrate", "--output", str(out), *nothing)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--overwrite" in r.stderr and str(out) in r.stderr and "points, about" not in r.stderr  # nothing measured
    assert out.read_text() == "measured yesterday"
    with pytest.raises(ConfigError, match="overwrite"):
        perfsim.calibrate(str(out), model="", stages="", comm="none", codecs="none", progress=False)
    r = run_cli_here("calibrate", "--output", str(out), "--overwrite", *nothing)
    assert r.returncode == 0, r.stderr
    assert Profile.load(out).metadata["calibration"]["command"].startswith("perfsim calibrate")


def test_a_value_repeated_in_a_list_is_measured_once():
    """`perfsim calibrate --model gpt2-tiny,gpt2-tiny --micro-batch 4,4` measured the model twice
    (2 x 54 points at mb 4, 4: duplicate records, twice the minutes); predict's comma lists run
    a repeated value once, and so does calibrate now."""
    from perfsim.calibrate.calibration import plan_calibration

    twice = plan_calibration(model="gpt2-tiny,gpt2-tiny", micro_batch="4,4", stages="1,1", quick=True)
    once = plan_calibration(model="gpt2-tiny", micro_batch="4", stages="1", quick=True)
    assert [c.model for c in twice.compute] == ["gpt2-tiny"]
    assert twice.compute[0].micro_batches == (4,) and twice.stages() == once.stages()
