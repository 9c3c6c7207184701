"""perfsim plot: every figure kind from synthetic tables in the predict schema.

The tables are built here from a closed-form pipeline model (no simulator), so
the tests check what is drawn (lines, colours, bar heights, axis units) against
numbers known in advance.
"""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from perfsim.analysis import plot_files, plots
from perfsim.analysis.sweep import config_id, sibling_path
from perfsim.errors import ConfigError
from perfsim.result import STAGE_COLUMNS, SUMMARY_COLUMNS

from _helpers import run_cli, run_cli_here

BWS = [1e10, 1e9, 1e8, 1e7]
METHODS = {"fp32": 32, "directq:fw4bw8": 6, "aqsgd:fw3bw6": 4.5}


def synthetic(pp=(4,), schedules=("gpipe",), micro=(1,), macro=8, grad=("none",)):
    """A sweep-shaped summary table + stages table: GPipe with 10 ms compute per
    micro-batch and a 1 MB fp32 boundary message scaled by the bit width."""
    rows, stages = [], []
    for p in pp:
        for sched in schedules:
            for mb in micro:
                for g in grad:
                    for comp, bits in METHODS.items():
                        for bw in BWS:
                            m = macro // mb
                            comm = 8e6 * bits / 32 / bw
                            it = (m + p - 1) * (10e-3 * mb + comm)
                            row = dict.fromkeys(SUMMARY_COLUMNS)
                            row.update(model="gpt2-xl", bandwidth_bps=bw, latency_s=0.0,
                                       compress=comp, grad_compress=g, schedule=sched, pp=p,
                                       dp=1, micro_batch=mb, macro_batch=macro,
                                       throughput_samples_per_s=macro / it, iteration_s=it,
                                       bubble_fraction=(p - 1) / (m + p - 1),
                                       peak_inflight=m if sched == "gpipe" else min(m, p),
                                       source="predicted")
                            row["config_id"] = config_id(row)
                            rows.append(row)
                            for s in range(p):
                                stages.append({"config_id": row["config_id"], "replica": 0,
                                               "stage": s, "compute_s": m * 10e-3 * mb,
                                               "comm_s": m * comm, "encode_s": 1e-3 * (bits < 32),
                                               "idle_s": it - m * (10e-3 * mb + comm),
                                               "dp_sync_s": 0.0, "bytes_sent": 1.0,
                                               "peak_inflight": 1})
    return pd.DataFrame(rows), pd.DataFrame(stages, columns=["config_id", *STAGE_COLUMNS])


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_labels_and_palette():
    assert plots.bandwidth_label(1e8) == "100 Mbps" and plots.bandwidth_label(1e10) == "10 Gbps"
    assert plots.method_name("aqsgd:fw3bw6") == "AQ-SGD fw3 bw6"
    assert plots.method_name("qsgd-maxnorm:4") == "QSGD-MaxNorm 4-bit"
    assert plots.method_name("fp32") == "FP32"
    # one colour per family, also for variants and for unknown families (stable)
    assert plots.method_color("aqsgd:fw2bw4") == plots.method_color("aqsgd:fw3bw6")
    assert plots.method_color("fp32") != plots.method_color("directq:fw4bw8")
    assert plots.method_color("newthing:3") == plots.method_color("newthing:5")
    styles = plots.method_styles(["aqsgd:fw3bw6", "aqsgd:fw2bw4", "fp32"])
    assert styles["aqsgd:fw3bw6"]["color"] == styles["aqsgd:fw2bw4"]["color"]
    assert styles["aqsgd:fw3bw6"]["linestyle"] != styles["aqsgd:fw2bw4"]["linestyle"]


