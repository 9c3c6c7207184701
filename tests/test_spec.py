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
    def pair(text):
        fw, bw = parse_spec(text, "pipeline").pipeline_pair()
        assert fw.role == bw.role == "compressor"
        return fw.text, bw.text

    assert pair("aqsgd:fw3bw6:m8") == ("aqsgd:3:m8", "directq:6")
    assert pair("directq:fw4bw8") == ("directq:4", "directq:8")
    assert pair("fp16") == ("fp16", "fp16")
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


# ---------------------------------------------------------------- a spec is a value (issue 38)

def _count_parses(monkeypatch) -> "collections.Counter":
    """Count every reading of spec text (``_parse``, the one place text becomes a Spec)."""
    import collections

    import perfsim.compression.spec as sp

    calls: collections.Counter = collections.Counter()
    real = sp._parse

    def counting(text, role):
        calls[(text, role)] += 1
        return real(text, role)

    monkeypatch.setattr(sp, "_parse", counting)
    return calls


def test_a_predict_parses_each_spec_once(monkeypatch):
    import perfsim

    calls = _count_parses(monkeypatch)
    res = perfsim.predict(model="gpt2-tiny", pp=4, dp=2, compress="AQSGD:fw3bw6", grad_compress="QSGD-MaxNorm:4",
                          boundary_compress="1=DirectQ:fw4bw8")
    user = {k: n for k, n in calls.items() if k[1] != "compressor"}
    # the user's three specs, each read once (params.normalize); the strategy, the engine's
    # pipeline pairs and gradient compressor, the memory model and the report hold the values
    assert user == {("AQSGD:fw3bw6", "pipeline"): 1, ("QSGD-MaxNorm:4", "grad"): 1,
                    ("DirectQ:fw4bw8", "pipeline"): 1}
    s = res.summary  # printed and stored as canonical text
    assert (s["compress"], s["grad_compress"], s["boundary_compress"]) == \
        ("aqsgd:fw3bw6", "qsgd-maxnorm:4", "1=directq:fw4bw8")
    calls.clear()  # a 1-bit optimizer: its warm-up is read from the value, not from its text again
    res = perfsim.predict(model="gpt2-tiny", pp=2, dp=2, grad_compress="onebit-adam:warmup=5")
    assert {k: n for k, n in calls.items() if k[1] != "compressor"} == \
        {("onebit-adam:warmup=5", "grad"): 1, ("fp32", "pipeline"): 1}  # compress's default, once too
    assert res.summary["warmup_iterations"] == 5  # the value's warm-up reached the engine


def test_the_predict_command_parses_each_spec_once(monkeypatch, capsys):
    from perfsim.cli import main

    calls = _count_parses(monkeypatch)
    assert main(["predict", "--model", "gpt2-tiny", "--pp", "2", "--dp", "2", "--compress", "directq:fw4bw8",
                 "--grad-compress", "powersgd:2", "--format", "json"]) == 0
    assert {k: n for k, n in calls.items() if k[1] != "compressor"} == \
        {("directq:fw4bw8", "pipeline"): 1, ("powersgd:2", "grad"): 1}
    assert '"compress": "directq:fw4bw8"' in capsys.readouterr().out


def test_every_listed_spec_round_trips_text_spec_text():
    import json

    import perfsim
    from perfsim.config import Strategy
    from perfsim.runtime.config import RunConfig

    rows = perfsim.compressors(shape=(8, 8))
    assert len(rows) > 10
    for row in rows.itertuples():
        role = "pipeline" if row.role == "pipeline" else "grad"
        spec = parse_spec(row.spec, role)
        assert spec.text == str(spec) == row.spec  # text -> Spec -> text
        assert parse_spec(spec.text, role) == spec and parse_spec(spec, role) is spec
        assert hash(parse_spec(spec.text, role)) == hash(spec)
        key = "compress" if role == "pipeline" else "grad_compress"
        assert getattr(Strategy(pp=2, dp=2, **{key: row.spec}), key) == spec  # a str is normalised
        cfg = RunConfig(model="digits-mlp", pp=2, dp=2, **{key: row.spec})
        assert getattr(cfg, key) == spec
        saved = json.loads(cfg.to_json())  # run configs and checkpoints store text
        assert saved[key] == row.spec and saved["boundary_compress"] is None
        assert getattr(RunConfig.from_dict(saved), key) == spec


def test_the_value_carries_what_the_runtime_reads():
    from perfsim.boundaries import parse_boundary_compress

    ps = parse_spec("powersgd:2:start=5:min_rate=3", "grad")
    assert (ps.family, ps.rank, ps.start_iter, ps.min_rate) == ("hook", 2, 5, 3.0)
    assert ps.compressor == parse_spec("powersgd:2:start=5:min_rate=3", "compressor")
    ob = parse_spec("onebit-lamb:warmup=7:exchange=momentum", "grad")
    assert (ob.optimizer, ob.warmup, ob.exchange, ob.warmup_steps(1000)) == ("onebit-lamb", 7, "momentum", 7)
    assert parse_spec("onebit-adam", "grad").warmup_steps(1000) == 200  # 20 % of the run
    zo = parse_spec("onebit-adam:refresh=16:bound=adam", "grad")  # 0/1 Adam's options, read once
    assert (zo.refresh, zo.bound, zo.warmup) == (16, "adam", None)
    assert parse_spec("qsgd:4", "grad").warmup_steps() is None
    none = parse_spec("none", "grad")
    assert none.plain and none.compressor.text == "fp32" and none.compressor.cast
    assert parse_spec("FP32", "pipeline").plain and not parse_spec("fp16", "pipeline").plain
    per = parse_boundary_compress("2=fp16,0=aqsgd:fw2bw4")
    assert per.get(0) == parse_spec("aqsgd:fw2bw4", "pipeline") and per.get(1) is None
    assert str(per) == "0=aqsgd:fw2bw4,2=fp16" and not parse_boundary_compress("")
    with pytest.raises(ConfigError, match="powersgd needs a rank"):
        parse_spec("powersgd", "grad")
