"""A new user's audit (qa6): each test failed before the fix it guards (/work/wt/qa6-findings.md)."""

from __future__ import annotations

import pytest

from _helpers import assert_user_error, run_cli_here

# a small, quick prediction (a two-stage tiny transformer on the default profile's V100)
TINY = ["--model", "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "--pp", "2"]


# ---------------------------------------------------------------- a flag given twice

@pytest.mark.parametrize("argv, culprit", [
    (["predict", "--bandwidth", "1Gbps", "--bandwidth", "10Gbps"], "--bandwidth"),
    (["predict", "--pp", "2", "--pp", "4"], "--pp"),
    (["predict", "-o", "a.csv", "--out", "b.csv"], "--out"),                 # one flag, two spellings
    (["predict", "--overlap", "--no-overlap"], "--no-overlap"),            # contradictory switches
    (["sweep", "--compress", "fp32", "--compress", "fp16"], "--compress"),
    (["plan", "--nodes", "2", "--nodes", "4"], "--nodes"),
    (["memory", "--gpu", "a100", "--gpu", "h100"], "--gpu"),
    (["run", "--steps", "3", "--steps", "30"], "--steps"),
    (["validate", "--profile", "a.json", "--profile", "b.json"], "--profile"),
    (["calibrate", "--output", "a.json", "--output", "b.json"], "--output"),
    (["plot", "t.csv", "--kind", "speedup", "--kind", "bubble"], "--kind"),
    (["compressors", "--shape", "1,4", "--shape", "1,8"], "--shape"),
])
def test_a_value_flag_given_twice_is_refused(argv, culprit):
    """`perfsim predict --bandwidth 1Gbps --bandwidth 10Gbps` priced 10 Gbps and said nothing:
    one of the two values the user wrote was dropped. Every command refuses it, naming the flag
    and both values (exit 2, one line), before any work."""
    r = run_cli_here(*argv, *(TINY if argv[0] == "predict" else []))
    assert_user_error(r.returncode, r.stderr, culprit)
    assert ("both given" if argv[1] == "--overlap" else "twice") in r.stderr
    values = [a for a in argv[1:] if not a.startswith("-")][-2:]
    if argv[1] != "--overlap" and argv[0] != "plot":
        assert all(v in r.stderr for v in values), r.stderr


def test_a_switch_or_a_counted_flag_repeated_is_harmless():
    """The same switch twice says one thing; -v -v is more detail (argparse's count)."""
    r = run_cli_here("predict", *TINY, "--allow-oom", "--allow-oom", "-q", "-q", "--format", "csv")
    assert r.returncode == 0, r.stderr
    r = run_cli_here("predict", *TINY, "--overlap", "--overlap", "--format", "csv")
    assert r.returncode == 0, r.stderr


def test_plot_filter_on_one_column_twice_is_refused(tmp_path):
    """`--filter pp=2 --filter pp=4` intersected to nothing, `--filter bandwidth=1Gbps --filter
    bandwidth=1Gbps,10Gbps` silently kept one value: one column, one filter (a comma list)."""
    table = tmp_path / "t.csv"
    r = run_cli_here("sweep", *TINY, "--bandwidth", "1Gbps,10Gbps", "-o", str(table))
    assert r.returncode == 0, r.stderr
    r = run_cli_here("plot", str(table), "--filter", "bandwidth=1Gbps", "-f", "bandwidth=1Gbps,10Gbps",
                     "-o", str(tmp_path / "x.png"))
    assert_user_error(r.returncode, r.stderr, "bandwidth")
    assert "twice" in r.stderr and not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------- a single table says what it priced

def _cells(stdout: str) -> dict[str, str]:
    """The single-configuration table's ``name │ value`` pairs (its configuration column)."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 4 and cells[0]:
            out[cells[0]] = cells[1]
    return out


def test_a_single_tables_configuration_names_gpu_precision_tp_and_what_was_given():
    """Two tables of `--gpu h100 --tp 2 --precision bf16` and `--gpu a100 --tp 4` printed the
    same configuration column (model, bandwidth, ... MB): the GPU, the precision and the TP
    degree they priced were nowhere in the table. Now they are, and so is every other
    setting the user gave that the table's standard rows do not show (--zero, --seq-len,
    --profile ...)."""
    gpt = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1024"
    a = run_cli_here("predict", "--model", gpt, "--gpu", "h100", "--tp", "2", "--precision", "bf16",
                     "--pp", "2", "--zero", "1", "--dp", "2", "--seq-len", "64")
    b = run_cli_here("predict", "--model", gpt, "--gpu", "a100", "--tp", "4", "--pp", "2", "--dp", "2")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    ca, cb = _cells(a.stdout), _cells(b.stdout)
    assert (ca["gpu"], ca["precision"], ca["tp"]) == ("h100-sxm5-80gb", "bf16", "2"), ca
    assert (cb["gpu"], cb["precision"], cb["tp"]) == ("a100-sxm4-80gb", "fp32", "4"), cb
    assert ca["zero"] == "1" and ca["seq_len"] == "64", ca


def test_a_profiles_table_names_the_device_it_was_measured_on():
    """Without --gpu the profile prices the compute: its device is the table's gpu row (the
    default's V100; a CPU profile's CPU), and a --profile given is shown, so the tables of two
    profiles differ."""
    base = ("predict", "--model", "gpt2-tiny", "--pp", "2")
    d = _cells(run_cli_here(*base).stdout)
    c = _cells(run_cli_here(*base, "--profile", "traces/cpu-2core.json").stdout)
    assert "V100" in d["gpu"] and "profile" in d["gpu"], d
    assert "cpu" in c["gpu"].lower() and "EPYC" in c["gpu"], c
    assert c["profile"].endswith("cpu-2core.json"), c
    import perfsim
    s = perfsim.predict(model="gpt2-tiny", pp=2, profile="traces/cpu-2core.json").summary
    assert s["gpu"] == "" and "EPYC" in s["profile_device"]   # the JSON says it too


# ---------------------------------------------------------------- a TP group across nodes

def test_a_tp_group_wider_than_a_node_is_said():
    """README: "`--gpu h100 --tp 8 ...` prices a GPU cluster". With the default --gpus-per-node 1
    every GPU is its own node, so the TP all-reduces crossed the 10 Gbps network (llama2-7b:
    228 s an iteration, 204 s of it TP collectives; 8 GPUs a node: 16.5 s) without a word. Now a
    note on stderr names the cause and the flag; nothing is said where TP fits in a node."""
    base = ["predict", "--model", "llama2-7b", "--gpu", "h100", "--tp", "8", "--pp", "2"]
    r = run_cli_here(*base, "--format", "csv")
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "tp 8" in line]
    assert len(notes) == 1 and "--gpus-per-node 1" in notes[0] and "--gpus-per-node 8" in notes[0], r.stderr
    assert "inter-node network" in notes[0]
    r = run_cli_here(*base, "--gpus-per-node", "8", "--format", "csv")
    assert r.returncode == 0 and "tp 8" not in r.stderr, r.stderr


def test_a_gpu_profile_without_records_names_its_gpu():
    """`perfsim predict --profile traces/gpu-h200.json` (an H200's operator rates, no layer
    records): "no compute time for layer 'embed' (profile has neither a record nor an effective
    FLOP rate)" -- true, and no way forward. The error now names the profile's GPU flag, and
    that hint predicts."""
    r = run_cli_here("predict", "--profile", "traces/gpu-h200.json", "--format", "csv")
    assert_user_error(r.returncode, r.stderr, "--gpu h200-sxm-141gb")
    hint = r.stderr.split("give ")[-1].split(" (")[0].split()
    assert hint[0] == "--gpu", r.stderr
    r = run_cli_here("predict", "--profile", "traces/gpu-h200.json", *hint, "--format", "csv")
    assert r.returncode == 0, r.stderr


def test_memory_and_plan_say_where_they_wrote(tmp_path):
    """`perfsim memory ... -o m.txt` and `perfsim plan ... -o p.csv` exited 0 printing nothing,
    where predict and sweep say "wrote FILE": a user could not tell a written file from a
    silent no-op (or a typo'd path). Both say it on stderr now (-q silences it)."""
    m, p = tmp_path / "m.txt", tmp_path / "p.csv"
    r = run_cli_here("memory", "--model", "gpt2-tiny", "--pp", "2", "-o", str(m))
    assert r.returncode == 0 and f"wrote {m}" in r.stderr and m.exists(), r.stderr
    r = run_cli_here("plan", "--model", "gpt2-tiny", "--profile", "traces/cpu-2core.json", "--no-progress",
                     "-o", str(p))
    assert r.returncode == 0 and f"wrote {p}" in r.stderr and p.exists(), r.stderr
    r = run_cli_here("memory", "--model", "gpt2-tiny", "--pp", "2", "-o", str(m), "-q")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_network_flags_of_a_job_inside_one_node_are_said_unused():
    """`perfsim predict --gpus-per-node 8 --bandwidth 100Mbps` (the 8 stages in one node) priced
    7.03 s whatever the bandwidth, without a word: nothing crosses the network. Said on stderr
    as the other settings without effect are; nothing is said where traffic leaves the node."""
    for argv in (["--gpus-per-node", "8", "--bandwidth", "100Mbps", "--latency", "5ms"],
                 ["--model", "gpt2-tiny", "--pp", "1", "--bandwidth", "100Mbps"]):
        r = run_cli_here("predict", *argv, "--format", "csv")
        assert r.returncode == 0, r.stderr
        notes = [n for n in r.stderr.splitlines() if n.startswith("note: bandwidth 100Mbps unused")]
        assert len(notes) == 1 and "one node" in notes[0], r.stderr
        assert ("note: latency 5ms unused" in r.stderr) == ("--latency" in argv), r.stderr
    r = run_cli_here("predict", "--gpus-per-node", "4", "--bandwidth", "100Mbps", "--format", "csv")
    assert r.returncode == 0 and "unused" not in r.stderr, r.stderr


@pytest.mark.parametrize("argv, flag", [
    (["predict", "--latency", "-1ms"], "--latency"),
    (["predict", "--host-overhead", "-1us"], "--host-overhead"),
    (["compressors", "--shape", "-1,4"], "--shape"),
])
def test_a_value_that_starts_with_a_dash_gets_the_way_to_write_it(argv, flag):
    """`--latency -1ms` answered "argument --latency: expected one argument" (argparse reads
    -1ms as a flag): the user gave one. The error now says how to give it, and that form
    reaches the value's own check."""
    r = run_cli_here(*argv)
    assert_user_error(r.returncode, r.stderr, flag)
    hint = f"{flag}={argv[-1]}"
    assert hint in r.stderr, r.stderr
    r = run_cli_here(argv[0], hint)
    assert_user_error(r.returncode, r.stderr, flag)
    assert "expected one argument" not in r.stderr


def test_a_topologys_table_does_not_state_its_largest_latency_as_the_jobs():
    """With --topology the table's latency row said "40ms" (the summary's latency_s: the
    topology's largest, a 3-stage job in one region never crosses it: 14.2 ms an iteration).
    The row now says it is the topology's largest; the topology is named once."""
    c = _cells(run_cli_here("predict", "--model", "gpt2-tiny", "--pp", "3", "--topology", "example-geo").stdout)
    assert c["bandwidth"] == "topology example-geo" and c["latency"] == "topology's, up to 40ms", c
    assert "topology" not in c, c


def test_every_file_a_help_example_names_is_shipped():
    """`perfsim plot --help` showed `perfsim plot traces/validation/cpu.csv --kind validation`:
    no such file (the grids' tables are traces/validation/<grid>/validation.csv), so a newcomer's
    first copy of the example failed. Every repository path in every command's examples exists."""
    import importlib
    import re
    from pathlib import Path

    from perfsim.cli import COMMANDS

    root = Path(__file__).resolve().parents[2]
    for name in COMMANDS:
        module = importlib.import_module(f"perfsim.commands.{name}")
        text = (getattr(module, "EXAMPLES", None) or "") + (module.__doc__ or "")
        # an output (after -o / --out / --output) and the profile the calibrate example writes are the user's
        outputs = set(re.findall(r"(?:-o|--out|--output) (\S+)", text)) | {"traces/mybox.json"}
        for path in re.findall(r"(?<![\w/])((?:traces|tests|perfsim/data)/[\w./-]+\.\w+)", text):
            assert path in outputs or (root / path).exists(), f"perfsim {name}: example names {path}, not shipped"


# ---------------------------------------------------------------- --set NAME=VALUE with a name twice

def test_set_assignments_refuse_a_name_twice():
    """The scripts' `--set NAME=VALUE` (megatron_open_data.py, nccl_open_data.py) kept the last of
    `--set nic_sharing=false --set nic_sharing=true` silently, as argparse kept the last of a
    flag given twice (F1); one parser of the assignments now refuses it, naming the key, and a
    malformed entry."""
    from perfsim.errors import ConfigError
    from perfsim.param_values import assignments

    assert assignments(["nic_sharing=false", " p2p-exchange = blocking "]) == {"nic_sharing": "false",
                                                                             "p2p_exchange": "blocking"}
    with pytest.raises(ConfigError, match="--set nic_sharing given twice"):
        assignments(["nic_sharing=false", "nic-sharing=true"])
    with pytest.raises(ConfigError, match="--set 'nic_sharing': not NAME=VALUE"):
        assignments(["nic_sharing"])


@pytest.mark.parametrize("script", ["megatron_open_data", "nccl_open_data"])
def test_the_open_data_scripts_refuse_a_set_name_twice(script, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / f"{script}.py"
    mod = importlib.util.module_from_spec(spec := importlib.util.spec_from_file_location(f"qa6_{script}", path))
    spec.loader.exec_module(mod)
    assert mod.main(["--set", "nic_sharing=false", "--set", "nic_sharing=true"]) == 2
    err = capsys.readouterr().err
    assert "nic_sharing given twice" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, culprit", [
    (["--pp", "1", "--dp", "2", "--bucket-size", "0"], "--bucket-size"),     # said "bucket_bytes=0"
    (["--pp", "2", "--cpu-adam-rate", "0"], "--cpu-adam-rate"),                         # said "cpu_adam_params_per_s=0.0"
])
def test_a_bad_value_is_named_by_its_flag_not_an_internal_field(argv, culprit):
    r = run_cli_here("predict", "--model", "gpt2-tiny", *argv)
    assert_user_error(r.returncode, r.stderr, culprit)


