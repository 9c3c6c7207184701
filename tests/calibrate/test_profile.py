"""Profile format: round trip, validation, lookups, fits."""

import json
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.profile import Profile, fit_alpha_beta, load_profile


def test_default_profile_has_paper_compute():
    p = Profile.default()
    # AQ-SGD Table 3: 45 ms fwd / 135 ms bwd per 6-block stage
    assert p.stage_compute("gpt2-xl", 0, 1, "fwd") == pytest.approx(0.045)
    assert p.stage_compute("gpt2-xl", 7, 1, "bwd") == pytest.approx(0.135)
    six = sum(p.compute_time("gpt2-xl", f"block{i}", 1, "fwd") for i in range(6))
    assert six == pytest.approx(0.045)
    # linear micro-batch scaling when only mb=1 was measured
    assert p.compute_time("gpt2-xl", "block0", 4, "bwd") == pytest.approx(4 * 0.135 / 6)
    assert p.compute_time("gpt2-xl", "nope", 1) is None


def test_round_trip_and_dataframe(tmp_path):
    p = Profile(metadata={"machine": "test"})
    p.add(op="allreduce", name="gloo", size_bytes=1000, world_size=2, time_s=0.0011)
    p.add(op="allreduce", name="gloo", size_bytes=3000, world_size=2, time_s=0.0031)
    path = tmp_path / "p.json"
    p.save(path)
    q = Profile.load(path)
    assert q.records == p.records and q.metadata == {"machine": "test"}
    fit = q.collective_fit("allreduce")
    assert fit.alpha_s == pytest.approx(1e-4) and fit.beta_s_per_byte == pytest.approx(1e-6)
    df = q.dataframe()
    assert list(df["size_bytes"]) == [1000, 3000]


def test_codec_fits_most_specific_first():
    p = Profile()
    p.add(op="fit_encode", name="*", alpha_s=1.0, beta_s_per_byte=0.0)
    p.add(op="fit_encode", name="directq", alpha_s=2.0, beta_s_per_byte=0.0)
    p.add(op="fit_encode", name="directq:4", alpha_s=3.0, beta_s_per_byte=0.0)
    assert p.encode_time("directq:4", 10) == 3.0
    assert p.encode_time("directq:8", 10) == 2.0
    assert p.encode_time("qsgd:4", 10) == 1.0
    assert p.encode_time("fp32", 10) == 0.0  # the '*' fit is for compressors, not fp32
    assert p.decode_time("qsgd:4", 10) == 0.0  # nothing known -> free
    p.add(op="encode", name="fp32", size_bytes=4096, time_s=7e-5)
    p.add(op="encode", name="fp32", size_bytes=8192, time_s=9e-5)
    assert abs(p.encode_time("fp32", 8192) - 9e-5) < 1e-9  # execute mode's copy, when measured
    assert p.encode_time("none", 8192) == 0.0


def test_fit_alpha_beta_exact():
    fit = fit_alpha_beta([0, 100, 200], [5.0, 6.0, 7.0])
    assert fit.alpha_s == pytest.approx(5.0) and fit.beta_s_per_byte == pytest.approx(0.01)


@pytest.mark.parametrize("doc,msg", [
    ({"format": "other", "version": 1, "records": []}, "format"),
    ({"format": "perfsim-profile", "version": 3, "records": []}, "version=3.*upgrade"),
    ({"format": "perfsim-profile", "version": 1}, "records"),
    ({"format": "perfsim-profile", "version": 1, "records": [{"op": "layer_fwd", "name": "x"}]}, "model"),
    ({"format": "perfsim-profile", "version": 1, "records": [{"op": "warp", "name": "x"}]}, "warp"),
    ({"format": "perfsim-profile", "version": 1,
      "records": [{"op": "encode", "name": "x", "size_bytes": 1, "time_s": -1}]}, "time_s"),
    ({"format": "perfsim-profile", "version": 1,
      "records": [{"op": "encode", "name": "x", "size_bytes": 1, "time_s": 1, "colour": 3}]}, "colour"),
])
def test_bad_profiles_rejected(tmp_path, doc, msg):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=msg):
        Profile.load(path)


