"""perfsim as a library: one parameter description for CLI, API and sweeps; the
README's Python example; DataFrames and short reprs; no torch for predict;
logging, completion and --help examples."""

from __future__ import annotations

import argparse
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import perfsim
from perfsim import params
from perfsim.cli import build_parser, main
from perfsim.errors import ConfigError

from _helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings if o.startswith("--")}


def test_every_parameter_is_a_flag_of_predict_and_sweep_and_a_keyword_of_the_api():
    want = {p.flag for p in params.PARAMS}
    for command in ("predict", "sweep"):
        assert want <= _flags(_subparser(command)), command
    api = inspect.signature(perfsim.predict).parameters
    assert list(api) == [*params.NAMES, "trace"]
    for p in params.PARAMS:
        assert api[p.name].default == p.default and api[p.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert api[p.name].annotation == p.annotation
        assert p.name in perfsim.predict.__doc__
    assert list(inspect.signature(perfsim.sweep).parameters)[:len(params.NAMES)] == list(params.NAMES)
    from perfsim.analysis.sweep import PARAMS

    assert tuple(PARAMS) == params.NAMES


@pytest.mark.parametrize("name,flag_value,api_value", [
    ("link_burst", "50KB", 50_000), ("p2p_protocol", "rendezvous", "rendezvous"),
    ("p2p_control_latency", "50us", 50e-6), ("latency", "5ms", 0.005),
    ("nic_sharing", None, False), ("intra_node_bandwidth", "100GB/s", 8e11)])
def test_flag_api_and_sweep_give_the_same_prediction(capsys, name, flag_value, api_value):
    """A parameter set by flag, by keyword (SI value) or as a sweep axis
    predicts the same configuration: no copy of the parameter list can drift."""
    import csv
    import io

    base = {"model": "gpt2-tiny", "pp": 2, "dp": 2, "gpus_per_node": 2, "macro_batch": 8,
            "bandwidth": "100Mbps", "compress": "aqsgd:fw3bw6"}
    flag = [params.BY_NAME[name].flag] if flag_value is not None else ["--no-" + name.replace("_", "-")]
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in base.items()] + flag
    argv += [flag_value] if flag_value is not None else []
    assert main(["predict", *argv, "--format", "csv"]) == 0
    cli = float(next(csv.DictReader(io.StringIO(capsys.readouterr().out)))["iteration_s"])
    api = perfsim.predict(**base, **{name: api_value}).summary["iteration_s"]
    default = perfsim.predict(**base).summary["iteration_s"]
    swept = perfsim.sweep(**base, **{name: [params.DEFAULTS[name] if params.DEFAULTS[name] is not None
                                            else "0s", api_value]}, jobs=1).to_frame()
    assert cli == pytest.approx(api, rel=1e-12)
    assert swept["iteration_s"].iloc[-1] == pytest.approx(api, rel=1e-12)
    assert len(swept) == 2


def test_api_errors_name_the_parameter():
    with pytest.raises(ConfigError, match="bandwith"):
        perfsim.predict(bandwith="1Gbps")
    with pytest.raises(ConfigError, match="link_burst"):
        perfsim.predict(link_burst="lots")
    with pytest.raises(ConfigError, match="p2p_protocol"):
        perfsim.predict(p2p_protocol="carrier-pigeon")