# ---------------------------------------------------------------- the notes: decided with the prediction

#: a tensor-parallel group of 2 GPUs over nodes of 1 (a quick GPU prediction)
TP_WIDE = dict(model="gpt2-tiny", gpu="h100", pp=1, tp=2)


def test_the_notes_are_the_predictions_not_the_command_lines():
    """qa6's notes (F8, F13, F15) were decided in `perfsim predict`'s command module: a user of
    `perfsim.predict` or of `--format json` / `-o out.json` never saw them. The prediction now
    carries them (`summary["notes"]`, one line each), and the JSON says what stderr says."""
    import json

    import perfsim

    s = perfsim.predict(**TP_WIDE).summary
    assert [n for n in s["notes"] if n.startswith("tp 2 spans 2 nodes")] and "--gpus-per-node 2" in s["notes"][0]
    assert perfsim.predict(**TP_WIDE, gpus_per_node=2).summary["notes"] == []
    one_node = perfsim.predict(model="gpt2-tiny", pp=2, gpus_per_node=2, bandwidth="100Mbps", latency="5ms").summary
    assert [n.split(" unused: ")[0] for n in one_node["notes"]] == ["bandwidth 100Mbps", "latency 5ms"], one_node
    geo = perfsim.predict(model="gpt2-tiny", pp=3, topology="example-geo").summary
    assert geo["notes"] == ["topology example-geo: bandwidth_bps 200Mbps and latency_s 40ms are its slowest link "
                            "and its largest latency, not necessarily this job's (the links rows hold the links it used)"]
    from perfsim.outputs import LIST_SEP
    assert not any(LIST_SEP in n for n in s["notes"] + one_node["notes"] + geo["notes"])  # a CSV cell splits back
    r = run_cli_here("predict", *[f"--{k.replace('_', '-')}={v}" for k, v in TP_WIDE.items()], "--format", "json")
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["summary"]["notes"]
    assert notes == s["notes"] and r.stderr.splitlines().count(f"note: {notes[0]}") == 1, r.stderr


