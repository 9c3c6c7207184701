"""A hostile pass over the commands (issue 39), every probe kept as a regression test.

Organised by probe: no stale results, no lost sweep work, no abbreviations, one
validator per concept, hints that work, and the smaller edges. Each test failed
before the change it guards.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import perfsim
from perfsim.errors import ConfigError

from _helpers import run_cli, run_cli_here

# a small, quick prediction (a two-stage tiny transformer on the default profile's V100)
TINY = ["--model", "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "--pp", "2"]


# ---------------------------------------------------------------- no abbreviations

@pytest.mark.parametrize("argv", [
    ["predict", "--epoch", "8"],         # a prefix of --epochs (the probe was --ep 8, now a flag of its own)
    ["predict", "--band", "1Gbps"],      # was silently --bandwidth
    ["sweep", "--band", "1Gbps,10Gbps"],
    ["plan", "--band", "1Gbps"],
    ["validate", "--prof", "x.json"],
    ["run", "--ste", "3"],
])
def test_options_are_never_abbreviated(argv):
    r = run_cli_here(*argv)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "unrecognized arguments" in r.stderr and argv[1] in r.stderr


def test_every_parser_refuses_abbreviations():
    """Every parser and subparser perfsim builds, not just the ones probed above."""
    from perfsim.cli import build_parser

    parser = build_parser()
    stack, seen = [parser], 0
    while stack:
        p = stack.pop()
        assert p.allow_abbrev is False, p.prog
        seen += 1
        for action in p._actions:
            stack.extend(getattr(action, "choices", None).values()
                         if isinstance(getattr(action, "choices", None), dict) else ())
    assert seen >= 9  # perfsim and its eight commands + completion


@pytest.mark.parametrize("name", ["predict", "sweep", "plan", "run", "validate", "calibrate"])
def test_the_api_refuses_unknown_keywords(name):
    with pytest.raises(ConfigError, match="ep"):
        getattr(perfsim, name)(ep=8)


# ---------------------------------------------------------------- no stale results

def _scaled_profile(path: Path, factor: float) -> None:
    """Multiply every measured layer time of the profile at ``path`` (in place)."""
    doc = json.loads(path.read_text())
    for rec in doc["records"]:
        if rec["op"] in ("layer_fwd", "layer_bwd"):
            rec["time_s"] *= factor
    path.write_text(json.dumps(doc))


@pytest.fixture
def profile_copy(tmp_path):
    from perfsim.profile import default_profile_path

    path = tmp_path / "x.json"
    path.write_bytes(default_profile_path().read_bytes())
    return path


def test_sweep_recomputes_rows_whose_profile_changed(tmp_path, profile_copy):
    """The probe: after the profile's times grew x10, a re-run said "resuming: 2 of 2" and
    kept 8.9 s per iteration where predict gave 80.8 s."""
    out = tmp_path / "s.csv"
    argv = ["sweep", "--profile", str(profile_copy), "--bandwidth", "1Gbps,100Mbps", "-o", str(out),
            "--no-progress"]
    assert run_cli_here(*argv).returncode == 0
    before = pd_read(out)
    _scaled_profile(profile_copy, 10)
    r = run_cli_here(*argv)
    assert r.returncode == 0, r.stderr
    assert f"profile {profile_copy} changed since the stored rows: recomputing 2 rows" in r.stderr
    assert "resuming" not in r.stderr
    after = pd_read(out)
    for bw, it in zip(after.bandwidth_bps, after.iteration_s):
        assert it == pytest.approx(perfsim.predict(profile=str(profile_copy), bandwidth=bw).summary["iteration_s"])
    assert after.iteration_s[0] > 5 * before.iteration_s[0]  # 1 Gbps: 8.9 -> 80.8 s
    assert (after.iteration_s > before.iteration_s).all()
    # unchanged inputs: reused, said so
    r = run_cli_here(*argv)
    assert "resuming: 2 of 2 configurations already done" in r.stderr and "changed" not in r.stderr


def pd_read(path):
    import pandas as pd

    return pd.read_csv(path)


def test_sweep_key_covers_workload_topology_and_version(tmp_path, caplog, monkeypatch):
    from perfsim.packaged import DATA

    wl, topo = tmp_path / "w.toml", tmp_path / "t.toml"
    wl.write_text((DATA / "example-workload.toml").read_text())
    topo.write_text((DATA / "example-geo-topology.toml").read_text())
    out = tmp_path / "s.csv"
    grid = dict(workload=str(wl), topology=str(topo), pp="2,4", out=str(out), progress=False)
    first = perfsim.sweep(**grid).to_frame()
    assert first["input_key"].str.contains("workload=").all() and first["input_key"].str.contains("topology=").all()

    def rerun():
        caplog.clear()
        with caplog.at_level("INFO", logger="perfsim"):
            table = perfsim.sweep(**grid).to_frame()
        return table, caplog.text

    _, text = rerun()
    assert "2 of 2 configurations already done" in text and "changed" not in text
    wl.write_text(wl.read_text().replace("fwd_s = 0.004", "fwd_s = 0.040"))
    table, text = rerun()
    assert f"workload {wl} changed since the stored rows: recomputing 2 rows" in text
    assert (table.iteration_s > first.iteration_s).all()
    topo.write_text(topo.read_text() + "\n# edited\n")  # same links, other bytes: still recomputed
    _, text = rerun()
    assert f"topology {topo} changed since the stored rows: recomputing 2 rows" in text
    monkeypatch.setattr(perfsim, "__version__", "99.0")
    _, text = rerun()
    assert "since the stored rows: recomputing 2 rows" in text and "-> 99.0+" in text
    # the same version number with other code (a development tree, an edited install)
    from perfsim import provenance

    monkeypatch.setattr(provenance, "code_digest", lambda: "0" * provenance.DIGEST_CHARS)
    _, text = rerun()
    assert "since the stored rows: recomputing 2 rows" in text and "-> 99.0+0000" in text


def test_sweep_key_covers_a_model_folders_config_json(tmp_path, caplog):
    """qa1: `--model FOLDER` (a Hub-style folder holding config.json) was not in the sweep's
    key: after config.json lost half its layers a re-run said "2 of 2 already done" and kept
    the old rows (the probe, llama-3-8b cut from 16 to 8 layers: 4,540,469,248 parameters
    kept where predict gives 2,795,573,248)."""
    folder = tmp_path / "model"
    folder.mkdir()
    config = json.loads((Path(__file__).resolve().parents[1] / "data" / "configs" / "qwen2-0.5b.json").read_text())
    (folder / "config.json").write_text(json.dumps(config))
    grid = dict(model=str(folder), gpu="h100", pp="1,2", out=str(tmp_path / "s.csv"), progress=False)
    first = perfsim.sweep(**grid).to_frame()
    assert first["input_key"].str.contains("model=").all()
    config["num_hidden_layers"] //= 2
    (folder / "config.json").write_text(json.dumps(config))
    caplog.clear()
    with caplog.at_level("INFO", logger="perfsim"):
        table = perfsim.sweep(**grid).to_frame()
    assert f"model {folder} changed since the stored rows: recomputing 2 rows" in caplog.text
    assert (table.params < first.params).all()
    assert list(table.params) == [perfsim.predict(model=str(folder), gpu="h100", pp=pp).summary["params"]
                                  for pp in (1, 2)]


def test_sweep_rows_without_a_key_are_recomputed(tmp_path, caplog):
    """A table written before rows carried their inputs' key is not trusted."""
    out = tmp_path / "s.csv"
    perfsim.sweep(bandwidth="1Gbps,100Mbps", out=str(out), progress=False)
    df = pd_read(out)
    df.drop(columns="input_key").to_csv(out, index=False)
    with caplog.at_level("INFO", logger="perfsim"):
        perfsim.sweep(bandwidth="1Gbps,100Mbps", out=str(out), progress=False)
    assert "2 stored rows carry no input key" in caplog.text
    assert "input_key" in pd_read(out).columns