def test_malformed_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="malformed"):
        load_profile(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


def test_load_by_name():
    assert load_profile("default-v100-aqsgd").metadata["stages_measured"] == 8
    assert load_profile(None).path.endswith("default-v100-aqsgd.json")


def _stage_profile(layers_field="0-1"):
    from perfsim.profile import Profile

    recs = []
    for i, name in enumerate(("fc0", "fc1", "fc2", "fc3")):
        recs.append(dict(op="layer_fwd", name=name, model="digits-mlp", micro_batch=8, time_s=0.001))
        recs.append(dict(op="layer_bwd", name=name, model="digits-mlp", micro_batch=8, time_s=0.002))
    recs.append(dict(op="optimizer", name="fc0", model="digits-mlp", size_bytes=4000, time_s=1e-4))
    recs.append(dict(op="optimizer", name="fc1", model="digits-mlp", size_bytes=8000, time_s=2e-4))
    for op, t in (("stage_fwd", 0.005), ("stage_bwd", 0.008), ("stage_optimizer", 0.003)):
        recs.append(dict(op=op, name="stage0", model="digits-mlp", micro_batch=8, world_size=2,
                         time_s=t, size_bytes=8192, source=f"calibrate; layers={layers_field}; threads=1"))
    return Profile.from_dict({"format": "perfsim-profile", "version": 1, "records": recs})


def test_stage_measured_only_for_the_same_partition():
    p = _stage_profile()
    assert p.stage_measured("digits-mlp", 0, 0, 1, 8, "fwd", 2) == pytest.approx(0.005)
    assert p.stage_measured("digits-mlp", 0, 0, 1, 8, "bwd", 2) == pytest.approx(0.008)
    assert p.stage_measured("digits-mlp", 0, 0, 2, 8, "fwd", 2) is None  # other layers
    assert p.stage_measured("digits-mlp", 0, 0, 1, 4, "fwd", 2) is None  # other micro-batch
    assert p.stage_measured("digits-mlp", 0, 0, 1, 8, "fwd", 4) is None  # other degree
    assert p.stage_measured("digits-mlp", 1, 2, 3, 8, "fwd", 2) is None  # not measured
    assert p.stage_optimizer_measured("digits-mlp", 0, 0, 1, 2) == pytest.approx(0.003)
    assert p.stage_optimizer_measured("digits-mlp", 0, 0, 2, 2) is None


def test_stage_measured_prefers_the_schedule_that_timed_it():
    """A stage timed under ZB-H1 (split backward) prices ZB-H1, a 1F1B one the plain
    schedules; a schedule without records of its own reads the plain one."""
    from perfsim.profile import Profile

    recs = [dict(op="stage_bwd", name="stage0", model="m", micro_batch=8, world_size=2, layers="0-1",
                 time_s=t, schedule=sched, size_bytes=1) for sched, t in (("zb-h1", 0.013), ("1f1b", 0.009))]
    p = Profile.from_dict({"format": "perfsim-profile", "version": 1, "records": recs})
    assert p.stage_measured("m", 0, 0, 1, 8, "bwd", 2, schedule="zb-h1") == pytest.approx(0.013)
    for sched in ("1f1b", "gpipe", None):
        assert p.stage_measured("m", 0, 0, 1, 8, "bwd", 2, schedule=sched) == pytest.approx(0.009)
    only_zb = Profile.from_dict({"format": "perfsim-profile", "version": 1, "records": recs[:1]})
    assert only_zb.stage_measured("m", 0, 0, 1, 8, "bwd", 2, schedule="1f1b") == pytest.approx(0.013)


def test_plan_prefers_measured_whole_stage_over_layer_sum():
    from perfsim.api import build_configs
    from perfsim.engine.plan import build_plan

    for layers_field, fwd0, bwd0 in (("0-1", 0.005, 0.008), ("0-2", 0.002, 0.004)):
        w, s, _, prof = build_configs(model="digits-mlp", pp=2, dp=2, micro_batch=8, macro_batch=16,
                                      partition="2,2", profile=_stage_profile(layers_field))
        plan = build_plan(w, s, prof)
        st0, st1 = plan.stages
        assert st0.fwd_s == pytest.approx(fwd0) and st0.bwd_s == pytest.approx(bwd0)
        assert sum(st0.layer_bwd) == pytest.approx(bwd0)  # bucket timing follows the stage
        assert st1.fwd_s == pytest.approx(0.002) and st1.bwd_s == pytest.approx(0.004)
        # the in-loop optimizer step of the same stage, else the per-layer fit
        fit = prof.optimizer_time(4 * st0.params)
        assert st0.optimizer_s == pytest.approx(0.003 if layers_field == "0-1" else fit)
        assert st1.optimizer_s == pytest.approx(prof.optimizer_time(4 * st1.params))
    assert fit != pytest.approx(0.003)


def test_time_op_cold_flushes_before_every_call(monkeypatch):
    from perfsim.calibrate import timing

    log = []
    monkeypatch.setattr(timing, "flush_caches", lambda device="cpu": log.append("flush"))
    timing.time_op(lambda arg: log.append("call"), setup=lambda: log.append("setup"),
                   warmup=1, repeats=3, cold=True)
    assert log == ["setup", "flush", "call"] * 4
    log.clear()
    timing.time_op(lambda: log.append("call"), warmup=1, repeats=3)
    assert log == ["call"] * 4  # warm by default: nothing flushed


def test_flush_caches_maps_writes_and_unmaps_a_fresh_region(monkeypatch):
    """CPU: a fresh mapping each time (mapped, written, unmapped, as a step's
    activations are), not a persistent buffer -- a persistent rewrite leaves the
    codec 2x faster than inside a training step (timing.flush_caches docstring)."""
    import mmap

    from perfsim.calibrate import timing

    made = []
    real = mmap.mmap

    class Spy:
        def __init__(self, fileno, length):
            self.region, self.written, self.closed = real(fileno, length), 0, False
            made.append(self)

        def write(self, data):
            self.written += self.region.write(data)

        def close(self):
            self.closed = True
            self.region.close()

    monkeypatch.setattr(mmap, "mmap", Spy)
    timing.flush_caches("cpu")
    timing.flush_caches("cpu")
    assert len(made) == 2 and made[0].region is not made[1].region
    assert all(m.written == timing.CPU_FLUSH_BYTES and m.closed for m in made)
    assert timing.CPU_FLUSH_BYTES >= 4 * 2**20  # beyond a core's L2 and glibc's heap reuse


def test_codec_time_prefers_the_boundary_of_the_same_model():
    """In-situ boundary points (shape= in source) beat the fit; among them the
    requested model's; a shape nobody timed falls back to the fit."""
    from perfsim.profile import Profile

    recs = [{"op": "encode", "name": "directq:4", "size_bytes": 4096, "time_s": 1e-4},
            {"op": "encode", "name": "directq:4", "size_bytes": 65536, "time_s": 2e-4},
            {"op": "encode", "name": "directq:4", "size_bytes": 4096, "time_s": 5e-4, "model": "a",
             "source": "calibrate; shape=8x128"},
            {"op": "encode", "name": "directq:4", "size_bytes": 4096, "time_s": 9e-4, "model": "b",
             "source": "calibrate; shape=8x128"}]
    p = Profile.from_dict({"format": "perfsim-profile", "version": 1, "metadata": {}, "records": recs})
    assert p.encode_time("directq:4", 4096, (8, 128), "a") == 5e-4
    assert p.encode_time("directq:4", 4096, (8, 128), "b") == 9e-4
    assert p.encode_time("directq:4", 4096, (8, 128)) in (5e-4, 9e-4)  # any model's
    fit = p.encode_time("directq:4", 4096)
    assert fit == pytest.approx(1e-4, rel=0.05) and p.encode_time("directq:4", 4096, (4, 256), "a") == fit


# ----------------------------------------------------------------- format version 2 / migration
V1_RECORDS = [
    {"op": "encode", "name": "directq:4", "size_bytes": 4096, "time_s": 5e-4, "model": "a",
     "source": "calibrate; device=cpu; threads=2; wire_bytes=520; cache=after-layer-step; shape=8x128"},
    {"op": "stage_fwd", "name": "stage0", "model": "m", "micro_batch": 8, "world_size": 2, "time_s": 0.005,
     "size_bytes": 8192, "source": "calibrate; runtime; layers=0-1; schedule=1f1b; microbatches=4"},
    {"op": "fit_p2p", "name": "gloo", "alpha_s": 1e-4, "beta_s_per_byte": 1e-9,
     "source": "calibrate; bandwidth_Bps=1e+09; points=5; max_rel_error=0.01; size_min=1024; size_max=1048576"},
    {"op": "gemm", "name": "8x8x8", "dtype": "fp32", "size_bytes": 768, "flops": 1024.0, "time_s": 1e-6,
     "source": "calibrate efficiency; device=cpu; achieved_tflops=0.001; achieved_gbps=0.768"},
    {"op": "layer_fwd", "name": "b0", "model": "m", "micro_batch": 1, "time_s": 0.01,
     "source": "paper Table 3: a=b; see x"},
]


def _v1(records=V1_RECORDS, **meta):
    return {"format": "perfsim-profile", "version": 1, "metadata": {"network": [{"name": "gloo"}], **meta},
            "records": [dict(r) for r in records]}


def test_v1_facts_in_source_become_typed_fields(tmp_path):
    p = Profile.from_dict(_v1(device="cpu"))
    enc, stage, fit, gemm, paper = p.records
    assert enc == {"op": "encode", "name": "directq:4", "size_bytes": 4096, "time_s": 5e-4, "model": "a",
                   "device": "cpu", "threads": 2, "wire_bytes": 520, "cache": "after-layer-step",
                   "shape": [8, 128], "source": "calibrate"}
    assert stage["layers"] == [0, 1] and stage["microbatches"] == 4 and stage["source"] == "calibrate; runtime"
    # restated figures (1/beta, flops/time) are dropped; the fit's quality facts are kept, typed
    assert "bandwidth_Bps" not in fit and fit["points"] == 5 and fit["max_rel_error"] == 0.01
    assert gemm["source"] == "calibrate efficiency" and gemm["device"] == "cpu" and "achieved_tflops" not in gemm
    assert paper["source"] == "paper Table 3: a=b; see x"  # free text stays free text
    assert "network" not in p.metadata and p.metadata["device"] == "cpu"
    # saved as version 2; loads back identical; the old file still reads the same
    path = tmp_path / "p.json"
    p.save(path)
    assert json.loads(path.read_text())["version"] == 2
    q = Profile.load(path)
    assert q.records == p.records and q.metadata == p.metadata
    old = tmp_path / "old.json"
    old.write_text(json.dumps(_v1(device="cpu")))
    assert Profile.load(old).records == p.records


@pytest.mark.parametrize("record,culprit", [
    ({"op": "encode", "name": "x", "size_bytes": 1, "time_s": 1.0, "source": "calibrate; threads=two"}, "threads"),
    ({"op": "encode", "name": "x", "size_bytes": 1, "time_s": 1.0, "source": "calibrate; shape=8xq"}, "shape"),
    ({"op": "stage_fwd", "name": "stage0", "model": "m", "micro_batch": 1, "time_s": 1.0,
      "source": "calibrate; layers=3-1"}, "layers"),
])
def test_v1_fact_that_does_not_parse_is_refused(record, culprit):
    with pytest.raises(ConfigError, match=rf"records\[0\]\.{culprit}="):
        Profile.from_dict(_v1([record]))


def test_v2_facts_are_type_checked():
    doc = {"format": "perfsim-profile", "version": 2, "metadata": {},
           "records": [{"op": "encode", "name": "x", "size_bytes": 1, "time_s": 1.0, "shape": "8x8"}]}
    assert Profile.from_dict(doc).records[0]["shape"] == [8, 8]
    doc["records"][0]["shape"] = [8, -1]
    with pytest.raises(ConfigError, match="shape"):
        Profile.from_dict(doc)
    doc["records"][0] = {"op": "encode", "name": "x", "size_bytes": 1, "time_s": 1.0, "mean_s": True}
    with pytest.raises(ConfigError, match="mean_s"):
        Profile.from_dict(doc)


@pytest.mark.parametrize("name", ["cpu-2core", "cpu-2core-xeon", "cpu-2core-xeon-idle", "default-v100-aqsgd"])
def test_shipped_profiles_load_and_round_trip_in_version_2(tmp_path, name):
    """The shipped (version-1) files migrate on load; saved as version 2 they load
    back to the same records and give the same costs."""
    p = load_profile(name)
    assert not any("=" in str(r.get("source", "")) for r in p.records if r.get("source", "").startswith("calibrate"))
    path = tmp_path / f"{name}.json"
    p.save(path)
    q = Profile.load(path)
    assert q.records == p.records and q.metadata == p.metadata
    for spec in ("directq:4", "qsgd-maxnorm:4", "fp32"):
        assert q.encode_time(spec, 1 << 20) == p.encode_time(spec, 1 << 20)
    situ = [r for r in p.records if r["op"] == "encode" and "shape" in r]
    for r in situ[:5]:
        assert isinstance(r["shape"], list)
        assert p.encode_time(r["name"], r["size_bytes"], tuple(r["shape"]), r["model"]) > 0
    stages = [r for r in p.records if r["op"] == "stage_fwd" and "layers" in r]
    for r in stages[:5]:
        first, last = r["layers"]
        assert p.stage_measured(r["model"], int(r["name"][5:]), first, last, r["micro_batch"], "fwd",
                                r["world_size"]) is not None


# ----------------------------------------------------------------- the one alpha-beta fit
def test_fit_weights_relative_error_so_small_messages_stay_right():
    """Sizes over five decades, 5 % noise on the largest: ordinary least squares would
    put the 1 KB time several times off (its alpha absorbs the big points' noise)."""
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7, 1e8]
    times = [1e-4 + s * 1e-9 for s in sizes]
    times[-1] *= 1.05
    fit = fit_alpha_beta(sizes, times)
    assert fit(1e3) == pytest.approx(times[0], rel=0.05)
    assert fit.points == 6 and fit.max_rel_error < 0.05
    # the OLS line through the same points misses the small message by far
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(times) / n
    beta = sum((x - mx) * (y - my) for x, y in zip(sizes, times)) / sum((x - mx) ** 2 for x in sizes)
    ols_alpha = max(my - beta * mx, 0.0)
    assert abs(ols_alpha + beta * 1e3 - times[0]) / times[0] > 0.5