def test_a_csv_cell_holds_the_notes_and_reads_back():
    from perfsim.outputs import records_csv
    from perfsim.result import notes_of

    text = records_csv([{"a": 1, "notes": ["x unused: y", "tp 2 spans"]}, {"a": 2, "notes": []}])
    assert text.splitlines() == ["a,notes", "1,x unused: y; tp 2 spans", "2,"]
    assert notes_of("x unused: y; tp 2 spans") == ["x unused: y", "tp 2 spans"]
    assert notes_of(float("nan")) == notes_of("") == notes_of(None) == []


def test_a_sweep_row_with_tp_wider_than_its_node_carries_the_note(tmp_path):
    """The sweep's rows carry each row's notes (its CSV and Parquet tables; a resumed row
    keeps them) and the command says each once."""
    out = tmp_path / "s.csv"
    argv = ["sweep", "--model", "gpt2-tiny", "--gpu", "h100", "--pp", "1", "--tp", "2", "--gpus-per-node", "1,2",
            "-o", str(out), "--no-progress"]
    for _ in range(2):  # the second: every row resumed from the table
        r = run_cli_here(*argv)
        assert r.returncode == 0, r.stderr
        assert len([n for n in r.stderr.splitlines() if n.startswith("note: tp 2 spans 2 nodes")]) == 1, r.stderr
    import csv
    rows = {row["gpus_per_node"]: row["notes"] for row in csv.DictReader(out.open())}
    assert rows["1"].startswith("tp 2 spans 2 nodes of 1 GPU") and rows["2"] == "", rows


