"""A profile loaded through the API is the caller's own value (qa7 findings F2, F3).

F2: ``perfsim.load_profile(PATH)`` returned the object the API caches for PATH: editing it
(a what-if: layer times x 10) changed every later ``perfsim.predict(profile=PATH)``
although the file had not changed (gpt2-tiny pp 2 on cpu-2core.json: 0.0996 s -> 0.603 s).
F3: a Profile edited in place kept the alpha-beta fits and record selections it had
memoised (keyed on the record count only): ``encode`` records x 100 still priced 0.0996 s
an iteration, the same records in a fresh Profile 2.72 s."""

from pathlib import Path

import perfsim
from perfsim.profile import Profile

ROOT = Path(__file__).resolve().parents[2]
PATH = str(ROOT / "traces" / "cpu-2core.json")
JOB = dict(model="gpt2-tiny", pp=2, bandwidth="100Mbps", compress="directq:4")


def _iteration(profile) -> float:
    return perfsim.predict(profile=profile, **JOB).row()["iteration_s"]


def test_editing_a_loaded_profile_leaves_its_files_predictions_alone():
    before = _iteration(PATH)
    mine = perfsim.load_profile(PATH)
    for r in mine.records:
        if r["op"] in ("layer_fwd", "layer_bwd"):
            r["time_s"] *= 10
    assert _iteration(mine) > 3 * before  # the edit is priced where it is given
    assert _iteration(PATH) == before  # and nowhere else
    assert perfsim.load_profile(PATH).to_dict() != mine.to_dict()


def test_a_profile_edited_in_place_is_priced_afresh():
    mine = Profile.load(PATH)
    before = _iteration(mine)
    for r in mine.records:
        if r["op"] in ("encode", "decode", "fit_encode", "fit_decode"):
            for k in ("time_s", "alpha_s", "beta_s_per_byte"):
                if k in r:
                    r[k] *= 100
    fresh = _iteration(Profile.from_dict(mine.to_dict()))
    assert fresh > 3 * before
    assert _iteration(mine) == fresh
    # a record replaced by another (the same count) is seen too
    i = next(i for i, r in enumerate(mine.records) if r["op"] == "layer_fwd" and r.get("model") == "gpt2-tiny")
    mine.records[i] = {**mine.records[i], "time_s": mine.records[i]["time_s"] * 50}
    assert _iteration(mine) == _iteration(Profile.from_dict(mine.to_dict())) > fresh


def test_a_link_calibrated_from_edited_records_is_priced_afresh():
    """The calibrated links (Link.calibrated) are memoised per profile like its fits: an edit in
    place of the point-to-point records it fits is seen by the next prediction."""
    mine = Profile.load(PATH)
    before = _iteration(mine)
    for r in mine.records:
        if r["op"] == "p2p":
            for k in ("time_s", "mean_s"):
                if k in r:
                    r[k] *= 10
    after = _iteration(mine)
    assert after == _iteration(Profile.from_dict(mine.to_dict())) > 1.5 * before