def test_fit_degenerate_cases():
    one = fit_alpha_beta([4096], [2e-4])  # one size: per-byte cost through the origin
    assert one.alpha_s == 0 and one(8192) == pytest.approx(4e-4)
    same = fit_alpha_beta([4096, 4096], [1e-4, 3e-4])
    inv = (1 / 1e-4, 1 / 3e-4)  # argmin of sum((x - t) / t)^2: sum(1/t) / sum(1/t^2)
    assert same.alpha_s == 0 and same(4096) == pytest.approx(sum(inv) / sum(i * i for i in inv))
    zero = fit_alpha_beta([0, 0], [1e-4, 1e-4])  # no bytes: pure fixed cost
    assert zero.alpha_s == pytest.approx(1e-4) and zero.beta_s_per_byte == 0
    with pytest.raises(ConfigError, match="no records"):
        fit_alpha_beta([1, 2], [0.0, 0.0])


def test_stored_fit_and_refit_of_raw_records_agree():
    """Calibrate stores fit_<op> records and the profile refits raw records when none is
    stored: both used to be different fits (relative-weighted vs ordinary least squares),
    so the same measurements priced a codec differently with and without the stored fit."""
    from perfsim.calibrate.fit import fit_records

    sizes = [4096, 65536, 1 << 20, 1 << 24]
    raw = [{"op": "encode", "name": "directq:4", "size_bytes": s, "time_s": 3e-5 + s * 2e-10 * (1.1 if s > 1e6 else 1)}
           for s in sizes]
    bare = Profile(records=[dict(r) for r in raw])
    stored = Profile(records=[dict(r) for r in raw] + fit_records(raw, "encode"))
    for s in (4096, 1 << 16, 1 << 22):
        assert bare.encode_time("directq:4", s) == pytest.approx(stored.encode_time("directq:4", s), rel=1e-12)


