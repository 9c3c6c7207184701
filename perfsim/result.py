"""One schema for predicted and measured results.

The simulator returns a :class:`Result` with ``source="predicted"``; the runtime
writes one with ``source="measured"``. Same columns, so ``perfsim validate``
can compare any row with any other.

A Result has four tables:
  summary      one dict: the configuration columns + the headline figures
  stages       one row per (replica, stage): time split and bytes
  microbatches one row per (stage, micro-batch): fwd/bwd compute and comm
               (the AQ-SGD paper's breakdown table)
  links        one row per directed link: bytes carried, busy time
and optionally ``trace_events`` in Chrome trace-event format.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any
from perfsim.errors import ConfigError
from perfsim.outputs import LIST_SEP, write_bytes, write_text

#: configuration columns, in order (CSV contract of `perfsim predict`)
CONFIG_COLUMNS = [
    "model", "bandwidth_bps", "latency_s", "compress", "grad_compress", "schedule",
    "pp", "dp", "micro_batch", "macro_batch",
]
#: headline figure columns
FIGURE_COLUMNS = [
    "throughput_samples_per_s", "throughput_tokens_per_s", "iteration_s", "bubble_fraction",
    "compute_s", "comm_s", "encode_s", "idle_s", "dp_sync_s", "optimizer_s",
    "pipeline_bytes", "dp_bytes", "peak_inflight", "epoch_s", "source",
]
SUMMARY_COLUMNS = CONFIG_COLUMNS + FIGURE_COLUMNS
STAGE_COLUMNS = ["replica", "stage", "compute_s", "comm_s", "encode_s", "idle_s", "dp_sync_s",
                 "bytes_sent", "peak_inflight"]
MICROBATCH_COLUMNS = ["stage", "microbatch", "fwd_compute_s", "fwd_comm_s", "bwd_compute_s",
                      "bwd_comm_s", "encode_s"]
LINK_COLUMNS = ["src", "dst", "bytes", "busy_s"]
#: every kind of bytes a summary counts as sent per iteration, all ranks (:mod:`perfsim.engine.report`):
#: pipeline activations and gradients, the data-parallel sync, the tensor- and expert-parallel
#: collectives, the tied-embedding all-reduce
SENT_BYTES_COLUMNS = ("pipeline_bytes", "dp_bytes", "tp_bytes", "ep_bytes", "tied_bytes")


def bytes_sent(summary: dict[str, Any]) -> float:
    """All bytes one iteration sends, every rank and kind (:data:`SENT_BYTES_COLUMNS`; a missing
    or None column counts 0, as in a measured summary without tensor parallelism)."""
    return float(sum(summary.get(k) or 0 for k in SENT_BYTES_COLUMNS))


@dataclass
class Result:
    """Predicted or measured performance of one configuration."""

    summary: dict[str, Any]
    stages: list[dict[str, Any]] = field(default_factory=list)
    microbatches: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    trace_events: list[dict[str, Any]] = field(default_factory=list)
    #: measured results: mean training loss per optimizer step (``losses.csv``)
    losses: dict[int, float] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The summary as one flat row in SUMMARY_COLUMNS order (extra keys after)."""
        ordered = {k: self.summary.get(k) for k in SUMMARY_COLUMNS}
        ordered.update({k: v for k, v in self.summary.items() if k not in ordered})
        return ordered

    def to_frame(self, table: str = "summary"):
        """A pandas DataFrame of one table: ``summary`` (one row, :meth:`row`),
        ``stages``, ``microbatches`` or ``links`` (columns as in the module docstring)."""
        import pandas as pd  # lazy: pandas is heavy, needed only here

        tables = {"summary": ([self.row()], SUMMARY_COLUMNS), "stages": (self.stages, STAGE_COLUMNS),
                  "microbatches": (self.microbatches, MICROBATCH_COLUMNS),
                  "links": (self.links, LINK_COLUMNS)}
        if table not in tables:
            raise ConfigError(f"table {table!r}: choose from {', '.join(tables)}")
        rows, columns = tables[table]
        df = pd.DataFrame(rows)
        return df if len(df.columns) else pd.DataFrame(columns=columns)

    def __repr__(self) -> str:
        s = self.summary
        head = " ".join(f"{k}={s[k]!r}" for k in ("model", "compress", "grad_compress", "pp", "dp")
                        if k in s)
        figs = []
        if "throughput_samples_per_s" in s:
            figs.append(f"{s['throughput_samples_per_s']:.4g} samples/s")
        if "iteration_s" in s:
            figs.append(f"iteration {s['iteration_s']:.4g} s")
        return (f"Result({s.get('source', '?')}: {head}; {', '.join(figs)}; "
                f"{len(self.stages)} stage rows, {len(self.microbatches)} micro-batch rows, "
                f"{len(self.links)} link rows)")

    def _repr_html_(self) -> str:  # notebooks: the summary as a table
        return self.to_frame().T.to_html(header=False)

    def to_json_dict(self) -> dict[str, Any]:
        return {"summary": self.row(), "stages": self.stages, "microbatches": self.microbatches,
                "links": self.links}

    def write_trace(self, path: str | os.PathLike) -> None:
        """Write the timeline as a Chrome/Perfetto trace (opens in ui.perfetto.dev)."""
        atomic_write_text(path, self.trace_text())

    def trace_text(self) -> str:
        """The timeline as Chrome/Perfetto trace JSON (what :meth:`write_trace` writes)."""
        return json.dumps({"traceEvents": self.trace_events, "displayTimeUnit": "ms"})


def notes_of(cell: Any) -> list[str]:
    """A summary's ``notes`` as the list :func:`perfsim.api.prediction_notes` made, from
    wherever it was read: a list (a Result, JSON), an array (a Parquet table), the text a CSV
    cell holds (the notes joined by :data:`perfsim.outputs.LIST_SEP`), or nothing (None,
    NaN, an empty cell: no note)."""
    if cell is None or (isinstance(cell, float) and cell != cell):
        return []
    if isinstance(cell, str):
        return [n for n in cell.split(LIST_SEP) if n]
    return [str(n) for n in cell]


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`perfsim.outputs.write_text`, the one writer)."""
    write_text(path, text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Binary twin of :func:`atomic_write_text`."""
    write_bytes(path, data)