def test_throughput_figure(tmp_path):
    df, _ = synthetic()
    fig = plots.make_figure("throughput", df)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["10 Mbps", "100 Mbps", "1 Gbps", "10 Gbps"]
    assert "samples/s" in ax.get_ylabel() and ax.get_xlabel() == "link bandwidth"
    lines = lines_by_label(ax)
    assert set(lines) == {"FP32", "DirectQ fw4 bw8", "AQ-SGD fw3 bw6"}
    assert lines["AQ-SGD fw3 bw6"].get_color() == plots.METHOD_COLORS["aqsgd"]
    fp32 = df[df.compress == "fp32"].sort_values("bandwidth_bps")
    np.testing.assert_allclose(lines["FP32"].get_ydata(), fp32.throughput_samples_per_s)
    for suffix in ("png", "svg"):
        path = plot_files.save_figure(fig, tmp_path / f"t.{suffix}")
        head = path.read_bytes()[:64]
        assert head.startswith(b"\x89PNG") if suffix == "png" else b"<svg" in path.read_bytes()[:1000]


def test_speedup_figure_and_panels():
    df, _ = synthetic(pp=(2, 4))
    fig = plots.make_figure("speedup", df)
    assert len(fig.axes) == 2 and [a.get_title() for a in fig.axes] == ["pp=2", "pp=4"]
    sched, _ = synthetic(schedules=("1f1b", "gpipe"))
    assert [a.get_title() for a in plots.make_figure("throughput", sched).axes] == ["GPipe", "1F1B"]
    lines = lines_by_label(fig.axes[1])
    np.testing.assert_allclose(lines["FP32"].get_ydata(), 1.0)
    d = df[df.pp == 4].set_index(["compress", "bandwidth_bps"])["throughput_samples_per_s"]
    expect = (d["aqsgd:fw3bw6"] / d["fp32"]).sort_index()
    np.testing.assert_allclose(lines["AQ-SGD fw3 bw6"].get_ydata(), expect)
    assert "FP32" in fig.axes[0].get_ylabel()
    # a time metric gives the same speed-up (baseline time / method time)
    fig = plots.make_figure("speedup", df, metric="iteration_s")
    np.testing.assert_allclose(lines_by_label(fig.axes[1])["AQ-SGD fw3 bw6"].get_ydata(), expect)
    with pytest.raises(ConfigError, match="baseline 'topk'"):
        plots.make_figure("speedup", df, baseline="topk")
    # gradient compression varying alone: the method is grad_compress, baseline none
    g, _ = synthetic(grad=("none", "qsgd-maxnorm:4"))
    g = g[g.compress == "aqsgd:fw3bw6"]
    fig = plots.make_figure("speedup", g)
    assert set(lines_by_label(fig.axes[0])) == {"FP32 gradients", "QSGD-MaxNorm 4-bit gradients"}
    assert fig.axes[0].get_ylabel() == "speed-up over FP32 gradients (x)"


def test_rows_of_other_configurations_are_never_averaged_into_one_line():
    """qa3: a sweep over --gpu a100,h100 x --precision fp32,bf16 drew one FP32 line at the mean
    of four configurations' throughput (panels came from a fixed list of columns that held
    neither gpu nor precision nor seq_len). Every parameter column that varies is a panel."""
    df, st = synthetic(pp=(4,))
    df = pd.concat([df.assign(precision="fp32", seq_len=1024),
                    df.assign(precision="bf16", seq_len=1024,
                              throughput_samples_per_s=df["throughput_samples_per_s"] * 3)])
    df["config_id"] = [config_id(r) for r in df.to_dict("records")]
    fig = plots.make_figure("throughput", df)
    assert sorted(a.get_title() for a in fig.axes) == ["precision=bf16", "precision=fp32"]
    for ax in fig.axes:
        mine = df[df.precision == ax.get_title().split("=")[1]]
        want = mine[mine.compress == "fp32"].sort_values("bandwidth_bps")["throughput_samples_per_s"]
        np.testing.assert_allclose(lines_by_label(ax)["FP32"].get_ydata(), want.to_numpy())
    long = pd.concat([df.assign(source="predicted"), df.assign(source="measured")])
    assert len(plots.validation_pairs(long)) == len(df)  # one pair per configuration, none averaged
    fig = plots.make_figure("breakdown", df[(df.bandwidth_bps == 1e8) & (df.compress == "fp32")],
                            pd.concat([st.assign(config_id=c) for c in df.config_id]))
    assert sorted(a.get_title().split("\n")[0] for a in fig.axes if a.get_visible()) == \
        ["precision=bf16", "precision=fp32"]