def test_shipped_files_of_both_versions_load():
    """The embedded default is stored as version 2, the Xeon CPU profile still as
    version 1 (migrated on load): the reader keeps reading both."""
    from perfsim.profile import default_profile_path

    assert json.loads(default_profile_path().read_text())["version"] == 2
    old = load_profile("cpu-2core-xeon")
    assert json.loads(open(old.path).read())["version"] == 1
    assert any(r.get("mean_s") for r in old.records) and any("shape" in r for r in old.records)


def test_calibrate_writes_typed_facts_even_from_a_text_source():
    """A measurement module that still says a fact in its ``source`` text (the
    efficiency records) gets it typed by build_profile, like a version-1 file."""
    from perfsim.calibrate.profile_io import build_profile

    rec = {"op": "gemm", "name": "8x8x8", "dtype": "fp32", "size_bytes": 768, "flops": 1024.0,
           "time_s": 1e-6, "source": "calibrate efficiency; device=cpu; achieved_tflops=0.001"}
    layer = {"op": "layer_fwd", "name": "b0", "model": "m", "micro_batch": 1, "time_s": 0.01,
             "threads": 2, "layers": "0-3", "source": "runtime"}
    gemm, lay = build_profile([rec, layer], {}).records
    assert gemm == {k: v for k, v in rec.items() if k != "source"} | {"device": "cpu", "source": "calibrate efficiency"}
    assert lay["layers"] == [0, 3] and lay["source"] == "calibrate; runtime"


