"""Figures from sweep tables (the predict summary schema, :data:`perfsim.result.SUMMARY_COLUMNS`).

Five kinds, each a function ``DataFrame -> matplotlib Figure``:

* ``throughput``  throughput vs link bandwidth (log axis), one line per method;
* ``speedup``     the same divided by the FP32 (uncompressed) throughput at the
                  same bandwidth;
* ``breakdown``   per stage, the iteration split into compute / encode-decode /
                  optimizer / waiting (stacked), with communication and DP-sync
                  time beside it (they may overlap compute), one panel per
                  configuration (the sweep's per-stage table, by ``config_id``);
* ``bubble``      pipeline bubble fraction vs micro-batches per iteration for
                  GPipe and 1F1B, with the closed form (p-1)/(m+p-1) of GPipe
                  (Huang et al. 2019, Sec. 2.3), and the peak
                  number of in-flight micro-batches (the memory side of 1F1B);
* ``validation``  predicted vs measured scatter (``perfsim validate`` tables),
                  with the y = x line, +-10 % band and the mean absolute
                  percentage error.

A method (a compression setting) has ONE colour in every figure: the colour of
its compressor family in :data:`METHOD_COLORS`; variants of a family (bit
widths) differ by line style and marker. Other varying configuration columns
become panels; ``filters`` (``"bandwidth=100Mbps"``, ``"compress=fp32,aqsgd:fw3bw6"``)
select rows first. Figures are built on :class:`matplotlib.figure.Figure`
(no pyplot global state) and saved atomically by
:func:`perfsim.analysis.plot_files.save_figure`, which also reads the tables
(:func:`~perfsim.analysis.plot_files.load_tables`).
"""

from __future__ import annotations

import math
import textwrap
from typing import Iterable, Sequence

from perfsim.analysis.style import (  # noqa: F401 - re-exported for users of plots
    BREAKDOWN, NETWORK, LINESTYLES, MARKERS, METHOD_COLORS, METHOD_NAMES, METRIC_LABELS, PANEL_COLUMNS,
    SCHEDULE_COLORS, SCHEDULE_NAMES, add_method_column, bandwidth_axis, bandwidth_label, config_columns, family,
    grad_name, is_none, log_axis, method_color, method_name, method_sort_key, method_styles, value_label,
)
from perfsim.errors import ConfigError
from perfsim.units import format_bandwidth, parse_bandwidth, parse_time, split_list

KINDS = ("throughput", "speedup", "breakdown", "bubble", "validation")

_ALIASES = {"bandwidth": "bandwidth_bps", "latency": "latency_s"}
MAX_PANELS = 12


# ---------------------------------------------------------------- table helpers

def _column(df, name: str) -> str:
    col = _ALIASES.get(name, name).replace("-", "_")
    if col not in df.columns:
        raise ConfigError(f"column {name!r}: unknown (columns: {', '.join(map(str, df.columns))})")
    return col


