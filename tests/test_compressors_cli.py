"""`perfsim compressors`: every registered compressor, sizes asked from the objects."""

import io
import math

import pytest

from perfsim.cli import main
from perfsim.commands.compressors import COLUMNS, build_example, parse_shape
from perfsim.compression import compressor_classes, make_compressor
from perfsim.errors import ConfigError

from _helpers import assert_user_error, run_cli


def _csv(capsys, *extra):
    import pandas as pd

    assert main(["compressors", "--format", "csv", *extra]) == 0
    return pd.read_csv(io.StringIO(capsys.readouterr().out))


@pytest.mark.parametrize("shape", [(1, 1024, 1600), (3, 5, 7), (1,)])
def test_csv_lists_every_compressor_with_its_own_wire_bytes(capsys, shape):
    df = _csv(capsys, "--shape", ",".join(map(str, shape)))
    assert tuple(df.columns) == COLUMNS
    grad = df[df.role == "grad"]
    assert set(grad["name"]) | {"aqsgd"} == set(compressor_classes()) | {"onebit-adam", "onebit-lamb"}
    n = math.prod(shape)
    for row in grad[grad.family != "optimizer"].itertuples():
        if row.wire_bytes != row.wire_bytes:  # this shape does not fit the compressor
            continue
        comp = make_compressor(row.spec)
        assert row.wire_bytes == comp.wire_bytes(shape), row.name
        assert row.ratio == pytest.approx(comp.wire_bytes(shape) / (4 * n), rel=1e-5)
        assert bool(row.allreduce_compatible) == comp.allreduce_compatible
        assert row.dp_bytes == sum(s.nbytes for s in comp.dp_plan(shape, 2))
    assert grad.set_index("spec").loc["none", "ratio"] == 1.0
    mine = grad.set_index("name")
    assert mine.loc["qsgd-maxnorm", "wire_bytes"] == 4 * math.ceil(n / 512) + math.ceil(n * 4 / 8)  # a norm per chunk
    assert bool(mine.loc["qsgd-maxnorm", "allreduce_compatible"]) and not bool(mine.loc["qsgd", "allreduce_compatible"])
    pipe = df[df.role == "pipeline"].set_index("spec")
    assert "aqsgd:fw3bw6" in pipe.index and "aqsgd:3" not in set(df.spec)  # the strings predict takes
    assert pipe.loc["aqsgd:fw3bw6", "wire_bytes"] == make_compressor("aqsgd:3").wire_bytes(shape)
    assert pipe.loc["aqsgd:fw3bw6", "syntax"].startswith("aqsgd:fwBITSbwBITS")


def test_json_is_the_csv_listing(capsys):
    import json

    df = _csv(capsys, "--shape", "64,64")
    assert main(["compressors", "--format", "json", "--shape", "64,64"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["spec"] for r in rows] == list(df["spec"])
    assert set(rows[0]) == set(COLUMNS)


def test_listed_specs_round_trip_through_predict_and_run(capsys, tmp_path):
    """Every string `perfsim compressors` prints is accepted, as printed, by the
    simulator (planned by the engine) and by execute mode's configuration, and
    prints back unchanged (canonical text)."""
    from perfsim.api import build_configs
    from perfsim.compression.spec import parse_spec
    from perfsim.engine.plan import build_plan
    from perfsim.runtime import make_config

    df = _csv(capsys, "--shape", "8,8")
    for row in df.itertuples():
        key = "compress" if row.role == "pipeline" else "grad_compress"
        params = {"model": "digits-mlp", "pp": 2, "dp": 2, "micro_batch": 8, "macro_batch": 16,
                  key: row.spec}
        workload, strategy, _, profile = build_configs(**params)
        build_plan(workload, strategy, profile)
        assert getattr(strategy, key) == parse_spec(row.spec, row.role)  # the value, held
        assert getattr(strategy, key).text == row.spec
        cfg = make_config(**params, out=str(tmp_path / "run"))
        assert getattr(cfg, key) == getattr(strategy, key)
        assert parse_spec(row.spec, row.role).text == row.spec


@pytest.mark.parametrize("spec,role", [("aqsgd:3", "pipeline"), ("aqsgd:fw3bw6", "grad"),
                                       ("aqsgd:3", "grad"), ("onebit-adam", "pipeline"),
                                       ("directq:fw4bw8:fw2bw2", "pipeline")])
def test_predict_and_run_reject_the_same_misplaced_specs(spec, role, tmp_path):
    from perfsim.api import build_configs
    from perfsim.runtime import make_config

    key = "compress" if role == "pipeline" else "grad_compress"
    params = {"model": "digits-mlp", "pp": 2, "dp": 2, "micro_batch": 8, "macro_batch": 16, key: spec}
    with pytest.raises(ConfigError, match=spec.split(":")[0]):
        build_configs(**params)
    with pytest.raises(ConfigError, match=spec.split(":")[0]):
        make_config(**params, out=str(tmp_path / "run"))


def test_powersgd_options_agree_between_predict_and_run(tmp_path):
    from perfsim.api import build_configs
    _, strategy, _, _ = build_configs(model="digits-mlp", pp=1, dp=2, micro_batch=8, macro_batch=16,
                                      grad_compress="powersgd:2:min_rate=3")
    g = strategy.grad_compress  # the Spec value the runtime's PowerSGD hook reads too
    assert (g.family, g.rank, g.start_iter, g.min_rate) == ("hook", 2, 2, 3.0)


def test_every_registered_class_builds_an_example():
    for name, cls in compressor_classes().items():
        comp = build_example(cls)
        assert comp is not None, f"{name}: give the class an example_spec"


def test_table(capsys):
    assert main(["compressors", "--shape", "64,64"]) == 0
    out = capsys.readouterr().out
    for name in ("qsgd-maxnorm-multiscale", "randk-maxnorm", "powersgd", "ecq"):
        assert name in out


@pytest.mark.parametrize("bad", ["1,a", "0,3", "", "-1", "1,,2"])
def test_bad_shape(bad, capsys):
    with pytest.raises(ConfigError):
        parse_shape(bad)
    assert main(["compressors", "--shape", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--shape" in err


def test_console_entry_point():
    r = run_cli("compressors", "--shape", "x1")
    assert_user_error(r.returncode, r.stderr, "--shape")
