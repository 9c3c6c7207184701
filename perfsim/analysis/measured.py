"""Stored measurements that ``perfsim validate --reuse-measured`` reuses, and the key
that says whether they still hold.

A row's measurement is stored in its run folders (``runs/<row>/result.json`` and its
``-r<k>`` repeats, with :data:`KEY_FILE` beside them) and in the grid's
``validation.csv`` (the measured columns and ``measured_key``). It is reused only
under the key it was taken with (:func:`measure_key`: perfsim's version and every run
parameter but the folder, :mod:`perfsim.provenance`); another key measures the row
again, saying what changed. Measurements stored before perfsim keyed them are reused
with a warning that they could not be checked.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from perfsim import outputs
from perfsim.errors import ConfigError
from perfsim.provenance import NO_KEY, input_key, stale_reasons

if TYPE_CHECKING:  # pragma: no cover
    from perfsim.analysis.validate import ValidationPlan

log = logging.getLogger("perfsim.analysis.validate")


#: the file beside a measured run's result.json holding the key it was measured under
KEY_FILE = "measure-key.json"
#: the files validate writes beside validation.csv (validate_grid._run_and_write, _profile_drift)
RESULT_FILES = ("summary.json", "validation.md", "validation.png", "drift-check.json")


def measure_key(run_params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The key of a measurement (:mod:`perfsim.provenance`): perfsim's version and every
    parameter of the run but its folder; and those parameters (JSON-ready)."""
    params = json.loads(json.dumps({k: v for k, v in run_params.items() if k != "out"}, default=str))
    return input_key(values={"run": params}, code=False), params


def write_key(run_dir: str, key: str, params: dict[str, Any]) -> None:
    outputs.write_text(Path(run_dir) / KEY_FILE, outputs.json_text({"key": key, "params": params}))


def repeat_choice(profile) -> str:
    """Which of a row's measured runs counts: the statistic the profile's calibration kept of its
    own repeats (``metadata["calibration"]["statistic"]``, :data:`perfsim.calibrate.calibration.STATISTICS`):
    ``min`` (the fastest run) or ``median`` (the middle run; a profile that does not say: median,
    calibrate's default). The fastest run against median layer times makes every prediction look
    too slow by the spread between runs, 10-25 % on a shared VM (docs/validation.md, session 24)."""
    cal = (getattr(profile, "metadata", None) or {}).get("calibration") or {}
    return "min" if cal.get("statistic") == "min" else "median"


def chosen_repeat(runs: list, choice: str):
    """The run that counts among ``runs`` (Results): ``min`` -> the highest throughput; ``median`` ->
    the lower median of the run times (the middle run of 3, the faster of 2)."""
    ranked = sorted(runs, key=lambda m: -(m.summary.get("throughput_samples_per_s") or 0.0))
    return ranked[0] if choice == "min" else ranked[(len(ranked) - 1) // 2]


def _stored_measurements(run_dir: Path, repeats: int, choice: str):
    """The stored measured run of a row that counts (:func:`chosen_repeat` of ``result.json`` of
    ``run_dir`` and its ``-r<k>`` repeats, all that are stored), or (None, [], None) when none is stored;
    the third item is the stored :data:`KEY_FILE` document of the runs (None when one
    of them has none: measured before perfsim keyed measurements, or keys that differ)."""
    runs, tputs, keys = [], [], []
    k = 0
    while True:
        folder = Path(str(run_dir) + (f"-r{k}" if k else ""))
        path = folder / "result.json"
        k += 1
        if not path.exists():
            if k > max(repeats, 1):
                break
            continue
        try:
            summary = json.loads(path.read_text())["summary"]
            keys.append(json.loads((folder / KEY_FILE).read_text()) if (folder / KEY_FILE).exists() else None)
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"{path}: unreadable stored measurement ({e})") from None
        tputs.append(summary.get("throughput_samples_per_s") or 0.0)
        runs.append(SimpleNamespace(summary=summary))
    same = keys and all(isinstance(d, dict) and d == keys[0] for d in keys)
    return (chosen_repeat(runs, choice) if runs else None), tputs, keys[0] if same else None


#: stored tables read by --reuse-measured, by path (before this process rewrites them)
_TABLES: dict[str, list[dict[str, str]]] = {}


#: the columns that make a file a validation table (:func:`check_table`)
ROW_COLUMNS = ("bandwidth_bps", "compress", "grad_compress", "measured_throughput_samples_per_s")


def same_row(rec: dict[str, str], row: dict[str, Any], base: dict[str, Any] | None = None) -> bool:
    """Whether stored table row ``rec`` (text, as read from ``validation.csv``) is grid row
    ``row`` (bandwidth, compressors, and its schedule and tp where the table records
    them); with ``base``, of the same model, pipeline, replicas and batch too."""
    try:
        rec_bw = float(rec["bandwidth_bps"]) if rec.get("bandwidth_bps") else None
        if (rec_bw != row["bandwidth"] or rec["compress"] != row["compress"]
                or rec["grad_compress"] != row["grad_compress"]
                or (rec.get("schedule") and row.get("schedule") and rec["schedule"] != row["schedule"])
                or (rec.get("tp") and float(rec["tp"]) != float(row.get("tp", 1)))):
            return False
        for k in ("model", "pp", "dp", "micro_batch", "macro_batch"):
            if base and rec.get(k) and k in base and \
                    (rec[k] != base[k] if k == "model" else float(rec[k]) != float(base[k])):
                return False
        return True
    except (KeyError, ValueError):
        return False