def apply_filters(df, filters: Sequence[str] = ()):
    """Keep rows matching every ``column=value[,value...]`` filter. ``bandwidth`` and
    ``latency`` take units (``bandwidth=100Mbps``). A column filtered twice is refused:
    the two would intersect (``pp=2`` then ``pp=4``: nothing), one value list says it."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    seen: dict[str, str] = {}
    for f in filters or ():
        if "=" not in f:
            raise ConfigError(f"filter {f!r}: expected COLUMN=VALUE[,VALUE...]")
        name, _, raw = f.partition("=")
        col = _column(df, name.strip())
        if col in seen:
            raise ConfigError(f"filter {f!r}: {name.strip()} filtered twice ({seen[col]!r} before); give "
                              "one filter per column, its values as a comma list")
        seen[col] = f
        values = split_list(raw, f"filter {f!r}")
        if not values:
            raise ConfigError(f"filter {f!r}: no value")
        if col == "bandwidth_bps":
            mask = np.isclose(df[col].to_numpy(float)[:, None],
                              [parse_bandwidth(v) for v in values], rtol=1e-9).any(axis=1)
        elif col == "latency_s":
            mask = np.isclose(df[col].to_numpy(float)[:, None],
                              [parse_time(v, "latency") for v in values], rtol=1e-9,
                              atol=1e-12).any(axis=1)
        elif df[col].dtype.kind in "if":
            try:
                nums = [float(v) for v in values]
            except ValueError:
                raise ConfigError(f"filter {f!r}: {col} is numeric") from None
            mask = df[col].isin(nums).to_numpy()
        else:
            mask = df[col].astype(str).str.lower().isin([v.lower() for v in values]).to_numpy()
        df = df[mask]
        if df.empty:
            raise ConfigError(f"filter {f!r}: no rows left")
    return df


def _require(df, cols: Iterable[str], kind: str) -> None:
    if df is None or len(df) == 0:
        raise ConfigError(f"{kind}: the table is empty")
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ConfigError(f"{kind}: the table lacks column(s) {', '.join(missing)}")
    if df[list(cols)].isna().all().any():
        empty = [c for c in cols if df[c].isna().all()]
        raise ConfigError(f"{kind}: column(s) {', '.join(empty)} hold no values")


def _filter_text(col: str, key) -> str:
    """``COLUMN=VALUE`` that :func:`apply_filters` accepts for a panel's first value
    (a rate and a latency with their units)."""
    value = key[0] if isinstance(key, tuple) else key
    if col == "bandwidth_bps":
        return f"bandwidth={format_bandwidth(float(value))}"
    if col == "latency_s":
        return f"latency={float(value):g}s"
    return f"{col}={value:g}" if isinstance(value, float) else f"{col}={value}"


def _panels(df, used: Sequence[str]):
    """Group rows into panels by the configuration columns that vary (other than ``used``)."""
    cols = [c for c in config_columns(df) if c not in used and df[c].astype(str).nunique() > 1]
    if not cols:
        return [("", df)]
    groups = list(df.groupby(cols, sort=True, dropna=False))
    if len(groups) > MAX_PANELS:
        raise ConfigError(f"{len(groups)} panels (varying {', '.join(cols)}); select at most "
                          f"{MAX_PANELS} with --filter, e.g. --filter {_filter_text(cols[0], groups[0][0])}")
    out = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        order = tuple(_order(c, v) for c, v in zip(cols, key))
        out.append((order, " · ".join(value_label(c, v) for c, v in zip(cols, key)), g))
    return [(title, g) for _, title, g in sorted(out, key=lambda t: t[0])]


def _order(col: str, value):
    """Panel order: GPipe before 1F1B, methods in palette order, numbers ascending."""
    if col == "schedule":
        return (list(SCHEDULE_NAMES).index(value) if value in SCHEDULE_NAMES else 9, str(value))
    if col in ("compress", "grad_compress"):
        return method_sort_key(str(value))
    return (0, str(value)) if isinstance(value, str) else (0, float(value))


def _figure(n: int, width: float = 5.2, height: float = 3.8, ncols: int | None = None):
    from matplotlib.figure import Figure  # lazy: matplotlib is heavy, needed only here

    ncols = ncols or min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols, height * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, list(axes[:n])


# ---------------------------------------------------------------- the five figures

def plot_throughput(df, metric: str = "throughput_samples_per_s", title: str | None = None,
                    speedup_over: str | None = None):
    """Throughput (or ``metric``) vs bandwidth, one line per method, log bandwidth axis.
    With ``speedup_over`` (a method, e.g. ``"fp32"``), each line is divided by that
    method's value at the same bandwidth and panel."""
    kind = "speedup" if speedup_over else "throughput"
    _require(df, ["bandwidth_bps", metric], kind)
    df = add_method_column(df)
    panels = _panels(df, ["bandwidth_bps", "compress", "grad_compress"])
    styles = method_styles(df["method"])
    if speedup_over:
        base_rows = df[df["method"] == speedup_over]
        base_label = base_rows["method_label"].iloc[0] if len(base_rows) else speedup_over
    fig, axes = _figure(len(panels))
    for ax, (ptitle, g) in zip(axes, panels):
        data = g.groupby(["method", "bandwidth_bps"], sort=True)[metric].mean()
        if speedup_over:
            try:
                base = data.xs(speedup_over, level="method")
            except KeyError:
                raise ConfigError(f"speedup: baseline {speedup_over!r} is not in the table "
                                  f"(methods: {', '.join(sorted(df['method'].unique()))})") from None
            data = data.div(base, level="bandwidth_bps")
            if metric.endswith("_s") and not metric.endswith("per_s"):  # a time: less is faster
                data = 1.0 / data
            ax.axhline(1.0, color=method_color(speedup_over), linewidth=0.8, alpha=0.5)
        labels = dict(zip(g["method"], g["method_label"]))
        for method in sorted(data.index.get_level_values(0).unique(), key=method_sort_key):
            series = data.xs(method, level="method").dropna()
            ax.plot(series.index, series.to_numpy(), label=labels[method], markersize=5,
                    **styles[method])
        bandwidth_axis(ax, g["bandwidth_bps"])
        ax.set_ylabel(f"speed-up over {base_label} (x)" if speedup_over
                      else METRIC_LABELS.get(metric, metric))
        if speedup_over:
            ax.set_ylim(bottom=0)
        else:
            lo, hi = data.min(), data.max()
            if lo > 0 and hi / lo > 30:
                log_axis(ax)
            else:
                ax.set_ylim(bottom=0, top=hi * 1.08)
        if ptitle:
            ax.set_title(ptitle, fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    if len(labels) > 4 or max(map(len, labels)) > 24:  # long names: below the panels
        fig.legend(handles, labels, loc="outside lower center", ncols=min(2, len(labels)),
                   fontsize=8)
    else:
        axes[0].legend(fontsize=8, title="method", title_fontsize=8)
    fig.suptitle(title or _auto_title(df, kind, width=int(fig.get_figwidth() * 11)),
                 fontsize=11)
    return fig


def plot_speedup(df, baseline: str | None = None, metric: str = "throughput_samples_per_s",
                 title: str | None = None):
    """Speed-up over the uncompressed baseline (``fp32``, or ``none`` when the DP
    gradient compression is what varies) at each bandwidth."""
    _require(df, ["bandwidth_bps", metric], "speedup")
    methods = set(add_method_column(df)["method"])
    if baseline is None:
        baseline = next((b for b in ("fp32", "none", "fp32 | none") if b in methods), None)
        if baseline is None:
            raise ConfigError("speedup: no fp32 / none baseline in the table; name one with "
                              f"--baseline (methods: {', '.join(sorted(methods))})")
    return plot_throughput(df, metric=metric, title=title, speedup_over=baseline)


def plot_breakdown(df, stages, title: str | None = None):
    """Per-stage time per iteration, one panel per configuration (replicas averaged).

    The wide stacked bar partitions the iteration: compute, encode/decode and the
    optimizer step, then the rest of ``iteration_s`` as *waiting* (exposed
    communication, pipeline bubble, gradient sync). Beside it a narrow bar shows
    the stage's communication and DP-sync time, which a simulator overlaps with
    compute (perfsim/engine/report.py) and a measurement may not, so it is drawn
    apart rather than stacked. When exactly two configuration columns vary (e.g.
    method and bandwidth) the panels form a grid sharing the time axis per column.
    """
    _require(df, ["config_id"], "breakdown")
    if stages is None or len(stages) == 0:
        raise ConfigError("breakdown: no per-stage table (the sweep's .stages file) found")
    _require(stages, ["config_id", "stage", "compute_s"], "breakdown")
    df = add_method_column(df)
    have = set(stages["config_id"])
    df = df[df["config_id"].isin(have)]
    if df.empty:
        raise ConfigError("breakdown: no per-stage rows for the selected configurations")
    if len(df) > MAX_PANELS:
        raise ConfigError(f"breakdown: {len(df)} configurations; select at most {MAX_PANELS} "
                          "with --filter (e.g. --filter bandwidth=100Mbps)")
    stages = stages.copy()
    for col in ("compute_s", "encode_s", "optimizer_s", "comm_s", "dp_sync_s", "idle_s"):
        stages[col] = stages[col].fillna(0.0) if col in stages else 0.0
    iteration = df.set_index("config_id")["iteration_s"] if "iteration_s" in df else None
    busy = stages["compute_s"] + stages["encode_s"] + stages["optimizer_s"]
    if iteration is not None and iteration.notna().all():
        stages["wait_s"] = (stages["config_id"].map(iteration) - busy).clip(lower=0.0)
    else:  # no iteration time: the table's own idle time is the rest
        stages["wait_s"] = stages["idle_s"]
    cats = [c for c in BREAKDOWN if stages[c[0]].gt(0).any()]
    net = [c for c in NETWORK if stages[c[0]].gt(0).any()]
    varying = [c for c in config_columns(df) if df[c].astype(str).nunique() > 1]
    from matplotlib.figure import Figure  # lazy: matplotlib is heavy, needed only here

    if len(varying) == 2:
        df = df.sort_values(varying, key=lambda col: col.map(_sort_value))
        rows = list(dict.fromkeys(df[varying[0]]))
        cols_ = list(dict.fromkeys(df[varying[1]]))
        if varying[1] == "bandwidth_bps":
            cols_ = sorted(cols_, reverse=True)
        fig = Figure(figsize=(max(7.0, 3.9 * len(cols_)), 2.9 * len(rows) + 1.1),
                     layout="constrained")
        grid = fig.subplots(len(rows), len(cols_), squeeze=False, sharey="col")
        cells = [(grid[rows.index(r[varying[0]])][cols_.index(r[varying[1]])], r)
                 for _, r in df.iterrows()]
        for ax in grid.ravel():
            ax.set_visible(False)
    else:
        n = len(df)
        ncols = min(n, 4)
        fig = Figure(figsize=(max(7.0, 3.9 * ncols), 2.9 * math.ceil(n / ncols) + 1.1),
                     layout="constrained")
        axes = fig.subplots(math.ceil(n / ncols), ncols, squeeze=False).ravel()
        for ax in axes:
            ax.set_visible(False)
        cells = list(zip(axes, (r for _, r in df.iterrows())))
    cols = [c[0] for c in cats + net]
    for ax, row in cells:
        ax.set_visible(True)
        per_stage = stages[stages["config_id"] == row["config_id"]].groupby("stage")[cols].mean()
        x = per_stage.index.to_numpy()
        bottom = 0
        for col, label, color in cats:
            ax.bar(x - 0.14, per_stage[col], bottom=bottom, color=color, label=label,
                   width=0.56, edgecolor="white", linewidth=0.4)
            bottom = bottom + per_stage[col]
        bottom = 0
        for col, label, color in net:
            ax.bar(x + 0.3, per_stage[col], bottom=bottom, color=color, label=label, width=0.2,
                   edgecolor=color, linewidth=0.4, hatch="////", alpha=0.85)
            bottom = bottom + per_stage[col]
        parts = [value_label(c, row[c]) for c in varying] or [row["method_label"]]
        it = row.get("iteration_s")
        head = " · ".join(parts)
        if it is not None and it == it:
            head += f"\niteration {_seconds(it)}"
        ax.set_title(head, fontsize=9)
        ax.set_xlabel("pipeline stage", fontsize=9)
        ax.set_xticks(list(x))
        ax.set_ylabel("time per iteration (s)", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = cells[0][0].get_legend_handles_labels()
    per_row = 3 if fig.get_figwidth() >= 11 else 2
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), per_row),
               fontsize=9)
    fig.suptitle(title or _auto_title(df, "breakdown", width=int(fig.get_figwidth() * 11)),
                 fontsize=11)
    return fig


