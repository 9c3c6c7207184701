"""FSDP2's own host time per unit (perfsim.calibrate.fsdp_host): the measurement, its
profile records, and the query the engine prices it with."""

from pathlib import Path

import pytest
import torch

from perfsim.errors import ConfigError
from perfsim.profile import Profile, load_profile
from _helpers import gloo_group

ROOT = Path(__file__).resolve().parents[2]


def test_fsdp_host_measures_more_cpu_time_under_fully_shard_and_writes_valid_records():
    """On a one-rank gloo group (in this process: cheap) the sharded stack costs the
    training thread more CPU time per unit than the plain one in both passes (FSDP2's
    hooks are not free), and the records the comm sweep writes load as a profile whose
    query returns them."""
    from perfsim.calibrate.fsdp_host import NAMES, WIDTH, measure, record

    threads = torch.get_num_threads()  # gloo_group sets 1: leave this process's other tests theirs
    try:
        with gloo_group(0, 1):
            items = measure(0, torch.device("cpu"), 1, repeats=3)
    finally:
        torch.set_num_threads(threads)
    assert [it["name"] for it in items] == list(NAMES)
    by = {it["name"]: it for it in items}
    assert all(len(it["samples"]) == 3 and it["size_bytes"] == WIDTH * (WIDTH + 1) * 4 for it in items)
    for name in ("unit_forward", "unit_backward"):
        assert sorted(by[name]["samples"])[1] > 0, name
    recs = [record([it], 1, 1) for it in items]
    p = Profile.from_dict({"format": "perfsim-profile", "version": 2, "metadata": {}, "records": recs})
    for rec in recs:
        assert rec["time_s"] >= 0
        assert p.fsdp_host_time(rec["name"]) == rec["time_s"]


def test_record_is_the_mean_over_ranks_of_each_ranks_median_clamped_at_zero():
    from perfsim.calibrate.fsdp_host import record

    ranks = [{"op": "fsdp", "name": "unit_forward", "size_bytes": 4224, "samples": [1e-3, 3e-3, 2e-3]},
             {"op": "fsdp", "name": "unit_forward", "size_bytes": 4224, "samples": [4e-3, 4e-3, 5e-3]}]
    r = record(ranks, 2, 1)
    assert r["time_s"] == pytest.approx(3e-3) and r["repeats"] == 6 and r["world_size"] == 2
    neg = [{**ranks[0], "name": "root_forward", "samples": [-1e-4, -2e-4, 1e-5]}]
    assert record(neg, 1, 1)["time_s"] == 0.0


def test_profile_without_fsdp_host_loads_and_answers_none():
    """Profiles older than the op (the shipped CPU profile among them) still load; the
    query says not measured, and a wrong name is refused."""
    p = load_profile(str(ROOT / "traces" / "cpu-2core.json"))
    assert p.fsdp_host_time("unit_forward") is None
    with pytest.raises(ValueError, match="unit_sideways"):
        p.fsdp_host_time("unit_sideways")
    with pytest.raises(ConfigError, match="records\\[0\\]"):  # time_s is required, as for other ops
        Profile.from_dict({"format": "perfsim-profile", "version": 2, "metadata": {},
                           "records": [{"op": "fsdp_host", "name": "unit_forward", "size_bytes": 4224}]})


def test_fsdp_is_a_comm_op_of_the_default_calibration():
    from perfsim.calibrate.calibration import DEFAULT_COMM, plan_calibration
    from perfsim.calibrate.comm import OPS

    assert "fsdp" in OPS and "fsdp" in DEFAULT_COMM.split(",")
    plan = plan_calibration(model="digits-mlp", micro_batch="8", stages="", codecs="none", comm="fsdp",
                            device="cpu", quick=True)
    assert plan.comm[0].ops == ("fsdp",)
    with pytest.raises(ConfigError, match="fsdpp"):
        plan_calibration(model="digits-mlp", codecs="none", comm="fsdpp", device="cpu", quick=True)


def test_the_comm_sweep_turns_each_ranks_items_into_one_record_per_name():
    """``perfsim.calibrate.comm`` summarises the op's raw items of every rank (between
    other ops' items) into ``fsdp_host`` records, no fit, and the drift check compares them."""
    from perfsim.calibrate.comm import CommConfig, _summarize
    from perfsim.calibrate.compare import compare_profiles
    from perfsim.calibrate.fsdp_host import NAMES

    cfg = CommConfig(ops=("allreduce", "fsdp"), sizes=(1024,), threads=1)
    ar = {"op": "allreduce", "size_bytes": 1024, "samples": [1e-4, 2e-4, 3e-4]}
    per_rank = {r: [ar] + [{"op": "fsdp", "name": n, "size_bytes": 4224, "samples": [(r + 1) * 1e-3] * 3}
                           for n in NAMES] for r in (0, 1)}
    recs = [r for r in _summarize(per_rank, cfg, "gloo") if r["op"] == "fsdp_host"]
    assert [r["name"] for r in recs] == list(NAMES)
    assert all(r["time_s"] == pytest.approx(1.5e-3) and r["world_size"] == 2 for r in recs)
    old = Profile.from_dict({"format": "perfsim-profile", "version": 2, "metadata": {}, "records": recs})
    new = Profile.from_dict({"format": "perfsim-profile", "version": 2, "metadata": {},
                             "records": [{**r, "time_s": 2 * r["time_s"]} for r in recs]})
    ratio, pairs, _ = compare_profiles(new, old)["communication"]
    assert (ratio, pairs) == (pytest.approx(2.0), 4)