def check_table(plan: ValidationPlan) -> None:
    """Refuse to replace ``plan.out``'s ``validation.csv`` unless ``plan.overwrite``: a file
    that is not a validation table, a folder without one that holds files by the names
    validate writes (:data:`RESULT_FILES`), or a table holding rows of another grid (a grid re-run
    resumes: its rows measured under the same key are kept, :func:`reused`). ConfigError
    naming the file and ``--overwrite``, before any run."""
    path = Path(plan.out) / "validation.csv"
    if plan.overwrite:
        return
    if not path.exists():  # no table: files by validate's names are someone else's, never written over
        theirs = [name for name in RESULT_FILES if (Path(plan.out) / name).exists()]
        if theirs:
            raise ConfigError(f"--out {plan.out!r}: holds {', '.join(theirs)} but no validation.csv: not a "
                              f"perfsim validation's folder, and validate writes those files; give another "
                              f"--out, or --overwrite to replace them")
        return
    try:
        with path.open(newline="") as fh:
            recs = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        recs = None
    if recs is None or not recs or any(c not in recs[0] for c in ROW_COLUMNS):
        raise ConfigError(f"--out {plan.out!r}: {path} is not a perfsim validation table; give another "
                          f"--out, or --overwrite to replace it")
    rows = plan.rows()
    other = sum(not any(same_row(rec, row, plan.base) for row in rows) for rec in recs)
    if other:
        raise ConfigError(f"--out {plan.out!r}: {path} holds {other} row(s) of another grid that this "
                          f"validation would discard; give another --out, or --overwrite to replace them")


def _table_measurement(out: str, row: dict[str, Any]):
    """The measured figures of ``row`` (its schedule and tp degree included, where
    the table records them) from the grid's stored ``validation.csv`` (the run folders
    are kept locally, not in git; the table keeps the run of each row that counted):
    ``(figures, throughputs, {"key": measured_key})``, or None when the table has no
    such row."""
    path = Path(out) / "validation.csv"
    if str(path) not in _TABLES:  # read once: the command rewrites the table after each row
        if not path.exists():
            return None
        with path.open() as fh:
            _TABLES[str(path)] = list(csv.DictReader(fh))
    for rec in _TABLES[str(path)]:
        if not same_row(rec, row):
            continue
        summary = {}
        for key, value in rec.items():
            if key == "measured_latency_in":  # text: who made the emulated latency (validate's TCP window)
                summary["latency_in"] = value or ""
            elif key.startswith("measured_") and key not in ("measured_throughput_all", "measured_repeats"):
                try:
                    summary[key[len("measured_"):]] = float(value)
                except ValueError:
                    pass
        summary["measured_steps"] = summary.pop("steps", None)
        tputs = [float(t) for t in rec.get("measured_throughput_all", "").split(";") if t]
        return SimpleNamespace(summary=summary), tputs, {"key": rec.get("measured_key")}
    return None


def reused(plan: ValidationPlan, row: dict[str, Any], run_dir: Path, key: str,
            key_params: dict[str, Any], choice: str, unchecked: bool = True):
    """``(figures, throughputs, key)`` of the stored measurement of ``row`` that
    ``--reuse-measured`` (or a grid re-run, which resumes) may use, or ``(None, [], None)``:
    none is stored, or it was taken with other run parameters or another perfsim (a
    warning says which, and the row is measured again). A measurement stored before
    perfsim keyed them is reused with a warning that it could not be checked
    (``unchecked``: ``--reuse-measured``), else measured again, saying so."""
    measured, tputs, doc = _stored_measurements(run_dir, plan.repeats, choice)
    where = str(run_dir)
    if measured is None:
        measured, tputs, doc = _table_measurement(plan.out, row) or (None, [], None)
        where = f"{Path(plan.out) / 'validation.csv'} ({run_dir.name})"
    if measured is None:
        return None, [], None
    stored = (doc or {}).get("key")
    why = stale_reasons(stored, key)
    if why == [NO_KEY] and not unchecked:
        log.warning("validate: the stored measurement %s carries no input key (measured before perfsim "
                    "keyed measurements on their run parameters): measuring it again (--reuse-measured "
                    "reuses it unchecked)", where)
        return None, [], None
    if why == [NO_KEY]:
        log.warning("validate: the stored measurement %s carries no input key (measured before perfsim "
                    "keyed measurements on their run parameters): reused unchecked; drop "
                    "--reuse-measured to measure it again", where)
        return measured, tputs, None
    if why:
        old = (doc or {}).get("params") or {}
        diff = [f"{k} {old.get(k)!r} -> {key_params.get(k)!r}" for k in sorted(set(old) | set(key_params))
                if old.get(k) != key_params.get(k)] if old else ["its run parameters"]
        parts = [r for r in why if not r.startswith("run ")] + (diff if "run changed" in why else [])
        log.warning("validate: the stored measurement %s was taken with other inputs (%s): measuring "
                    "it again", where, "; ".join(parts))
        return None, [], None
    return measured, tputs, stored
