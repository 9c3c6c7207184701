"""Parameter sweeps: a grid of ``perfsim predict`` configurations, run in
parallel, written as one tidy table (one row per configuration).

A sweep is a :class:`SweepSpec`: for each ``predict`` parameter, the list of
values to try (the same comma lists as the ``perfsim predict`` flags, or a sweep
file in TOML). :func:`expand` takes the cartesian product; :func:`run_sweep`
runs every configuration through :func:`perfsim.api.predict` -- in this
process, or on the batch runner's process pool (:class:`perfsim.batch.BatchRunner`,
shared with ``perfsim plan``) when the grid is long enough for the pool to pay
(:func:`use_pool`) -- and writes

* ``OUT`` (``.csv`` or ``.parquet``): the predict summary schema
  (:data:`perfsim.result.SUMMARY_COLUMNS`, extra columns after -- among them each
  parameter given that the summary does not show, e.g. ``seq_len``,
  ``bucket_size_bytes``: :func:`perfsim.params.shown_columns` --, then ``config_id``),
  rows in grid order;
* ``OUT`` with suffix ``.stages.csv`` / ``.stages.parquet``: the per-stage
  tables (:data:`perfsim.result.STAGE_COLUMNS`) keyed by ``config_id``, which the
  breakdown plot reads;
* ``OUT`` with suffix ``.errors.csv`` when ``skip_invalid`` set and some
  configurations were rejected (a grid may hold combinations that do not fit).

Resuming: each finished configuration is appended at once, as one JSON line
written by a single ``os.write`` on an ``O_APPEND`` descriptor, to the part file
``OUT.part.jsonl``. A re-run reads the part file (and the rows of an existing
``OUT``), drops a torn last line, and skips every configuration whose
``config_id`` (a hash of its normalised parameters) is already there with the same
:func:`input_key` (column ``input_key``: perfsim's version and the SHA-256 of every
input file -- profile, topology, workload, config.json); a row whose inputs changed
is recomputed, and a warning says which input and how many rows. Stored rows of
another grid are never dropped: the sweep is refused (another ``out``, or
``resume=False`` / ``--overwrite``). The final files are written atomically and the
part file is removed only after that.

Sweep file (TOML), every key optional, a scalar or a list per key; dashes or
underscores::

    model = "gpt2-xl"
    bandwidth = ["10Gbps", "1Gbps", "100Mbps", "10Mbps"]
    compress = ["fp32", "directq:fw4bw8", "aqsgd:fw3bw6"]
    schedule = "gpipe"
    pp = 8
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from perfsim import outputs, params
from perfsim.params import plain  # specs stored as their canonical text
from perfsim.api import input_files, predict as api_predict
from perfsim.batch import BatchRunner, fork_context
from perfsim.documents import read_document
from perfsim.errors import ConfigError
from perfsim.provenance import input_key as key, stale_notes, stale_reasons
from perfsim.result import STAGE_COLUMNS, SUMMARY_COLUMNS, notes_of
from perfsim.units import EXAMPLE_UNITS, format_bandwidth, refuse_bare_number

log = logging.getLogger(__name__)

#: the parameters of :func:`perfsim.api.predict`, in the order a grid varies them
#: (last key varies fastest): :data:`perfsim.params.NAMES`
PARAMS = params.NAMES
TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
#: seconds a 2-worker pool costs before its first result (fork, process start, the
#: first batch's hand-over); ``python benchmarks/bench_startup.py`` measures it
#: (docs/validation.md, "Measurement notes")
POOL_STARTUP_S = 0.3


# ---------------------------------------------------------------- the grid

def normalize_value(key: str, value: Any) -> Any:
    """One parameter value in canonical form (:func:`perfsim.params.normalize`),
    so that ``"1Gbps"`` and ``"1000Mbps"`` are the same configuration."""
    return params.normalize(key, value)


@dataclass(frozen=True)
class SweepSpec:
    """The grid: for each predict parameter given, the values to try.

    values: ``{param: [value, ...]}``; keys from :data:`PARAMS` (dashes allowed),
      values scalars, comma lists or lists, normalised on construction.
    Parameters not given are left to ``predict``'s defaults.
    """

    values: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        try:
            grid = params.grid(self.values)
        except ConfigError as exc:
            raise ConfigError(f"sweep {exc}") from None
        object.__setattr__(self, "values", grid)

    @property
    def axes(self) -> list[str]:
        """Parameters with more than one value."""
        return [k for k, v in self.values.items() if len(v) > 1]

    def __len__(self) -> int:
        return math.prod(len(v) for v in self.values.values())

    def merged(self, overrides: Mapping[str, Any]) -> "SweepSpec":
        """A copy where each key of ``overrides`` (e.g. from CLI flags) replaces the file's."""
        base = dict(self.values)
        base.update({k.replace("-", "_"): v for k, v in overrides.items() if v is not None})
        return SweepSpec(base)