def _sort_value(v):
    """Sort key of a configuration value: methods in palette order, numbers as numbers."""
    if isinstance(v, str):
        return method_sort_key(v)
    return (0, v)


def _seconds(x: float) -> str:
    return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.3g} ms"


def plot_bubble(df, title: str | None = None):
    """Bubble fraction vs micro-batches per iteration (m = macro_batch / micro_batch),
    GPipe vs 1F1B, with GPipe's closed form (p - 1) / (m + p - 1); and, when the
    table has it, the peak number of in-flight micro-batches per stage (memory)."""
    _require(df, ["schedule", "pp", "macro_batch", "micro_batch", "bubble_fraction"], "bubble")
    import numpy as np  # lazy: numpy is heavy, needed only here

    df = df.copy()
    df["m"] = df["macro_batch"] / df["micro_batch"]
    has_mem = "peak_inflight" in df.columns and df["peak_inflight"].notna().any()
    panels = _panels(df, ["schedule", "micro_batch", "macro_batch"])
    ncols = 2 if has_mem else 1
    from matplotlib.figure import Figure  # lazy: matplotlib is heavy, needed only here

    fig = Figure(figsize=(5.2 * ncols, 3.8 * len(panels) + 0.6), layout="constrained")
    grid = fig.subplots(len(panels), ncols, squeeze=False)
    for (ptitle, g), axrow in zip(panels, grid):
        ax = axrow[0]
        ms = np.array(sorted(g["m"].unique()))
        for i, (sched, s) in enumerate(sorted(g.groupby("schedule"), key=lambda kv: kv[0] != "gpipe")):
            s = s.groupby("m")[["bubble_fraction"] + (["peak_inflight"] if has_mem else [])].mean()
            style = dict(color=SCHEDULE_COLORS.get(sched, "#555555"), marker="os^"[i % 3],
                         linestyle=("-", "--", ":")[i % 3], markersize=7 - 2 * i,
                         label=SCHEDULE_NAMES.get(sched, sched))
            ax.plot(s.index, s["bubble_fraction"], **style)
            if has_mem:
                axrow[1].plot(s.index, s["peak_inflight"], **style)
        for p in sorted(g["pp"].unique()):
            ax.plot(ms, (p - 1) / (ms + p - 1), color="black", linewidth=0.8, linestyle=(0, (2, 2)),
                    label=f"ideal (p-1)/(m+p-1), p={p}" if g["pp"].nunique() > 1
                    else "ideal (p-1)/(m+p-1)")
        for a in axrow:
            a.set_xscale("log", base=2)
            a.set_xticks(ms, [f"{m:g}" for m in ms])
            a.set_xticks([], minor=True)
            a.set_xlabel("micro-batches per iteration (m)")
            a.grid(True, alpha=0.3)
            if ptitle:
                a.set_title(ptitle, fontsize=10)
        ax.set_ylabel("pipeline bubble fraction")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
        if has_mem:
            axrow[1].set_ylabel("peak in-flight micro-batches per stage")
            axrow[1].set_ylim(bottom=0)
    fig.suptitle(title or _auto_title(df, "bubble", width=int(fig.get_figwidth() * 11)),
                 fontsize=11)
    return fig


