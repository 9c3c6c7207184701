"""perfsim plan: enumeration, branch-and-bound pruning, ranking by time to loss, CLI."""

import json
import shlex
import subprocess
import sys

import pytest

from perfsim.convergence import load_convergence, parse_convergence, steps_to
from perfsim.errors import ConfigError
from perfsim.plan import TIE_BAND, SearchSpace, _lossless, enumerate_candidates, pareto_front, plan, run_command
from perfsim.plan_bounds import iteration_bound

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
        assert c["pp"] > 1 or str(c["compress"]) == "fp32"
        assert c["dp"] > 1 or str(c["grad_compress"]) == "none"
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
    key = lambda c: (c.params["pp"], c.params["dp"], c.params["micro_batch"], str(c.params["compress"]))  # noqa: E731
    assert [key(c) for c in pruned.ranked] == [key(c) for c in exhaustive.ranked[:2]]
    # every bound is a true lower bound of the simulated iteration
    assert all(c.bound_s <= c.summary["iteration_s"] * (1 + 1e-9) for c in exhaustive.ranked)
    assert base["bandwidth"] == "100Mbps"


def test_time_to_loss_can_overturn_throughput(tmp_path):
    common = dict(model="gpt2-tiny", nodes=2, global_batch=32, profile=CPU, bandwidth="10Mbps",
                  space=SearchSpace(pp=(2,), micro_batch=(8,), schedules=("1f1b",),
                                    compress=("fp32", "aqsgd:fw3bw6"), grad_compress=("none",)))
    fast = plan(convergence=str(_curves(tmp_path, 1.0)), **common)
    assert str(fast.ranked[0].params["compress"]) == "aqsgd:fw3bw6"  # at 10 Mbps compression wins per step
    t_aq = next(c for c in fast.ranked if str(c.params["compress"]) == "aqsgd:fw3bw6").summary["iteration_s"]
    t_fp = next(c for c in fast.ranked if str(c.params["compress"]) == "fp32").summary["iteration_s"]
    factor = 1.5 * t_fp / t_aq  # needs more extra steps than it saves time per step
    slow = plan(convergence=str(_curves(tmp_path, factor)), **common)
    assert str(slow.ranked[0].params["compress"]) == "fp32"
    aq = next(c for c in slow.ranked if str(c.params["compress"]) == "aqsgd:fw3bw6")
    assert aq.steps_ratio == pytest.approx(factor, rel=0.02)
    # the target is fp32's loss at half its budget (step 151 of 300): time to loss = iteration x
    # ratio x the 151 steps uncompressed training needs, AQ-SGD's uncompressed first epoch among
    # them at its warm-up pace (qa7)
    assert aq.reference_steps == 151
    steps, s = aq.steps_ratio * 151, aq.summary
    warm = min(steps, s["warmup_iterations"])
    assert 0 < warm and s["warmup_iteration_s"] > s["iteration_s"]
    assert aq.time_to_loss_s == pytest.approx(warm * s["warmup_iteration_s"] + (steps - warm) * s["iteration_s"])
    assert "slower to the target" in slow.explanation
    # a method that never reaches the target in its measured budget is left out, and said so
    never = tmp_path / "never.json"
    never.write_text(json.dumps({"pipeline": {"fp32": [[s, 4 - s / 100] for s in range(1, 301)],
                                              "aqsgd:fw3bw6": [[s, 4.0] for s in range(1, 301)]},
                                 "gradient": {"none": [[1, 1.0]]}}))
    res = plan(convergence=str(never), **common)
    assert {str(c.params["compress"]) for c in res.ranked} == {"fp32"}
    assert any("never reached" in n and "aqsgd:fw3bw6" in n for n in res.notes)


