"""perfsim plan: enumeration, branch-and-bound pruning, ranking by time to loss, CLI."""

import json
import subprocess
import sys

import pytest

from perfsim.convergence import load_convergence, parse_convergence, steps_to
from perfsim.errors import ConfigError
from perfsim.plan import (SearchSpace, enumerate_candidates, iteration_bound, pareto_front, plan,
                          run_command)

CPU = "traces/cpu-2core.json"


def _curves(tmp_path, slow_factor):
    """fp32 loss 4 - step/100; aqsgd:fw3bw6 the same curve stretched by slow_factor."""
    fp32 = [[s, 4 - s / 100] for s in range(1, 301)]
    slow = [[s, 4 - s / (100 * slow_factor)] for s in range(1, int(300 * slow_factor) + 2)]
    path = tmp_path / "curves.json"
    path.write_text(json.dumps({"model": "gpt2-tiny", "source": "test", "smoothing": 1,
                                "pipeline": {"fp32": fp32, "aqsgd:fw3bw6": slow},
                                "gradient": {"none": fp32}}))
    return path


def test_enumeration_splits_every_gpu_and_the_global_batch():
    space = SearchSpace(schedules=("1f1b",), compress=("fp32",), grad_compress=("none",), recompute=("none",))
    cands = enumerate_candidates(n_layers=4, gpus=4, gpus_per_node=1, global_batch=8, space=space,
                                 base={"model": "m"}, known={"model"})
    splits = {(c["pp"], c["dp"], c["micro_batch"], c["macro_batch"]) for c in cands}
    # pp x dp = 4; per-replica batch 8/dp; micro-batches 1,2,4,8 dividing it
    assert splits == {(1, 4, 1, 2), (1, 4, 2, 2), (2, 2, 1, 4), (2, 2, 2, 4), (2, 2, 4, 4),
                      (4, 1, 1, 8), (4, 1, 2, 8), (4, 1, 4, 8), (4, 1, 8, 8)}
    # a pipeline of one stage has nothing to compress; one replica no gradient to sync
    space2 = SearchSpace(schedules=("1f1b",), compress=("fp32", "aqsgd:fw3bw6"), grad_compress=("none", "fp16"))
    for c in enumerate_candidates(n_layers=4, gpus=4, gpus_per_node=1, global_batch=8, space=space2,
                                  base={}, known=set()):
        assert c["pp"] > 1 or c["compress"] == "fp32"
        assert c["dp"] > 1 or c["grad_compress"] == "none"
    with pytest.raises(ConfigError, match="tensor parallelism"):
        enumerate_candidates(n_layers=4, gpus=4, gpus_per_node=2, global_batch=8,
                             space=SearchSpace(tp=(2,)), base={}, known=set())


def test_iteration_bound_is_busiest_stage_one_pass_or_busiest_link():
    assert iteration_bound([1.0, 2.0], [], 4, None) == 8.0  # busiest stage x micro-batches
    assert iteration_bound([1.0, 2.0, 3.0], [], 1, None) == 6.0  # one pass through all stages
    # 1 MB per micro-batch over 8 Mbit/s: 1 s each, 4 micro-batches
    assert iteration_bound([0.1, 0.1], [1e6], 4, 8e6) == pytest.approx(4.0)
    # a stage's gradient sync of 2 MB on its busiest link at 8 Mbit/s: 2 s
    assert iteration_bound([0.1], [], 4, 8e6, [2e6, 1e6]) == pytest.approx(2.0)


def test_branch_and_bound_keeps_the_exhaustive_top_and_prunes(tmp_path):
    base = {"bandwidth": "100Mbps"}
    space = SearchSpace(schedules=("1f1b",), compress=("fp32", "directq:fw4bw8"), grad_compress=("none",))
    pruned = plan(model="gpt2-tiny", nodes=4, global_batch=32, space=space, top=2,
                  profile=CPU, bandwidth="100Mbps")
    exhaustive = plan(model="gpt2-tiny", nodes=4, global_batch=32, space=space, top=10_000,
                      profile=CPU, bandwidth="100Mbps")
    assert exhaustive.pruned == 0 and exhaustive.evaluated == exhaustive.total
    assert pruned.pruned > 0 and pruned.evaluated + pruned.pruned == pruned.total
    key = lambda c: (c.params["pp"], c.params["dp"], c.params["micro_batch"], c.params["compress"])  # noqa: E731
    assert [key(c) for c in pruned.ranked] == [key(c) for c in exhaustive.ranked[:2]]
    # every bound is a true lower bound of the simulated iteration
    assert all(c.bound_s <= c.summary["iteration_s"] * (1 + 1e-9) for c in exhaustive.ranked)
    assert base["bandwidth"] == "100Mbps"