def test_breakdown_figure():
    big, big_st = synthetic(pp=(2, 4))
    with pytest.raises(ConfigError, match="24 configurations; select at most 12"):
        plots.make_figure("breakdown", big, big_st)
    df, st = synthetic(pp=(4,))
    fig = plots.make_figure("breakdown", df, st, filters=["bandwidth=100Mbps,10Mbps"])
    visible = [a for a in fig.axes if a.get_visible()]
    assert len(visible) == 6
    ax = next(a for a in visible if a.get_title().startswith("FP32 · 10 Mbps"))
    # the wide stacked bars of each stage add up to the iteration time; the narrow
    # bar beside them is the stage's communication time
    tops, comm = {}, {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        target = tops if patch.get_width() > 0.5 else comm
        target[x] = max(target.get(x, 0), patch.get_y() + patch.get_height())
    row = df[(df.compress == "fp32") & (df.bandwidth_bps == 1e7)]
    assert sorted(tops) == [0, 1, 2, 3]
    np.testing.assert_allclose(list(tops.values()), row.iteration_s.item())
    np.testing.assert_allclose(list(comm.values()),
                               st[st.config_id == row.config_id.item()].comm_s)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["compute", "encode/decode", "waiting (exposed comm., bubble)",
                      "communication (may overlap)"]
    with pytest.raises(ConfigError, match="per-stage"):
        plots.make_figure("breakdown", df, None, filters=["bandwidth=100Mbps"])


def test_bubble_figure():
    df, _ = synthetic(pp=(4,), schedules=("gpipe", "1f1b"), micro=(1, 2, 4, 8), macro=32)
    df = df[(df.compress == "fp32") & (df.bandwidth_bps == 1e10)]
    fig = plots.make_figure("bubble", df)
    bubble, memory = fig.axes
    lines = lines_by_label(bubble)
    assert {"GPipe", "1F1B", "ideal (p-1)/(m+p-1)"} <= set(lines)
    np.testing.assert_allclose(lines["GPipe"].get_xdata(), [4, 8, 16, 32])
    np.testing.assert_allclose(lines["ideal (p-1)/(m+p-1)"].get_ydata(),
                               3 / (np.array([4, 8, 16, 32]) + 3))
    mem = lines_by_label(memory)
    np.testing.assert_allclose(mem["1F1B"].get_ydata(), 4)  # 1F1B bounds in-flight by p
    np.testing.assert_allclose(mem["GPipe"].get_ydata(), [4, 8, 16, 32])
    assert lines["GPipe"].get_color() != lines["1F1B"].get_color()


def validate_tables():
    df, _ = synthetic()
    meas = df.throughput_samples_per_s * (1 + 0.04 * np.cos(np.arange(len(df))))
    wide = df.assign(predicted_throughput_samples_per_s=df.throughput_samples_per_s,
                     measured_throughput_samples_per_s=meas)
    suffix = df.assign(throughput_samples_per_s_predicted=df.throughput_samples_per_s,
                       throughput_samples_per_s_measured=meas)
    long = pd.concat([df, df.assign(source="measured", throughput_samples_per_s=meas)])
    return meas, df, [wide, suffix, long]


def test_validation_figure_layouts():
    meas, df, tables = validate_tables()
    mape = 100 * np.mean(np.abs(df.throughput_samples_per_s - meas) / meas)
    for table in tables:
        pairs = plots.validation_pairs(table)
        assert len(pairs) == len(df)
        fig = plots.make_figure("validation", table)
        assert f"MAPE {mape:.1f} %" in fig._suptitle.get_text()
        scatter, errors = fig.axes
        assert "measured" in scatter.get_xlabel() and "samples/s" in scatter.get_xlabel()
        lines = lines_by_label(errors)
        assert lines["AQ-SGD fw3 bw6"].get_color() == plots.METHOD_COLORS["aqsgd"]
    # loopback runs (no emulated bandwidth): one scatter, no error-vs-bandwidth panel
    loop = tables[0].assign(bandwidth_bps=np.nan).iloc[::4]
    fig = plots.make_figure("validation", loop)
    assert len(fig.axes) == 1 and "MAPE" in fig.get_suptitle()
    with pytest.raises(ConfigError, match="predicted/measured"):
        plots.make_figure("validation", df.drop(columns="source"))
    with pytest.raises(ConfigError, match="both"):
        plots.make_figure("validation", df)  # predicted rows only


def test_filters_and_errors():
    df, _ = synthetic()
    assert len(plots.apply_filters(df, ["bandwidth=100Mbps", "compress=fp32,aqsgd:fw3bw6"])) == 2
    assert len(plots.apply_filters(df, ["pp=4"])) == len(df)
    with pytest.raises(ConfigError, match="column 'colour': unknown"):
        plots.apply_filters(df, ["colour=red"])
    with pytest.raises(ConfigError, match="no rows left"):
        plots.apply_filters(df, ["pp=16"])
    with pytest.raises(ConfigError, match="expected COLUMN=VALUE"):
        plots.apply_filters(df, ["pp"])
    with pytest.raises(ConfigError, match="kind 'pie'"):
        plots.make_figure("pie", df)
    with pytest.raises(ConfigError, match="empty"):
        plots.make_figure("throughput", df.iloc[:0])
    with pytest.raises(ConfigError, match="column 'tokens'"):
        plots.make_figure("throughput", df, metric="tokens")
    with pytest.raises(ConfigError, match="lacks column"):
        plots.make_figure("bubble", df.drop(columns="schedule"))
    with pytest.raises(ConfigError, match="panels"):
        big = pd.concat([df.assign(dp=d) for d in range(1, 15)])
        plots.make_figure("throughput", big)


def test_cli(tmp_path, monkeypatch):
    df, st = synthetic()
    table = tmp_path / "sweep.csv"
    df.to_csv(table, index=False)
    st.to_csv(sibling_path(table, "stages"), index=False)
    proc = run_cli("plot", str(table), "--kind", "breakdown", "--filter", "bandwidth=10Mbps",
                   "--out", "b.svg", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "b.svg").read_text().lstrip().startswith("<?xml")
    # the rest through perfsim.cli.main in this process (no interpreter, pandas and
    # matplotlib start-up per call), from the same folder
    monkeypatch.chdir(tmp_path)
    proc = run_cli_here("plot", str(table), "--kind", "speedup")
    assert proc.returncode == 0 and (tmp_path / "sweep.speedup.png").exists(), proc.stderr
    # a Result JSON list, as `perfsim predict --format json` / `perfsim run` write it
    import json

    results = []
    for _, row in df[df.bandwidth_bps == 1e8].iterrows():
        stages = st[st.config_id == row.config_id].drop(columns="config_id")
        summary = row.drop(labels="config_id").to_dict()
        results.append({"summary": {k: (None if v != v else v) for k, v in summary.items()},
                        "stages": stages.to_dict("records"), "microbatches": [], "links": []})
    (tmp_path / "r.json").write_text(json.dumps(results))
    summary, stages = plot_files.load_tables(tmp_path / "r.json")
    assert len(summary) == 3 and summary.config_id.is_unique and len(stages) == 3 * 4
    proc = run_cli_here("plot", "r.json", "--kind", "breakdown")
    assert proc.returncode == 0 and (tmp_path / "r.breakdown.png").exists(), proc.stderr
    (tmp_path / "bad.json").write_text('{"rows": []}')
    proc = run_cli_here("plot", "bad.json")
    assert proc.returncode == 2 and "Result JSON" in proc.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(SUMMARY_COLUMNS) + "\n")
    for args, culprit in [((str(table), "--kind", "pie"), "pie"),
                          ((str(empty),), "empty"),
                          (("missing.csv",), "missing.csv"),
                          ((str(table), "--filter", "colour=red"), "colour"),
                          ((str(table), "--out", "x.jpg"), "x.jpg"),
                          ((str(table), "--kind", "validation"), "validation")]:
        proc = run_cli_here("plot", *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and culprit in lines[0], proc.stderr