def test_without_curves_the_plan_ranks_by_iteration_time_and_says_so():
    res = plan(model="gpt2-xl", nodes=2, global_batch=8, space=SearchSpace(
        schedules=("gpipe",), compress=("fp32",), grad_compress=("none",)), top=3)
    assert any("ranked by iteration time" in n for n in res.notes)
    its = [c.summary["iteration_s"] for c in res.ranked]
    assert its == sorted(its) and all(c.time_to_loss_s is None for c in res.ranked)
    with pytest.raises(ConfigError, match="pp=2: does not divide the cluster's 3 GPUs"):
        plan(model="gpt2-xl", nodes=3, global_batch=1, space=SearchSpace(pp=(2,)))
    with pytest.raises(ConfigError, match="global_batch"):
        plan(model="gpt2-xl", nodes=2, global_batch=1, space=SearchSpace(pp=(1,)))


def test_the_plan_table_shows_each_rows_80_percent_interval():
    """The issue asks for an interval in predict's, sweep's and plan's tables: plan's had it in JSON and
    in the winner's sentence only."""
    from perfsim.commands.plan import _table
    from perfsim.units import format_time

    res = plan(model="gpt2-tiny", nodes=4, bandwidth="100Mbps", global_batch=32, space=SearchSpace(
        schedules=("1f1b",), compress=("fp32", "directq:fw4bw8"), grad_compress=("none",)), top=3)
    lines = _table(res).splitlines()
    assert "80 % interval" in lines[0]
    for line, c in zip(lines[1:], res.ranked):
        s = c.summary
        assert f"{format_time(s['iteration_s_low'])}-{format_time(s['iteration_s_high'])}" in line, line
        assert s["iteration_s_low"] < s["iteration_s"] < s["iteration_s_high"]


def test_the_explanation_says_whether_compression_pays():
    """perfsim plan says why the winner wins: compressed or not, against the best configuration of the
    other kind it simulated (a lossless one it did not simulate is more than the error band slower)."""
    from perfsim.plan import compression_verdict

    kw = dict(model="gpt2-tiny", profile=CPU, nodes=2, global_batch=32, top=3)
    slow = plan(bandwidth="10Mbps", **kw)
    assert not _lossless(slow.ranked[0]) and "Compression pays:" in slow.explanation, slow.explanation
    for rate in ("10Gbps", "1Gbps"):
        fast = plan(bandwidth=rate, space=SearchSpace(compress=("fp32", "directq:fw4bw8"), grad_compress=("none",)),
                    **kw)
        w = fast.ranked[0]
        verdict = compression_verdict(w, fast.all_evaluated, "per iteration")
        lossy = [c for c in fast.all_evaluated if c.summary is not None and not _lossless(c)]
        if not _lossless(w):
            assert verdict.startswith("Compression pays"), (rate, verdict)
        elif not lossy:
            assert "none was simulated" in verdict and "does not pay" in verdict, (rate, verdict)
        else:
            best = min(lossy, key=lambda c: c.score())
            gap = best.score() / w.score() - 1
            assert (f"is {gap:.1%} slower" if gap > 0 else "within the model's error band") in verdict, verdict
            assert str(best.params["compress"]) in verdict and "does not pay here" in verdict, verdict


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
    # both engines number the ranks along the job's placement: the default needs no flag
    assert run_command(p) == ("perfsim run --model gpt2-tiny --pp 2 --dp 2 --schedule 1f1b --compress "
                              "aqsgd:fw3bw6 --grad-compress none --micro-batch 8 --macro-batch 16 "
                              "--emulate-bandwidth 100Mbps")
    megatron = run_command({**p, "placement": "tp,dp,pp"})
    assert "--placement tp,dp,pp" in megatron and "--device-order" not in megatron
    assert "--device-order 3,2,1,0" in run_command({**p, "device_order": "3,2,1,0"})
    assert run_command({**p, "model": "bert-large"}) is None
    assert pareto_front([(1, 1), (2, 3), (3, 2), (0.5, 0.5), (4, 4)]) == [3, 0, 1, 4]