def validation_pairs(df, metric: str = "throughput_samples_per_s"):
    """Predicted/measured pairs from a validate table in any of three layouts:
    wide ``predicted_<metric>``/``measured_<metric>``, wide ``<metric>_predicted``/
    ``<metric>_measured``, or long (a ``source`` column, predicted and measured rows
    of the same configuration). Returns a DataFrame with ``predicted``, ``measured``
    and the configuration columns."""
    import pandas as pd  # lazy: pandas is heavy, needed only here

    if df is None or len(df) == 0:
        raise ConfigError("validation: the table is empty")
    for p, m in ((f"predicted_{metric}", f"measured_{metric}"),
                 (f"{metric}_predicted", f"{metric}_measured")):
        if p in df.columns and m in df.columns:
            out = df.rename(columns={p: "predicted", m: "measured"})
            break
    else:
        if "source" not in df.columns or metric not in df.columns:
            raise ConfigError(f"validation: no predicted/measured {metric} columns and no "
                              "'source' column in the table")
        keys = config_columns(df)
        pred = df[df["source"] == "predicted"].groupby(keys, dropna=False)[metric].mean()
        meas = df[df["source"] == "measured"].groupby(keys, dropna=False)[metric].mean()
        out = pd.concat({"predicted": pred, "measured": meas}, axis=1).dropna().reset_index()
    out = out.dropna(subset=["predicted", "measured"])
    if out.empty:
        raise ConfigError("validation: no configuration has both a predicted and a measured value")
    return out