def expand(spec: SweepSpec) -> list[dict[str, Any]]:
    """The cartesian product of ``spec``, in :data:`PARAMS` order (last varies fastest)."""
    return params.expand(spec.values)


def config_id(params: Mapping[str, Any]) -> str:
    """A stable 16-hex-digit id of one configuration (hash of its canonical JSON)."""
    canon = json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True, default=str)
    return hashlib.sha1(canon.encode()).hexdigest()[:16]


def load_sweep_file(path: str | os.PathLike) -> SweepSpec:
    """Read a TOML sweep file (see the module docstring)."""
    path = Path(path)
    data = read_document(path, "sweep file", kind="toml")
    if "sweep" in data and isinstance(data["sweep"], dict) and len(data) == 1:
        data = data["sweep"]
    seen: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            raise ConfigError(f"sweep file {str(path)!r}: [{key}] tables are not supported; "
                              "write keys at the top level")
        name = str(key).replace("-", "_")
        if name in seen:  # TOML sees two keys; the last one won silently
            raise ConfigError(f"sweep file {str(path)!r}: {name} given twice ({seen[name]} and {key}); "
                              "give it once")
        seen[name] = key
        _unit_given(path, key, value)
        if name in FILE_PARAMS:
            data[key] = _beside(path, value)
    try:
        return SweepSpec(data)
    except ConfigError as exc:
        raise ConfigError(f"sweep file {str(path)!r}: {exc}") from None


#: the parameters whose value may name a file (a profile, topology, workload file or config.json)
FILE_PARAMS = ("profile", "topology", "workload", "model")


def _beside(path: Path, value: Any) -> Any:
    """``value`` (or each of a list) with a relative path that names a file beside the sweep
    file ``path`` made to name that file from here (``sub/prof.json`` for ``prof.json`` in
    ``sub/sweep.toml``): a sweep file's paths are its own, wherever perfsim runs (qa7: they
    were read from the working folder, where another file of that name was priced). A name
    (a preset, a shipped example) or a path that is not beside the file stays as it is."""
    if isinstance(value, list):
        return [_beside(path, v) for v in value]
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        return value
    there = path.parent / value
    if there.exists() and there.resolve() != Path(value).resolve():
        return str(there)
    return value


def _unit_given(path: Path, key: str, value: Any) -> None:
    """A sweep file mirrors the flags: a number of a parameter with a unit (a rate, a time, a
    size) needs its unit as the flag does (``bandwidth = 100`` is not 100 bit/s, ``latency = 5``
    not 5 s); zero is unambiguous. ConfigError naming the key and the value
    (:func:`perfsim.units.refuse_bare_number`)."""
    param = params.BY_NAME.get(str(key).replace("-", "_"))
    if param is None or param.kind not in EXAMPLE_UNITS:
        return
    for item in value if isinstance(value, list) else [value]:
        refuse_bare_number(item, f"sweep file {str(path)!r}: {param.name}", param.kind, param.flag)


# ---------------------------------------------------------------- running one batch

def _json_default(obj):
    item = getattr(obj, "item", None)  # numpy scalars
    if callable(item):
        return item()
    return str(obj)


def _resolve_predict(predict: Callable | None) -> Callable:
    if predict is not None:
        return predict
    return api_predict


