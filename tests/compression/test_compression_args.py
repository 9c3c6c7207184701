"""The declarative argument schema of compressor specs (perfsim.compression.args):
parsing, defaults, canonical text, syntax lines and one-line errors naming the culprit."""

from __future__ import annotations

import pytest

from perfsim.compression import compressor_classes, make_compressor
from perfsim.compression.args import SpecArg, complete, format_spec, format_syntax, parse_args
from perfsim.errors import ConfigError

#: the syntax lines `perfsim compressors` prints (derived from spec_args, except qsgd's)
SYNTAX = {
    "fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "onebit": "onebit",
    "directq": "directq:BITS[:det][:bucket=N]",
    "aqsgd": "aqsgd:BITS[:m8|m4|m2][:disk=PATH]",
    "topk": "topk:FRACTION:BITS[:det]",
    "qsgd": "qsgd:BITS[:bucket=D] | qsgd:s=LEVELS[:bucket=D]",
    "qsgd-maxnorm": "qsgd-maxnorm:BITS[:norm=NORM][:chunk=D]",
    "qsgd-maxnorm-multiscale": "qsgd-maxnorm-multiscale:BITS[:SCALE_BITS,...][:bucket=B]",
    "randk-maxnorm": "randk-maxnorm:FRACTION:BITS[:scaled]",
    "randk-maxnorm-multiscale": "randk-maxnorm-multiscale:FRACTION:BITS[:SCALE_BITS,...][:scaled]",
    "ecq": "ecq:BITS[:alpha=A][:beta=B][:bucket=D]",
    "powersgd": "powersgd:RANK[:start=ITER][:min_rate=R]",
}


def test_syntax_lines():
    assert {name: cls.spec_syntax for name, cls in compressor_classes().items()} == SYNTAX


@pytest.mark.parametrize("text,canonical", [
    ("directq:4:DET:bucket=16", "directq:4:det:bucket=16"), ("directq:4:stoch", "directq:4"),
    ("aqsgd:3:M8:disk=/Tmp/X", "aqsgd:3:m8:disk=/Tmp/X"), ("topk:2e-1:8", "topk:0.2:8"),
    ("qsgd:s=7:bucket=512", "qsgd:4"), ("qsgd:s=5", "qsgd:s=5"), ("qsgd:4:bucket=0", "qsgd:4:bucket=0"),
    ("qsgd-maxnorm:4:chunk=512", "qsgd-maxnorm:4"), ("qsgd-maxnorm:2:chunk=512", "qsgd-maxnorm:2:chunk=512"),
    ("qsgd-maxnorm-multiscale:4", "qsgd-maxnorm-multiscale:4:8"),
    ("qsgd-maxnorm-multiscale:4:8+6:bucket=1", "qsgd-maxnorm-multiscale:4:6,8"),
    ("randk-maxnorm:scaled:0.50:4", "randk-maxnorm:0.5:4:scaled"),
    ("randk-maxnorm-multiscale:0.1:2", "randk-maxnorm-multiscale:0.1:2:6"),
    ("ecq:4:alpha=0.01:beta=0.9", "ecq:4:beta=0.9"), ("ecq:2:bucket=16", "ecq:2"),
    ("powersgd:4:min_rate=2.5:start=2", "powersgd:4:min_rate=2.5"), ("none", "fp32"),
    ("topk:0.123456789:8", "topk:0.123456789:8"),  # floats are written exactly
])
def test_canonical_spec(text, canonical):
    comp = make_compressor(text)
    assert comp.spec == canonical
    assert make_compressor(canonical).spec == canonical


@pytest.mark.parametrize("text,culprit", [
    ("directq", "missing BITS"), ("topk:0.2", "missing BITS"), ("directq:5", "bits=5: unsupported"),
    ("directq:x", "bits 'x': not an integer"), ("directq:4:foo", "unexpected argument 'foo'"),
    ("directq:4:bucket=0", "bucket=0: must be >= 1"), ("qsgd:4:bucket=x", "option bucket='x'"),
    ("ecq:4:gamma=1", "unknown option 'gamma'"), ("ecq:4:beta=2", "beta=2: must be in [0, 1]"),
    ("ecq:4:alpha=inf", "not a finite number"), ("topk:1.5:8", "fraction=1.5: must be in (0, 1]"),
    ("aqsgd:3:m3", "unexpected argument 'm3'"), ("aqsgd:3:disk=", "option disk='': empty"),
    ("qsgd:4:s=7", "qsgd:BITS or qsgd:s=LEVELS"), ("qsgd:s=200", "s=200: must be in [1, 127]"),
    ("qsgd-maxnorm-multiscale:4:4", "scale bits 4"), ("qsgd-maxnorm-multiscale:4:8,8", "repeated"),
    ("powersgd:4:start=1", "start=1: must be >= 2"), ("fp16:1", "fp16 takes no arguments"),
])
def test_errors_are_one_line_naming_the_culprit(text, culprit):
    with pytest.raises(ConfigError) as err:
        make_compressor(text)
    msg = str(err.value)
    assert culprit in msg and msg.startswith(f"compressor {text!r}: ") and "\n" not in msg


def test_from_values_fills_defaults_and_checks():
    classes = compressor_classes()
    ecq = classes["ecq"].from_values({"bits": 4}, seed=3)
    assert (ecq.spec, ecq.alpha, ecq.beta, ecq.bucket, ecq.seed) == ("ecq:4", 0.01, 1.0, 512, 3)
    with pytest.raises(ConfigError, match="bucket=0"):
        classes["directq"].from_values({"bits": 4, "bucket": 0})
    with pytest.raises(ConfigError, match="missing argument bits"):
        classes["directq"].from_values({})
    with pytest.raises(ConfigError, match="unknown argument"):
        classes["directq"].from_values({"bits": 4, "levels": 3})


def test_schema_functions_on_a_schema_of_their_own():
    schema = (SpecArg("n", low=1), SpecArg("x", float, default=lambda v: v["n"] / 2),
              SpecArg("on", default=False, words={"on": True, "off": False}),
              SpecArg("tag", str, key=True, default=None, metavar="T"))
    assert format_syntax("demo", schema) == "demo:N[:X][:on][:tag=T]"
    assert parse_args("demo", schema, ["ON", "3", "tag=Ab"]) == {"on": True, "n": 3, "tag": "Ab"}
    values = complete(schema, {"n": 3})
    assert values == {"n": 3, "x": 1.5, "on": False, "tag": None}
    assert format_spec("demo", schema, values) == "demo:3:1.5"
    assert format_spec("demo", schema, {**values, "on": True, "tag": "Ab"}) == "demo:3:1.5:on:tag=Ab"
    with pytest.raises(ConfigError, match="n=0: must be >= 1"):
        complete(schema, {"n": 0})
    with pytest.raises(ConfigError, match="unexpected argument '2'"):
        parse_args("demo", schema, ["3", "1.5", "2"])
