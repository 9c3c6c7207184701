"""calibrate --efficiency: achieved-rate records of the compute model's operator classes."""

import json

import pytest

from perfsim.errors import ConfigError
from perfsim.profile import EFFICIENCY_OPS, Profile

from _helpers import assert_user_error, run_cli


def test_efficiency_records_cover_every_operator_class(tmp_path):
    from perfsim.calibrate.efficiency import EfficiencyConfig, measure_efficiency

    recs = measure_efficiency(EfficiencyConfig(dtypes=("float32",), quick=True, device="cpu"))
    assert {r["op"] for r in recs} == set(EFFICIENCY_OPS)
    gemm = {r["name"]: r for r in recs if r["op"] == "gemm"}
    # FLOPs and minimum bytes follow from the shape: 2 m n k, (mk + kn + mn) * 4 bytes
    assert gemm["128x128x128"]["flops"] == 2 * 128**3
    assert gemm["128x128x128"]["size_bytes"] == 3 * 128 * 128 * 4
    att = {r["name"]: r for r in recs if r["op"] == "attention"}
    fwd, both = att["b2h4s128d64:fwd"], att["b2h4s128d64:fwdbwd"]
    assert fwd["flops"] == 4 * 2 * 4 * 128 * 128 * 64 / 2  # causal half
    assert both["flops"] == 3.5 * fwd["flops"]
    adam = [r for r in recs if r["op"] == "adamw"]
    assert all(r["size_bytes"] == 28 * int(r["name"].split(":")[1]) for r in adam)
    assert all(r["time_s"] > 0 for r in recs)
    # they are valid profile records
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "perfsim-profile", "version": 1, "metadata": {},
                                "records": recs}))
    assert len(Profile.load(path).records) == len(recs)


def test_efficiency_record_without_flops_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "perfsim-profile", "version": 1, "metadata": {},
                                "records": [{"op": "gemm", "name": "8x8x8", "dtype": "float32",
                                             "size_bytes": 768, "time_s": 1e-6}]}))
    with pytest.raises(ConfigError, match="flops"):
        Profile.load(path)


def test_calibrate_efficiency_flag_rejects_unknown_dtype(tmp_path):
    proc = run_cli("calibrate", "--model", "none", "--codecs", "none", "--comm", "none", "--stages", "",
                   "--efficiency", "fp8", "-o", str(tmp_path / "x.json"))
    assert_user_error(proc.returncode, proc.stderr, "--efficiency 'fp8'")
