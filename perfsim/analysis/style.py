"""Shared look of perfsim figures: one colour per compression method family,
readable names and units, log axes with plain labels.

Every figure in :mod:`perfsim.analysis.plots` (and the notebooks) takes its
colours from :data:`METHOD_COLORS`, so AQ-SGD is the same blue everywhere.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from perfsim import params
from perfsim.compression.spec import DISPLAY, Spec, parse_spec
from perfsim.errors import ConfigError
from perfsim.units import format_bandwidth

#: one colour per compressor family, shared by every figure
METHOD_COLORS = {
    "fp32": "#404040", "none": "#404040",
    "fp16": "#8c564b", "bf16": "#c49c94",
    "directq": "#ff7f0e",
    "aqsgd": "#1f77b4",
    "qsgd": "#2ca02c", "qsgd-maxnorm": "#2ca02c",
    "maxnorm": "#17becf",
    "ecq": "#d62728", "ecq-sgd": "#d62728",
    "onebit": "#9467bd", "onebit-adam": "#9467bd", "onebit-lamb": "#9467bd",
    "powersgd": "#e377c2",
    "topk": "#bcbd22", "randk": "#7f7f7f",
}
_FALLBACK_COLORS = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#dbdb8d")
#: display names of compressor families (perfsim.compression.spec.DISPLAY)
METHOD_NAMES = DISPLAY
SCHEDULE_COLORS = {"gpipe": "#1b9e77", "1f1b": "#d95f02"}
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}
#: time categories of the breakdown, bottom to top
#: time categories of the breakdown: the stacked bar partitions the iteration
#: (busy categories, then the rest = waiting); the narrow bar beside it shows
#: network activity, which may overlap the busy time
BREAKDOWN = (("compute_s", "compute", "#4c72b0"), ("encode_s", "encode/decode", "#8172b3"),
             ("optimizer_s", "optimizer step", "#64b5cd"),
             ("wait_s", "waiting (exposed comm., bubble)", "#cfcfcf"))
NETWORK = (("comm_s", "communication (may overlap)", "#dd8452"),
           ("dp_sync_s", "DP gradient sync (may overlap)", "#55a868"))
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")
#: configuration columns that may become panels, in order (then every other parameter's column:
#: :func:`config_columns`)
PANEL_COLUMNS = ("model", "schedule", "pp", "dp", "micro_batch", "macro_batch", "latency_s",
                 "grad_compress", "compress", "bandwidth_bps")


def config_columns(df) -> list[str]:
    """The columns of ``df`` that describe a configuration: :data:`PANEL_COLUMNS`, then every
    other predict parameter's column (:func:`perfsim.params.column`: ``gpu``, ``precision``,
    ``seq_len``, ``bucket_size_bytes`` ...). Rows that differ in one of them are different
    configurations, never averaged into one point."""
    cols = [c for c in PANEL_COLUMNS if c in df.columns]
    return cols + [c for c in dict.fromkeys(params.column(n) for n in params.NAMES)
                   if c in df.columns and c not in cols]


# ---------------------------------------------------------------- labels and styles

def _spec(spec: Any, role: str = "pipeline"):
    if spec is None or (isinstance(spec, float) and math.isnan(spec)):
        return None
    try:
        return parse_spec(spec if isinstance(spec, Spec) else str(spec), role)  # table text, or a value
    except ConfigError:
        return None


def family(spec: Any) -> str:
    """``"aqsgd:fw3bw6"`` -> ``"aqsgd"`` (the spec's registry name); missing -> ``"none"``."""
    parsed = _spec(spec, "grad")
    if parsed is None:
        return str(spec).split(":")[0].strip().lower() if spec is not None and spec == spec else "none"
    return parsed.name


def method_color(spec: Any) -> str:
    """The colour of a method in every figure (by compressor family)."""
    fam = family(spec)
    if fam in METHOD_COLORS:
        return METHOD_COLORS[fam]
    return _FALLBACK_COLORS[sum(map(ord, fam)) % len(_FALLBACK_COLORS)]


def method_name(spec: Any, role: str = "pipeline") -> str:
    """Readable name (:attr:`perfsim.compression.spec.Spec.label`): ``"aqsgd:fw3bw6"``
    -> ``"AQ-SGD fw3 bw6"``, ``"qsgd-maxnorm:4"`` -> ``"QSGD-MaxNorm 4-bit"``."""
    parsed = _spec(spec, role) or _spec(spec, "grad")
    return parsed.label if parsed is not None else str(spec)


def grad_name(spec: Any) -> str:
    """Name of a data-parallel gradient compression: ``"none"`` -> ``"FP32 gradients"``."""
    if family(spec) in ("none", "fp32"):
        return "FP32 gradients"
    return f"{method_name(spec, 'grad')} gradients"


def bandwidth_label(bps: float) -> str:
    """``1e8`` -> ``"100 Mbps"``."""
    return re.sub(r"([\d.]+)", r"\1 ", format_bandwidth(float(bps)), count=1)


def value_label(col: str, value: Any) -> str:
    if col == "bandwidth_bps":
        return bandwidth_label(value)
    if col == "latency_s":
        return f"latency {float(value) * 1e3:g} ms"
    if col in ("compress", "grad_compress"):
        return grad_name(value) if col == "grad_compress" else method_name(value)
    if col == "schedule":
        return SCHEDULE_NAMES.get(str(value), str(value))
    return f"{col.replace('_', '-')}={value}"


def is_none(value: Any) -> bool:
    return family(value) in ("none",) or str(value).lower() in ("none", "fp32", "nan")


def add_method_column(df):
    """Add ``method`` (the varying compression setting), ``method_family`` and
    ``method_label`` columns. When only the pipeline compression varies the method
    is ``compress``; when only the DP gradient compression varies it is
    ``grad_compress``; when both vary, both."""
    df = df.copy()
    comp = df["compress"].fillna("fp32").astype(str) if "compress" in df else None
    grad = df["grad_compress"].fillna("none").astype(str) if "grad_compress" in df else None
    comp_varies = comp is not None and comp.nunique() > 1
    grad_varies = grad is not None and grad.nunique() > 1
    if grad_varies and not comp_varies:
        df["method"] = grad
        df["method_family"] = grad.map(family)
        df["method_label"] = grad.map(grad_name)
    elif grad_varies:
        df["method"] = comp + " | " + grad
        df["method_family"] = comp.map(family)
        df["method_label"] = [f"{method_name(c)}, {grad_name(g)}" for c, g in zip(comp, grad)]
    else:
        df["method"] = comp if comp is not None else "fp32"
        df["method_family"] = df["method"].map(family)
        df["method_label"] = df["method"].map(method_name)
    return df


def method_styles(methods: Iterable[str]) -> dict[str, dict]:
    """``{method: {color, linestyle, marker}}``: colour by family; variants within
    a family get distinct line styles and markers (in sorted order)."""
    out, seen = {}, {}
    for m in sorted(set(methods), key=method_sort_key):
        fam = family(m.split(" | ")[0])
        k = seen.get(fam, 0)
        seen[fam] = k + 1
        out[m] = {"color": method_color(fam), "linestyle": LINESTYLES[k % len(LINESTYLES)],
                  "marker": MARKERS[k % len(MARKERS)]}
    return out


def method_sort_key(m: str):
    order = list(METHOD_COLORS)
    fam = family(m.split(" | ")[0])
    return (order.index(fam) if fam in order else len(order), m)


def bandwidth_axis(ax, values) -> None:
    """Log bandwidth axis labelled in readable units ("100 Mbps"); the sweep's own
    bandwidths are the ticks when there are few, slanted when two are close."""
    # lazy: matplotlib is heavy, needed only here
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log")
    vals = sorted(set(float(v) for v in values))
    if len(vals) <= 8:
        ax.xaxis.set_major_locator(FixedLocator(vals))
        ax.xaxis.set_minor_locator(NullLocator())
        span = math.log10(vals[-1] / vals[0]) if len(vals) > 1 else 1.0
        gaps = [math.log10(b / a) for a, b in zip(vals, vals[1:])]
        if gaps and min(gaps) < span / 6:
            ax.tick_params(axis="x", labelrotation=35)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: bandwidth_label(x)))
    ax.set_xlabel("link bandwidth")
    ax.grid(True, which="major", alpha=0.3)


def log_axis(ax, axis: str = "y") -> None:
    """Log axis with plain numbers (1, 2, 5, 10, ...) instead of powers of ten."""
    # lazy: matplotlib is heavy, needed only here
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    getattr(ax, f"set_{axis}scale")("log")
    a = getattr(ax, f"{axis}axis")
    a.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    a.set_minor_formatter(NullFormatter())


METRIC_LABELS = {"throughput_samples_per_s": "throughput (samples/s)",
                  "throughput_tokens_per_s": "throughput (tokens/s)",
                  "iteration_s": "iteration time (s)", "epoch_s": "epoch time (s)"}