def test_plan_keeps_tp_in_a_node_and_a_pinned_wider_tp_carries_the_note():
    """perfsim plan searches TP among the divisors of a node's GPUs: no candidate's TP group
    crosses a node. A TP pinned wider than a node is planned as given, each candidate saying so."""
    import perfsim

    r = perfsim.plan(model="gpt2-tiny", gpu="h100", nodes=2, gpus_per_node=1, global_batch=8)
    assert {c.params.get("tp", 1) for c in r.all_evaluated} == {1}
    assert not any(c.summary["notes"] for c in r.all_evaluated if c.summary is not None)
    r = perfsim.plan(model="gpt2-tiny", gpu="h100", nodes=2, gpus_per_node=1, tp=2, global_batch=8)
    assert all(row["notes"][0].startswith("tp 2 spans 2 nodes") for row in r.rows())
    cli = run_cli_here("plan", "--model", "gpt2-tiny", "--gpu", "h100", "--nodes", "2", "--tp", "2",
                       "--global-batch", "8", "--no-progress")
    assert cli.returncode == 0, cli.stderr
    assert len([n for n in cli.stderr.splitlines() if n.startswith("note: tp 2 spans 2 nodes")]) == 1, cli.stderr


# ---------------------------------------------------------------- run --help says what run does

