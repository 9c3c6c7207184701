"""Every prediction's 80 % interval (perfsim.engine.uncertainty) and the file it rests on."""

import importlib.util
from pathlib import Path

import pytest

from perfsim.api import predict
from perfsim.engine import uncertainty

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("error_bands", ROOT / "scripts" / "error_bands.py")
bands_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bands_script)

GPT = "gpt:layers=12,hidden=2048,heads=16,seq=1024,vocab=50304"


def _gpu(gpu, **kw):
    kw = {**dict(model=GPT, gpu=gpu, tp=1, pp=2, dp=1, micro_batch=2, global_batch=16, precision="fp16"), **kw}
    return predict(**kw).summary


def test_interval_brackets_the_prediction_and_says_what_it_rests_on():
    s = _gpu("a100")
    assert s["iteration_s_low"] < s["iteration_s"] < s["iteration_s_high"]
    b = uncertainty.band("gpu:ampere")
    assert s["iteration_s_low"] == pytest.approx(s["iteration_s"] / (1 + b.q90))
    assert s["iteration_s_high"] == pytest.approx(s["iteration_s"] / (1 + b.q10))
    assert f"{b.rows} validation rows" in s["interval_note"] and "borrowed" not in s["interval_note"]


def test_a_borrowed_curve_widens_by_the_measured_transfer_error():
    own, borrowed = _gpu("a100"), _gpu("l4", precision="bf16", micro_batch=1)
    assert "borrowed" in borrowed["interval_note"]
    rel = lambda s: (s["iteration_s_high"] - s["iteration_s_low"]) / s["iteration_s"]  # noqa: E731
    assert rel(borrowed) > rel(own)


def test_more_gpus_than_the_data_is_flagged_as_extrapolated():
    s = _gpu("a100", dp=8, global_batch=64)
    assert s["gpus"] == 16 and "extrapolated" in s["interval_note"]
    assert "extrapolated" not in _gpu("a100")["interval_note"]


def test_a_profile_priced_prediction_takes_the_profile_band():
    s = predict().summary  # the default: the shipped V100 profile's records
    assert uncertainty.source_key(s) == ("profile", False)
    assert s["iteration_s_low"] < s["iteration_s"] < s["iteration_s_high"]


def test_conformal_bounds_are_the_order_statistics_the_guarantee_needs():
    xs = [i / 100 for i in range(100)]  # 0.00 .. 0.99
    lo, hi = bands_script.conformal_bounds(xs, 0.8)
    # n = 100, tails 0.1: k_lo = floor(101 * 0.1) = 10, k_hi = ceil(101 * 0.9) = 91
    assert (lo, hi) == (0.09, 0.90)
    assert bands_script.conformal_bounds([0.5], 0.8) == (0.5, 0.5)
    assert bands_script.coverage([-0.2, 0.0, 0.1, 0.3], -0.1, 0.2) == 0.5


@pytest.mark.skipif(bands_script._script("calibrate_a100").data_path() is None,
                    reason="../shared/data/a100-single-node not present")
def test_a100_band_covers_its_held_out_configurations():
    """The stored A100 band against the held-out configurations (the stored file must have
    been made by the curve in the code: scripts/error_bands.py --check)."""
    cal = bands_script._script("calibrate_a100")
    rows = [r for r in cal.load_rows(cal.data_path()) if r["split"] == "held-out"][::3]
    b = uncertainty.band("gpu:ampere")
    cov = bands_script.coverage(cal.errors(rows), b.q10, b.q90)
    assert 0.7 <= cov <= 0.9, f"coverage {cov:.0%} on {len(rows)} held-out rows"
