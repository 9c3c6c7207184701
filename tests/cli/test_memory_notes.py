"""``perfsim memory`` names the settings it was given that do not change the job's memory
(network, links, collectives, timing) instead of accepting and ignoring them without a word
(qa7's open item); a setting that does change it is not named."""

import json

from perfsim.analysis.memory_fit import memory_report
from perfsim.cli import main

JOB = dict(model="llama2-7b", gpu="h100", tp=1, pp=1, dp=8, micro_batch=4, precision="bf16", gpus_per_node=8)


def test_settings_that_do_not_change_memory_are_named():
    report = memory_report(**JOB, bandwidth="1Gbps", straggler_cv=0.02)
    assert len(report.notes) == 1
    note = report.notes[0]
    assert "--bandwidth" in note and "--straggler-cv" in note and "--gpus-per-node" in note
    assert "memory" in note
    # the GPU prices capacity; a strategy setting is not a system setting: neither is named
    assert "--gpu" not in note.replace("--gpus-per-node", "") and "--zero" not in note


def test_a_job_given_only_what_memory_uses_has_no_note():
    assert memory_report(model="llama2-7b", gpu="h100", tp=1, pp=1, dp=8, micro_batch=4,
                         precision="bf16").notes == []


def test_the_cli_prints_the_note_and_json_holds_it(capsys):
    argv = ["memory", "--model", "llama2-7b", "--gpu", "h100", "--tp", "1", "--pp", "1", "--dp", "8",
            "--micro-batch", "4", "--precision", "bf16", "--latency", "5ms", "--format", "json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "--latency" in json.loads(out)["notes"][0]
    assert err.count("note: --latency") == 1


def test_a_grids_memory_warning_names_the_configurations_it_is_about():
    """In a grid, `warning: peak memory ... exceeds` was printed once per distinct peak without saying
    which rows: with --recompute none,full the reader could not tell that full recomputation fits."""
    from _helpers import run_cli_here

    r = run_cli_here("predict", "--model", "gpt2-medium", "--pp", "4", "--recompute", "none,full",
                     "--bandwidth", "1Gbps")
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: peak memory")]
    assert len(warnings) == 1 and warnings[0].endswith("(recompute=none)"), r.stderr
    both = run_cli_here("predict", "--model", "gpt2-medium", "--pp", "4", "--compress", "fp32,fp16",
                        "--bandwidth", "1Gbps").stderr
    assert [line for line in both.splitlines() if line.startswith("warning: peak memory")][0].endswith(
        "(every configuration)"), both  # one peak shared by both rows
    one = run_cli_here("predict", "--model", "gpt2-medium", "--pp", "4", "--bandwidth", "1Gbps").stderr
    assert "warning: peak memory" in one and "configuration" not in one and "(compress=" not in one, one