def run_batch(batch: list[tuple[str, dict]], predict: Callable | None = None,
              skip_invalid: bool = False) -> list[dict]:
    """Run ``[(config_id, params), ...]`` through ``predict``; one record per config:
    ``{"config_id", "params", "summary", "stages"}`` or, for a configuration that
    ``predict`` rejects with :class:`ConfigError` when ``skip_invalid`` is set,
    ``{"config_id", "params", "error"}``. Runs in a worker process."""
    fn = _resolve_predict(predict)
    out = []
    for cid, params in batch:
        try:
            result = fn(**params)
        except ConfigError as exc:
            if not skip_invalid:
                raise ConfigError(f"configuration {_describe(params)}: {exc}") from None
            out.append({"config_id": cid, "params": params, "error": str(exc)})
            continue
        out.append({"config_id": cid, "params": params, "summary": result.row(),
                    "stages": list(result.stages)})
    return out


def _describe(params: Mapping[str, Any]) -> str:
    parts = []
    for k, v in params.items():
        if k == "bandwidth":
            v = format_bandwidth(v)
        parts.append(f"{k}={v}")
    return " ".join(parts)


# ---------------------------------------------------------------- in-process or pool

def _batches(todo: list[tuple[str, dict]], workers: int) -> list[list[tuple[str, dict]]]:
    """Split into batches: small enough to balance load and to flush often
    (about 8 per worker), large enough to amortise inter-process overhead."""
    size = max(1, min(256, len(todo) // max(1, workers * 8)))
    return [todo[i:i + size] for i in range(0, len(todo), size)]


def use_pool(remaining: int, seconds_each: float, jobs: int) -> bool:
    """A pool pays when the time it saves on the ``remaining`` configurations
    (each ``seconds_each`` in-process, spread over ``jobs`` workers) exceeds its
    start-up cost :data:`POOL_STARTUP_S`."""
    if jobs <= 1 or remaining < 2:
        return False
    saved = remaining * seconds_each * (1 - 1 / min(jobs, remaining))
    return saved > POOL_STARTUP_S


def _iter_pool(batches, predict, skip_invalid, jobs) -> Iterator[list[dict]]:
    """The batches on a local pool of ``jobs`` workers (:class:`perfsim.batch.BatchRunner`),
    each batch's records as soon as it is done."""
    with BatchRunner(jobs) as runner:
        yield from runner.as_completed(run_batch, batches, predict, skip_invalid)


def _iter_run(todo, predict, skip_invalid, jobs, pool: bool | None) -> Iterator[list[dict]]:
    """Run ``todo``: the first configuration in-process, timed; the rest in a
    pool when ``pool`` is True, or None and :func:`use_pool` says it pays."""
    rest = list(todo)
    if pool is None:
        start = time.perf_counter()
        yield run_batch([rest.pop(0)], predict, skip_invalid)
        pool = use_pool(len(rest), time.perf_counter() - start, jobs)
    parallel = pool and jobs > 1 and len(rest) > 1 and fork_context() is not None
    if pool and not parallel and jobs > 1:
        log.debug("sweep: torch is loaded in this process, running in-process")
    if not parallel:
        for item in rest:
            yield run_batch([item], predict, skip_invalid)
        return
    log.debug("sweep: %d configurations on %d worker processes", len(rest), jobs)
    _resolve_predict(predict)  # import the simulator once here; forked workers inherit it
    yield from _iter_pool(_batches(rest, jobs), predict, skip_invalid, jobs)


# ---------------------------------------------------------------- part file (resume)

def part_path(out: str | os.PathLike) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".part.jsonl")


def sibling_path(out: str | os.PathLike, what: str) -> Path:
    """``runs/sweep.csv`` -> ``runs/sweep.<what>.csv`` (same suffix as the table)."""
    out = Path(out)
    return out.with_name(f"{out.stem}.{what}{out.suffix}")


def _read_part(path: Path) -> list[dict]:
    """Records of a part file; a torn last line (crash mid-write) is dropped."""
    if not path.exists():
        return []
    records = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rec["config_id"]
        except (json.JSONDecodeError, KeyError, TypeError):
            if i == len(lines) - 1:
                break  # torn tail: that configuration simply runs again
            raise ConfigError(f"part file {str(path)!r}: line {i + 1} is corrupt; "
                              "delete the file or run with --fresh") from None
        records.append(rec)
    return records


def _records_from_table(out: Path) -> list[dict]:
    """Records of an existing final table (so a finished sweep extended with new
    values only runs the new ones)."""
    if not out.exists():
        return []
    summary = read_table(out, allow_empty=True)
    if "config_id" not in summary.columns:
        if len(summary.columns):  # someone's table, not a sweep's: never overwritten silently
            raise ConfigError(f"--out {str(out)!r}: holds a table that is not a perfsim sweep's (no config_id "
                              f"column); give another --out, or --overwrite (resume=False) to replace it")
        return []
    stages_file = sibling_path(out, "stages")
    stages = read_table(stages_file, allow_empty=True) if stages_file.exists() else None
    by_id: dict[str, list] = {}
    if stages is not None and "config_id" in stages.columns:
        for cid, group in stages.groupby("config_id", sort=False):
            by_id[cid] = group.drop(columns="config_id").to_dict("records")
    recs = []
    for row in summary.to_dict("records"):
        cid = row.pop("config_id")
        if "notes" in row:  # a list again, as predict made it (a CSV cell's text, a Parquet array)
            row["notes"] = notes_of(row["notes"])
        recs.append({"config_id": cid, "summary": row, "stages": by_id.get(cid, [])})
    return recs


class _PartWriter:
    """Append-only JSON-lines log; one ``os.write`` per batch, fsync at most once a second."""

    def __init__(self, path: Path, records: list[dict]):
        self.path = path
        # rewrite cleanly first, so a torn tail never glues onto the next record
        outputs.write_text(path, outputs.jsonl_text(records, _json_default))
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.last_sync = time.monotonic()

    def append(self, records: Iterable[dict]) -> None:
        data = outputs.jsonl_text(list(records), _json_default).encode()
        os.write(self.fd, data)
        if time.monotonic() - self.last_sync > 1.0:
            os.fsync(self.fd)
            self.last_sync = time.monotonic()

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


# ---------------------------------------------------------------- tables

def read_table(path: str | os.PathLike, allow_empty: bool = False):
    """Read a CSV or Parquet table into a DataFrame (ConfigError if missing or empty)."""
    import pandas as pd  # lazy: pandas is heavy, needed only here

    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise ConfigError(f"table {str(path)!r}: unknown format (use .csv or .parquet)")
    if not path.exists():
        raise ConfigError(f"table {str(path)!r}: not found")
    try:
        if path.suffix.lower() == ".csv":
            df = pd.read_csv(path)
        else:
            df = pd.read_parquet(path)
    except pd.errors.EmptyDataError:
        df = pd.DataFrame()
    except Exception as exc:  # pyarrow / parser errors: the file is the culprit
        raise ConfigError(f"table {str(path)!r}: unreadable ({exc})") from None
    if df.empty and not allow_empty:
        raise ConfigError(f"table {str(path)!r}: empty")
    return df


def write_table(df, path: str | os.PathLike) -> None:
    """Write ``df`` atomically as CSV or Parquet, chosen by the suffix (:func:`perfsim.outputs.write_frame`)."""
    if Path(path).suffix.lower() not in TABLE_SUFFIXES:
        raise ConfigError(f"output {str(path)!r}: unknown format (use .csv or .parquet)")
    outputs.write_frame(path, df)


@dataclass
class SweepTable:
    """What a sweep produced: ``summary`` (one row per configuration, predict
    schema + ``config_id``), ``stages`` (per-stage rows keyed by ``config_id``),
    ``errors`` (configurations rejected when ``skip_invalid``)."""

    summary: Any
    stages: Any
    errors: Any

    def to_frame(self):
        """The summary table (one row per configuration)."""
        return self.summary

    def __repr__(self) -> str:
        axes = [c for c in ("model", "bandwidth_bps", "latency_s", "compress", "grad_compress",
                            "schedule", "pp", "dp", "micro_batch", "macro_batch")
                if c in self.summary.columns and self.summary[c].nunique() > 1]
        return (f"SweepTable({len(self.summary)} configurations varying {', '.join(axes) or 'nothing'}; "
                f"{len(self.stages)} stage rows, {len(self.errors)} rejected)")

    def _repr_html_(self) -> str:
        return self.summary._repr_html_()


def _assemble(configs: list[tuple[str, dict]], records: dict[str, dict]) -> SweepTable:
    import pandas as pd  # lazy: pandas is heavy, needed only here

    rows, stage_rows, errors = [], [], []
    for cid, config in configs:
        rec = records.get(cid)
        if rec is None:
            continue
        if "error" in rec:
            errors.append({"config_id": cid, **plain(config), "error": rec["error"]})
            continue
        rows.append({**rec["summary"], **params.shown_columns(config, rec["summary"]), "config_id": cid})
        stage_rows.extend({"config_id": cid, **s} for s in rec.get("stages") or [])
    summary = pd.DataFrame(rows)
    extra = [c for c in summary.columns if c not in SUMMARY_COLUMNS and c != "config_id"]
    summary = summary.reindex(columns=[*SUMMARY_COLUMNS, *extra, "config_id"])
    stages = pd.DataFrame(stage_rows)
    if not stages.empty:
        extra = [c for c in stages.columns if c not in STAGE_COLUMNS and c != "config_id"]
        stages = stages.reindex(columns=["config_id", *STAGE_COLUMNS, *extra])
    return SweepTable(summary, stages, pd.DataFrame(errors))


def input_key(params: Mapping[str, Any]) -> str:
    """The key a finished configuration is stored under beside its ``config_id``:
    perfsim's version and the content of every file a prediction of ``params``
    reads (:func:`perfsim.api.input_files`, :func:`perfsim.provenance.input_key`)."""
    return key(input_files(**params))


#: the column (and part-file field) holding each row's :func:`input_key`
KEY_COLUMN = "input_key"


def _reusable(out: Path, part: Path, configs: list[tuple[str, dict]], keys: dict[str, str]) -> dict[str, dict]:
    """The stored records (final table, then part file) that are still the answer:
    their configuration is in the grid and their input key is the current one. A
    stored row whose inputs changed is recomputed, with one warning per reason. Rows
    of another grid are never dropped silently: ConfigError (give another --out, or
    --overwrite to replace them)."""
    for what in ("stages", "errors"):  # the files written beside the table: someone else's are kept
        sibling = sibling_path(out, what)
        sibling = sibling.with_suffix(".csv") if what == "errors" else sibling
        if sibling.exists() and len(columns := read_table(sibling, allow_empty=True).columns) \
                and "config_id" not in columns:
            raise ConfigError(f"--out {str(out)!r}: {str(sibling)!r} holds a table that is not a perfsim "
                              f"sweep's (no config_id column), which this sweep would replace; give another "
                              f"--out, or --overwrite (resume=False) to replace it")
    stored: dict[str, dict] = {}
    for source, recs in (("its table", _records_from_table(out)),
                         (f"its interrupted sweep ({part.name})", _read_part(part))):
        other = sum(rec["config_id"] not in keys for rec in recs)
        if other:
            raise ConfigError(f"--out {str(out)!r}: {source} holds {other} row(s) of another grid that "
                              f"this sweep would discard; give another --out, or --overwrite "
                              f"(resume=False) to replace them")
        stored.update((rec["config_id"], rec) for rec in recs)
    params_of = dict(configs)
    records, reasons = {}, []
    for cid, rec in stored.items():
        found = rec.get(KEY_COLUMN, (rec.get("summary") or {}).get(KEY_COLUMN))
        why = stale_reasons(found, keys[cid], where=_given_files(params_of[cid]))
        if why:
            reasons += why
        else:
            records[cid] = rec
    for note in stale_notes(reasons):
        log.warning("sweep: %s", note)
    return records


def _given_files(params: Mapping[str, Any]) -> dict[str, Any]:
    """The input files by role as the user named them (for notes; the default profile by its path)."""
    return {role: params[role] if isinstance(params.get(role), str) else path
            for role, path in input_files(**params).items()}


def run_sweep(spec: SweepSpec | Mapping[str, Any], out: str | os.PathLike | None = None, *,
              jobs: int | None = None, pool: bool | None = None, predict: Callable | None = None,
              skip_invalid: bool = False, resume: bool = True, progress: bool | None = None,
              report: Callable[[str], None] | None = None) -> SweepTable:
    """Run every configuration of ``spec`` and return the tables.

    out: table path (``.csv`` / ``.parquet``); with it, results are logged to the
      part file as they finish and the final files written atomically, and a
      re-run resumes (``resume=False`` starts over). Without it, nothing is written;
      ``-``: the summary table as CSV on stdout.
    jobs: worker processes at most (default: all cores); 1 = in-process.
    pool: True = a process pool, False = in-process, None = a pool only when it
      pays (:func:`use_pool`, after timing the first configuration here).
    predict: the function to call (default :func:`perfsim.api.predict`); must be
      picklable (a module-level function) for a pool.
    skip_invalid: record configurations that predict rejects (ConfigError) instead
      of stopping the sweep.
    progress: show a progress bar (default: when stderr is a terminal).
    report: called with a one-line note when earlier results are reused.
    """
    if not isinstance(spec, SweepSpec):
        spec = SweepSpec(spec)
    jobs = int(jobs) if jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise ConfigError(f"jobs={jobs}: must be >= 1")
    if outputs.is_stdio(out):  # "-": the table as CSV on stdout; nothing to resume from
        table = _run_sweep(spec, None, jobs, pool, predict, skip_invalid, resume, progress, report)
        outputs.write_frame(out, table.summary, "csv")
        return table
    if out is not None:  # before any work: a bad path, a missing pyarrow
        outputs.check_file_target(out, "--out")
        outputs.output_format(out, allowed=("csv", "parquet"), default="", flag="--out", has_format_flag=False)
        if Path(out).suffix.lower() not in TABLE_SUFFIXES:
            raise ConfigError(f"--out {str(out)!r}: needs a .csv or .parquet suffix")
        with outputs.locked_dir(out, "--out", file=True):  # one sweep per output at a time
            return _run_sweep(spec, out, jobs, pool, predict, skip_invalid, resume, progress, report)
    return _run_sweep(spec, out, jobs, pool, predict, skip_invalid, resume, progress, report)


def _run_sweep(spec, out, jobs, pool, predict, skip_invalid, resume, progress, report) -> SweepTable:
    report = report or log.info

    configs = [(config_id(p), p) for p in expand(spec)]
    keys = {cid: input_key(p) for cid, p in configs}
    records: dict[str, dict] = {}
    part = part_path(out) if out is not None else None
    if out is not None and resume:
        records = _reusable(Path(out), part, configs, keys)
    todo = [(cid, p) for cid, p in configs if cid not in records]
    if records:
        report(f"resuming: {len(records)} of {len(configs)} configurations already done")

    writer = _PartWriter(part, list(records.values())) if part is not None else None
    show = sys.stderr.isatty() if progress is None else bool(progress)
    if show:
        # lazy: tqdm is heavy, needed only here
        from tqdm.auto import tqdm  # a widget in notebooks, text on terminals
    else:
        from tqdm import tqdm  # lazy: tqdm is heavy, needed only here
    bar = tqdm(total=len(configs), initial=len(configs) - len(todo), unit="config",
               desc="sweep", disable=not show, file=sys.stderr, dynamic_ncols=True)
    try:
        if todo:
            iterator = _iter_run(todo, predict, skip_invalid, jobs, pool)
            for batch_records in iterator:
                for rec in batch_records:
                    rec[KEY_COLUMN] = keys[rec["config_id"]]  # the part file's field, the table's column
                    if "summary" in rec:
                        rec["summary"][KEY_COLUMN] = rec[KEY_COLUMN]
                    records[rec["config_id"]] = rec
                if writer is not None:
                    writer.append(batch_records)
                bar.update(len(batch_records))
    finally:
        bar.close()
        if writer is not None:
            writer.close()

    table = _assemble(configs, records)
    if out is not None:
        out = Path(out)
        write_table(table.summary, out)
        stages_file, errors_file = sibling_path(out, "stages"), sibling_path(out, "errors")
        if not table.stages.empty:
            write_table(table.stages, stages_file)
        elif stages_file.exists():
            stages_file.unlink()
        errors_file = errors_file.with_suffix(".csv")
        if not table.errors.empty:
            outputs.write_frame(errors_file, table.errors, "csv")
        elif errors_file.exists():  # from an earlier run of a different grid
            errors_file.unlink()
        part.unlink(missing_ok=True)
    return table
