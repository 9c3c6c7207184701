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