# ---------------------------------------------------------------- no lost sweep work

def test_other_grid_on_the_same_out_keeps_the_interrupted_rows(tmp_path):
    """The probe: a sweep with another grid on the same -o discarded the interrupted grid's
    601 computed rows."""
    from analysis.test_sweep import Interrupt  # a predict interrupted after n configurations (tests/analysis/)

    from perfsim.analysis.sweep import part_path, run_sweep

    out = tmp_path / "s.csv"
    with pytest.raises(KeyboardInterrupt):
        run_sweep({"bandwidth": "10Gbps,1Gbps,100Mbps", "pp": "2,4"}, out, jobs=1, predict=Interrupt(3),
                  progress=False)
    kept = part_path(out).read_text()
    assert len(kept.splitlines()) == 3
    r = run_cli_here("sweep", "--bandwidth", "10Mbps", "-o", str(out), "--no-progress")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "3 row(s) of another grid" in r.stderr and "--overwrite" in r.stderr
    assert part_path(out).read_text() == kept and not out.exists()
    # the same grid resumes them; --overwrite replaces them on purpose
    r = run_cli_here("sweep", "--bandwidth", "10Mbps", "-o", str(out), "--no-progress", "--overwrite")
    assert r.returncode == 0 and len(pd_read(out)) == 1


