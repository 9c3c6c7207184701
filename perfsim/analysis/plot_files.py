"""The files of a plot: its input tables read and its figure written.

:func:`load_tables` reads what ``perfsim plot`` draws from -- a sweep or validate table
(CSV or Parquet, with its per-stage sibling ``<stem>.stages.<ext>``), a Result JSON of
``perfsim predict --format json`` / ``perfsim run``, or either on standard input (``-``);
:func:`save_figure` writes a :mod:`perfsim.analysis.plots` figure as PNG, SVG or PDF (by
suffix) atomically, and :func:`check_figure_target` refuses a figure path before any work.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

from perfsim.analysis.sweep import config_id, read_table, sibling_path
from perfsim.documents import read_document
from perfsim.errors import ConfigError
from perfsim.outputs import check_file_target, is_stdio
from perfsim.result import atomic_write_bytes



#: figure formats by suffix
FIGURE_FORMATS = ("png", "svg", "pdf")


def check_figure_target(path: str | os.PathLike, what: str = "figure") -> str:
    """The format of a figure file (its suffix), refused with one line before any work
    when unknown or when the path cannot be written."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FIGURE_FORMATS:
        raise ConfigError(f"{what} {str(path)!r}: unknown format (use .png, .svg or .pdf)")
    check_file_target(path, what)
    return fmt


def save_figure(fig, path: str | os.PathLike, dpi: int = 150) -> Path:
    """Save as PNG, SVG or PDF (by suffix), atomically."""
    path = Path(path)
    fmt = "png" if is_stdio(path) else check_figure_target(path)  # -: a PNG on stdout
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())
    return path


def load_tables(path: str | os.PathLike, stages: str | os.PathLike | None = None):
    """Read a plot input: a sweep/validate table (``.csv`` / ``.parquet``; its per-stage
    sibling ``<stem>.stages.<ext>`` is picked up when present) or a Result JSON
    written by ``perfsim predict --format json`` / ``perfsim run`` (``{"summary", "stages"}``,
    or a list of them); ``-``: either, read from standard input. Returns ``(summary,
    stages or None)``."""
    import pandas as pd  # lazy: pandas is heavy, needed only here

    data = _stdin_table() if is_stdio(path) else None
    path = Path(path)
    if isinstance(data, pd.DataFrame):
        summary = data
        stage_df = read_table(stages, allow_empty=True) if stages else None
    elif data is not None or path.suffix.lower() == ".json":
        data = data if data is not None else read_document(path, "table", kind="json")
        results = data if isinstance(data, list) else [data]
        if not results or not all(isinstance(r, dict) and isinstance(r.get("summary"), dict)
                                  for r in results):
            raise ConfigError(f"table {str(path)!r}: expected a Result JSON "
                              "({\"summary\": ..., \"stages\": ...}) or a list of them")
        rows, stage_rows = [], []
        for r in results:
            cid = r["summary"].get("config_id") or config_id(r["summary"])
            rows.append({**r["summary"], "config_id": cid})
            stage_rows += [{"config_id": cid, **s} for s in r.get("stages") or []]
        summary, stage_df = pd.DataFrame(rows), pd.DataFrame(stage_rows)
    else:
        summary = read_table(path)
        candidate = Path(stages) if stages else sibling_path(path, "stages")
        if stages and not candidate.exists():
            raise ConfigError(f"stages table {str(candidate)!r}: not found")
        stage_df = read_table(candidate, allow_empty=True) if candidate.exists() else None
    return summary, (stage_df if stage_df is not None and len(stage_df) else None)


def _stdin_table():
    """The table on standard input: a Result JSON (parsed) or a CSV table (a DataFrame)."""
    import pandas as pd  # lazy: pandas is heavy, needed only here

    text = sys.stdin.read() if sys.stdin is not None else ""
    if not text.strip():
        raise ConfigError("table '-': standard input is empty")
    if text.lstrip()[:1] in "{[":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"table '-': malformed JSON ({exc})") from None
    try:
        df = pd.read_csv(io.StringIO(text))
    except Exception as exc:  # the parser's own errors: the input is the culprit
        raise ConfigError(f"table '-': unreadable CSV ({exc})") from None
    if df.empty:
        raise ConfigError("table '-': no rows")
    return df
