"""``perfsim memory``: the peak predict reports, and what each change saves."""

import json

import pytest

import perfsim
from perfsim.analysis.memory_fit import GIB, memory_report, render
from _helpers import run_cli

JOB = dict(model="llama2-7b", gpu="h100", tp=1, pp=1, dp=8, micro_batch=4, precision="bf16")


def test_peak_is_the_one_predict_reports_and_each_option_too():
    small = dict(model="gpt2-xl", gpu="a100", pp=2, dp=2, precision="bf16")
    rep = memory_report(**small)
    assert rep.peak_bytes / GIB == pytest.approx(perfsim.predict(**small).summary["peak_memory_gib"])
    zero3 = rep.options_by_flags()["--zero 3"]
    assert zero3 / GIB == pytest.approx(perfsim.predict(**small, zero=3).summary["peak_memory_gib"])
    assert rep.fits and all(peak < rep.peak_bytes for _, peak, _ in rep.options)


def test_a_job_no_single_change_fits_gets_a_combination_that_fits():
    rep = memory_report(**JOB)
    assert rep.fits is False and not any(f for _, _, f in rep.options)
    flags, peak = rep.combination[-1]
    assert peak <= rep.capacity_bytes
    change = {}
    for part in flags.split("--")[1:]:
        name, value = part.split()
        change[name.replace("-", "_")] = int(value) if value.isdigit() else value
    assert perfsim.predict(**{**JOB, **change}).summary["fits"]


def test_cli_text_json_and_bad_input(tmp_path):
    args = ["memory", "--model", "llama2-7b", "--gpu", "h100", "--tp", "1", "--pp", "1", "--dp", "8",
            "--micro-batch", "4", "--precision", "bf16"]
    r = run_cli(*args)
    assert r.returncode == 0 and "does NOT fit in 80 GiB" in r.stdout and "together, these fit" in r.stdout
    out = tmp_path / "m.json"
    assert run_cli(*args, "--format", "json", "-o", str(out)).returncode == 0
    assert json.loads(out.read_text())["fits"] is False
    bad = run_cli("memory", "--model", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "nope" in bad.stderr


def test_without_gpu_the_profiles_gpu_is_the_capacity():
    """qa6: `perfsim memory` on the default profile said "no --gpu given: no capacity to compare
    with" while `perfsim predict` of the same job warned that its 72 GiB exceed the profile's
    V100 (16 GiB): the command whose question is "does it fit?" had the answer and gave none.
    It now compares with the GPU the profile was measured on, and says so; a CPU profile names
    no GPU, and keeps the old line."""
    rep = memory_report(model="gpt2-xl", recompute="none")  # the paper's job without its recomputation
    assert rep.capacity_bytes == 16 * GIB and rep.fits is False
    text = render(rep)
    assert "does NOT fit in 16 GiB (v100-sxm2-16gb, the profile's GPU)" in text, text
    assert any(f for _, _, f in rep.options) or rep.combination, text  # what makes it fit
    cpu = memory_report(model="gpt2-tiny", pp=2, profile="traces/cpu-2core.json")
    assert cpu.capacity_bytes is None and "no --gpu given" in render(cpu)