def test_other_grid_on_a_finished_table_is_refused(tmp_path):
    out = tmp_path / "s.csv"
    assert run_cli_here("sweep", "--bandwidth", "1Gbps,100Mbps", "-o", str(out), "--no-progress").returncode == 0
    before = out.read_text()
    r = run_cli_here("sweep", "--bandwidth", "10Gbps", "-o", str(out), "--no-progress")
    assert r.returncode == 2 and "its table holds 2 row(s) of another grid" in r.stderr
    assert out.read_text() == before
    # a grid that extends the stored one loses nothing: it runs only the new value
    r = run_cli_here("sweep", "--bandwidth", "1Gbps,100Mbps,10Gbps", "-o", str(out), "--no-progress")
    assert r.returncode == 0 and "2 of 3 configurations already done" in r.stderr
    assert len(pd_read(out)) == 3


# ---------------------------------------------------------------- no stale measurements

def _measured(it):
    from perfsim.result import Result

    return Result({"throughput_samples_per_s": 32 / it, "iteration_s": it, "measured_steps": 4,
                   "source": "measured"})


def _plan(tmp_path, **kw):
    from perfsim.analysis import validate as v

    base = {"model": "digits-mlp", "pp": 2, "dp": 1, "micro_batch": 8, "macro_batch": 32, "schedule": "1f1b"}
    return v.ValidationPlan(**{"base": base, "bandwidths": (1e8,), "profile": "x", "steps": 5,
                               "out": str(tmp_path), "runtime_model": False, "link_model": "nominal", **kw})


def _row(plan, runs):
    from perfsim.analysis import validate as v
    from perfsim.profile import Profile

    def runner(**kw):
        runs.append(kw)
        Path(kw["out"]).mkdir(parents=True, exist_ok=True)
        (Path(kw["out"]) / "result.json").write_text(json.dumps({"summary": _measured(0.01 * kw["steps"]).summary}))
        return _measured(0.01 * kw["steps"])

    prof = Profile.from_dict({"format": "perfsim-profile", "version": 2, "metadata": {}, "records": []})
    return v.run_row(plan, plan.rows()[0], prof, 0, runner, lambda **kw: _measured(0.05))


def test_reuse_measured_remeasures_a_run_taken_with_other_parameters(tmp_path, caplog):
    """--reuse-measured matched stored runs on (bandwidth, compress, grad_compress) only:
    a grid re-run with --steps 6 silently reused the 5-step measurement."""
    runs = []
    first = _row(_plan(tmp_path), runs)
    assert len(runs) == 1 and first["measured_key"].startswith("perfsim=")
    again = _row(_plan(tmp_path, reuse_measured=True), runs)  # same parameters: reused
    assert len(runs) == 1 and again["measured_iteration_s"] == first["measured_iteration_s"]
    with caplog.at_level("WARNING", logger="perfsim"):
        changed = _row(_plan(tmp_path, steps=6, reuse_measured=True), runs)
    assert len(runs) == 2 and changed["measured_iteration_s"] == pytest.approx(0.06)
    assert "steps 5 -> 6" in caplog.text and "measuring it again" in caplog.text


