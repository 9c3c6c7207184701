"""perfsim validate: link parameters from a profile, row errors, MAPE, CSV/plot, CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from perfsim.analysis import validate as v
from perfsim.errors import ConfigError
from perfsim.link import POOL_MAX_BYTES, Link, _expected_s, pooled_small_message_s, resolve_link
from perfsim.profile import Profile
from perfsim.result import Result

from _helpers import assert_user_error, run_cli, run_cli_here


def _profile(records, backend="gloo", version=2):
    return Profile.from_dict({"format": "perfsim-profile", "version": version,
                              "metadata": {"backend": backend}, "records": records})


def _link(prof, bw, lat, dp_only=False, link_model="auto"):
    """The link predict resolves for a row (perfsim.link, one transport model)."""
    op = "allreduce" if dp_only else "p2p"
    if bw is None:
        return Link.calibrated(prof, None, lat, op=op)
    return resolve_link(prof, bw, lat, op=op, model=link_model)


def _p2p(name, alpha, bw_bps, sizes=(1024, 16384, 262144, 1048576), op="p2p"):
    return [{"op": op, "name": name, "size_bytes": s, "time_s": alpha + 8 * s / bw_bps, "world_size": 2}
            for s in sizes]


def test_calibrated_link_recovers_rate_and_fixed_cost():
    prof = _profile(_p2p("gloo@100Mbps", 2e-4, 9.5e7) + _p2p("gloo", 3e-5, 2e10))
    link = _link(prof, 1e8, 0.0, dp_only=False)
    assert link.rate_bps == pytest.approx(9.5e7, rel=1e-6)
    assert link.one_way_s == pytest.approx(2e-4, rel=1e-3)
    assert "gloo@100Mbps" in link.source
    # loopback rows use the plain backend records
    loop = _link(prof, None, 0.0, dp_only=False)
    assert loop.rate_bps == pytest.approx(2e10, rel=1e-6)
    # a rate the profile did not measure falls back to the nominal one (and says so)
    other = _link(prof, 3e8, 0.005, dp_only=False)
    assert other.rate_bps == 3e8 and other.one_way_s == 0.005 and other.source.startswith("nominal")
    # nominal link model ignores the profile
    assert _link(prof, 1e8, 0.0, dp_only=False, link_model="nominal").rate_bps == 1e8


def test_link_for_dp_uses_allreduce_half_fixed_cost():
    prof = _profile(_p2p("gloo@100Mbps", 4e-4, 9e7, op="allreduce"))
    link = _link(prof, 1e8, 0.0, dp_only=True)
    assert link.rate_bps == pytest.approx(9e7, rel=1e-6)
    assert link.one_way_s == pytest.approx(2e-4, rel=1e-3)


def test_link_without_records_and_without_rate_is_an_error():
    with pytest.raises(ConfigError, match="no p2p records"):
        v.link_params(_profile([]), None, 0.0, "profile", dp_only=False)
    params, source = v.link_params(_profile(_p2p("gloo", 3e-5, 2e10)), None, 0.0, "profile", dp_only=False)
    assert params["nic"].rate_bps == pytest.approx(2e10, rel=1e-6) and source == "profile p2p gloo"


def test_plan_validation():
    with pytest.raises(ConfigError, match="profile"):
        v.ValidationPlan(base={}, profile=None)
    with pytest.raises(ConfigError, match="link_model"):
        v.ValidationPlan(base={}, profile="x", link_model="magic")
    with pytest.raises(ConfigError, match="steps"):
        v.ValidationPlan(base={}, profile="x", steps=1)
    plan = v.ValidationPlan(base={}, profile="x", bandwidths=(1e9, 1e8), compresses=("fp32", "directq:fw4bw8"))
    assert len(plan.rows()) == 4 and plan.rows()[1] == {"bandwidth": 1e9, "compress": "directq:fw4bw8",
                                                       "grad_compress": "none"}
    assert v.parse_bandwidths("1Gbps, none,100Mbps") == (1e9, None, 1e8)


def _result(it, source):
    return Result({"throughput_samples_per_s": 32 / it, "iteration_s": it, "compute_s": 0.001,
                   "measured_steps": 5, "source": source})


def test_rows_errors_table_csv_and_plot(tmp_path):
    prof = _profile(_p2p("gloo@100Mbps", 2e-4, 9.5e7))
    calls = {}

    def runner(**kw):
        calls["run"] = kw
        return _result(0.010 if kw["compress"] == "fp32" else 0.004, "measured")

    def predictor(**kw):
        calls["predict"] = kw
        return _result(0.011 if kw["compress"] == "fp32" else 0.004, "predicted")

    plan = v.ValidationPlan(base={"model": "digits-mlp", "pp": 2, "dp": 1, "micro_batch": 8,
                                  "macro_batch": 32, "schedule": "1f1b"},
                            bandwidths=(1e8,), compresses=("fp32", "directq:fw4bw8"), profile="x",
                            steps=5, dataset_limit=128, out=str(tmp_path))
    rows = [v.run_row(plan, r, prof, i, runner, predictor) for i, r in enumerate(plan.rows())]
    df = pd.DataFrame(rows)
    assert calls["run"]["emulate_bandwidth"] == 1e8 and calls["run"]["dataset_limit"] == 128
    # validate only chooses the profile: predict gets the nominal rate and resolves the
    # calibrated link itself (perfsim.link), as for any other prediction
    assert calls["predict"]["bandwidth"] == 1e8 and calls["predict"]["link_model"] == "auto"
    assert calls["predict"]["profile"] is prof
    assert df["error_iteration_s_pct"].tolist() == pytest.approx([10.0, 0.0])
    assert df["error_throughput_samples_per_s_pct"].iloc[0] == pytest.approx(100 * (1 / 1.1 - 1))
    s = v.summarize(df)
    assert s["rows"] == 2 and s["rows_over_10pct"] == 0 and s["mape_pct"] == pytest.approx(100 * (1 - 1 / 1.1) / 2)
    text = v.format_table(df)
    assert "100Mbps" in text and "MAPE" in text
    md = v.markdown_table(df)
    assert md.count("\n| 100Mbps |") == 2 and "MAPE" in md
    csv = v.write_csv(df, tmp_path / "validation.csv")
    assert pd.read_csv(csv).shape[0] == 2
    png = v.plot(df, tmp_path / "validation.png")
    assert png.exists() and png.stat().st_size > 1000


@pytest.fixture(scope="module")
def small_profile(tmp_path_factory):
    """``perfsim calibrate --quick --model digits-mlp --micro-batch 8 --stages '' --codecs fp32
    --comm p2p`` through run_cli_here: the validate tests read the profile; the calibrate CLI
    in a process of its own is tests/calibrate/test_calibrate.py's."""
    out = tmp_path_factory.mktemp("prof") / "p.json"
    r = run_cli_here("calibrate", "--quick", "--model", "digits-mlp", "--micro-batch", "8", "--stages", "",
                     "--codecs", "fp32", "--comm", "p2p", "--no-progress", "--output", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_cli_end_to_end_loopback(small_profile, tmp_path):
    r = subprocess.run([sys.executable, "-m", "perfsim", "validate", "--model", "digits-mlp", "--pp", "2",
                        "--compress", "fp32", "--steps", "3", "--profile", str(small_profile),
                        "--out", str(tmp_path), "--no-progress", "--no-plot"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "MAPE" in r.stdout
    df = pd.read_csv(tmp_path / "validation.csv")
    assert len(df) == 1 and df["measured_throughput_samples_per_s"].iloc[0] > 0
    assert df["predicted_throughput_samples_per_s"].iloc[0] > 0
    assert df["link_source"].iloc[0] == "profile p2p gloo"
    # after the runs the model's layers are timed again as the profile was and compared
    assert "drift check after the runs: compare with" in r.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["profile_drift"]["compute"] > 0 and (tmp_path / "drift-check.json").exists()
    # the same command again resumes: the row measured under the same key is kept (qa2, F12)
    again = run_cli_here("validate", "--model", "digits-mlp", "--pp", "2", "--compress", "fp32", "--steps", "3",
                         "--profile", str(small_profile), "--out", str(tmp_path), "--no-progress", "--no-plot")
    assert again.returncode == 0, again.stderr
    assert "resumed: 1 of 1 rows kept" in again.stderr and "--overwrite" in again.stderr
    df2 = pd.read_csv(tmp_path / "validation.csv")
    assert df2["measured_throughput_samples_per_s"].iloc[0] == df["measured_throughput_samples_per_s"].iloc[0]
    assert bool(df2["measured_reused"].iloc[0]) and not bool(df["measured_reused"].iloc[0])


def test_row_drift_times_the_compute_before_each_row_and_predicts_at_that_speed(small_profile, tmp_path):
    """--row-drift: a drift check before each row measured now (OUT/row-drift/<row>.json), and the row
    predicted again with the profile's compute as that check timed it (the model's error apart from
    the machine's speed moving between calibration and row); measured again without it, the row's
    old check is removed, never read as if it described the new runs."""
    from perfsim.calibrate.compare import compare_profiles
    from perfsim.profile import load_profile

    grid = ("validate", "--model", "digits-mlp", "--pp", "2", "--compress", "fp32", "--steps", "3",
            "--profile", str(small_profile), "--out", str(tmp_path), "--no-progress", "--no-plot", "--no-drift-check")
    r = run_cli_here(*grid, "--row-drift")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "validation.csv")
    check = Path(df["row_drift_file"].iloc[0])
    assert check.parent == tmp_path / "row-drift" and check.is_file()
    prof, now = load_profile(str(small_profile)), load_profile(str(check))
    assert df["row_compute_drift"].iloc[0] == pytest.approx(compare_profiles(now, prof)["compute"][0])
    # every compute record slower now predicts a longer iteration, every one faster a shorter one; the
    # median alone says nothing of the sign when the records moved both ways (a loaded 2-core machine)
    from perfsim.calibrate.compare import GROUPS, _key

    old_times = {_key(r): float(r["time_s"]) for r in prof.records if r.get("time_s", 0) > 0}
    moved = [float(r["time_s"]) / old_times[_key(r)] for r in now.records
             if r.get("op") in GROUPS["compute"] and r.get("time_s", 0) > 0 and _key(r) in old_times]
    plain, drifted = (float(df[c].iloc[0]) for c in ("predicted_iteration_s", "predicted_drifted_iteration_s"))
    assert moved and drifted != plain
    if min(moved) > 1 or max(moved) < 1:
        assert (drifted - plain) * (moved[0] - 1) > 0
    measured = df["measured_iteration_s"].iloc[0]
    assert df["error_drifted_iteration_s_pct"].iloc[0] == pytest.approx(
        100 * (df["predicted_drifted_iteration_s"].iloc[0] - measured) / measured)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["drifted"]["rows"] == 1 and "at each row's own compute speed (--row-drift, 1 rows)" in r.stdout
    again = run_cli_here(*grid, "--overwrite")
    assert again.returncode == 0, again.stderr
    assert not check.exists() and "row_compute_drift" not in pd.read_csv(tmp_path / "validation.csv")


def test_row_drift_without_layer_records_to_time_again_is_refused_before_any_run(small_profile, tmp_path):
    """--row-drift needs the profile's CPU layer records of the grid's model at its micro-batch; without
    them the grid is refused in one line before anything runs or is written."""
    out = tmp_path / "grid"
    r = run_cli_here("validate", "--model", "digits-mlp", "--pp", "2", "--micro-batch", "4", "--steps", "3",
                     "--profile", str(small_profile), "--out", str(out), "--no-progress", "--no-plot", "--row-drift")
    assert_user_error(r.returncode, r.stderr, "--row-drift: profile")
    assert "micro-batch 4" in r.stderr and not out.exists()


def test_cli_never_replaces_a_table_of_another_grid_without_overwrite(small_profile, tmp_path):
    """qa1 F12: `validate --out DIR` replaced DIR/validation.csv (a user's file, or another
    grid's table) without a word, where run and sweep refuse: one line naming the file and
    --overwrite, the file untouched, nothing run."""
    table = tmp_path / "validation.csv"
    table.write_text("my notes\nkeep me\n")
    r = run_cli_here("validate", "--no-progress", "--profile", str(small_profile), "--out", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"perfsim validate: error: --out '{tmp_path}': {table} is not a perfsim validation table; "
        "give another --out, or --overwrite to replace it"]
    assert table.read_text() == "my notes\nkeep me\n" and not (tmp_path / "runs").exists()
    pd.DataFrame([{"model": "digits-mlp", "pp": 2, "dp": 1, "bandwidth_bps": None, "compress": c,
                   "grad_compress": "none", "measured_throughput_samples_per_s": 100.0}
                  for c in ("fp32", "directq:fw4bw8")]).to_csv(table, index=False)
    r = run_cli_here("validate", "--no-progress", "--profile", str(small_profile), "--out", str(tmp_path))
    assert r.returncode == 2 and "holds 1 row(s) of another grid" in r.stderr and "--overwrite" in r.stderr
    r = run_cli_here("validate", "--no-progress", "--profile", str(small_profile), "--out", str(tmp_path),
                     "--overwrite", "--reuse-measured")
    assert r.returncode == 2 and "give one or the other" in r.stderr and not (tmp_path / "runs").exists()


def test_a_grid_run_again_resumes_rows_measured_under_the_same_key(tmp_path, caplog, monkeypatch):
    """A re-run keeps each row measured earlier with the same run parameters (from the run
    folders or the table), measures the rest, and measures a row of other parameters again."""
    monkeypatch.setattr(v, "load_profile", lambda path: _profile([]))
    runs = []

    def runner(**kw):
        runs.append(kw["compress"])
        return _result(0.01 * kw["steps"], "measured")

    def predictor(**kw):
        return _result(0.02, "predicted")

    base = {"model": "digits-mlp", "pp": 2, "dp": 1, "micro_batch": 8, "macro_batch": 32, "schedule": "1f1b"}
    grid = dict(base=base, bandwidths=(1e8,), profile="x", steps=5, out=str(tmp_path), runtime_model=False,
                link_model="nominal")
    first = v.run_validation(v.ValidationPlan(compresses=("fp32",), **grid), runner=runner, predictor=predictor)
    v.write_csv(first, tmp_path / "validation.csv")  # interrupted after row 0: its table
    plan = v.ValidationPlan(compresses=("fp32", "directq:fw4bw8"), **grid)
    v.check_table(plan)  # the same grid: no refusal
    df = v.run_validation(plan, runner=runner, predictor=predictor)
    assert runs == ["fp32", "directq:fw4bw8"] and df["measured_reused"].tolist() == [True, False]
    assert df["measured_iteration_s"].tolist() == pytest.approx([0.05, 0.05])
    v.write_csv(df, tmp_path / "validation.csv")
    with caplog.at_level("WARNING", logger="perfsim"):  # other run parameters: measured again
        again = v.run_validation(v.ValidationPlan(**{**plan.__dict__, "steps": 6}), runner=runner,
                                 predictor=predictor)
    assert runs[2:] == ["fp32", "directq:fw4bw8"] and not again["measured_reused"].any()
    assert caplog.text.count("taken with other inputs (its run parameters): measuring it again") == 2
    with pytest.raises(ConfigError, match="1 row.s. of another grid"):
        v.check_table(v.ValidationPlan(compresses=("directq:fw4bw8",), **grid))
    v.check_table(v.ValidationPlan(compresses=("directq:fw4bw8",), overwrite=True, **grid))
    v._TABLES.clear()


BAD_INPUT = [
    ([], "--profile"),
    (["--profile", "nosuch.json"], "nosuch.json"),
    (["--profile", "PROFILE", "--compress", "nosuch:fw4bw8"], "nosuch"),
    (["--profile", "PROFILE", "--macro-batch", "30"], "--macro-batch"),
]


@pytest.mark.parametrize("args,culprit", BAD_INPUT)
def test_cli_bad_input(small_profile, tmp_path, args, culprit):
    cli = run_cli if args == BAD_INPUT[0][0] else run_cli_here  # the first in a real process
    args = [str(small_profile) if a == "PROFILE" else a for a in args]
    r = cli("validate", "--no-progress", "--out", str(tmp_path), *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0]


def test_cli_out_that_is_a_file_is_named_as_such(small_profile, tmp_path):
    """qa1: `validate --out FILE` said "the runtime rejects compress=fp32 grad_compress=none:
    --out ...: is a file, not a folder" -- blaming the compressors for the folder."""
    f = tmp_path / "results.json"
    f.write_text("{}")
    r = run_cli_here("validate", "--no-progress", "--profile", str(small_profile), "--out", str(f))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"perfsim validate: error: --out '{f}': {f} is a file, not a folder"]


def test_a_folder_of_someone_elses_files_is_never_written_over(small_profile, tmp_path):
    """qa3: `validate --out results` where results/ held the user's own summary.json and
    validation.md (no validation.csv) replaced both, exit 0 (only a validation.csv was
    checked). `perfsim run` refuses the same for its result files; so does validate now."""
    out = tmp_path / "results"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": 1}')
    (out / "validation.md").write_text("my notes\n")
    r = run_cli_here("validate", "--no-progress", "--no-plot", "--profile", str(small_profile), "--out", str(out))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "summary.json, validation.md" in r.stderr, r.stderr
    assert "--overwrite" in r.stderr
    assert (out / "summary.json").read_text() == '{"mine": 1}' and (out / "validation.md").read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["summary.json", "validation.md"]


def _shaped(name, alpha, rate_bps, burst, sizes=(1024, 4096, 16384, 262144, 1048576, 4194304)):
    return [{"op": "p2p", "name": name, "size_bytes": s, "world_size": 2,
             "time_s": alpha + max(0, s - burst) * 8 / rate_bps} for s in sizes]


def test_calibrated_link_has_burst_and_eager_protocol():
    """Token-bucket burst of the shaped fit; gloo pipelines are eager because execute
    mode posts its receives a step ahead."""
    prof = _profile(_shaped("messenger@100Mbps", 1.5e-4, 9.5e7, 50_000)
                    + _shaped("gloo@100Mbps", 3e-5, 9.6e7, 50_000))
    link = _link(prof, 1e8, 0.0, dp_only=False)
    assert "messenger@100Mbps" in link.source
    assert link.rate_bps == pytest.approx(9.5e7, rel=1e-6)
    assert link.burst_bytes == pytest.approx(50_000, rel=1e-6)
    assert link.one_way_s == pytest.approx(1.5e-4, rel=1e-6)  # small messages pass inside the burst
    assert link.protocol == "eager"
    assert link.control_latency_s is None
    assert _link(prof, 1e8, 0.0, dp_only=False, link_model="nominal").burst_bytes == 0


def test_reuse_measured_reads_stored_runs(tmp_path):
    """--reuse-measured: the fastest stored repeat counts; no run happens."""
    import json

    plan = v.ValidationPlan(base={"model": "digits-mlp", "pp": 2, "dp": 1, "micro_batch": 8,
                                  "macro_batch": 32, "schedule": "1f1b"},
                            bandwidths=(1e8,), profile="x", steps=5, out=str(tmp_path), reuse_measured=True)
    run_dir = tmp_path / "runs" / "00-100Mbps-fp32-none"
    for suffix, it in (("", 0.010), ("-r1", 0.008)):
        d = tmp_path / "runs" / f"00-100Mbps-fp32-none{suffix}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"summary": _result(it, "measured").summary}))

    def runner(**kw):
        raise AssertionError("must not run")

    row = v.run_row(plan, plan.rows()[0], _profile(_p2p("gloo@100Mbps", 2e-4, 9.5e7)), 0, runner,
                    lambda **kw: _result(0.008, "predicted"))
    assert row["measured_iteration_s"] == 0.008 and row["measured_repeats"] == 2
    assert row["error_iteration_s_pct"] == pytest.approx(0.0)
    assert str(run_dir) == row["run_dir"]


@pytest.mark.parametrize("statistic, counted", [("median", 0.010), ("min", 0.008), (None, 0.010)])
def test_the_repeat_that_counts_is_the_profiles_own_statistic(tmp_path, statistic, counted):
    """A profile of median layer times is compared with the middle of 3 runs, a min profile with the
    fastest: the fastest run against median layer times made predictions on a shared VM look 10-25 % too
    slow (docs/validation.md, session 24). Measured now and reused from the run folders alike."""
    import json

    plan = v.ValidationPlan(base={"model": "digits-mlp", "pp": 2, "dp": 1, "micro_batch": 8,
                                  "macro_batch": 32, "schedule": "1f1b"},
                            bandwidths=(1e8,), profile="x", steps=5, out=str(tmp_path), repeats=3)
    prof = _profile(_p2p("gloo@100Mbps", 2e-4, 9.5e7))
    if statistic:
        prof.metadata["calibration"] = {"statistic": statistic}
    times = iter((0.012, 0.008, 0.010))

    def runner(**kw):  # writes each run's result as perfsim run does
        r = _result(next(times), "measured")
        Path(kw["out"]).mkdir(parents=True, exist_ok=True)
        (Path(kw["out"]) / "result.json").write_text(json.dumps({"summary": r.summary}))
        return r

    row = v.run_row(plan, plan.rows()[0], prof, 0, runner, lambda **kw: _result(0.009, "predicted"))
    assert row["measured_iteration_s"] == counted and row["measured_repeats"] == 3
    assert row["measured_repeat_choice"] == (statistic or "median")
    again = v.run_row(plan, plan.rows()[0], prof, 0, None, lambda **kw: _result(0.009, "predicted"))
    assert again["measured_iteration_s"] == counted and again["measured_reused"]


def test_link_fixed_cost_is_the_expected_small_message_time():
    """Bimodal small messages (0.15 ms, or a 4-ms tick): the median lands on a mode,
    the fixed cost handed to the simulator is the mean calibrate recorded."""
    recs = _shaped("messenger@100Mbps", 1.5e-4, 9.5e7, 50_000) + _shaped("gloo@100Mbps", 3e-5, 9.6e7, 50_000)
    means = {1024: 1.2e-3, 4096: 1.0e-3, 16384: 1.4e-3}
    for r in recs:
        if r["size_bytes"] in means:
            r["mean_s"] = means[r["size_bytes"]] / (5 if r["name"].startswith("gloo") else 1)
    link = _link(_profile(recs), 1e8, 0.0, dp_only=False)
    assert link.one_way_s == pytest.approx(1.2e-3, rel=1e-6)  # middle of the three smallest means
    assert link.rate_bps == pytest.approx(9.5e7, rel=1e-6)  # the rate still from time_s
    assert _expected_s({"time_s": 2e-4}) == 2e-4 and _expected_s({"time_s": 2e-4, "mean_s": 3e-4}) == 3e-4
    # a version-1 profile said it inside ``source``: migrated on load, the same link
    old = [{k: v for k, v in r.items() if k != "mean_s"} | ({"source": f"calibrate; mean_s={r['mean_s']!r}"}
           if "mean_s" in r else {}) for r in recs]
    assert _link(_profile(old, version=1), 1e8, 0.0) == link
    # version 1 ignored a mean it could not read; now the file is refused, naming the field
    with pytest.raises(ConfigError, match=r"records\[0\]\.mean_s='oops'"):
        _profile([{**old[0], "source": "calibrate; mean_s=oops"}], version=1)


def test_small_message_cost_is_pooled_over_rates_and_burst_is_the_configured_bucket():
    """Messages that fit in every link's token bucket cost the same at any rate: the
    fixed cost is the repeat-weighted mean over all emulated rates, and the burst is
    the bucket perfsim.netem configured (payload share), not the fitted knee."""
    from perfsim.shaping import tbf_burst_bytes

    recs = []
    for name, rate, mean in (("messenger@100Mbps", 9.5e7, 2e-3), ("messenger@1Gbps", 9.5e8, 4e-4)):
        part = _shaped(name, 1.5e-4, rate, 30_000)
        for r in part:
            if r["size_bytes"] <= POOL_MAX_BYTES:
                r["mean_s"], r["repeats"] = mean, 60 if "100M" in name else 20
        recs += part
    prof = _profile(recs)
    pooled = pooled_small_message_s(prof, "p2p", "messenger")
    assert pooled == pytest.approx((60 * 2e-3 + 20 * 4e-4) / 80)
    for rate in (1e8, 1e9):
        link = _link(prof, rate, 0.001, dp_only=False)
        assert link.one_way_s == pytest.approx(pooled + 0.001)  # the same at both rates
        assert link.burst_bytes == pytest.approx(tbf_burst_bytes(rate) * 0.95)
    assert tbf_burst_bytes(1e8) == 50_000 and tbf_burst_bytes(1e6) == 16 * 1514
    assert pooled_small_message_s(_profile(_shaped("messenger@1Gbps", 1e-4, 9e8, 1e4)), "p2p",
                                    "messenger") is None  # no recorded means: per-rate fit


def test_reuse_measured_falls_back_to_the_stored_table(tmp_path):
    """Without run folders, --reuse-measured reads the measured columns of the grid's
    validation.csv -- as stored before this process rewrites it row by row."""
    v._TABLES.clear()
    plan = v.ValidationPlan(base={"model": "digits-mlp", "pp": 2, "dp": 1, "micro_batch": 8,
                                  "macro_batch": 32, "schedule": "1f1b"},
                            bandwidths=(1e8,), compresses=("fp32", "directq:fw4bw8"), profile="x", steps=5,
                            out=str(tmp_path), reuse_measured=True)
    pd.DataFrame([{"bandwidth_bps": 1e8, "compress": c, "grad_compress": "none", "measured_steps": 4,
                   "measured_iteration_s": it, "measured_throughput_samples_per_s": 32 / it,
                   "measured_throughput_all": f"{32 / it:.2f}"} for c, it in (("fp32", 0.02), ("directq:fw4bw8", 0.01))]
                 ).to_csv(tmp_path / "validation.csv", index=False)

    def runner(**kw):
        raise AssertionError("must not run")

    prof = _profile(_p2p("gloo@100Mbps", 2e-4, 9.5e7))
    first = v.run_row(plan, plan.rows()[0], prof, 0, runner, lambda **kw: _result(0.02, "predicted"))
    (tmp_path / "validation.csv").write_text("overwritten by the command after row 0\n")
    second = v.run_row(plan, plan.rows()[1], prof, 1, runner, lambda **kw: _result(0.011, "predicted"))
    assert first["measured_iteration_s"] == 0.02 and first["error_iteration_s_pct"] == pytest.approx(0.0)
    assert second["measured_iteration_s"] == 0.01 and second["measured_steps"] == 4
    v._TABLES.clear()


def test_schedule_rows_run_and_predict_each_schedule(tmp_path):
    """A grid over schedules: each row runs and predicts its own schedule; only the
    interleaved one keeps --virtual-stages."""
    seen = []

    def runner(**kw):
        seen.append(("run", kw["schedule"], kw.get("virtual_stages")))
        return _result(0.01, "measured")

    def predictor(**kw):
        seen.append(("predict", kw["schedule"], kw.get("virtual_stages")))
        return _result(0.01, "predicted")

    plan = v.ValidationPlan(base={"model": "digits-mlp", "pp": 2, "schedule": "1f1b", "virtual_stages": 2},
                            profile="x", schedules=("1f1b", "interleaved-1f1b", "zb-h1"),
                            out=str(tmp_path), runtime_model=False, link_model="nominal", bandwidths=(1e8,))
    rows = plan.rows()
    assert [r["schedule"] for r in rows] == ["1f1b", "interleaved-1f1b", "zb-h1"]
    out = [v.run_row(plan, r, _profile([]), i, runner, predictor) for i, r in enumerate(rows)]
    assert [o["schedule"] for o in out] == ["1f1b", "interleaved-1f1b", "zb-h1"]
    assert seen == [("run", "1f1b", None), ("predict", "1f1b", None),
                    ("run", "interleaved-1f1b", 2), ("predict", "interleaved-1f1b", 2),
                    ("run", "zb-h1", None), ("predict", "zb-h1", None)]
    assert len({o["run_dir"] for o in out}) == 3
    df = pd.DataFrame(out)
    assert v.format_table(df).splitlines()[0].startswith("schedule")
    md = v.markdown_table(df).splitlines()
    assert md[0].startswith("| schedule | bandwidth") and md[3].startswith("| interleaved-1f1b | 100Mbps")


def test_validate_cli_rejects_a_schedule_that_does_not_fit(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "perfsim", "validate", "--profile", "traces/cpu-2core.json",
                           "--schedule", "1f1b,zb-v", "--out", str(tmp_path), "--pp", "4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "zb-v" in proc.stderr and "model chunks per device: 8" in proc.stderr  # predict's wording (job.check_chunks)
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_tp_axis_reaches_run_and_predict(tmp_path):
    """A --tp axis: each row runs and predicts with its tp; a simulator that does not
    know tp yet leaves the TP row measured only (NaN error, a note), never a tp=1 row."""
    prof = _profile(_p2p("gloo@100Mbps", 4e-4, 9e7, op="allreduce"))
    runs, preds = [], []

    def runner(**kw):
        runs.append(kw)
        return _result(0.02 if kw.get("tp", 1) == 1 else 0.03, "measured")

    def predictor(**kw):
        preds.append(kw)
        if "tp" in kw:
            raise ConfigError("unknown parameter(s) ['sequence_parallel', 'tp'] (known: ...)")
        return _result(0.021, "predicted")

    plan = v.ValidationPlan(base={"model": "gpt2-tiny", "pp": 1, "dp": 1, "micro_batch": 8,
                                  "macro_batch": 32, "schedule": "1f1b"},
                            bandwidths=(1e8,), tps=(1, 2), sequence_parallel=True, profile="x",
                            steps=5, out=str(tmp_path))
    assert [r["tp"] for r in plan.rows()] == [1, 2]
    df = pd.DataFrame([v.run_row(plan, r, prof, i, runner, predictor) for i, r in enumerate(plan.rows())])
    assert "tp" not in runs[0] and runs[1]["tp"] == 2 and runs[1]["sequence_parallel"] is True
    assert preds[1]["tp"] == 2 and preds[1]["sequence_parallel"] is True
    assert runs[1]["out"].endswith("-tp2sp")
    assert df["tp"].tolist() == [1, 2] and df["predict_note"].iloc[1].startswith("not predicted")
    assert df["error_iteration_s_pct"].iloc[0] == pytest.approx(5.0) and pd.isna(df["error_iteration_s_pct"].iloc[1])
    s = v.summarize(df)
    assert s["rows"] == 1 and s["rows_measured_only"] == 1
    assert "tp2+sp" in v.format_table(df) and "tp2+sp" in v.markdown_table(df)
    assert "not predicted" in v.markdown_table(df)

    def tp1_fails(**kw):
        raise ConfigError("unknown parameter(s) ['tp']")

    with pytest.raises(ConfigError):  # only a TP row may go unpredicted
        v.run_row(plan, {"bandwidth": 1e8, "compress": "fp32", "grad_compress": "none", "tp": 1},
                  prof, 0, runner, tp1_fails)


BAD_TP = [
    (["--tp", "3"], "tp=3"),
    (["--tp", "x"], "--tp"),
    (["--sequence-parallel"], "--sequence-parallel"),
]


@pytest.mark.parametrize("args,culprit", BAD_TP)
def test_cli_bad_tp(small_profile, tmp_path, args, culprit):
    cli = run_cli if args == BAD_TP[0][0] else run_cli_here  # the first in a real process
    r = cli("validate", "--model", "gpt2-tiny", "--pp", "1", "--profile", str(small_profile),
            "--out", str(tmp_path), "--no-progress", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and culprit in r.stderr


def test_tp_row_measured_for_real(tmp_path):
    """A TP row of a validation grid trains with real tensor parallelism (2 gloo ranks)
    and carries its TP figures; the prediction gets tp."""
    prof = _profile(_p2p("gloo", 1e-4, 8e9, op="allreduce"))
    seen = {}

    def predictor(**kw):
        seen.update(kw)
        return _result(0.05, "predicted")

    plan = v.ValidationPlan(base={"model": "gpt2-tiny", "pp": 1, "dp": 1, "micro_batch": 2,
                                  "macro_batch": 4, "schedule": "1f1b"},
                            tps=(2,), profile="x", steps=3, dataset_limit=16, out=str(tmp_path))
    row = v.run_row(plan, plan.rows()[0], prof, 0, predictor=predictor)
    assert seen["tp"] == 2 and row["tp"] == 2 and row["predict_note"] == ""
    assert row["measured_tp_bytes"] == 2 * 4 * 2 * 4 * (2 * 64 * 128 * 4)  # ranks, layers, mb, allreduces
    assert row["measured_tp_comm_s"] > 0 and row["measured_throughput_samples_per_s"] > 0
    assert row["error_iteration_s_pct"] == row["error_iteration_s_pct"]  # predicted: a number


@pytest.mark.parametrize("made,window", [("application", "off"), ("", "off"), ("kernel", None)])
def test_tcp_window_follows_who_made_the_latency(tmp_path, made, window):
    """An emulated latency the kernel never saw (the messenger delays deliveries: no sch_netem)
    gives TCP no round trip, so the prediction takes no window ceiling (perfsim.tcp); a run
    that does not say is taken as such. tc netem's latency is a real round trip: the window
    stays predict's own (auto)."""
    calls = {}

    def runner(**kw):
        res = _result(0.02, "measured")
        if made:
            res.summary["latency_in"] = made
        return res

    def predictor(**kw):
        calls["predict"] = kw
        return _result(0.02, "predicted")

    plan = v.ValidationPlan(base={"model": "digits-mlp", "pp": 2, "dp": 1, "micro_batch": 8,
                                  "macro_batch": 32, "schedule": "1f1b"},
                            bandwidths=(1e8,), compresses=("fp32",), profile="x", steps=5,
                            latency_s=0.04, out=str(tmp_path))
    row = v.run_row(plan, plan.rows()[0], _profile(_p2p("gloo@100Mbps", 2e-4, 9.5e7)), 0, runner, predictor)
    assert calls["predict"].get("tcp_window") == window
    # nor a round trip over which a connection would restart slow start after idle
    assert calls["predict"].get("tcp_slow_start_after_idle") == window
    assert row["measured_latency_in"] == made
    # stored, the column reaches a re-prediction from the grid's table (--reuse-measured)
    v._TABLES.clear()
    pd.DataFrame([row]).to_csv(tmp_path / "validation.csv", index=False)
    plan2 = v.ValidationPlan(**{**plan.__dict__, "reuse_measured": True})
    v.run_row(plan2, plan2.rows()[0], _profile([]), 0, lambda **kw: pytest.fail("must not run"), predictor)
    assert calls["predict"].get("tcp_window") == window
    v._TABLES.clear()


def test_a_profile_of_another_cpu_is_named_before_any_run(caplog, tmp_path):
    """validate measures runs here against the profile's costs: a profile calibrated on another
    CPU (model or cores) is one warning naming both (before: nothing; the rows' errors were the
    two machines' difference). Refused input after it: no run starts."""
    import logging
    from pathlib import Path

    from perfsim.analysis.validate_grid import validate
    from perfsim.calibrate.machine import other_cpu
    from perfsim.profile import load_profile

    root = Path(__file__).resolve().parents[2] / "traces"
    here = load_profile(root / "cpu-2core.json").metadata
    assert other_cpu({**here, "cpu_model": "Some Other CPU"}).startswith("calibrated on Some Other CPU (")
    assert other_cpu({**here, "cpu_model": "Some Other CPU", "device": "cuda"}) is None  # a GPU's profile
    other = json.loads((root / "cpu-2core.json").read_text())
    other["metadata"]["cpu_model"] = "Some Other CPU"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(other))
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError, match="--sequence-parallel"):
        validate(profile=str(path), model="digits-mlp", pp=2, sequence_parallel=True, out=str(tmp_path / "v"))
    assert [r for r in caplog.records if "calibrated on Some Other CPU" in r.getMessage()]