@pytest.mark.parametrize("job", [
    dict(pp=2, dp=2, schedule="interleaved-1f1b", virtual_stages=3),
    dict(pp=2, dp=1, tp=2, schedule="1f1b", sequence_parallel=True),
    dict(pp=2, dp=2, schedule="1f1b", tied_embedding="sync"),
    dict(pp=1, dp=4, schedule="1f1b", zero=3, grad_compress="none", compress="fp32"),
    dict(pp=2, dp=2, schedule="1f1b", partition="2,4"),
])
def test_emitted_run_command_trains_the_predicted_job(job, tmp_path):
    """``plan --emit perfsim``: the command, parsed by perfsim run, is the job predicted, field
    by field. (Before: --virtual-stages, --sequence-parallel, --tied-embedding, --zero and
    --partition were left out, so the command silently trained run's defaults: 2 chunks, no
    sequence parallelism, an untied head, no ZeRO, a balanced split.)"""
    import argparse

    from perfsim.api import build_configs
    from perfsim.commands import run as run_cmd
    from perfsim.params import JOB_FIELDS
    from perfsim.runtime import make_config

    p = {"model": "gpt2-tiny", "compress": "aqsgd:fw3bw6", "grad_compress": "none", "micro_batch": 2,
         "macro_batch": 8, "bandwidth": "100Mbps", **job}
    words = shlex.split(run_command(p))
    ap = argparse.ArgumentParser()
    run_cmd.add_arguments(ap)
    cfg = make_config(**run_cmd.run_params(ap.parse_args([*words[2:], "--out", str(tmp_path / "r")])))
    predicted = build_configs(**p)[1]
    for name in JOB_FIELDS:
        if name != "kernels":  # perfsim run trains eager modules whatever the prediction priced
            assert getattr(cfg, name) == getattr(predicted, name), (name, words)


def test_emitted_run_command_says_its_one_rate_covers_the_intra_node_pairs():
    """perfsim run shapes every rank's link at one rate; a plan of several GPUs per node priced
    their intra-node path apart (gpt2-tiny pp 4 at 1 Gbps: 27.4 ms on 4 nodes, 1.1 ms on one
    node of 4), so the command says so in its comment (before: nothing)."""
    p = {"model": "gpt2-tiny", "pp": 4, "dp": 1, "schedule": "1f1b", "compress": "fp32", "grad_compress": "none",
         "micro_batch": 8, "macro_batch": 32, "bandwidth": "1Gbps"}
    assert "#" not in run_command(p)
    cmd = run_command({**p, "gpus_per_node": 2})
    assert cmd.endswith("  # every rank's link shaped at 1Gbps, the plan's 2 GPUs per node included "
                        "(their intra-node path was priced apart)")
    assert shlex.split(cmd, comments=True) == shlex.split(run_command(p))


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
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "pp=2: does not divide" in bad.stderr


def _two_regions(tmp_path, regions):
    """Nodes alternating between two regions: 10 Gbps inside one, 20 Mbps between them."""
    path = tmp_path / "geo.toml"
    path.write_text(f"regions = {list(regions)}\n"
                    'region_bandwidth = [["10Gbps", "20Mbps"], ["20Mbps", "10Gbps"]]\n'
                    'region_latency = [["0.1ms", "1ms"], ["1ms", "0.1ms"]]\n')
    return path


def test_chain_order_crosses_the_slow_hop_once(tmp_path):
    from perfsim.network import load_topology
    from perfsim.placement import boundary_rates, chain_order, per_link_compression

    regions = [0, 1, 0, 1, 0, 1]
    topo = load_topology(_two_regions(tmp_path, regions))
    chain = chain_order(topo, len(regions))
    crossings = sum(regions[a] != regions[b] for a, b in zip(chain, chain[1:]))
    assert sorted(chain) == list(range(6)) and crossings == 1  # the identity crosses 5 times
    rates = boundary_rates(topo, 1, pp=6, dp=1, tp=1, schedule="1f1b", microbatches=4, placement="tp,pp,dp",
                           order=chain)
    assert sorted(rates) == [20e6] + [10e9] * 4
    slow = rates.index(20e6)
    from perfsim.compression.spec import parse_spec

    pairs = per_link_compression(rates, [parse_spec("fp16", "pipeline"), parse_spec("aqsgd:fw2bw4", "pipeline")])
    # uniform fp16, uniform aqsgd, and fp16 with aqsgd on the slow boundary only -- never the reverse
    assert [(str(a), str(b)) for a, b in pairs] == [("fp16", ""), ("aqsgd:fw2bw4", ""), ("fp16", f"{slow}=aqsgd:fw2bw4")]


