"""One schema for predicted and measured results.

The simulator returns a :class:`Result` with ``source="predicted"``; the runtime
writes one with ``source="measured"``. Same columns, so ``perfsim validate``
can compare any row with any other (ARCHITECTURE.md, rule 2).

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


@dataclass
class Result:
    """Predicted or measured performance of one configuration."""

    summary: dict[str, Any]
    stages: list[dict[str, Any]] = field(default_factory=list)
    microbatches: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    trace_events: list[dict[str, Any]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The summary as one flat row in SUMMARY_COLUMNS order (extra keys after)."""
        ordered = {k: self.summary.get(k) for k in SUMMARY_COLUMNS}
        ordered.update({k: v for k, v in self.summary.items() if k not in ordered})
        return ordered

    def to_json_dict(self) -> dict[str, Any]:
        return {"summary": self.row(), "stages": self.stages, "microbatches": self.microbatches,
                "links": self.links}

    def write_trace(self, path: str | os.PathLike) -> None:
        """Write the timeline as a Chrome/Perfetto trace (opens in ui.perfetto.dev)."""
        atomic_write_text(path, json.dumps({"traceEvents": self.trace_events,
                                            "displayTimeUnit": "ms"}))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`perfsim.outputs.write_text`)."""
    from perfsim.outputs import write_text

    write_text(path, text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Binary twin of :func:`atomic_write_text`."""
    from perfsim.outputs import write_bytes

    write_bytes(path, data)
