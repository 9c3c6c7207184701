"""One output writer and outputs that never clobber."""

import json
import os
import shutil
import stat
import subprocess
import sys
import threading

import pytest

from perfsim.cli import main
from perfsim.errors import ConfigError, OutputError
from perfsim import outputs

from _helpers import run_cli, run_cli_here

ROOT = os.geteuid() == 0
FAST = ["--pp", "2", "--macro-batch", "4"]


def _one_line(proc, code):
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_output_follows_a_symlink_to_its_target(tmp_path):
    target = tmp_path / "real.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert main(["predict", *FAST, "-o", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("model,")


def test_output_keeps_the_mode_of_an_existing_file(tmp_path):
    out = tmp_path / "x.json"
    out.write_text("[]")
    out.chmod(0o640)
    outputs.write_text(out, "[1]")
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and out.read_text() == "[1]"


def test_output_to_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    assert main(["predict", *FAST, "--format", "csv", "-o", str(fifo)]) == 0
    reader.join(30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith("model,")


@pytest.mark.skipif(not ROOT, reason="mknod needs root")
def test_output_to_a_device_is_written_in_place(tmp_path):
    null = tmp_path / "null"  # a private copy of /dev/null: the real one is never at risk
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert main(["predict", *FAST, "--format", "json", "-o", str(null)]) == 0
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_full_disk_is_one_line_and_exit_1(tmp_path):
    full = "/dev/full"
    if ROOT:  # a private copy of /dev/full
        full = str(tmp_path / "full")
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    proc = run_cli("predict", *FAST, "--format", "csv", "-o", full)
    _one_line(proc, 1)
    assert "No space left on device" in proc.stderr
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_full_and_closed_stdout_are_one_line_and_exit_1():
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "perfsim", "predict", *FAST, "--format", "csv"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    _one_line(proc, 1)
    assert "No space left on device" in proc.stderr
    proc = subprocess.run(f"{sys.executable} -m perfsim predict {' '.join(FAST)} >&-", shell=True,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    _one_line(proc, 1)
    assert "stdout" in proc.stderr and "closed" in proc.stderr


def test_output_format_from_suffix_or_flag(tmp_path):
    assert outputs.output_format("a.CSV") == "csv"
    assert outputs.output_format("a.json") == "json"
    assert outputs.output_format("a") == "table"
    assert outputs.output_format("a.csv", "csv") == "csv"
    assert outputs.output_format("a", "json") == "json" and outputs.output_format("-", "json") == "json"
    with pytest.raises(ConfigError, match="suffix says csv, --format says json"):  # issue 39: JSON in a.csv
        outputs.output_format("a.csv", "json")
    with pytest.raises(ConfigError, match="unknown suffix '.xlsx'"):
        outputs.output_format("a.xlsx")
    with pytest.raises(ConfigError, match="unknown suffix"):
        outputs.output_format("a.json", allowed=("csv", "parquet"), flag="--out")


def test_predict_writes_parquet(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    out = tmp_path / "p.parquet"
    assert main(["predict", *FAST, "--bandwidth", "1Gbps,100Mbps", "-o", str(out)]) == 0
    df = pd.read_parquet(out)
    assert list(df["bandwidth_bps"]) == [1e9, 1e8]


def test_parquet_without_pyarrow_refused_up_front(tmp_path):
    code = ("import sys; sys.modules['pyarrow'] = None\n"  # as if pyarrow were not installed
            "from perfsim.cli import main\n"
            f"sys.exit(main(['predict', '-o', {str(tmp_path / 'x.parquet')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    _one_line(proc, 2)
    assert "perfsim[parquet]" in proc.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_bad_output_paths_are_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    cases = [
        (["predict", "-o", str(tmp_path)], "is a directory"),
        (["predict", "-o", str(tmp_path / "afile" / "x.csv")], "is not a directory"),
        (["predict", "-o", str(tmp_path / "x.xlsx")], "unknown suffix"),
        (["sweep", "--pp", "2", "--out", str(tmp_path)], "is a directory"),
        (["sweep", "--pp", "2", "--out", str(tmp_path / "s.txt")], "unknown suffix"),
        (["run", "--out", str(tmp_path / "afile"), "--steps", "1"], "is a file"),
    ]
    for argv, msg in cases:
        proc = run_cli(*argv)
        _one_line(proc, 2)
        assert msg in proc.stderr, (argv, proc.stderr)


def test_overflowing_prediction_is_an_error_not_nan(tmp_path):
    """A NaN prediction printed NaN and exited 0; JSON got a bare NaN."""
    proc = run_cli("predict", *FAST, "--bandwidth", "1e-300bps", "--format", "json")
    _one_line(proc, 2)
    assert "overflowed" in proc.stderr and "NaN" not in proc.stdout


def test_write_failure_is_an_output_error(tmp_path):
    with pytest.raises(OutputError, match="is a directory"):
        outputs.write_text(tmp_path, "x")


def test_every_command_names_its_output_the_same_way():
    """--out and --output both existed, depending on the command."""
    from perfsim.cli import COMMANDS, build_parser

    parser = build_parser()
    names = {"-o", "--out", "--output"}
    checked = 0
    for name in COMMANDS:
        sub = parser._subparsers._group_actions[0].choices[name]
        flags = {s for a in sub._actions for s in a.option_strings}
        if flags & names:  # a command that writes an output accepts all three spellings
            assert names <= flags, name
            checked += 1
    assert checked >= 6


def test_second_sweep_on_the_same_output_is_refused(tmp_path):
    out = tmp_path / "s.csv"
    holder = subprocess.Popen([sys.executable, "-c", "import time; from perfsim.outputs import locked_dir\n"
                               f"with locked_dir({str(out)!r}, file=True):\n print('ok', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        proc = run_cli("sweep", "--pp", "2", "--out", str(out), "--no-progress")
        _one_line(proc, 2)
        assert f"pid {holder.pid}" in proc.stderr
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(not ROOT or not shutil.which("unshare"), reason="mounts a read-only tmpfs (root)")
def test_unwritable_output_folder_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    script = (f"mount -t tmpfs -o ro none {ro} && "
              f"exec {sys.executable} -m perfsim predict -o {ro / 'x.csv'}")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    _one_line(proc, 2)
    assert "not writable" in proc.stderr


# ------------------------------------------------------------ outputs owns every format
def test_formats_round_trip(tmp_path):
    """json_text / records_csv / frame_bytes / write_frame: what the commands and the
    library write, read back by the readers they are meant for."""
    import io
    import json

    import pandas as pd

    assert outputs.json_text({"a": 1}) == '{\n "a": 1\n}\n'
    with pytest.raises(ValueError):
        outputs.json_text(float("nan"), allow_nan=False)
    # union of keys in first-seen order after the given ones; None and missing: empty cells
    text = outputs.records_csv([{"b": 1, "a": None}, {"c": 3}], ["a"])
    assert text == "a,b,c\n,1,\n,,3\n"
    df = pd.DataFrame({"x": [1, 2], "y": ["u", "v"]})
    assert outputs.frame_bytes(df, "csv") == b"x,y\n1,u\n2,v\n"
    assert [json.loads(ln) for ln in outputs.frame_bytes(df, "jsonl").decode().splitlines()] == \
        [{"x": 1, "y": "u"}, {"x": 2, "y": "v"}]
    with pytest.raises(ValueError, match="frame format 'xlsx'"):
        outputs.frame_bytes(df, "xlsx")
    outputs.write_frame(tmp_path / "t.csv", df)
    assert pd.read_csv(tmp_path / "t.csv").equals(df)
    pytest.importorskip("pyarrow")
    outputs.write_frame(tmp_path / "t.parquet", df)
    assert pd.read_parquet(tmp_path / "t.parquet").equals(df)
    assert not list(tmp_path.glob(".t.*"))  # no temp file left behind
    assert pd.read_parquet(io.BytesIO(outputs.frame_bytes(df, "parquet"))).equals(df)


def test_emit_writes_stdout_for_none_and_dash(tmp_path, capsys):
    outputs.emit(None, "one\n")
    outputs.emit("-", "two\n")
    outputs.emit(tmp_path / "f.txt", "three\n")
    assert capsys.readouterr().out == "one\ntwo\n"
    assert (tmp_path / "f.txt").read_text() == "three\n"


def test_no_module_serialises_a_table_itself():
    """Issue 38: five modules wrote their own CSV/JSON/Parquet. Every to_csv / to_parquet /
    csv writer / json.dump of a file's content is in perfsim/outputs.py now."""
    import re
    from pathlib import Path

    pkg = Path(outputs.__file__).parent
    pattern = re.compile(r"\.to_csv\(|\.to_parquet\(|csv\.(Dict)?[Ww]riter\(|json\.dump\(")
    offenders = [f"{p.relative_to(pkg)}:{i}" for p in sorted(pkg.rglob("*.py")) if p.name != "outputs.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line) and not line.lstrip().startswith(("def ", "#", '"""'))]
    assert offenders == [], offenders


def test_dash_is_stdout_for_memory_and_plan(tmp_path):
    """`-o -` wrote a file named '-' (issue 38); now it is standard output for every command."""
    import io
    import json

    import pandas as pd

    args = ["memory", "--model", "llama2-7b", "--gpu", "h100", "--pp", "1", "--dp", "8", "--format", "json"]
    r = run_cli(*args, "-o", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["fits"] in (True, False) and not (tmp_path / "-").exists()
    cpu = os.path.join(os.path.dirname(__file__), "..", "..", "traces", "cpu-2core.json")
    r = run_cli("plan", "--model", "gpt2-tiny", "--profile", cpu, "--nodes", "2", "--bandwidth", "100Mbps",
                "--global-batch", "16", "--schedule", "1f1b", "--compress", "fp32", "--grad-compress", "none",
                "--top", "2", "--format", "csv", "-o", "-", "--emit-run", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(io.StringIO(r.stdout))  # the emitted command went to stderr, not into the CSV
    assert list(table["rank"]) == [1, 2] and "perfsim run" in r.stderr and not (tmp_path / "-").exists()


def test_plan_and_memory_write_the_format_their_out_suffix_names(tmp_path, capsys):
    """qa1: `plan -o p.json` and `memory -o m.json` wrote the text table into the .json file
    (exit 0), where predict and compressors pick the format from the suffix. Now the suffix
    chooses, and a suffix the command cannot write, or one that disagrees with --format, is
    refused before any work (exit 2)."""
    import json

    import pandas as pd

    mem = ["memory", "--model", "gpt2-tiny", "--pp", "2"]
    assert main([*mem, "-o", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["worst_stage"] == 1
    assert main([*mem, "-o", str(tmp_path / "m.txt")]) == 0
    assert (tmp_path / "m.txt").read_text().startswith("peak ")
    for bad in (["-o", str(tmp_path / "m.csv")], ["-o", str(tmp_path / "m.txt"), "--format", "json"]):
        assert main([*mem, *bad]) == 2
        assert not (tmp_path / "m.csv").exists()
    cpu = os.path.join(os.path.dirname(__file__), "..", "..", "traces", "cpu-2core.json")
    plan = ["plan", "--model", "gpt2-tiny", "--profile", cpu, "--nodes", "2", "--bandwidth", "100Mbps",
            "--global-batch", "16", "--schedule", "1f1b", "--compress", "fp32", "--grad-compress", "none",
            "--top", "2", "--no-progress"]
    assert main([*plan, "-o", str(tmp_path / "p.json")]) == 0
    assert [r["rank"] for r in json.loads((tmp_path / "p.json").read_text())] == [1, 2]
    assert main([*plan, "-o", str(tmp_path / "p.csv")]) == 0
    assert list(pd.read_csv(tmp_path / "p.csv")["rank"]) == [1, 2]
    capsys.readouterr()
    for bad in (["-o", str(tmp_path / "p.png")], ["-o", str(tmp_path / "q.csv"), "--format", "json"]):
        assert main([*plan, *bad]) == 2
        assert "--out" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "q.csv").exists()


# an input file given again as the output: the input (a calibration profile, a model's
# config.json, loss curves) was replaced by the output, exit 0 (qa3 probe)
_TINY_CFG = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 128, "n_positions": 32}


@pytest.mark.parametrize("argv,flag,culprit", [
    (["predict", "--profile", "{p}", "--pp", "2", "--model", "gpt2-tiny", "-o", "{p}"], "--out", "--profile"),
    (["predict", "--profile", "{p}", "--pp", "2", "--model", "gpt2-tiny", "--trace", "{p}"], "--trace", "--profile"),
    (["predict", "--pp", "2", "--model", "{c}", "-o", "{c}"], "--out", "--model"),
    (["predict", "--pp", "2", "--model", "gpt2-tiny", "-o", "{d}/r.json", "--trace", "{d}/r.json"], "--trace", "--out"),
    (["predict", "--pp", "2", "--model", "gpt2-tiny", "--bandwidth", "1Gbps,{p_bw}", "--profile", "{d}/t-1.json",
      "--trace", "{d}/t.json"], "--trace", "--profile"),
    (["memory", "--profile", "{p}", "--model", "gpt2-tiny", "--pp", "2", "-o", "{p}"], "--out", "--profile"),
    (["memory", "--model", "{d}", "--pp", "2", "-o", "{c}"], "--out", "--model"),
    (["plan", "--profile", "{p}", "--model", "gpt2-tiny", "--nodes", "2", "--bandwidth", "1Gbps",
      "--global-batch", "8", "-o", "{p}"], "--out", "--profile"),
    (["plan", "--model", "gpt2-tiny", "--nodes", "2", "--bandwidth", "1Gbps", "--global-batch", "8",
      "--convergence", "{v}", "-o", "{v}"], "--out", "--convergence"),
])
def test_an_output_is_never_one_of_the_inputs(tmp_path, argv, flag, culprit):
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    profile = tmp_path / "p.json"
    shutil.copy(repo / "traces" / "cpu-2core.json", profile)
    shutil.copy(repo / "traces" / "cpu-2core.json", tmp_path / "t-1.json")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_TINY_CFG))
    curves = tmp_path / "curves.json"
    shutil.copy(repo / "perfsim" / "data" / "convergence" / "gpt2-tiny.json", curves)
    before = {f: f.read_bytes() for f in tmp_path.iterdir()}
    fill = dict(p=profile, c=config, d=tmp_path, v=curves, p_bw="10Gbps")
    proc = run_cli_here(*[a.format(**fill) for a in argv])
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"perfsim {argv[0]}: error: {flag} ") and culprit in proc.stderr, proc.stderr
    assert {f: f.read_bytes() for f in tmp_path.iterdir()} == before  # every input as it was, nothing written


def test_a_trace_on_standard_output_never_shares_it(tmp_path, monkeypatch):
    """qa3: `predict --trace - --format json` wrote the trace and the result into one stdout
    (two JSON documents back to back: jq fails), and a grid's `--trace -` wrote files named
    `--0`, `--1`. `--trace -` is stdout only where nothing else goes there: one configuration
    with `--out FILE`."""
    monkeypatch.chdir(tmp_path)
    base = ["predict", "--model", "gpt2-tiny", "--pp", "2"]
    for extra in (["--format", "json"], [], ["-o", "-"], ["--bandwidth", "1Gbps,10Gbps", "-o", "r.json"]):
        r = run_cli_here(*base, "--trace", "-", *extra)
        assert r.returncode == 2 and r.stdout == "", (extra, r.stderr)
        assert r.stderr.startswith("perfsim predict: error: --trace '-': ") and len(r.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    r = run_cli_here(*base, "--trace", "-", "-o", "r.json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["traceEvents"] and json.loads((tmp_path / "r.json").read_text())["summary"]