def test_plan_puts_fewer_bits_on_the_slow_hop(tmp_path):
    regions = [0, 1, 0, 1]
    # a one-step epoch: AQ-SGD's uncompressed first epoch is one of the ~150 steps to the loss (qa7)
    res = plan(model="gpt2-tiny", nodes=4, global_batch=16, profile=CPU, topology=str(_two_regions(tmp_path, regions)),
               space=SearchSpace(pp=(4,), micro_batch=(4,), schedules=("1f1b",), compress=("fp16", "aqsgd:fw2bw4"),
                                 grad_compress=("none",), recompute=("none",)), top=100, dataset_samples=16)
    best = res.ranked[0].params
    order = best["device_order"]
    # the winner lays the pipeline so that it leaves a region once, and compresses that hop harder
    nodes = [order[s] for s in range(4)]
    hops = [k for k in range(3) if regions[nodes[k]] != regions[nodes[k + 1]]]
    assert len(hops) == 1
    assert str(best["compress"]) == "fp16" and str(best["boundary_compress"]) == f"{hops[0]}=aqsgd:fw2bw4"
    done = [c for c in res.all_evaluated if c.summary is not None]
    uniform = [c for c in done if not c.params.get("boundary_compress")]
    assert {str(c.params["compress"]) for c in uniform} == {"fp16", "aqsgd:fw2bw4"}
    win = res.ranked[0].summary["iteration_s"]
    assert all(win < c.summary["iteration_s"] for c in uniform)  # faster than uniform compression
    assert all(c.bound_s <= c.summary["iteration_s"] * (1 + 1e-9) for c in done)
    per = ["fp16"] * 3
    per[hops[0]] = "aqsgd:fw2bw4"
    assert f"pipeline boundaries compressed {' | '.join(per)}" in res.explanation


