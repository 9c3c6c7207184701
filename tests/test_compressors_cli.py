"""`perfsim compressors`: every registered compressor, sizes asked from the objects."""

import io
import math
import subprocess
import sys

import pytest

from perfsim.cli import main
from perfsim.commands.compressors import COLUMNS, build_example, parse_shape
from perfsim.compression import compressor_classes, make_compressor
from perfsim.errors import ConfigError


def _csv(capsys, *extra):
    import pandas as pd

    assert main(["compressors", "--format", "csv", *extra]) == 0
    return pd.read_csv(io.StringIO(capsys.readouterr().out))


@pytest.mark.parametrize("shape", [(1, 1024, 1600), (3, 5, 7), (1,)])
def test_csv_lists_every_compressor_with_its_own_wire_bytes(capsys, shape):
    df = _csv(capsys, "--shape", ",".join(map(str, shape)))
    assert tuple(df.columns) == COLUMNS
    assert set(df["name"]) == set(compressor_classes())
    n = math.prod(shape)
    for row in df.itertuples():
        if not isinstance(row.spec, str) or row.wire_bytes != row.wire_bytes:  # a class with no buildable example
            continue
        comp = make_compressor(row.spec)
        assert row.wire_bytes == comp.wire_bytes(shape), row.name
        assert row.ratio == pytest.approx(comp.wire_bytes(shape) / (4 * n), rel=1e-5)
        assert bool(row.allreduce_compatible) == comp.allreduce_compatible
    mine = df.set_index("name")
    assert mine.loc["fp32", "ratio"] == 1.0
    assert mine.loc["qsgd-maxnorm", "wire_bytes"] == 4 * math.ceil(n / 512) + math.ceil(n * 4 / 8)  # a norm per chunk
    assert bool(mine.loc["qsgd-maxnorm", "allreduce_compatible"]) and not bool(mine.loc["qsgd", "allreduce_compatible"])


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
    r = subprocess.run([sys.executable, "-m", "perfsim", "compressors", "--shape", "x1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
