"""Profile format: round trip, validation, lookups, fits."""

import json

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
