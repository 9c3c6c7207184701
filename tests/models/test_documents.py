"""perfsim.documents: every input document is read, and its errors worded, one way."""

import pytest

from perfsim.analysis.plots import load_tables
from perfsim.analysis.sweep import load_sweep_file
from perfsim.documents import parse_document, read_document
from perfsim.errors import ConfigError
from perfsim.network import load_topology
from perfsim.profile import Profile
from perfsim.workload import load_workload_file

#: (reader, kind of document its message names, the kind of file it reads)
READERS = [(Profile.load, "profile", "json"), (load_topology, "topology", "json"),
           (load_workload_file, "workload", "toml"), (load_sweep_file, "sweep file", "toml"),
           (lambda p: load_tables(p), "table", "json")]
BROKEN = {"json": "{oops", "toml": "x = [\n"}


@pytest.mark.parametrize("reader,what,kind", READERS)
def test_every_reader_words_its_errors_alike(tmp_path, reader, what, kind):
    bad = tmp_path / f"bad.{kind}"
    bad.write_text(BROKEN[kind])
    with pytest.raises(ConfigError, match=rf"^{what} '.*bad\.{kind}': malformed {kind.upper()} \(") as err:
        reader(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=rf"^{what} '.*missing\.{kind}': cannot read \(file not found\)$"):
        reader(tmp_path / f"missing.{kind}")
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=rf"^{what} .*: cannot read \(not UTF-8 text"):
        reader(bad)


def test_kinds_by_suffix_and_csv_rows(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("src,dst\n0,1\n")
    assert read_document(f, "topology") == [{"src": "0", "dst": "1"}]
    g = tmp_path / "w"
    g.write_text("a = 1\n")
    assert read_document(g, "workload", default="toml") == {"a": 1}
    assert parse_document('{"a": [1]}', "json", "x") == {"a": [1]}
    with pytest.raises(ConfigError, match=r"^x: malformed JSON \(Expecting value, line 2\)$"):
        parse_document("\n]", "json", "x")
