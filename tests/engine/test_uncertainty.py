"""Every prediction's 80 % interval (perfsim.engine.uncertainty) and the file it rests on."""

import importlib.util
import math
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
    """A GPU-priced prediction, with the unfused attention the A100 band's rows ran unless told."""
    kw = {**dict(model=GPT, gpu=gpu, tp=1, pp=2, dp=1, micro_batch=2, global_batch=16, precision="fp16",
                 attention="megatron"), **kw}
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


def test_flash_attention_rates_fitted_on_another_architecture_widen_like_a_borrowed_curve():
    """The A100 curve's FlashAttention rates are the H200's (its data ran unfused attention): a
    flash prediction on it widens by the transfer error; the unfused one and an H100's own flash do not."""
    unfused, flash = _gpu("a100", attention="megatron"), _gpu("a100", attention="flash")
    w = uncertainty.bands()["transfer"]["error"]
    b = uncertainty.band("gpu:ampere")
    assert flash["iteration_s_low"] == pytest.approx(flash["iteration_s"] / (1 + b.q90 + w))
    assert flash["iteration_s_high"] == pytest.approx(flash["iteration_s"] / (1 + b.q10 - w))
    assert "FlashAttention rates borrowed" in flash["interval_note"] and "borrowed" not in unfused["interval_note"]
    assert "borrowed" not in _gpu("h100", pp=1, global_batch=4, precision="bf16", attention="flash")["interval_note"]


def test_fp8_widens_the_slow_side_by_the_measured_fp8_gemm_optimism():
    """The Hopper band's steps ran bf16; fp8 GEMMs timed beside bf16 ones on an H100 show the fp8
    rate more optimistic by up to the stored amount, so an fp8 prediction's slow end moves by it
    (the fast end stays: none of those GEMMs ran faster in fp8 than the model says relative to bf16)."""
    bf16, fp8 = (_gpu("h100", pp=1, global_batch=4, precision=p) for p in ("bf16", "fp8"))  # one GPU: inside the data
    b, w = uncertainty.band("gpu:hopper"), uncertainty.bands()["fp8"]["error"]
    assert w == pytest.approx(bands_script.fp8_widening()[0], abs=1e-4) and 0 < w < 1
    assert fp8["iteration_s_high"] == pytest.approx(fp8["iteration_s"] / (1 + b.q10 - w))
    assert fp8["iteration_s_low"] == pytest.approx(fp8["iteration_s"] / (1 + b.q90))
    assert bf16["iteration_s_high"] == pytest.approx(bf16["iteration_s"] / (1 + b.q10))
    assert "fp8" in fp8["interval_note"] and "fp8" not in bf16["interval_note"]


def test_more_gpus_than_the_data_is_flagged_as_extrapolated():
    s = _gpu("a100", dp=8, global_batch=64)
    assert s["gpus"] == 16 and "extrapolated" in s["interval_note"]
    assert "extrapolated" not in _gpu("a100")["interval_note"]


def test_a_profile_priced_prediction_takes_the_profile_band():
    s = predict().summary  # the default: the shipped V100 profile's records
    assert uncertainty.source_key(s) == ("profile", False)
    assert s["iteration_s_low"] < s["iteration_s"] < s["iteration_s_high"]


def test_every_file_the_cpu_band_reads_is_in_the_checkout():
    """``scripts/error_bands.py --check`` reproduces the CPU band from a clone: the profile, each
    grid's table and, when drift-checked, its ``drift-check.json`` (session 25's were git-ignored
    and lost with its machine) and each row's own check, none of them ignored by git."""
    import shutil
    import subprocess

    src = bands_script.CPU_BAND
    rp = bands_script._script("repredict_validation")
    folder = ROOT / src["folder"] if "folder" in src else rp.STORED
    checked = src.get("drift_checked") or src.get("row_drift_checked")
    names = ["summary.json", "validation.csv"] + (["drift-check.json"] if checked else [])
    need = [ROOT / src["profile"]] + [folder / g / n for g in src.get("grids", rp.GRIDS) for n in names]
    if src.get("row_drift_checked"):  # and every row's own check (perfsim validate --row-drift)
        import csv

        for g in src.get("grids", rp.GRIDS):
            with (folder / g / "validation.csv").open() as f:
                need += [folder / g / "row-drift" / Path(r["row_drift_file"]).name for r in csv.DictReader(f)]
    assert [str(p.relative_to(ROOT)) for p in need if not p.is_file()] == []
    if (ROOT / ".git").exists() and shutil.which("git"):
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *map(str, need)],
                                 capture_output=True, text=True).stdout.split()
        assert ignored == []


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


PER_DOUBLING = {"kind": "per-doubling", "lo": 0.02, "hi": 0.01}
SPREAD = {"kind": "speed-spread", "sigma": 0.04}


