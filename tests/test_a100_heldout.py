"""The A100 compute model against real measurements it was not fitted on.

Reads ../shared/data/a100-single-node (never copied into the repo); skipped without it.
The split (scripts/calibrate_a100.py): a row is held out when the SHA-256 of its
configuration text has an odd first byte. The fit used only the other half."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("calibrate_a100", ROOT / "scripts" / "calibrate_a100.py")
cal = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cal)

DATA = cal.data_path()
pytestmark = pytest.mark.skipif(DATA is None, reason="../shared/data/a100-single-node not present")


def test_split_is_half_and_fixed():
    rows = cal.load_rows(DATA)
    held = [r for r in rows if not r["calib"]]
    assert len(rows) == 1440 and 650 < len(held) < 790
    assert held[0]["key"] == next(r["key"] for r in cal.load_rows(DATA) if not r["calib"])


def test_held_out_mape():
    rows = [r for r in cal.load_rows(DATA) if not r["calib"]][::7]  # every 7th held-out row (time)
    errs = [abs(cal.predict_row(r) - r["time_s"]) / r["time_s"] for r in rows]
    mape = sum(errs) / len(errs)
    # the whole held-out half gives 4.63 % (scripts/calibrate_a100.py --check), this subsample
    # 4.3 %; it must stay in that range: a broken compute model or placement lands far above
    assert mape < 0.05, f"held-out MAPE {100 * mape:.1f} % on {len(rows)} rows"