def test_readme_python_example_runs():
    """The README's "Use from Python" block, executed as written."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use from Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {**__import__("os").environ, "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Result(predicted" in proc.stdout and "aqsgd:fw3bw6" in proc.stdout


def test_result_repr_is_short_and_frames_have_the_schema():
    from perfsim.result import LINK_COLUMNS, MICROBATCH_COLUMNS, STAGE_COLUMNS, SUMMARY_COLUMNS

    r = perfsim.predict(macro_batch=8)
    assert len(repr(r)) < 300 and "samples/s" in repr(r)
    assert list(r.to_frame().columns)[:len(SUMMARY_COLUMNS)] == SUMMARY_COLUMNS
    assert len(r.to_frame()) == 1
    assert set(STAGE_COLUMNS) <= set(r.to_frame("stages").columns) and len(r.to_frame("stages")) == 8
    assert list(r.to_frame("microbatches").columns)[:len(MICROBATCH_COLUMNS)] == MICROBATCH_COLUMNS
    assert set(LINK_COLUMNS) <= set(r.to_frame("links").columns)
    with pytest.raises(ConfigError, match="table 'nope'"):
        r.to_frame("nope")
    t = perfsim.sweep(bandwidth="1Gbps,100Mbps", macro_batch=8, jobs=1)
    assert len(repr(t)) < 200 and "2 configurations varying bandwidth_bps" in repr(t)


def test_load_profile_and_compressors():
    prof = perfsim.load_profile("default-v100")
    assert prof.path.endswith("default-v100-aqsgd.json")
    specs = perfsim.compressors()
    assert {"aqsgd:fw3bw6", "directq:fw4bw8", "qsgd-maxnorm:4", "none"} <= set(specs["spec"])


@pytest.mark.parametrize("argv", [
    ["predict"], ["predict", "--compress", "fp32,aqsgd:fw3bw6", "--grad-compress", "none,qsgd-maxnorm:4",
                  "--dp", "2", "--format", "csv"],
    ["predict", "--grad-compress", "onebit-lamb", "--dp", "2"],  # its warm-up is a spec fact, no torch
    ["compressors", "--format", "json"],
    ["plan", "--model", "gpt2-tiny", "--nodes", "2", "--bandwidth", "100Mbps", "--format", "json"],
    ["sweep", "--bandwidth", "1Gbps,10Mbps", "--no-progress", "-o", "{tmp}/s.csv"]])
def test_predict_sweep_compressors_do_not_import_torch(argv, tmp_path):
    """``python -X importtime`` lists every module imported: no torch or triton (and,
    but for the sweep's pandas tables, no numpy)."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "perfsim", *argv],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "perfsim.engine" in imported or argv[0] == "compressors"
    if argv[0] == "plan":
        assert "perfsim.plan" in imported
    assert not {"torch", "triton"} & imported
    assert argv[0] == "sweep" or "numpy" not in imported


def test_execute_mode_still_imports_torch():
    code = ("import sys; from perfsim.runtime import make_config; "
            "import perfsim.compression as c; c.make_compressor('qsgd-maxnorm:4').compress("
            "__import__('torch').ones(8)); print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "True", proc.stderr


def test_quiet_and_verbose(tmp_path, capsys):
    out = tmp_path / "r.csv"
    assert main(["predict", "--macro-batch", "4", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().err
    assert main(["-q", "predict", "--macro-batch", "4", "-o", str(out)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["predict", "--macro-batch", "4", "-o", str(out), "-q"]) == 0  # after the command too
    assert capsys.readouterr().err == ""
    assert main(["-v", "predict", "--macro-batch", "4", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "wrote" in err and "predict {" in err  # the debug line of each configuration
    import logging

    logging.getLogger("perfsim").setLevel(logging.INFO)


@pytest.mark.parametrize("command", ["predict", "run", "calibrate", "validate", "sweep", "plot",
                                     "compressors", "completion", "plan"])
def test_help_ends_with_examples(command):
    p = _subparser(command)
    assert p.epilog and f"perfsim {command}" in p.epilog
    assert p.format_help().rstrip().endswith(p.epilog.rstrip().splitlines()[-1].strip())


def test_plan_is_public_and_keeps_its_module():
    from perfsim.plan import PlanResult, SearchSpace  # noqa: F401  (the module's names still import)

    assert callable(perfsim.plan) and "nodes" in inspect.signature(perfsim.plan).parameters


def test_shell_completion():
    pytest.importorskip("shtab")
    proc = run_cli("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    assert "--grad-compress" in proc.stdout and "complete" in proc.stdout


def test_py_typed_is_shipped():
    assert (Path(perfsim.__file__).parent / "py.typed").exists()
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["perfsim"]


@pytest.mark.parametrize("compress,grad,who", [
    ("directq:fw4bw8", "aqsgd:fw3bw6", "simulator"),   # a pipeline spec as gradient compression
    ("fp32", "powersgd:2:start=1", "simulator"),       # PowerSGD needs start >= 2 (one grammar)
])
def test_validate_checks_every_spec_before_any_run(tmp_path, compress, grad, who):
    """perfsim.validate refuses a bad spec before the first (slow) measured run."""
    from perfsim.analysis import validate as v

    plan = v.ValidationPlan(base={"model": "digits-mlp", "pp": 1, "dp": 2, "micro_batch": 8,
                                  "macro_batch": 16},
                            compresses=("fp32", compress), grad_compresses=("none", grad),
                            profile="default-v100", out=str(tmp_path))
    with pytest.raises(ConfigError, match=f"{who} rejects .*{re.escape(grad)}"):
        v.check_specs(plan)
    with pytest.raises(ConfigError, match=re.escape(grad)):
        perfsim.validate(model="digits-mlp", profile="default-v100", compress=["fp32"],
                         grad_compress=[grad], pp=1, dp=2, micro_batch=8, macro_batch=16,
                         out=str(tmp_path))
    assert not list(tmp_path.glob("runs/*"))  # nothing ran


def test_run_keywords_are_the_run_flags(tmp_path):
    """Every keyword of perfsim.run is a flag of `perfsim run`, and execute mode's
    configuration accepts all of them at their defaults."""
    from perfsim.runtime import make_config

    sig = inspect.signature(perfsim.run).parameters
    dests = {a.dest for a in _subparser("run")._actions} - {"help", "no_progress", "verbose", "quiet"}
    assert set(sig) - {"progress"} == dests
    values = {k: p.default for k, p in sig.items() if k != "progress" and p.default is not None}
    cfg = make_config(**{**values, "out": str(tmp_path / "run")})
    assert cfg.model == sig["model"].default and cfg.pp == sig["pp"].default
    with pytest.raises(ConfigError, match="optimizer"):
        perfsim.run(model="digits-mlp", optimizer="lbfgs", steps=3)