@pytest.mark.parametrize("rule", [PER_DOUBLING, SPREAD])
def test_the_extrapolation_widening_is_zero_inside_the_data_and_grows_with_the_gpu_count(rule):
    for n in (1, 2, 8):
        assert uncertainty.extrapolation_widening(n, 8, rule) == (0.0, 0.0)
    widths = [uncertainty.extrapolation_widening(n, 8, rule) for n in (9, 16, 64, 1024, 131072)]
    for (lo_a, hi_a), (lo_b, hi_b) in zip(widths, widths[1:]):
        assert lo_b > lo_a > 0 and hi_b >= hi_a >= 0
    assert uncertainty.extrapolation_widening(32, 8, PER_DOUBLING) == pytest.approx((0.04, 0.02))  # 2 doublings
    assert uncertainty.extrapolation_widening(4096, 8, {"kind": "none"}) == (0.0, 0.0)
    with pytest.raises(ValueError, match="kind"):
        uncertainty.extrapolation_widening(16, 8, {"kind": "linear"})


def test_the_widening_is_capped_and_never_narrows():
    assert uncertainty.widened(-0.1, 0.1, 0.02, 0.03) == pytest.approx((-0.12, 0.13))
    assert uncertainty.widened(-0.1, 0.1, 5.0, 5.0) == (uncertainty.Q10_FLOOR, uncertainty.Q90_CEIL)
    assert uncertainty.widened(-0.7, 1.5, 1.0, 1.0) == (-0.7, 1.5)  # already past the caps: kept


def test_an_extrapolated_interval_is_wider_by_the_stored_rule_and_says_so():
    rule = uncertainty.bands()["extrapolation"]
    inside, outside = _gpu("a100", dp=4, global_batch=32), _gpu("a100", dp=64, global_batch=512)
    b = uncertainty.band("gpu:ampere")
    w_lo, w_hi = uncertainty.extrapolation_widening(128, 8, rule)
    q10, q90 = uncertainty.widened(b.q10, b.q90, w_lo, w_hi)
    assert outside["iteration_s_low"] == pytest.approx(outside["iteration_s"] / (1 + q90))
    assert outside["iteration_s_high"] == pytest.approx(outside["iteration_s"] / (1 + q10))
    assert f"-{100 * w_lo:.1f} / +{100 * w_hi:.1f} points" in outside["interval_note"]
    assert "4.0 doublings" in outside["interval_note"] and rule["basis"] in outside["interval_note"]
    assert inside["iteration_s_high"] == pytest.approx(inside["iteration_s"] / (1 + b.q10))  # not widened


def test_per_doubling_shift_is_the_band_moving_outwards_only():
    inside = [i / 100 for i in range(-10, 11)]  # band -0.09 .. +0.09 (n = 21: k_lo 2, k_hi 20)
    lo_in, hi_in = bands_script.conformal_bounds(inside)
    assert bands_script.per_doubling(inside, [x - 0.04 for x in inside], 2) == pytest.approx((0.02, 0.0))
    assert bands_script.per_doubling(inside, [2 * x for x in inside], 1) == pytest.approx((-lo_in, hi_in))
    assert bands_script.per_doubling(inside, [x / 2 for x in inside], 1) == (0.0, 0.0)  # narrower: no widening


def test_the_choice_between_widenings_is_deterministic_and_follows_the_rule():
    """Synthetic residuals whose spread grows by 60 % of the in-range spread (sigma 5 points) per
    doubling beyond the fit's largest job: the empirical variant E (linear per doubling) is
    chosen, and its rate is the quantiles' growth, 1.28 x 3 points per doubling on each side."""
    import random

    rng = random.Random(7)

    def rows(growth, n_max):
        out = []
        for g in (2, 4, 8):
            d = max(0.0, math.log2(g / n_max))
            out += [(g, rng.gauss(0, 0.05 * (1 + growth * d))) for _ in range(300)]
        return out

    code, fit_a, fit_b = rows(0.0, 8), rows(0.6, 2), rows(0.6, 4)
    first = bands_script.extrapolation(code, fit_a, fit_b)
    assert first == bands_script.extrapolation(code, fit_a, fit_b)
    rule, report = first
    assert rule["variant"] == "E" and rule["kind"] == "per-doubling"
    assert rule["lo"] == pytest.approx(0.038, abs=0.012) and rule["hi"] == pytest.approx(0.038, abs=0.012)
    assert any(line.startswith("extrapolation: chose E") for line in report)


@pytest.mark.skipif(bands_script._script("calibrate_a100").data_path() is None,
                    reason="../shared/data/a100-single-node not present")