def test_collective_records_count_for_the_call_they_timed():
    """An all-gather of tensors (what tensor parallelism calls) and one of a list (the
    data-parallel compressors') are fitted apart; a record without ``call`` -- every
    profile written before the fact existed -- is its kind's default call."""
    p = Profile(metadata={"backend": "gloo"})
    for s, t in ((1000, 2e-4), (3000, 4e-4)):
        p.add(op="allgather", name="gloo", size_bytes=s, world_size=2, time_s=t)  # old: no call
        p.add(op="allgather", name="gloo", call="all_gather_into_tensor", size_bytes=s, world_size=2,
              time_s=3 * t)
        p.add(op="allreduce", name="gloo", size_bytes=s, world_size=2, time_s=t)
    assert p.fit("allgather", "gloo")(2000) == pytest.approx(3e-4)
    assert p.fit("allgather", "gloo", "all_gather")(2000) == pytest.approx(3e-4)
    assert p.fit("allgather", "gloo", "all_gather_into_tensor")(2000) == pytest.approx(9e-4)
    assert p.collective_ratio("allgather", "all_gather_into_tensor", 2000) == pytest.approx(3.0)
    assert p.collective_ratio("reduce_scatter", "reduce_scatter_tensor", 2000) is None  # not measured
    with pytest.raises(ConfigError, match="call"):
        p.add(op="allgather", name="gloo", call=3, size_bytes=1, time_s=1.0)


