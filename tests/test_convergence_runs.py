"""`plan --convergence` from `perfsim run` folders: users bring curves of their own runs."""
from __future__ import annotations

import math

import pytest

from perfsim.convergence import convergence_from_runs, load_convergence
from perfsim.errors import ConfigError
from perfsim.result import Result
from perfsim.runtime.measure import write_outputs

JOB = dict(model="digits-mlp", lr=1e-3, optimizer="adamw", micro_batch=8, macro_batch=32, dataset_limit=None)


def _run(folder, losses, **summary):
    """A run folder as `perfsim run` writes it (write_outputs), with these losses."""
    s = {**JOB, "compress": "fp32", "grad_compress": "none", "pp": 1, "dp": 2, "seed": 0, **summary}
    r = Result(s, [], [], [], [])
    r.losses = {i + 1: v for i, v in enumerate(losses)}
    folder.mkdir(parents=True)
    write_outputs(r, folder)
    return folder


def _decay(rate, n=60):
    return [2.0 * math.exp(-rate * i) for i in range(n)]


def test_runs_give_gradient_ratios_with_seed_intervals(tmp_path):
    for seed, jitter in ((0, 0.0), (1, 0.002)):
        _run(tmp_path / f"ref{seed}", _decay(0.05 + jitter), seed=seed)
        _run(tmp_path / f"q{seed}", _decay(0.025 + jitter), seed=seed, grad_compress="qsgd-maxnorm:4")
    conv = load_convergence(str(tmp_path), "digits-mlp")  # one folder holding the runs
    rp, rg = conv.ratios("fp32", "qsgd-maxnorm:4")
    assert rg.n == 2 and 1.6 < rg.mean < 2.4 and rg.lo <= rg.mean <= rg.hi
    assert conv.steps_ratio("fp32", "none") == 1.0
    assert "perfsim run folders" in conv.source
    # the same runs as a comma list
    listed = ",".join(str(tmp_path / n) for n in ("ref0", "q0", "ref1", "q1"))
    assert load_convergence(listed, "digits-mlp").steps_ratio("fp32", "qsgd-maxnorm:4") == \
        conv.steps_ratio("fp32", "qsgd-maxnorm:4")


def test_pipeline_runs_and_their_reference(tmp_path):
    ref = _run(tmp_path / "fp32", _decay(0.05), pp=2, dp=1)
    aq = _run(tmp_path / "aq", _decay(0.05), pp=2, dp=1, compress="aqsgd:fw3bw6")
    conv = convergence_from_runs([ref, aq])
    assert set(conv.pipeline) == {"fp32", "aqsgd:fw3bw6"} and not conv.gradient
    assert conv.steps_ratio("aqsgd:fw3bw6", "none") == 1.0  # the same curve: no penalty
    assert conv.steps_ratio("aqsgd:fw3bw6", "qsgd-maxnorm:4") is None  # no gradient curves given


@pytest.mark.parametrize("change, message", [
    (dict(lr=1e-2), "lr=0.01"),
    (dict(micro_batch=4), "micro_batch=4"),
    (dict(compress="directq:fw4bw8", grad_compress="qsgd-maxnorm:4"), "compresses both"),
    (dict(seed=1, grad_compress="qsgd-maxnorm:4"), "has seeds [1]"),
])
def test_runs_of_different_jobs_are_refused(tmp_path, change, message):
    ref = _run(tmp_path / "ref", _decay(0.05))
    other = _run(tmp_path / "other", _decay(0.03), **{"grad_compress": "qsgd-maxnorm:4", **change})
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        convergence_from_runs([ref, other])


def test_not_a_run_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not a perfsim run folder"):
        load_convergence(f"{tmp_path / 'empty'},{tmp_path / 'missing'}", "digits-mlp")


def test_plan_ranks_with_run_folders(tmp_path):
    import perfsim

    _run(tmp_path / "ref", _decay(0.05))
    _run(tmp_path / "q", _decay(0.03), grad_compress="qsgd-maxnorm:4")  # ~5/3 the steps
    res = perfsim.plan(model="digits-mlp", profile="traces/cpu-2core.json", nodes=2, bandwidth="100Mbps",
                       global_batch=32, pp=1, top=100, convergence=str(tmp_path))
    rows = {r["grad_compress"]: r for r in res.rows()}
    assert "qsgd-maxnorm:4" in rows and 1.4 < rows["qsgd-maxnorm:4"]["steps_ratio"] < 2
    assert rows["none"]["steps_ratio"] == 1.0
    assert rows["qsgd-maxnorm:4"]["time_to_loss_s"] > rows["none"]["time_to_loss_s"] * \
        rows["qsgd-maxnorm:4"]["iteration_s"] / rows["none"]["iteration_s"]
    assert any("perfsim run folders" in n for n in res.notes)
