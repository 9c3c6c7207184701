"""A compression spec's own comma list (qsgd-maxnorm-multiscale's other scales) survives
the comma lists of the flags and sweep files (qa9)."""

import csv
import json

import pytest

from perfsim.cli import main
from perfsim.errors import ConfigError
from perfsim.param_values import values_of

MULTI = "qsgd-maxnorm-multiscale:4:6,8"  # canonical text: what a CSV row and `perfsim compressors` write


def test_a_spec_keeps_its_scales_in_a_comma_list():
    assert [v.text for v in values_of("grad_compress", f"none,{MULTI},ecq:4", cli=True)] == \
        ["none", MULTI, "ecq:4"]
    assert [v.text for v in values_of("grad_compress", ["none", f"{MULTI}:bucket=4"])] == \
        ["none", f"{MULTI}:bucket=4"]
    with pytest.raises(ConfigError, match="element 2 of 3 is empty"):
        values_of("grad_compress", "none,,ecq:4", cli=True)


def test_a_digit_after_a_spec_without_scales_is_still_an_error(capsys):
    assert main(["predict", "--model", "gpt2-small-byte", "--pp", "2", "--grad-compress", "ecq:4,8"]) == 2
    err = capsys.readouterr().err
    assert "compressor 'ecq:4,8': bits '4,8': not an integer" in err and err.count("\n") == 1


def test_a_csv_rows_spec_is_accepted_back_by_predict(tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert main(["sweep", "--model", "gpt2-small-byte", "--pp", "2", "--dp", "2", "--grad-compress",
                 f"none,{MULTI}", "-o", str(out), "--no-progress", "-j", "1"]) == 0
    rows = {r["grad_compress"]: r for r in csv.DictReader(out.open())}
    assert set(rows) == {"none", MULTI}
    capsys.readouterr()
    assert main(["predict", "--model", "gpt2-small-byte", "--pp", "2", "--dp", "2", "--grad-compress",
                 rows[MULTI]["grad_compress"], "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["grad_compress"] == MULTI
    assert s["dp_bytes"] == float(rows[MULTI]["dp_bytes"]) < float(rows["none"]["dp_bytes"])