def test_collective_ratio_prefers_the_link_it_was_measured_on():
    """The ratio at an emulated rate wins over loopback's when both were measured there."""
    p = Profile(metadata={"backend": "gloo"})
    for name, k in (("gloo", 2.0), ("gloo@1Gbps", 1.25)):
        for s in (1000, 4000):
            p.add(op="allreduce", name=name, size_bytes=s, world_size=2, time_s=1e-3 + s * 1e-7)
            p.add(op="reduce_scatter", name=name, call="reduce_scatter_tensor", size_bytes=s, world_size=2,
                  time_s=k * (1e-3 + s * 1e-7))
    assert p.collective_ratio("reduce_scatter", "reduce_scatter_tensor", 2500, 1e9) == pytest.approx(1.25)
    assert p.collective_ratio("reduce_scatter", "reduce_scatter_tensor", 2500, 1e8) == pytest.approx(2.0)
    assert p.collective_ratio("reduce_scatter", "reduce_scatter_tensor", 2500) == pytest.approx(2.0)


def test_collective_ratio_from_the_same_sweep_interpolated_in_log_size():
    """Records that carry the allreduce of their own sweep (``allreduce_s``) give the
    ratio at each measured size, linear in log(size) between them, flat beyond; the
    profile's other allreduce records (another day, another load) do not enter."""
    p = Profile(metadata={"backend": "gloo"})
    for s, t, ref in ((1000, 2e-3, 1e-3), (4000, 3e-3, 3e-3)):
        p.add(op="reduce_scatter", name="gloo", call="reduce_scatter_tensor", size_bytes=s, world_size=2,
              time_s=t, allreduce_s=ref)
        p.add(op="allreduce", name="gloo", size_bytes=s, world_size=2, time_s=10 * ref)
    ratio = lambda n: p.collective_ratio("reduce_scatter", "reduce_scatter_tensor", n)  # noqa: E731
    assert ratio(1000) == pytest.approx(2.0) and ratio(4000) == pytest.approx(1.0)
    assert ratio(2000) == pytest.approx(1.5)  # halfway in log(size)
    assert ratio(10) == pytest.approx(2.0) and ratio(1e9) == pytest.approx(1.0)
    p.add(op="reduce_scatter", name="gloo", call="reduce_scatter_tensor", size_bytes=1000, world_size=2,
          time_s=4e-3, allreduce_s=1e-3)  # a second sweep: the mean ratio at that size
    assert ratio(1000) == pytest.approx(3.0)


