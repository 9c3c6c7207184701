"""perfsim.documents: every input document is read, and its errors worded, one way."""

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from perfsim.analysis.plot_files import load_tables
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


def test_a_json_key_given_twice_is_refused_naming_it(tmp_path):
    """qa3: JSON keeps a repeated key's last value silently: a topology with "bandwidth" 1Gbps
    then 10Mbps ran at 10 Mbps, a Llama-3-8B config.json with num_hidden_layers 32 then 16 was
    priced as 16 layers, exit 0 (TOML refuses a repeated key itself)."""
    from perfsim.models.hf_config import from_hf_config

    topo = tmp_path / "t.json"
    topo.write_text('{"nodes": 2, "bandwidth": "1Gbps", "latency": "1ms", "bandwidth": "10Mbps"}')
    with pytest.raises(ConfigError, match=r"^topology '.*t\.json': key 'bandwidth' given twice"):
        load_topology(topo)
    cfg = tmp_path / "config.json"
    text = (Path(__file__).resolve().parents[1] / "data" / "llama-3-8b-config.json").read_text()
    cfg.write_text(text.replace('"num_hidden_layers": 32,', '"num_hidden_layers": 32, "num_hidden_layers": 16,'))
    with pytest.raises(ConfigError, match="key 'num_hidden_layers' given twice"):
        from_hf_config(cfg)
    nested = tmp_path / "w.json"
    nested.write_text('{"name": "m", "layers": [{"name": "a", "params": 1, "params": 2, "out_shape": [4]}]}')
    with pytest.raises(ConfigError, match="key 'params' given twice"):
        load_workload_file(nested)
    assert parse_document('{"a": {"b": 1}, "c": {"b": 2}}', "json", "x") == {"a": {"b": 1}, "c": {"b": 2}}


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


# ---------------------------------------------------------------- README.md as a product page
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _readme_commands(text: str) -> list[list[str]]:
    """Every ``perfsim ...`` / ``make ...`` command of README's shell code blocks (continuation
    lines joined, comments dropped) and of its inline code spans."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] in ("perfsim", "make"):
                commands.append(argv)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose.replace("\n", " ")):
        argv = span.split()
        # a span naming a command (`perfsim plot`) is a name; one with arguments is a command
        if len(argv) >= 3 and argv[0] in ("perfsim", "make") and re.fullmatch(r"[\w-]+", argv[1]) \
                and "|" not in span and "..." not in span and "<" not in span:
            commands.append(shlex.split(span))
    return commands


def test_readme_is_a_short_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, len(text.splitlines())
    assert "make predict" in text and "make test" in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):  # every docs/ link resolves
        assert (ROOT / link).is_file(), link


def test_every_readme_command_parses(capsys):
    """Each ``perfsim`` command of the README is accepted by the CLI's own parser (flags, values
    argparse checks) and each ``make`` target exists in the Makefile."""
    from perfsim.cli import COMMANDS, build_parser

    commands = _readme_commands(README.read_text())
    perfsim_cmds = [c for c in commands if c[0] == "perfsim"]
    assert {c[1] for c in perfsim_cmds} >= set(COMMANDS), "a command without a README example"
    parser = build_parser()
    for argv in perfsim_cmds:
        try:
            args = parser.parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"README: `{' '.join(argv)}` is refused: {capsys.readouterr().err.strip()} ({exc.code})")
        assert args.command == argv[1]
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", makefile, re.M))
    make_cmds = [c for c in commands if c[0] == "make"]
    assert {"predict", "test"} <= {c[1] for c in make_cmds}
    for argv in make_cmds:
        for word in argv[1:]:
            assert "=" in word or word in targets, f"README: `{' '.join(argv)}`: no Makefile target {word!r}"


def test_a_refused_readme_command_is_caught(tmp_path):
    cmds = _readme_commands("```bash\nperfsim predict --bandwith 1Gbps \\\n  --pp 2  # typo\nmake tset\n```\n"
                            "and `perfsim plan --nodes 2` inline\n")
    assert cmds == [["perfsim", "predict", "--bandwith", "1Gbps", "--pp", "2"], ["make", "tset"],
                    ["perfsim", "plan", "--nodes", "2"]]
    from perfsim.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(cmds[0][1:])


def test_readme_extras_exist():
    """The extras the README names (its "extras:" sentence and every ``perfsim[X]``) are in
    pyproject.toml; issue 38 found a ``cluster`` extra that was not."""
    text = README.read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    sentence = text[text.index("extras:"):]
    sentence = sentence[:re.search(r"\.\s", sentence).start()]
    named = re.findall(r"`([\w-]+)`\s*\(", sentence)
    named += [x for group in re.findall(r"perfsim\[([\w,-]+)\]", text) for x in group.split(",")]
    assert named and set(named) <= set(extras), (named, sorted(extras))
    assert set(extras) <= set(named), f"extras the README does not name: {sorted(set(extras) - set(named))}"


@pytest.mark.slow
def test_readme_accuracy_table_is_the_stored_results_repredicted():
    """README's accuracy table is what ``scripts/accuracy_table.py`` prints today (its --check)."""
    spec = importlib.util.spec_from_file_location("accuracy_table", ROOT / "scripts" / "accuracy_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if mod._script("calibrate_a100").data_path() is None:
        pytest.skip("the A100 data (../shared/data/a100-single-node) is not on this machine")
    text = README.read_text()
    stored = text.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0].strip()
    table = mod.table()
    assert stored == table, "README's accuracy table is stale: python scripts/accuracy_table.py"
    assert len(table.splitlines()) == 2 + 2 + len(mod.GRIDS)  # header and rule, A100, Megatron open data, grids
