"""A profile's backward records may contain their block's recomputed forward (``recompute``
fact, perfsim.engine.layer_times.timed_recompute): the embedded default's do (the AQ-SGD
paper's code checkpoints every block; Table 3's 135 ms backward is 3 x its 45 ms forward).
The engine takes that recomputation out for another ``--recompute`` and, without one,
predicts the job as it was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import perfsim
from perfsim.errors import ConfigError

from _helpers import assert_user_error, run_cli_here

FWD, BWD = 0.045, 0.135  # per micro-batch and stage of 6 blocks (paper Table 3)


def _stage_times(r) -> set[tuple[float, float]]:
    return {(round(m["fwd_compute_s"], 6), round(m["bwd_compute_s"], 6)) for m in r.microbatches}


def _default_profile() -> dict:
    return json.loads(Path(perfsim.__file__).with_name("data").joinpath("default-v100-aqsgd.json").read_text())


def test_the_default_predicts_the_papers_run_with_its_recomputation():
    r = perfsim.predict()
    assert r.summary["recompute"] == "full"
    assert _stage_times(r) == {(FWD, BWD)}  # the measured backward, not a second forward on top
    assert "memory_warning" not in r.summary and r.summary["peak_memory_gib"] < 16  # fits the paper's V100
    full = perfsim.predict(recompute="full")
    assert full.summary["iteration_s"] == r.summary["iteration_s"]
    assert "timed with full recomputation)" in r.summary["compute_model"]


def test_other_recomputation_takes_the_measured_one_out():
    none = perfsim.predict(recompute="none")
    assert _stage_times(none) == {(FWD, round(BWD - FWD, 6))}  # 2 x the forward: the gradients alone
    assert none.summary["iteration_s"] < perfsim.predict().summary["iteration_s"]
    assert "taken out, recompute none priced" in none.summary["compute_model"]
    sel = perfsim.predict(recompute="selective")
    (f, b), = _stage_times(sel)
    # selective re-runs the attention core's FLOP share of each block's forward (a few per cent at s = 1024)
    assert f == FWD and BWD - FWD < b < BWD - FWD + 0.1 * FWD


def test_the_fact_without_it_keeps_the_old_pricing(tmp_path):
    prof = _default_profile()
    for rec in prof["records"]:
        rec.pop("recompute", None)
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(prof))
    r = perfsim.predict(profile=str(path))
    assert r.summary["recompute"] == "none"
    assert _stage_times(r) == {(FWD, BWD)}
    assert _stage_times(perfsim.predict(profile=str(path), recompute="full")) == {(FWD, round(BWD + FWD, 6))}


def test_another_gpu_is_priced_by_its_own_model_without_the_profiles_recomputation():
    r = perfsim.predict(gpu="a100-80gb", pp=8, precision="bf16")
    assert r.summary["recompute"] == "none"


def test_an_unknown_recomputation_is_refused_at_load(tmp_path):
    prof = _default_profile()
    i = next(i for i, rec in enumerate(prof["records"]) if rec.get("recompute"))
    prof["records"][i]["recompute"] = "sometimes"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ConfigError, match=rf"records\[{i}\]\.recompute='sometimes' unknown"):
        perfsim.predict(profile=str(path))
    proc = run_cli_here("predict", "--profile", str(path))
    assert_user_error(proc.returncode, proc.stderr, f"records[{i}].recompute")


def test_a_backward_shorter_than_its_recomputation_is_refused(tmp_path):
    prof = _default_profile()
    for rec in prof["records"]:
        if rec["op"] == "layer_bwd" and rec.get("recompute"):
            rec["time_s"] = FWD / 6 / 2  # half the forward it says it re-ran
    path = tmp_path / "short.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ConfigError, match="is not longer than the full recomputation"):
        perfsim.predict(profile=str(path), recompute="none")
    assert perfsim.predict(profile=str(path)).summary["recompute"] == "full"  # as measured: nothing taken out


def test_records_that_disagree_are_refused(tmp_path):
    prof = _default_profile()
    recs = [rec for rec in prof["records"] if rec["op"] == "layer_bwd" and rec.get("recompute")]
    dup = dict(recs[0], micro_batch=2, time_s=2 * recs[0]["time_s"])
    dup.pop("recompute")
    prof["records"].append(dup)
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ConfigError, match="timed with different recomputation"):
        perfsim.predict(profile=str(path), recompute="none")
