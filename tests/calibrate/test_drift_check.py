"""The drift check times what a prediction reads, and its times can refresh the calibration."""

from __future__ import annotations

from pathlib import Path

from perfsim.calibrate import compare
from perfsim.profile import Profile


def _layer(name: str, t: float, **facts) -> dict:
    return {"op": "layer_fwd", "model": "gpt2-tiny", "name": name, "micro_batch": 8, "time_s": t,
            "device": "cpu", **facts}


def _tp_stage(t: float, sp: int) -> dict:
    return {"op": "stage_fwd", "model": "gpt2-tiny", "name": "stage0", "micro_batch": 8, "world_size": 1,
            "tp": 2, "sequence_parallel": sp, "time_s": t, "device": "cpu"}


def _calibration_asked(monkeypatch, records, **kw) -> dict:
    """The keyword arguments drift_check plans its calibration with for a profile holding ``records``."""
    from perfsim.calibrate import calibration

    asked = {}

    def fake_plan(**kwargs):
        asked.update(kwargs)
        return "plan"

    monkeypatch.setattr(calibration, "plan_calibration", fake_plan)
    monkeypatch.setattr(calibration, "run_calibration",
                        lambda plan, out, **kw: Profile(records=[_layer("h0", 2.0)], metadata={}))
    prof = Profile(records=records, metadata={"device": "cpu", "calibration": {"ranks": 2}})
    compare.drift_check(prof, "gpt2-tiny", 8, "unused.json", **kw)
    return asked


def test_a_tp_drift_check_times_the_tp_ranks_records_the_prediction_reads(monkeypatch):
    records = [_layer("h0", 1.0), _tp_stage(0.5, 0), _tp_stage(0.6, 1)]
    assert _calibration_asked(monkeypatch, records, tp=2)["tp"] == "2"
    assert _calibration_asked(monkeypatch, records)["tp"] == ""  # a grid without TP: layers only
    assert _calibration_asked(monkeypatch, [_layer("h0", 1.0)], tp=2)["tp"] == ""  # nothing of tp 2 to re-time


def test_refreshed_takes_the_new_times_of_what_both_measured_and_keeps_the_rest():
    link = {"op": "p2p", "size_bytes": 1024, "time_s": 1e-3, "world_size": 2}
    old = Profile(records=[_layer("h0", 1.0, spread_s=0.1), _layer("h1", 3.0), link],
                  metadata={"device": "cpu", "command": "calibrate"})
    now = Profile(records=[_layer("h0", 2.0, spread_s=0.3), _layer("h2", 9.0)],
                  metadata={"command": "validate's drift check"})
    new = compare.refreshed(old, now)
    assert [r["time_s"] for r in new.records] == [2.0, 3.0, 1e-3]  # h0 re-timed; h1 and the link kept
    assert new.records[0]["spread_s"] == 0.3
    assert not any(r.get("name") == "h2" for r in new.records)  # only what the calibration had
    assert old.records[0]["time_s"] == 1.0  # the calibration itself is left as it was
    assert new.metadata["refreshed_by"] == "validate's drift check"


def test_a_calibration_whose_stages_disagree_with_their_layers_is_named():
    """A whole stage and its layers are timed apart; on a machine that held still a plain stage
    takes 1.01-1.12x its layers' sum (traces/cpu-2core.json), while session 27's calibration timed
    its pp-2 stages 11 minutes after their layers, in a slower phase (1.62-1.82x): predictions of
    pipelines read the stage records, so calibrate names each one outside the steady band."""
    from perfsim.calibrate.compare import STEADY_STAGE_LAYER, stage_layer_ratios, stage_layer_warnings
    from perfsim.profile import Profile, load_profile

    root = Path(__file__).resolve().parents[2] / "traces"
    steady = stage_layer_ratios(load_profile(str(root / "cpu-2core.json")))
    assert steady and all(STEADY_STAGE_LAYER[0] <= r <= STEADY_STAGE_LAYER[1] for r in steady.values())
    assert not any(k.startswith("digits-mlp") for k in steady)  # layers of microseconds: overhead, not drift
    assert stage_layer_warnings(steady) == []
    moved = stage_layer_ratios(load_profile(str(root / "cpu-2core-s27.json")))
    lines = stage_layer_warnings(moved)
    assert len(lines) == 3 and lines[0].startswith("calibrate: warning: gpt2-tiny stage0 fwd mb 8 pp 2 1f1b took 1.81x")
    assert not any("interleaved" in k or "zb-h1" in k for k in moved)  # their calls cost more by design
    assert stage_layer_ratios(Profile.default()) == {}  # a GPU profile: not compared


def test_calibrate_times_the_models_compute_together_before_codecs_and_links():
    from perfsim.calibrate.calibration import plan_calibration

    names = [n for n, _ in plan_calibration(model="gpt2-tiny", micro_batch="8", stages="2", codecs="fp32",
                                            comm="p2p", tp="2", device="cpu").stages()]
    assert [n.split()[0] for n in names] == ["compute", "tp", "tp", "stages", "codecs", "comm"], names


def test_calibrate_records_each_stages_ratio_and_warns_outside_the_steady_band(monkeypatch, tmp_path, capsys):
    """run_calibration's wiring: the ratios go to metadata["calibration"]["stage_layer_ratio"], one
    stderr line per stage outside STEADY_STAGE_LAYER (the measurement replaced by records whose pp-2
    stage0 takes 1.8x its layers, as session 27's did)."""
    from perfsim.calibrate import compute
    from perfsim.calibrate.calibration import calibrate
    from perfsim.models.registry import get_model_spec

    names = [layer.name for layer in get_model_spec("gpt2-tiny").layers()]

    def fake_measure(cfg, progress=None):
        recs = [dict(_layer(n, 2e-3), op=op) for n in names for op in ("layer_fwd", "layer_bwd")]
        return recs + [{"op": "stage_fwd", "model": "gpt2-tiny", "name": f"stage{k}", "micro_batch": 8,
                        "world_size": 2, "layers": [3 * k, 3 * k + 2], "schedule": "1f1b", "device": "cpu",
                        "time_s": t} for k, t in ((0, 3 * 2e-3 * 1.8), (1, 3 * 2e-3 * 1.05))]

    monkeypatch.setattr(compute, "measure_compute", fake_measure)
    prof = calibrate(str(tmp_path / "p.json"), progress=False, model="gpt2-tiny", micro_batch="8", stages="",
                     codecs="none", comm="none", device="cpu")
    ratios = prof.metadata["calibration"]["stage_layer_ratio"]
    assert ratios == {"gpt2-tiny stage0 fwd mb 8 pp 2 1f1b": 1.8, "gpt2-tiny stage1 fwd mb 8 pp 2 1f1b": 1.05}
    err = capsys.readouterr().err
    assert "warning: gpt2-tiny stage0 fwd mb 8 pp 2 1f1b took 1.80x" in err and "stage1 fwd" not in err
    # validate's drift checks (run_calibration(warn=False)) compare with the profile: the ratios, no lines
    from perfsim.calibrate.calibration import plan_calibration, run_calibration

    quiet = run_calibration(plan_calibration(model="gpt2-tiny", micro_batch="8", stages="", codecs="none",
                                             comm="none", device="cpu"), str(tmp_path / "q.json"),
                            progress=False, warn=False)
    assert quiet.metadata["calibration"]["stage_layer_ratio"] == ratios and "warning" not in capsys.readouterr().err