def test_time_to_loss_can_overturn_throughput(tmp_path):
    common = dict(model="gpt2-tiny", nodes=2, global_batch=32, profile=CPU, bandwidth="10Mbps",
                  space=SearchSpace(pp=(2,), micro_batch=(8,), schedules=("1f1b",),
                                    compress=("fp32", "aqsgd:fw3bw6"), grad_compress=("none",)))
    fast = plan(convergence=str(_curves(tmp_path, 1.0)), **common)
    assert fast.ranked[0].params["compress"] == "aqsgd:fw3bw6"  # at 10 Mbps compression wins per step
    t_aq = next(c for c in fast.ranked if c.params["compress"] == "aqsgd:fw3bw6").summary["iteration_s"]
    t_fp = next(c for c in fast.ranked if c.params["compress"] == "fp32").summary["iteration_s"]
    factor = 1.5 * t_fp / t_aq  # needs more extra steps than it saves time per step
    slow = plan(convergence=str(_curves(tmp_path, factor)), **common)
    assert slow.ranked[0].params["compress"] == "fp32"
    aq = next(c for c in slow.ranked if c.params["compress"] == "aqsgd:fw3bw6")
    assert aq.steps_ratio == pytest.approx(factor, rel=0.02)
    # the target is fp32's loss at half its budget (step 151 of 300): time to loss = iteration x
    # ratio x the 151 steps uncompressed training needs
    assert aq.reference_steps == 151
    assert aq.time_to_loss_s == pytest.approx(aq.summary["iteration_s"] * aq.steps_ratio * 151)
    assert "slower to the target" in slow.explanation
    # a method that never reaches the target in its measured budget is left out, and said so
    never = tmp_path / "never.json"
    never.write_text(json.dumps({"pipeline": {"fp32": [[s, 4 - s / 100] for s in range(1, 301)],
                                              "aqsgd:fw3bw6": [[s, 4.0] for s in range(1, 301)]},
                                 "gradient": {"none": [[1, 1.0]]}}))
    res = plan(convergence=str(never), **common)
    assert {c.params["compress"] for c in res.ranked} == {"fp32"}
    assert any("never reached" in n and "aqsgd:fw3bw6" in n for n in res.notes)


def test_without_curves_the_plan_ranks_by_iteration_time_and_says_so():
    res = plan(model="gpt2-xl", nodes=2, global_batch=8, space=SearchSpace(
        schedules=("gpipe",), compress=("fp32",), grad_compress=("none",)), top=3)
    assert any("ranked by iteration time" in n for n in res.notes)
    its = [c.summary["iteration_s"] for c in res.ranked]
    assert its == sorted(its) and all(c.time_to_loss_s is None for c in res.ranked)
    with pytest.raises(ConfigError, match="global_batch"):
        plan(model="gpt2-xl", nodes=3, global_batch=1, space=SearchSpace(pp=(2,)))


def test_convergence_files_are_validated(tmp_path):
    with pytest.raises(ConfigError, match="unknown key"):
        parse_convergence({"model": "x", "curves": {}}, "f")
    with pytest.raises(ConfigError, match="empty curve"):
        parse_convergence({"pipeline": {"fp32": []}}, "f")
    with pytest.raises(ConfigError, match="no such file"):
        load_convergence("nope", "gpt2-tiny")
    conv = load_convergence(str(_curves(tmp_path, 2.0)), "gpt2-tiny")
    assert conv.steps_ratio("fp32", "none") == 1.0
    assert conv.steps_ratio("aqsgd:fw3bw6", "none") == pytest.approx(2.0, rel=0.02)
    assert conv.steps_ratio("directq:fw4bw8", "none") is None  # no curve
    assert steps_to([(1, 3.0), (2, 2.0)], 2.5) == 2 and steps_to([(1, 3.0)], 1.0) is None


def test_emit_run_and_pareto_front():
    p = {"model": "gpt2-tiny", "pp": 2, "dp": 2, "schedule": "1f1b", "compress": "aqsgd:fw3bw6",
         "grad_compress": "none", "micro_batch": 8, "macro_batch": 16, "bandwidth": "100Mbps"}
    assert run_command(p) == ("perfsim run --model gpt2-tiny --pp 2 --dp 2 --schedule 1f1b --compress "
                              "aqsgd:fw3bw6 --grad-compress none --micro-batch 8 --macro-batch 16 "
                              "--emulate-bandwidth 100Mbps")
    assert run_command({**p, "model": "bert-large"}) is None
    assert pareto_front([(1, 1), (2, 3), (3, 2), (0.5, 0.5), (4, 4)]) == [3, 0, 1, 4]


def test_plan_cli_json_and_errors(tmp_path):
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "perfsim", "plan", "--model", "gpt2-tiny", "--profile", CPU, "--nodes", "2",
           "--bandwidth", "100Mbps", "--global-batch", "16", "--schedule", "1f1b", "--compress",
           "fp32,directq:fw4bw8", "--grad-compress", "none", "--top", "3", "--format", "json", "-o", str(out),
           "--plot", str(tmp_path / "p.png")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [r["rank"] for r in rows] == [1, 2, 3]
    for key in ("compress", "grad_compress", "tp", "pp", "dp", "iteration_s", "throughput_samples_per_s",
                "time_to_loss_s"):
        assert key in rows[0]
    assert rows[0]["pp"] * rows[0]["dp"] * rows[0]["tp"] == 2
    assert (tmp_path / "p.png").stat().st_size > 1000
    bad = subprocess.run([sys.executable, "-m", "perfsim", "plan", "--model", "gpt2-tiny", "--nodes", "3",
                          "--global-batch", "1", "--pp", "2"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "global_batch" in bad.stderr
