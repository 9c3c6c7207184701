"""Terminal rendering of ``perfsim predict`` results (rich tables)."""

from __future__ import annotations

import io
from collections import defaultdict
from itertools import zip_longest

from rich.console import Console
from rich.table import Table

from perfsim.commands import interval_text
from perfsim.hardware import value_precision
from perfsim.units import format_bandwidth, format_bytes, format_time
from perfsim.memory import breakdown_text


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _cell(s: dict, key: str, fmt) -> str:
    """One configuration cell; the compression columns as sent: under 16-bit precision
    the plain specs (``fp32``, ``none``) send the training dtype
    (:func:`perfsim.engine.plan.native_specs`)."""
    values = value_precision(s.get("precision") or "")
    if key in ("compress", "grad_compress") and values in ("fp16", "bf16") \
            and str(s[key]).lower() in ("fp32", "none"):
        return f"none ({values})"
    return fmt(s[key])


def _label(column: str, value) -> str:
    """A parameter's value in a grid's table, by its column's unit (``_bps``, ``_s``, ``_bytes``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for suffix, fmt in (("_bps", format_bandwidth), ("_s", format_time), ("_bytes", format_bytes)):
            if column.endswith(suffix):
                return fmt(value)
    return "" if value is None else str(value)


def render(results, file=None, width: int | None = None, color: bool = True,
           labels: list[dict] | None = None) -> str | None:
    """Print to ``file`` (a rich console) or, with ``file=None``, return plain text.
    ``labels``: per result, ``{column: value}`` of the parameters its grid varies
    (:func:`perfsim.params.column`); a grid's table has a column for each one that its
    standard columns do not show (``gpu``, ``seq_len`` ...). One configuration's table names
    the GPU (else the profile's device), precision and TP degree it priced, and a row for
    each label (there: the parameters given) that its standard rows do not show."""
    # no terminal to fit (a pipe, a file, returned text): text wraps at 140 columns (or ``width``), a
    # grid's table keeps its own width, so no cell is cut short
    piped = file is None or not getattr(file, "isatty", lambda: False)()
    if piped and width is None and file is not None:
        width = 140

    console = Console(file=file if file is not None else io.StringIO(), width=width, no_color=not color,
                      record=file is None, force_terminal=False if file is None else None)
    many = len(results) > 1
    cfg_cols = [("model", "model", str), ("bandwidth", "bandwidth_bps", format_bandwidth),
                ("latency", "latency_s", lambda x: format_time(x) if x else "0"),
                ("compress", "compress", str), ("grad", "grad_compress", str), ("sched", "schedule", str),
                ("pp", "pp", str), ("dp", "dp", str), ("mb", "micro_batch", str), ("MB", "macro_batch", str)]
    fig_cols = [("samples/s", lambda s: f"{s['throughput_samples_per_s']:.3g}"),
                ("tokens/s", lambda s: f"{s['throughput_tokens_per_s']:.4g}"),
                ("iteration", lambda s: format_time(s["iteration_s"])),
                ("80 % interval", interval_text),
                ("bubble", lambda s: f"{s['bubble_fraction']:.1%}"),
                # the run asked for (--epochs), warm-up included: a steady epoch alone showed AQ-SGD's
                # compressed pace for a 1-epoch run that is all uncompressed warm-up
                ("run", lambda s: format_time(s["total_s"])),
                ("pipe bytes", lambda s: format_bytes(s["pipeline_bytes"])),
                ("dp bytes", lambda s: format_bytes(s["dp_bytes"]))]
    # the other bytes sent, where any configuration sends them: a tied-embedding all-reduce is timed in the
    # dp sync, and a table whose dp bytes said 0 B read as no data-parallel traffic at all
    for name, key in (("tp bytes", "tp_bytes"), ("ep bytes", "ep_bytes"), ("tied bytes", "tied_bytes")):
        if any(r.summary.get(key) for r in results):
            fig_cols.append((name, lambda s, key=key: format_bytes(s.get(key) or 0)))
    if many:  # one row per configuration; only the columns that vary (GPU-model axes too)
        sweep_cols = cfg_cols + [("tp", "tp", str), ("cp", "cp", str), ("ep", "ep", str), ("precision", "precision", str),
                                 ("recompute", "recompute", str), ("attention", "attention", str),
                                 ("tied", "tied_embedding", str)]
        varying = [c for c in sweep_cols if len({str(r.summary.get(c[1])) for r in results}) > 1] or cfg_cols[:1]
        labels = labels or [{} for _ in results]
        drawn = {key for _, key, _ in sweep_cols}
        other = [k for k in dict.fromkeys(k for row in labels for k in row) if k not in drawn]
        t = Table(title=f"perfsim predict ({len(results)} configurations)", title_justify="left")
        for name in [n for n, _, _ in varying] + other:
            t.add_column(name)
        for name, _ in fig_cols:
            t.add_column(name, justify="right")
        for r, extra in zip(results, labels):
            s = r.summary
            t.add_row(*[_cell(s, key, fmt) for _, key, fmt in varying], *[_label(k, extra.get(k)) for k in other],
                      *[f(s) for _, f in fig_cols])
        text_width = console.width
        if piped:  # rich caps a print's width at the console's
            console.width = max(text_width, console.measure(t, options=console.options.update(max_width=1000)).maximum)
        console.print(t)
        console.width = text_width
    else:
        s = results[0].summary
        t = Table(title="perfsim predict", title_justify="left", show_header=False)
        t.add_column("configuration")
        t.add_column("value")
        t.add_column("figure")
        t.add_column("value", justify="right")
        # what was priced: the GPU (or the profile's device), precision and TP degree, then each
        # setting given that no row shows (labels: --zero, --seq-len, --profile ...)
        single_cols = cfg_cols + [("gpu", "gpu", lambda g: g or f"{s.get('profile_device') or 'unknown'} (profile)"),
                                  ("precision", "precision", str), ("tp", "tp", str)]
        drawn = {key for _, key, _ in single_cols} | {"topology"}  # the topology: in the bandwidth row
        given = [(k, _label(k, v)) for k, v in (labels or [{}])[0].items() if k not in drawn]
        topology = {"bandwidth_bps": f"topology {s.get('topology')}",  # its links, not one rate and latency:
                    "latency_s": f"topology's, up to {format_time(s['latency_s'])}"}  # the summary's are its extremes
        cfg = [(n, topology[key] if key in topology and s.get("topology") else _cell(s, key, fmt))
               for n, key, fmt in single_cols] + given
        figs = [(n, f(s)) for n, f in fig_cols]
        for (a, b), (c, d) in zip_longest(cfg, figs, fillvalue=("", "")):
            t.add_row(a, b, c, d)
        console.print(t)
    if not many:
        r = results[0]
        s = r.summary
        st = Table(title="per stage (seconds per iteration)", title_justify="left")
        for col in ("replica", "stage", "layers", "compute", "comm (overlapped)", "encode/decode", "dp sync",
                    "optimizer", "idle", "sent", "peak in-flight"):
            st.add_column(col, justify="right")
        for row in r.stages:
            st.add_row(str(row["replica"]), str(row["stage"]), row["layers"], f"{row['compute_s']:.3f}",
                       f"{row['comm_s']:.3f}", f"{row['encode_s']:.4f}", f"{row['dp_sync_s']:.3f}",
                       f"{row['optimizer_s']:.4f}", f"{row['idle_s']:.3f}", format_bytes(row["bytes_sent"]),
                       str(row["peak_inflight"]))
        console.print(st)
        mt = Table(title="per micro-batch (ms, mean over micro-batches; full table with --format csv/json)",
                   title_justify="left")
        for col in ("stage", "fwd comp", "fwd comm", "bwd comp", "bwd comm", "encode/decode"):
            mt.add_column(col, justify="right")
        acc = defaultdict(lambda: defaultdict(float))
        count = defaultdict(int)
        for row in r.microbatches:
            count[row["stage"]] += 1
            for k in ("fwd_compute_s", "fwd_comm_s", "bwd_compute_s", "bwd_comm_s", "encode_s"):
                acc[row["stage"]][k] += row[k]
        for stage in sorted(acc):
            a, n = acc[stage], count[stage]
            mt.add_row(str(stage), _ms(a["fwd_compute_s"] / n), _ms(a["fwd_comm_s"] / n),
                       _ms(a["bwd_compute_s"] / n), _ms(a["bwd_comm_s"] / n), _ms(a["encode_s"] / n))
        console.print(mt)
        console.print(f"iteration {format_time(s['iteration_s'])}: {s['throughput_samples_per_s']:.3f} samples/s, "
                      f"{s['throughput_tokens_per_s']:.0f} tokens/s, bubble {s['bubble_fraction']:.1%}; "
                      f"{s['epochs']} epoch(s) of {s['iterations_per_epoch']} iterations: "
                      f"{format_time(s['total_s'])} ({s['events']} events simulated, source={s['source']})")
        if s.get("tp", 1) > 1 or s.get("cp", 1) > 1:
            what = " and ".join(([f"tensor parallel {s['tp']}"] if s.get("tp", 1) > 1 else [])
                                + ([f"context parallel {s['cp']} (the exchanges the attention does not hide)"]
                                   if s.get("cp", 1) > 1 else []))
            console.print(f"{what}: {format_time(s['tp_comm_s'])} of collectives per stage (serial with compute)")
        if s.get("ep", 1) > 1:
            how = (f"{format_time(s['ep_hidden_s'])} of them hidden beside another micro-batch's compute, "
                   "--ep-overlap" if s.get("ep_overlap") else "serial with compute")
            console.print(f"expert parallel {s['ep']}: {format_time(s['ep_comm_s'])} of token all-to-alls per "
                          f"stage and iteration (dispatch and combine, {how}; in the stages' "
                          f"layer collectives), {format_bytes(s['ep_bytes'])} sent per iteration")
        if s.get("tied_bytes"):
            console.print(f"tied embedding: the first and the last stage all-reduce its gradient after the "
                          f"data-parallel sync, {format_bytes(s['tied_bytes'])} sent per iteration (in dp sync; "
                          f"--tied-embedding untied trains a separate head instead)")
        if s.get("gpus_per_node", 1) > 1 and s["gpus"] > s["gpus_per_node"]:
            # say how --bandwidth was read: the node's NICs are shared by all its GPUs
            nics = s["nics_per_node"]
            console.print(f"network: {s['gpus_per_node']} GPUs per node share {nics} NIC(s) of "
                          f"{format_bandwidth(s['bandwidth_bps'] / nics)} between nodes "
                          f"(--nic {s['gpus_per_node']}x<rate> gives every GPU its own), "
                          f"{format_bandwidth(s['intra_node_bandwidth_bps'])} inside a node")
        if s.get("peak_memory_gib") is not None:
            worst = max(r.stages, key=lambda x: x["memory_gib"] or 0)
            fits = "" if s["fits"] is None else (" -- fits in " if s["fits"] else " -- does NOT fit in ") + \
                f"{s['memory_capacity_gib']:.0f} GiB ({s['gpu']})"
            parts = breakdown_text(worst["weights_gib"], worst["grads_gib"], worst["optimizer_state_gib"],
                                   worst["activations_gib"], worst["buffers_gib"],
                                   worst.get("sharding_buffers_gib") or 0.0)
            console.print(f"memory: peak {s['peak_memory_gib']:.1f} GiB per GPU on stage {worst['stage']} "
                          f"({parts}){fits}")
            if s.get("host_memory_gib"):
                console.print(f"offload: gradients and optimizer state in host memory, {s['host_memory_gib']:.1f} GiB per GPU")
        if s.get("model_note"):
            console.print(f"model: {s['model']}: {s['model_note']}")
        if s.get("compute_model"):
            console.print(f"compute: {s['compute_model']}")
        if s.get("shard_host_note"):  # a CPU profile's ZeRO-3 (perfsim.engine.sharding.fsdp_host_note)
            console.print(f"sharding: {s['shard_host_note']}")
        cap, link = s.get("tcp_rate_cap_bps"), s.get("link_rate_bps")
        if cap and link and cap < link:  # the TCP window binds (perfsim.tcp)
            console.print(f"tcp window: {s['tcp_window']}; at most {format_bandwidth(cap)} per message over the "
                          f"{2e3 * s['latency_s']:g} ms round trip, below the link's {format_bandwidth(link)} "
                          f"(--tcp-window, --tcp-connections)")
        if s.get("interval_note"):
            console.print(f"uncertainty: {s['interval_note']}")
    if file is None:
        return console.export_text()
    return None
