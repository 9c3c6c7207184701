"""The public homes: perfsim.calibrate / perfsim.validate (the functions the commands
call), perfsim.runtime's names, and the flags shared by the commands."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys

import pytest

import perfsim
from perfsim.errors import ConfigError


def test_runtime_names_resolve_to_their_defining_modules():
    import perfsim.runtime as rt

    assert "Messenger" in rt.__all__ and "OneBitAdam" in rt.__all__ and "run" in rt.__all__
    for name in rt.__all__:
        obj = getattr(rt, name)
        assert obj.__module__.startswith("perfsim.runtime."), name
        assert obj.__name__ == name
    with pytest.raises(AttributeError, match="nosuch"):
        rt.nosuch  # noqa: B018


def test_importing_runtime_config_stays_torch_free():
    code = ("import sys, perfsim, perfsim.runtime, perfsim.runtime.config; "
            "from perfsim.runtime import RunConfig; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_calibrate_flags_are_the_keywords_of_the_library():
    """`perfsim calibrate`'s flags and defaults come from plan_calibration's keywords (besides
    where the profile goes and whether it may replace a file there, progress, and --compare, whose
    library side is perfsim.calibrate.compare.compare_profiles)."""
    from perfsim.calibrate.calibration import plan_calibration
    from perfsim.commands import calibrate as command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    defaults = vars(parser.parse_args([]))
    params = inspect.signature(plan_calibration).parameters
    assert set(params) == set(defaults) - {"out", "overwrite", "no_progress", "compare"}
    assert all(defaults[k] == p.default for k, p in params.items())
    assert set(inspect.signature(perfsim.calibrate).parameters) == {"out", "progress", "command", "overwrite",
                                                                     *params}


def test_plan_calibration_takes_sequences_and_names_the_flag():
    from perfsim.calibrate.calibration import plan_calibration

    plan = plan_calibration(model=["digits-mlp"], micro_batch=[2, 4], stages=[2], codecs=["fp32"],
                            comm="p2p", quick=True, device="cpu")
    assert [c.model for c in plan.compute] == ["digits-mlp"]
    # --quick: whole stages by the harness, inside the compute stage
    assert plan.compute[0].micro_batches == (2, 4) and plan.compute[0].stages == (2,)
    assert [name for name, _ in plan.stages()] == ["compute digits-mlp", "codecs (1 specs)",
                                                   "comm loopback (p2p)"]
    # else (on a CPU) by short runs, one per micro-batch
    full = plan_calibration(model=["digits-mlp"], micro_batch=[2, 4], stages=[2], codecs="none", comm="none",
                            device="cpu")
    assert full.compute[0].stages == () and [name for name, _ in full.stages()][1:] == [
        "stages digits-mlp mb 2 pp=2 (run)", "stages digits-mlp mb 4 pp=2 (run)"]
    assert 0 < plan.estimate_seconds() < plan.estimate_seconds(quick=False)
    assert plan.settings["micro_batches"] == [2, 4]
    for kw, flag in ((dict(micro_batch=[0]), "--micro-batch"), (dict(ranks=0), "--ranks"),
                     (dict(statistic="mean"), "--statistic"), (dict(stages="99"), "--stages"),
                     (dict(stage_timing="guess"), "--stage-timing"),
                     (dict(efficiency="fp8"), "--efficiency")):
        with pytest.raises(ConfigError, match=flag):
            plan_calibration(model="digits-mlp", comm="none", codecs="none", **kw)


def test_validate_checks_before_any_run(tmp_path):
    with pytest.raises(ConfigError, match="--profile"):
        perfsim.validate(profile=None, out=str(tmp_path))
    with pytest.raises(ConfigError, match="--macro-batch"):
        perfsim.validate(profile="default-v100", macro_batch=30, out=str(tmp_path))
    with pytest.raises(ConfigError, match="--tp"):
        perfsim.validate(profile="default-v100", tp="1,x", out=str(tmp_path))
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_run_and_validate_share_the_job_flags():
    """run's and validate's job flags are generated from perfsim.params.PARAMS (predict's):
    the same help, parsed as predict parses them; a flag not given is None (RunConfig's
    default, the job's, or with --resume the checkpoint's), the help states the default."""
    from perfsim import params
    from perfsim.commands import run, validate

    for module, lists in ((run, False), (validate, True)):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        defaults = vars(parser.parse_args([]))
        names = params.RUN_JOB_PARAMS if not lists else validate.JOB
        assert set(names) <= set(defaults)
        assert all(defaults[name] is None for name in names)
        text = parser.format_help()
        assert params.BY_NAME["dp"].help in text and params.BY_NAME["micro_batch"].help in text
        if lists:  # validate's grid defaults, stated
            assert "(default 2)" in text and "a comma list runs every value" in text
        else:  # run: the job's defaults (predict's: pp 8)
            assert "(default 8)" in text and "(default gpt2-small-byte)" in text
    r = subprocess.run([sys.executable, "-m", "perfsim", "run", "--pp", "0", "--out", "never"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--pp" in r.stderr and "Traceback" not in r.stderr, r.stderr