def plot_validation(df, metric: str = "throughput_samples_per_s", title: str | None = None):
    """Predicted vs measured: a scatter with the y = x line and a +-10 % band (colour
    per method, marker per bandwidth) and, when the table has bandwidths, the signed
    error of each configuration vs bandwidth. The title gives the MAPE and worst row."""
    import numpy as np  # lazy: numpy is heavy, needed only here
    from matplotlib.lines import Line2D  # lazy: matplotlib is heavy, needed only here
    from matplotlib.patches import Patch  # lazy: matplotlib is heavy, needed only here

    pairs = add_method_column(validation_pairs(df, metric))
    pairs["error"] = 100 * (pairs["predicted"] - pairs["measured"]) / pairs["measured"]
    has_bw = "bandwidth_bps" in pairs.columns and pairs["bandwidth_bps"].notna().all()
    fig, axes = _figure(2 if has_bw else 1, width=5.6, height=5.0)
    ax = axes[0]
    styles = method_styles(pairs["method"])
    bws = sorted(pairs["bandwidth_bps"].unique()) if has_bw else [None]
    groups = sorted(pairs.groupby("method"), key=lambda kv: method_sort_key(kv[0]))
    for method, g in groups:
        for j, bw in enumerate(bws):
            h = g if bw is None else g[g["bandwidth_bps"] == bw]
            if not h.empty:
                ax.scatter(h["measured"], h["predicted"], color=styles[method]["color"],
                           marker=MARKERS[j % len(MARKERS)], s=46, edgecolor="white",
                           linewidth=0.5, zorder=3)
    lo = min(pairs["measured"].min(), pairs["predicted"].min()) * 0.85
    hi = max(pairs["measured"].max(), pairs["predicted"].max()) * 1.15
    if lo > 0 and hi / lo > 10:
        log_axis(ax, "x")
        log_axis(ax, "y")
        xs = np.geomspace(lo, hi, 50)
    else:
        lo = 0 if lo < 0.3 * hi else lo  # zoom in on clustered points
        xs = np.linspace(lo, hi, 50)
    ax.plot(xs, xs, color="black", linewidth=0.9, label="predicted = measured")
    ax.fill_between(xs, xs * 0.9, xs * 1.1, color="black", alpha=0.08, label="±10 %")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    unit = METRIC_LABELS.get(metric, metric)
    ax.set_xlabel(f"measured {unit}")
    ax.set_ylabel(f"predicted {unit}")
    ax.grid(True, alpha=0.3)
    labels = dict(zip(pairs["method"], pairs["method_label"]))
    handles = [Patch(color=styles[m]["color"], label=labels[m]) for m, _ in groups]
    if has_bw:
        handles += [Line2D([], [], color="#606060", marker=MARKERS[j % len(MARKERS)],
                           linestyle="", label=bandwidth_label(bw)) for j, bw in enumerate(bws)]
    handles += ax.get_legend_handles_labels()[0]
    # below the panels: over- (upper left) and under-predictions (lower right) stay visible
    fig.legend(handles=handles, fontsize=8, loc="outside lower center",
               ncols=min(len(handles), 5 if has_bw else 3))
    if has_bw:
        ax2 = axes[1]
        for method, g in groups:
            e = g.groupby("bandwidth_bps")["error"].mean()
            ax2.plot(e.index, e.to_numpy(), label=labels[method], markersize=6, **styles[method])
        for y, alpha in ((5, 0.5), (10, 0.9)):
            for sign in (1, -1):
                ax2.axhline(sign * y, color="black", linewidth=0.7, alpha=alpha, linestyle=":")
        ax2.axhline(0, color="black", linewidth=0.9)
        bandwidth_axis(ax2, pairs["bandwidth_bps"])
        span = float(pairs["error"].abs().max())
        ax2.set_ylim(min(-12.0, float(pairs["error"].min()) - 0.1 * span),
                     max(12.0, float(pairs["error"].max()) + 0.1 * span))
        ax2.set_ylabel("prediction error (%)")
        ax2.set_title("(predicted - measured) / measured; dotted: ±5 %, ±10 %", fontsize=10)
        ax2.legend(fontsize=8, title="method", title_fontsize=8)
    mape = pairs["error"].abs().mean()
    worst = pairs["error"].abs().max()
    sep = ": " if has_bw else "\n"
    fig.suptitle(title or f"Predicted vs measured {unit}{sep}{len(pairs)} configurations, "
                 f"MAPE {mape:.1f} %, worst {worst:.1f} %", fontsize=11)
    return fig