def test_reuse_measured_table_rows_keyed_and_matched_by_schedule(tmp_path, caplog):
    """The table fallback ignored the schedule (a schedule grid reused the first
    schedule's measurement for every schedule) and any change of run parameters."""
    import shutil

    import pandas as pd

    from perfsim.analysis import measured, validate as v
    from perfsim.profile import Profile

    prof = Profile.from_dict({"format": "perfsim-profile", "version": 2, "metadata": {}, "records": []})
    times = {"gpipe": 0.03, "1f1b": 0.02}

    def runner(**kw):
        return _measured(times[kw["schedule"]])

    plan = _plan(tmp_path, schedules=("gpipe", "1f1b"))
    rows = [v.run_row(plan, r, prof, i, runner, lambda **kw: _measured(0.05)) for i, r in enumerate(plan.rows())]
    pd.DataFrame(rows).to_csv(tmp_path / "validation.csv", index=False)
    shutil.rmtree(tmp_path / "runs")  # the run folders are not kept: the table is what is stored
    measured._TABLES.clear()

    def refuse(**kw):
        raise AssertionError("must not run")

    plan = _plan(tmp_path, schedules=("gpipe", "1f1b"), reuse_measured=True)
    got = [v.run_row(plan, r, prof, i, refuse, lambda **kw: _measured(0.05))["measured_iteration_s"]
           for i, r in enumerate(plan.rows())]
    assert got == [0.03, 0.02]
    # a measurement of another seed is not this row's: measured again
    measured._TABLES.clear()
    runs = []
    with caplog.at_level("WARNING", logger="perfsim"):
        _row(_plan(tmp_path, schedules=("gpipe", "1f1b"), seed=1, reuse_measured=True), runs)
    assert len(runs) == 1 and "was taken with other inputs" in caplog.text
    measured._TABLES.clear()


def test_reuse_measured_without_a_key_warns(tmp_path, caplog):
    """A measurement stored before perfsim keyed them cannot be checked: reused, and said so."""
    runs = []
    _row(_plan(tmp_path), runs)
    (tmp_path / "runs" / "00-100Mbps-fp32-none" / "measure-key.json").unlink()
    with caplog.at_level("WARNING", logger="perfsim"):
        _row(_plan(tmp_path, reuse_measured=True), runs)
    assert len(runs) == 1 and "carries no input key" in caplog.text


# ---------------------------------------------------------------- one validator per concept

WARMUP_RULE = "warmup=0 must be an integer >= 1 (1-bit Adam, arXiv:2102.02888"


@pytest.mark.parametrize("argv", [
    ["predict", "--dp", "2", "--grad-compress", "onebit-adam:warmup=0"],   # was accepted (exit 0)
    ["sweep", "--dp", "2", "--grad-compress", "none,onebit-adam:warmup=0", "-o", "SWEEP"],
    ["run", "--model", "digits-mlp", "--pp", "2", "--micro-batch", "8", "--schedule", "1f1b", "--dp", "2",
     "--grad-compress", "onebit-adam:warmup=0", "--out", "RUN"],
])
def test_onebit_warmup_zero_refused_by_every_command_for_one_reason(tmp_path, argv):
    argv = [str(tmp_path / "s.csv") if a == "SWEEP" else str(tmp_path / "r") if a == "RUN" else a
            for a in argv]
    r = run_cli_here(*argv)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and WARMUP_RULE in lines[0] and "onebit-adam:warmup=0" in lines[0]
    assert not (tmp_path / "s.csv").exists() and not (tmp_path / "r").exists()


def test_onebit_warmup_zero_refused_by_the_api_and_ddp():
    torch = pytest.importorskip("torch")
    from perfsim.compression.spec import parse_spec
    from perfsim.ddp import onebit_optimizer
    from perfsim.compression.spec import Spec

    for call in (lambda: perfsim.predict(dp=2, grad_compress="onebit-adam:warmup=0"),
                 lambda: parse_spec("onebit-lamb:warmup=0", "grad"),
                 lambda: onebit_optimizer(torch.nn.Linear(2, 2), "onebit-adam:warmup=0", lr=1e-3),
                 lambda: onebit_optimizer(torch.nn.Linear(2, 2), "onebit-adam", lr=1e-3, warmup=0),
                 lambda: Spec("onebit-adam", "optimizer", (), "grad", warmup=0)):
        with pytest.raises(ConfigError, match=re.escape(WARMUP_RULE)):
            call()
    assert onebit_optimizer(torch.nn.Linear(2, 2), "onebit-adam:warmup=1", lr=1e-3).warmup == 1


# ---------------------------------------------------------------- hints that work

HINT = re.compile(r"e\.g\. ([^\s,)]+)")