def _flag_helps(command: str) -> dict[str, str]:
    import argparse

    from perfsim.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: " ".join((a.help or "").split()) for a in sub.choices[command]._actions}


@pytest.mark.parametrize("command", ["run", "validate"])
def test_run_help_texts_are_true_for_a_run(command):
    """`perfsim run --help` showed predict's texts: "default gpipe, 1f1b with a gpu preset",
    "needs gpu", "default 32, or global_batch / dp" -- run has no --gpu nor --global-batch, and
    refuses fused kernels, offload, ZeRO-1/2 and scatter-gather sends. Each job flag now has
    run's text where predict's does not hold (Param.run_help, one table), and the defaults it
    states are the trained job's (RunConfig's; validate's its own)."""
    import inspect
    import re

    from perfsim import params
    from perfsim.analysis.validate_grid import validate
    from perfsim.runtime.config import RunConfig

    helps = _flag_helps(command)
    defaults = {k: v.default for k, v in inspect.signature(validate).parameters.items()} if command == "validate" \
        else {n: getattr(RunConfig, n) for n in params.RUN_JOB_PARAMS}
    checked = [n for n in params.RUN_JOB_PARAMS if n in helps]
    assert {"schedule", "kernels", "offload", "zero", "macro_batch"} & set(checked)
    for name in checked:
        text = helps[name]
        assert not re.search(r"gpu preset|needs gpu|global_batch", text, re.I), (name, text)
        if name in params.RUN_HELPS:  # run's own text, not predict's
            assert text.startswith(" ".join(params.RUN_HELPS[name].split())[:40]), (name, text)
        stated = re.findall(r"\(default ([^)]*)\)", text)
        want = defaults.get(name)
        if stated and want is not None and not isinstance(want, tuple):
            assert stated[-1] == (str(want).lower() if isinstance(want, bool) else str(want)), (name, stated, want)