def _auto_title(df, kind: str, width: int = 70) -> str:
    what = {"throughput": "Throughput vs bandwidth", "speedup": "Speed-up over uncompressed",
            "breakdown": "Time per iteration by stage", "bubble": "Pipeline bubble: GPipe vs 1F1B"}[kind]
    fixed = []
    for col in ("model", "pp", "dp", "schedule", "micro_batch", "macro_batch"):
        if col in df.columns and df[col].astype(str).nunique() == 1 and df[col].notna().all():
            v = df[col].iloc[0]
            fixed.append(str(v) if col == "model" else value_label(col, v))
    for col, label in (("grad_compress", "grad"), ("compress", "pipeline")):
        if (kind != "breakdown" and col in df.columns and df[col].astype(str).nunique() == 1
                and not is_none(df[col].iloc[0])):
            v = df[col].iloc[0]
            fixed.append(grad_name(v) if col == "grad_compress" else f"pipeline: {method_name(v)}")
    if not fixed:
        return what
    tail = ", ".join(fixed)
    if len(what) + len(tail) + 3 <= width:
        return f"{what} ({tail})"

    return what + "\n" + textwrap.fill(tail, width=max(width, 30), break_on_hyphens=False)


# ---------------------------------------------------------------- entry points

def make_figure(kind: str, df, stages=None, *, metric: str = "throughput_samples_per_s",
                baseline: str | None = None, title: str | None = None, filters=()):
    """Build the figure ``kind`` (one of :data:`KINDS`) from a summary table."""
    if kind not in KINDS:
        raise ConfigError(f"plot kind {kind!r}: unknown (choose from {', '.join(KINDS)})")
    if df is None or len(df) == 0:
        raise ConfigError(f"{kind}: the table is empty")
    if metric not in df.columns and kind in ("throughput", "speedup"):
        _column(df, metric)
    df = apply_filters(df, filters)
    if kind == "throughput":
        return plot_throughput(df, metric=metric, title=title)
    if kind == "speedup":
        return plot_speedup(df, baseline=baseline, metric=metric, title=title)
    if kind == "breakdown":
        return plot_breakdown(df, stages, title=title)
    if kind == "bubble":
        return plot_bubble(df, title=title)
    return plot_validation(df, metric=metric, title=title)