#: (flag, bad value) of predict: units, specs, counts; each error's hint is fed back
BAD_PREDICT = [
    ("--bandwidth", "200"), ("--latency", "5"), ("--bucket-size", "25Mb"), ("--link-burst", "50kb"),
    ("--bucket-size", "25"), ("--link-burst", "50"), ("--tcp-window", "4"),
    ("--host-overhead", "25"), ("--p2p-control-latency", "50"), ("--nic", "4x"), ("--nic", "4x200"),
    ("--compress", "aqsgd"), ("--compress", "aqsgd:fw3bw6:m7"), ("--compress", "directq"),
    ("--compress", "directq:fw4bw8:x"), ("--compress", "aqsgd:fw3bw6:zz=1"),
    ("--grad-compress", "powersgd"), ("--grad-compress", "topk"), ("--grad-compress", "onebit-adam:100"),
    ("--grad-compress", "qsgd-maxnorm:4:bucket=x"), ("--boundary-compress", "aqsgd"),
]


def _compressor_probes():
    """Every registered compressor given an option it does not take, in each role it has."""
    from perfsim.compression.registry import compressor_classes
    from perfsim.compression.spec import HOOKS, PIPELINE_ONLY

    for name, cls in sorted(compressor_classes().items()):
        if not cls.spec_args:
            continue
        if name not in PIPELINE_ONLY:
            yield ("--grad-compress", f"{name}:zz=1")
        if name not in HOOKS:
            yield ("--compress", f"{name}:zz=1")