def test_the_stored_extrapolation_rule_is_what_the_validation_configurations_give():
    """scripts/error_bands.py's choice, re-run on the A100 validation configurations (~3 s):
    deterministic, and the stored rule is its output (within rounding of half a point per doubling:
    if the model's A100 predictions moved, run ``python scripts/error_bands.py``)."""
    code = bands_script.a100("validation")
    fits = [bands_script.a100("validation", bands_script.SMALL_FITS[n]) for n in (2, 4)]
    rule, _ = bands_script.extrapolation(code, *fits)
    assert rule == bands_script.extrapolation(code, *fits)[0]
    stored = uncertainty.bands()["extrapolation"]
    assert (stored["variant"], stored["kind"], stored["basis"]) == (rule["variant"], rule["kind"], rule["basis"])
    for k in ("lo", "hi", "sigma"):
        assert stored.get(k, 0) == pytest.approx(rule.get(k, 0), abs=0.005), "run python scripts/error_bands.py"
    lines = bands_script.extrapolation_coverage(stored, "validation")  # --held-out's path, on validation rows
    assert len(lines) == 2 and all("8-GPU validation rows: " in line and "of 153" in line for line in lines)


def test_a_capped_extrapolation_says_so_and_reports_the_move_it_made(monkeypatch):
    """A per-doubling rule (variants E and S; the stored rule may be another) widens the slow side
    until the cap: the note says so and states the move it made."""
    stored = uncertainty.bands()
    rule = {"kind": "per-doubling", "lo": 0.022, "hi": 0.056, "variant": "S", "basis": "a per-doubling rule"}
    monkeypatch.setattr(uncertainty, "bands", lambda: {**stored, "extrapolation": rule})
    b = uncertainty.band("gpu:ampere")
    # enough doublings beyond the data's 8 GPUs for the rule's slow side to reach the cap
    per_doubling = uncertainty.extrapolation_widening(16, 8, rule)[1]
    assert per_doubling > 0
    doublings = math.ceil((uncertainty.Q90_CEIL - b.q90) / per_doubling) + 1
    dp = 2 ** doublings // 8  # tp 8 x pp 8 x dp = 8 x 2^doublings GPUs
    s = _gpu("a100", tp=8, pp=8, dp=dp, micro_batch=1, global_batch=dp)
    q10, q90 = uncertainty.widened(b.q10, b.q90, *uncertainty.extrapolation_widening(s["gpus"], 8, rule))
    assert q90 == uncertainty.Q90_CEIL and "(capped)" in s["interval_note"]
    assert f"+{100 * (q90 - b.q90):.1f} points" in s["interval_note"]
    assert s["iteration_s_low"] == pytest.approx(s["iteration_s"] / 2)


def test_a_grid_measured_with_row_drift_is_repriced_as_validate_priced_it():
    """Session 27's sitting (docs/validation.md, "The CPU band priced with each row's own drift check"):
    scripts/repredict_validation.py re-prices each stored row with its own check exactly as
    `perfsim validate --row-drift` did during the run, and finds the rule's premise as recorded (the
    tp2 grid held still on both rows, tp2 sp on neither)."""
    import tempfile

    import pandas as pd

    rp = bands_script._script("repredict_validation")
    folder = ROOT / "traces" / "validation" / "s27"
    with tempfile.TemporaryDirectory() as tmp:
        for n, (grid, held) in enumerate((("gpt2-tiny-tp2", [True, True]), ("gpt2-tiny-tp2-sp", [False, False]))):
            df = rp.repredict_frame(folder / grid, str(ROOT / "traces" / "cpu-2core-s27.json"), Path(tmp) / str(n),
                                    row_drift_checked=True)
            stored = pd.read_csv(folder / grid / "validation.csv")
            assert list(df.predicted_iteration_s) == pytest.approx(list(stored.predicted_drifted_iteration_s), rel=1e-9)
            assert list(df.row_drift) == pytest.approx(list(stored.row_compute_drift), rel=1e-9)
            assert [bool(h) for h in df.row_held_still] == held


def test_the_row_drift_report_refuses_bad_input_in_one_line(capsys):
    """scripts/repredict_validation.py --row-drift: a missing folder, a profile that cannot be read,
    grids measured without --row-drift: one line on stderr and exit 2, no traceback."""
    rp = bands_script._script("repredict_validation")
    s27 = str(ROOT / "traces" / "validation" / "s27")
    for args, culprit in ((["--row-drift", "traces/cpu-2core-s27.json"], "usage:"),
                          (["--row-drift", "/nonexistent.json", s27], "/nonexistent.json"),
                          (["--row-drift", str(ROOT / "traces" / "cpu-2core.json"), str(ROOT / "traces" / "validation")],
                           "has no drift check of its own")):
        assert rp.main(args) == 2
        err = capsys.readouterr().err
        assert culprit in err and len(err.strip().splitlines()) == 1, err