def test_the_shipped_default_profile_is_what_its_generator_writes():
    # traces/make_default_profile.py documents every number of the embedded default; the
    # shipped copy must be its output (a model spec change that alters a record shows here)
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("make_default_profile", root / "traces" / "make_default_profile.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    built = gen.build()
    for shipped in (root / "perfsim" / "data" / "default-v100-aqsgd.json", root / "traces" / "default-v100-aqsgd.json"):
        prof = load_profile(str(shipped))
        assert prof.records == built.records and prof.metadata == built.metadata, shipped


def test_gradient_buckets_prefer_the_measured_data_parallel_path():
    """A bucket's codec cost is the compressor's own DP path where calibrate timed it
    (dp_encode / dp_decode), else compress / decompress times their passes."""
    from perfsim.compression import make_compressor
    from perfsim.engine.buckets import bucket_codec_times

    spec, sizes, n = "qsgd-maxnorm:4", [4096, 1 << 20, 1 << 22], 834_304

    def line(op, alpha, beta):
        return [{"op": op, "name": spec, "size_bytes": s, "time_s": alpha + beta * s} for s in sizes]

    plain = line("encode", 1e-4, 1e-9) + line("decode", 5e-5, 5e-10)
    measured = plain + line("dp_encode", 2e-4, 2e-9) + line("dp_decode", 1e-4, 1e-9)
    steps = make_compressor(spec).dp_plan((n,), 2)
    assert bucket_codec_times(Profile(records=plain), spec, steps, 2, 4 * n) == pytest.approx(
        (1e-4 + 4e-9 * n, 5e-5 + 2e-9 * n), rel=1e-9)
    assert bucket_codec_times(Profile(records=measured), spec, steps, 2, 4 * n) == pytest.approx(
        (2e-4 + 8e-9 * n, 1e-4 + 4e-9 * n), rel=1e-9)
    assert Profile(records=measured).dp_codec_time("encode", "directq:4", 4 * n) is None


def test_records_of_another_sequence_length_are_not_this_models_measurement():
    """calibrate times a preset at its own sequence length: with --seq-len another, the layer
    and stage records are not measurements of the model asked for. The default profile (GPT2-XL
    at 1024 tokens) prices 2048 tokens from its FLOP rate (more than twice the compute), not
    as its 1024-token records (before: the same 5.76 s in each of its 8 stages, 2x the tokens/s); a profile
    without a FLOP rate refuses in one line naming seq_len (before: gpt2-tiny at 1024 tokens
    priced as measured at 64)."""
    import perfsim

    base = perfsim.predict()
    longer = perfsim.predict(seq_len=2048)
    assert perfsim.predict(seq_len=1024).stages == base.stages  # its own length: the records
    # (the split follows the new layer times: compare the pipeline's total compute)
    assert sum(s["compute_s"] for s in longer.stages) > 2 * sum(s["compute_s"] for s in base.stages)
    cpu = Path(__file__).resolve().parents[2] / "traces" / "cpu-2core.json"
    with pytest.raises(ConfigError, match=r"^seq_len=1024: the profile times gpt2-tiny at its own 64 tokens"):
        perfsim.predict(model="gpt2-tiny", pp=2, profile=str(cpu), seq_len=1024)
    assert perfsim.predict(model="gpt2-tiny", pp=2, profile=str(cpu), seq_len=64).summary["iteration_s"] == \
        perfsim.predict(model="gpt2-tiny", pp=2, profile=str(cpu)).summary["iteration_s"]