def _hint(flag, bad):
    r = run_cli_here("predict", "--dp", "2", flag, bad)
    assert r.returncode == 2, (flag, bad, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return HINT.search(lines[0]), lines[0]


@pytest.mark.parametrize("flag,bad", BAD_PREDICT + list(_compressor_probes()))
def test_every_hint_is_accepted_by_the_same_command(flag, bad):
    """The probe: `--bandwidth 0` suggested 0Mbps (refused), `aqsgd:fw3bw6:m7` suggested
    aqsgd:3 (refused); each hint is now fed back to predict and must work."""
    found, line = _hint(flag, bad)
    assert found, f"no hint in: {line}"  # every probe here gives one
    hint = found.group(1)
    extra = ["--gpu", "a100-sxm4-80gb"] if flag == "--host-overhead" else []  # it needs a GPU preset
    r = run_cli_here("predict", "--dp", "2", "--pp", "8", "--allow-oom", *extra, flag, hint)
    assert r.returncode == 0, f"{flag} {bad} -> hint {hint!r} refused: {r.stderr}"


def test_hints_exist_where_the_probe_found_them():
    """The probes above keep their hints (so the test above cannot pass by skipping)."""
    for flag, bad, hint in [("--bandwidth", "200", "200Mbps"), ("--latency", "5", "5ms"),
                            ("--host-overhead", "25", "25us"),
                            ("--compress", "aqsgd:fw3bw6:m7", "aqsgd:fw3bw6"),
                            ("--grad-compress", "powersgd", "powersgd:2")]:
        found, line = _hint(flag, bad)
        assert found and found.group(1) == hint, line


def test_no_hint_where_none_can_work():
    """`--bandwidth 0` suggested 0Mbps, which is refused too: no rate fixes a zero."""
    found, line = _hint("--bandwidth", "0")
    assert found is None and "positive" in line


def test_a_suffix_hint_names_only_flags_the_command_has(tmp_path):
    """qa1: `sweep -o x.json` said "(use .csv, .parquet, .pq, or --format)"; sweep has no
    --format (following the hint: "unrecognized arguments: --format")."""
    r = run_cli_here("sweep", "--pp", "2", "--macro-batch", "4", "-o", str(tmp_path / "x.json"), "--no-progress")
    assert r.returncode == 2 and "unknown suffix '.json' (use .csv, .parquet, .pq)" in r.stderr, r.stderr
    assert "--format" not in r.stderr
    r = run_cli_here("predict", "--pp", "2", "--macro-batch", "4", "-o", str(tmp_path / "x.xyz"))
    assert r.returncode == 2 and "or --format)" in r.stderr  # predict has it


@pytest.mark.parametrize("flag", ["--hang-timeout", "--timeout"])
def test_timeout_hint_is_seconds(flag, tmp_path):
    """`run --hang-timeout 30` said "e.g. 30ms": following it kills a healthy run as hung.
    The hint is parsed back by the same parser and is a sensible timeout (seconds)."""
    from perfsim.units import parse_time

    r = run_cli_here("run", "--model", "digits-mlp", "--pp", "2", "--micro-batch", "8", "--schedule", "1f1b", flag,
                     "30", "--out", str(tmp_path / "r"))
    assert r.returncode == 2 and flag in r.stderr
    hint = HINT.search(r.stderr).group(1)
    assert hint == "30s" and parse_time(hint, flag, allow_zero=False) == 30.0
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- smaller edges

@pytest.mark.parametrize("argv,culprit", [
    (["predict", "--bandwidth", "10Gbps,,1Gbps"], "--bandwidth '10Gbps,,1Gbps': element 2 of 3 is empty"),
    (["sweep", "--compress", "fp32,", "-o", "OUT"], "--compress 'fp32,': element 2 of 2 is empty"),
    (["sweep", "--model", "gpt2-xl,,bert-large", "-o", "OUT"], "element 2 of 3 is empty"),
])
def test_an_empty_list_element_is_refused(tmp_path, argv, culprit):
    """`--bandwidth 10Gbps,,1Gbps` silently dropped the empty element."""
    r = run_cli_here(*[str(tmp_path / "s.csv") if a == "OUT" else a for a in argv])
    assert r.returncode == 2 and culprit in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_layer_limit_is_checked_before_anything_is_built(tmp_path):
    """A workload of 10^8 layers grew to 5 GB; now one line, at once (the limit is documented)."""
    from perfsim.models.specs import MAX_LAYERS

    wl = tmp_path / "w.toml"
    wl.write_text('name = "huge"\n[[layers]]\nname = "block"\ncount = 100000000\nparams = 1000\n'
                  'out_shape = [16]\nfwd_s = 0.001\n')
    r = run_cli_here("predict", "--workload", str(wl))
    assert r.returncode == 2 and "layers[0].count=100000000" in r.stderr and str(MAX_LAYERS) in r.stderr
    wl.write_text("".join(f'[[layers]]\nname = "b{i}"\ncount = {MAX_LAYERS // 2}\nparams = 1\nout_shape = [1]\n'
                          f"fwd_s = 0.001\n" for i in range(3)))  # over the limit in all, not each
    r = run_cli_here("predict", "--workload", str(wl))
    assert r.returncode == 2 and "layers[2]" in r.stderr and f"{3 * (MAX_LAYERS // 2)} layers in all" in r.stderr
    r = run_cli_here("predict", "--model", "gpt:layers=100000000,hidden=64,heads=2,seq=32,vocab=128")
    assert r.returncode == 2 and "100000000 layers" in r.stderr
    docs = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    assert f"{MAX_LAYERS:,} layers" in docs


def test_format_and_suffix_must_agree(tmp_path):
    """JSON was written silently to x.csv."""
    out = tmp_path / "x.csv"
    r = run_cli_here("predict", *TINY, "-o", str(out), "--format", "json")
    assert r.returncode == 2 and "suffix says csv, --format says json" in r.stderr
    assert not out.exists()
    assert run_cli_here("predict", *TINY, "-o", str(out), "--format", "csv").returncode == 0
    assert out.read_text().startswith("model,")


def test_errors_name_the_values_the_user_gave():
    """`--virtual-stages 100` was reported as pp=800."""
    r = run_cli_here("predict", "--schedule", "interleaved-1f1b", "--virtual-stages", "100")
    assert r.returncode == 2 and "virtual_stages=100" in r.stderr and "pp=8" in r.stderr
    assert "pp=800" not in r.stderr
    r = run_cli_here("predict", "--schedule", "zb-v", "--pp", "30")
    assert r.returncode == 2 and "pp=30" in r.stderr and "pp=60" not in r.stderr


def test_dash_is_stdout_for_every_file_output(tmp_path, monkeypatch):
    """`predict -o -` wrote a file named '-'."""
    import io

    import pandas as pd

    monkeypatch.chdir(tmp_path)
    r = run_cli_here("predict", *TINY, "-o", "-", "--format", "csv")
    assert r.returncode == 0 and r.stdout.startswith("model,") and not Path("-").exists()
    r = run_cli_here("sweep", *TINY, "--bandwidth", "1Gbps,100Mbps", "-o", "-", "--no-progress")
    assert r.returncode == 0 and not Path("-").exists()
    table = pd.read_csv(io.StringIO(r.stdout))
    assert len(table) == 2 and "wrote 2 configurations to stdout" in r.stderr
    # plot - reads the table from stdin
    monkeypatch.setattr(sys, "stdin", io.StringIO(r.stdout))
    r = run_cli_here("plot", "-", "-o", "fig.svg")
    assert r.returncode == 0 and Path("fig.svg").read_text().lstrip().startswith("<?xml")
    # folder outputs refuse it (one line)
    for cmd in (["run", "--model", "digits-mlp"], ["validate", "--profile", "default-v100"]):
        r = run_cli_here(*cmd, "--out", "-")
        assert r.returncode == 2 and "'-' (standard output)" in r.stderr, r.stderr
    assert not Path("-").exists()


def test_dash_out_writes_binary_stdout():
    """`plot -o -` and `calibrate -o -` go through the same writer: a real process's stdout."""
    table = run_cli("predict", *TINY, "--bandwidth", "1Gbps,100Mbps", "--format", "json")
    assert table.returncode == 0
    import subprocess

    r = subprocess.run([sys.executable, "-m", "perfsim", "plot", "-", "-o", "-"], input=table.stdout.encode(),
                       capture_output=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith(b"\x89PNG"), r.stderr


def test_plot_filter_hint_is_a_filter_that_works(tmp_path):
    """Too many panels said "e.g. --filter pp=...", which no filter accepts; the hint is now
    a value of the table, fed back to the same command."""
    from analysis.test_plots import synthetic  # tests/analysis/

    df, _ = synthetic(pp=tuple(range(2, 16)))  # 14 panels, one per pp
    df.to_csv(tmp_path / "t.csv", index=False)
    r = run_cli_here("plot", str(tmp_path / "t.csv"), "-o", str(tmp_path / "f.svg"))
    assert r.returncode == 2 and "14 panels" in r.stderr
    hint = re.search(r"e\.g\. --filter (\S+)", r.stderr).group(1)
    assert hint == "pp=2", r.stderr
    r = run_cli_here("plot", str(tmp_path / "t.csv"), "-o", str(tmp_path / "f.svg"), "--filter", hint)
    assert r.returncode == 0 and (tmp_path / "f.svg").exists()


def test_an_empty_value_in_a_list_is_refused():
    """A sweep file's `bandwidth = ["10Gbps", ""]` dropped the empty value like the comma list."""
    with pytest.raises(ConfigError, match="element 2 of 2 is empty"):
        perfsim.sweep(bandwidth=["10Gbps", ""])


@pytest.mark.parametrize("func,kwargs,culprit", [
    ("predict", dict(profile=5), "profile=5"),
    ("memory_report", dict(model="gpt2-tiny", pp=2, profile=[1]), "profile=[1]"),
    ("predict", dict(partition=5), "partition 5"),
    ("predict", dict(device_order=5), "device_order=5"),
    ("plan", dict(convergence=5), "convergence=5"),
    ("plan", dict(target_loss="x"), "target_loss='x'"),
    ("plan", dict(target_loss=float("inf")), "target_loss=inf"),
])
def test_the_api_answers_a_wrong_type_with_a_config_error(func, kwargs, culprit):
    """qa1: these raised TypeError / AttributeError from deep inside (`expected str, bytes or
    os.PathLike object, not int`, `'int' object is not iterable`); a target loss of inf was
    accepted (every method "reaches" it at once, the ranking by iteration time alone)."""
    if func == "plan":
        kwargs = dict(model="gpt2-tiny", nodes=2, bandwidth="1Gbps", global_batch=16, **kwargs)
    with pytest.raises(ConfigError, match=re.escape(culprit)):
        getattr(perfsim, func)(**kwargs)


def test_the_plan_reads_convergence_curves_from_a_path_object():
    """qa1: `perfsim.plan(convergence=Path(...))` raised AttributeError ('PosixPath' ... 'split')."""
    curves = Path(perfsim.__file__).parent / "data" / "convergence" / "gpt2-tiny.json"
    r = perfsim.plan(model="gpt2-tiny", nodes=2, bandwidth="1Gbps", global_batch=16, top=1, convergence=curves)
    assert str(curves) in " ".join(r.notes)
