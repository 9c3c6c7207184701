"""The drift check times what a prediction reads, and its times can refresh the calibration."""

from __future__ import annotations

from perfsim.calibrate import compare
from perfsim.profile import Profile


def _layer(name: str, t: float, **facts) -> dict:
    return {"op": "layer_fwd", "model": "gpt2-tiny", "name": name, "micro_batch": 8, "time_s": t,
            "device": "cpu", **facts}


def _tp_stage(t: float, sp: int) -> dict:
    return {"op": "stage_fwd", "model": "gpt2-tiny", "name": "stage0", "micro_batch": 8, "world_size": 1,
            "tp": 2, "sequence_parallel": sp, "time_s": t, "device": "cpu"}


def _calibration_asked(monkeypatch, records, **kw) -> dict:
    """The keyword arguments drift_check hands calibrate for a profile holding ``records``."""
    from perfsim.calibrate import calibration

    asked = {}

    def fake_calibrate(out, **kwargs):
        asked.update(kwargs)
        return Profile(records=[_layer("h0", 2.0)], metadata={})

    monkeypatch.setattr(calibration, "calibrate", fake_calibrate)
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
