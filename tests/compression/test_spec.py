"""One spec vocabulary: parse_spec gives the canonical text, family and label that
the registry, the runtime, profiles and plots share."""

from __future__ import annotations

import pytest

from perfsim.compression.spec import Spec, parse_spec
from perfsim.errors import ConfigError


@pytest.mark.parametrize("text,role,canonical,family,label", [
    ("AQSGD:FW3BW6:m8", "pipeline", "aqsgd:fw3bw6:m8", "pipeline", "AQ-SGD fw3 bw6 m8"),
    (" directq:fw4bw8 ", "pipeline", "directq:fw4bw8", "pipeline", "DirectQ fw4 bw8"),
    ("none", "pipeline", "fp32", "pipeline", "FP32"),
    ("fp32", "grad", "none", "compressor", "none"),
    ("QSGD-MaxNorm:4", "grad", "qsgd-maxnorm:4", "compressor", "QSGD-MaxNorm 4-bit"),
    ("powersgd:2:MIN_RATE=3", "grad", "powersgd:2:min_rate=3", "hook", "PowerSGD r=2 min_rate=3"),
    ("onebit-lamb:warmup=10", "grad", "onebit-lamb:warmup=10", "optimizer", "1-bit LAMB warmup=10"),
    ("aqsgd:3:disk=/Tmp/Store", "compressor", "aqsgd:3:disk=/Tmp/Store", "compressor", "AQ-SGD 3-bit disk=/Tmp/Store"),
])
def test_canonical_text_family_label(text, role, canonical, family, label):
    s = parse_spec(text, role)
    assert (s.text, s.family, s.label, str(s)) == (canonical, family, label, canonical)
    assert parse_spec(s.text, role) == s  # canonical text round-trips
    assert parse_spec(s, role) is s


def test_pipeline_pair():
    assert parse_spec("aqsgd:fw3bw6:m8", "pipeline").pipeline_pair() == ("aqsgd:3:m8", "directq:6")
    assert parse_spec("directq:fw4bw8", "pipeline").pipeline_pair() == ("directq:4", "directq:8")
    assert parse_spec("fp16", "pipeline").pipeline_pair() == ("fp16", "fp16")
    with pytest.raises(ConfigError, match="not a pipeline"):
        parse_spec("qsgd:4", "grad").pipeline_pair()


@pytest.mark.parametrize("text,role,culprit", [
    ("", "grad", "empty"), ("aqsgd:3", "pipeline", "fwXbwY"), ("qsgd:fw4bw8", "grad", "fwXbwY"),
    ("aqsgd:3", "grad", "pipeline activations"), ("onebit-adam", "pipeline", "--grad-compress"),
    ("directq:fw4bw8:fw2bw2", "pipeline", "more than one"), ("qsgd::4", "grad", "empty part"),
])
def test_misplaced_specs_name_the_culprit(text, role, culprit):
    with pytest.raises(ConfigError, match=culprit):
        parse_spec(text, role)


def test_profiles_and_plots_use_the_canonical_spec():
    from perfsim.analysis.style import family, method_name
    from perfsim.profile import load_profile

    prof = load_profile("default-v100")
    assert prof.encode_time("AQSGD:3", 1e6) == prof.encode_time("aqsgd:3", 1e6) > 0
    assert method_name("AQSGD:fw3bw6") == "AQ-SGD fw3 bw6" and family("QSGD-MaxNorm:4") == "qsgd-maxnorm"
    assert isinstance(parse_spec("fp16"), Spec)