def test_boundary_compress_is_checked():
    from perfsim.api import predict
    from perfsim.boundaries import parse_boundary_compress

    parsed = parse_boundary_compress(" 1 = AQSGD:fw3bw6, 0=fp16")
    assert {k: v.text for k, v in parsed.items()} == {0: "fp16", 1: "aqsgd:fw3bw6"}
    assert parsed.text == "0=fp16,1=aqsgd:fw3bw6" and parse_boundary_compress(parsed) is parsed
    for bad, msg in (("aqsgd:fw3bw6", "BOUNDARY=SPEC"), ("x=fp16", "integer"), ("0=fp16,0=fp32", "twice")):
        with pytest.raises(ConfigError, match=msg):
            parse_boundary_compress(bad)
    with pytest.raises(ConfigError, match="boundary 2 does not exist"):
        predict(model="gpt2-tiny", pp=2, boundary_compress="2=fp16")
    with pytest.raises(ConfigError, match="permutation"):
        predict(model="gpt2-tiny", pp=2, device_order="0,0")
    proc = subprocess.run([sys.executable, "-m", "perfsim", "run", "--model", "gpt2-tiny", "--pp", "2",
                           "--boundary-compress", "1=fp16", "--steps", "1"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "boundary 1" in proc.stderr


def test_emitted_per_boundary_run_sends_the_predicted_bytes(tmp_path):
    """The plan's winner on a 3-node, 2-region topology, run for real (3 ranks over
    loopback): every link carries the bytes per step the simulator predicted."""
    import csv
    import shlex

    from perfsim.api import predict

    # the run's one-step epoch (--dataset-limit 8): AQ-SGD's warm-up is one step (qa7)
    res = plan(model="gpt2-tiny", nodes=3, global_batch=8, profile=CPU, topology=str(_two_regions(tmp_path, [0, 1, 0])),
               space=SearchSpace(pp=(3,), micro_batch=(4,), schedules=("1f1b",), compress=("fp16", "aqsgd:fw2bw4"),
                                 grad_compress=("none",), recompute=("none",)), top=3, dataset_samples=8)
    best = res.ranked[0]
    assert best.params.get("boundary_compress")
    cmd = shlex.split(run_command(best.params))
    assert cmd[:2] == ["perfsim", "run"] and "--boundary-compress" in cmd and "--device-order" in cmd
    out = tmp_path / "run"
    # AQ-SGD sends its first epoch uncompressed: a one-step epoch leaves steps 1-2 to measure
    proc = subprocess.run([sys.executable, "-m", "perfsim", "run", *cmd[2:], "--steps", "3", "--dataset-limit", "8",
                           "--no-progress", "--out", str(out)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    with open(out / "links.csv") as f:
        measured = {(int(r["src"]), int(r["dst"])): float(r["bytes"]) for r in csv.DictReader(f)}
    predicted = {(l["src"], l["dst"]): l["bytes"] for l in predict(**best.params).links if l["kind"] == "p2p"}
    assert measured == predicted
    assert len(set(predicted.values())) > 2  # the boundaries differ: fp16 one way, AQ-SGD the other


def test_parallel_backends_find_the_serial_ranking():
    space = SearchSpace(pp=(2,), schedules=("1f1b",), compress=("fp32", "directq:fw4bw8"), grad_compress=("none",),
                        recompute=("none",))
    common = dict(model="gpt2-tiny", nodes=2, global_batch=16, space=space, top=3, profile=CPU, bandwidth="100Mbps")
    key = lambda r: [(c.params["micro_batch"], str(c.params["compress"]), c.summary["iteration_s"]) for c in r.ranked]  # noqa: E731
    serial = key(plan(**common))
    assert key(plan(jobs=2, **common)) == serial
    with pytest.raises(ConfigError, match="backend"):
        plan(backend="ray", **common)
    pytest.importorskip("dask")
    assert key(plan(jobs=2, backend="dask", **common)) == serial
    with pytest.raises(ConfigError, match="only with backend=dask"):
        plan(dask_scheduler="tcp://127.0.0.1:1", **common)
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc:
        assert key(plan(backend="dask", dask_scheduler=lc.scheduler_address, **common)) == serial


@pytest.mark.parametrize("model", ["gpt2-tiny", "digits-mlp"])
def test_bundled_curves_cover_the_default_search(model):
    """Every pipeline and gradient spec the plan searches by default has a measured
    curve for the bundled runtime models (scripts/convergence_curves.py)."""
    from perfsim.plan import GRADIENT_COMPRESSION, PIPELINE_COMPRESSION

    curves = load_convergence(None, model)
    assert curves is not None and curves.model == model
    assert all(curves.steps_ratio(c, "none") is not None for c in PIPELINE_COMPRESSION)
    assert all(curves.steps_ratio("fp32", g) is not None for g in GRADIENT_COMPRESSION)
    assert curves.reference_steps() > 1


def test_topology_bounds_prune_and_keep_the_exhaustive_winner(tmp_path):
    common = dict(model="gpt2-tiny", nodes=4, global_batch=16, profile=CPU,
                  topology=str(_two_regions(tmp_path, [0, 1, 0, 1])),
                  space=SearchSpace(micro_batch=(2, 4), schedules=("1f1b", "gpipe"), compress=("fp16", "aqsgd:fw2bw4"),
                                    grad_compress=("none", "qsgd-maxnorm:4"), recompute=("none",)))
    pruned, exhaustive = plan(top=1, **common), plan(top=10_000, **common)
    assert exhaustive.pruned == 0 and pruned.pruned > 0
    assert pruned.ranked[0].params == exhaustive.ranked[0].params
    # each boundary charged at its slowest link and latency: still a lower bound everywhere
    assert all(c.bound_s <= c.summary["iteration_s"] * (1 + 1e-9) for c in exhaustive.all_evaluated if c.summary)


def test_explanation_says_what_the_runner_up_is_slower_in_and_when_it_is_a_tie():
    """Without loss curves the plan ranks by the run's mean iteration, yet its explanation said
    the runner-up was "0.0% slower to the target" (there is no target). It now names what was
    compared, and a runner-up within the model's error band (TIE_BAND) is called a tie the
    data do not separate."""
    res = plan(model="gpt2-xl", nodes=2, gpus_per_node=2, bandwidth="1Gbps", global_batch=16, top=3)
    assert res.ranked[0].time_to_loss_s is None and "to the target" not in res.explanation
    gain = res.ranked[1].score() / res.ranked[0].score() - 1
    assert "per iteration over the run" in res.explanation
    assert ("do not separate the two" in res.explanation) == (0 <= gain < TIE_BAND)


def test_without_a_gpu_preset_the_profiles_gpu_bounds_the_memory():
    """The default profile was measured on a V100 16 GB: predict warns above it and `perfsim memory`
    compares with it, yet the planner (no --gpu) recommended gpt2-xl on one GPU per replica at 25.8 GiB.
    It now rejects what the profile's GPU cannot hold, and shows the recomputation each candidate ran
    (the profile's measured full, not the flag's absence)."""
    from perfsim.commands.plan import _table

    res = plan(model="gpt2-xl", nodes=2, gpus_per_node=2, bandwidth="1Gbps", global_batch=16, top=3)
    assert res.rejected > 0 and res.ranked
    assert all(c.summary["peak_memory_gib"] <= 16 for c in res.ranked)
    assert {r["recompute"] for r in res.rows()} == {"full"}
    assert all(" full " in line for line in _table(res).splitlines()[1:1 + len(res.ranked)])
    cpu = plan(model="gpt2-tiny", nodes=2, bandwidth="100Mbps", global_batch=16, profile=CPU, top=1)
    assert cpu.ranked  # a CPU profile names no GPU: nothing to bound it by


def test_a_mixture_of_experts_plan_shows_its_expert_parallelism(capsys):
    """The table of a MoE plan has an ``ep`` column (its expert parallelism is searched); a dense
    model's table has none."""
    from perfsim.cli import main

    moe = "llama:layers=2,hidden=256,heads=4,seq=128,vocab=1000,experts=8,top_k=2,expert_ffn=256"
    pinned = ["--gpu", "h100", "--nodes", "1", "--gpus-per-node", "4", "--global-batch", "16", "--tp", "1",
              "--pp", "1", "--zero", "0", "--recompute", "none", "--micro-batch", "4", "--compress", "fp32",
              "--precision", "bf16", "--attention", "flash", "--top", "8", "-q"]
    for model, has_ep in ((moe, True), ("llama:layers=2,hidden=256,heads=4,seq=128,vocab=1000", False)):
        assert main(["plan", "--model", model, *pinned]) == 0
        lines = capsys.readouterr().out.splitlines()
        header = lines[0].split()
        assert ("ep" in header) == has_ep
        if has_ep:
            eps = {row.split()[header.index("ep")] for row in lines[1:9] if row.strip()}
            assert {"1", "4"} <= eps  # dp 4: ep 1, 2 and 4 searched


def test_a_plans_percentages_never_say_zero_for_a_difference():
    from perfsim.plan import percent

    assert [percent(x) for x in (0.0, 7.4e-5, -3e-6, 0.0123)] == ["0%", "0.0074%", "-0.0003%", "1.2%"]
