"""Re-predict the shipped validation grids with other profiles, against their stored
measurements -- no new runs.

    python scripts/repredict_validation.py PROFILE [PROFILE ...]
    python scripts/repredict_validation.py --row-drift PROFILE FOLDER   # grids measured with --row-drift

For each grid of traces/validation/ (gpt2-tiny dp2 / pp2 1F1B / pp2 GPipe, digits-mlp
dp2 / pp2) every row goes through :func:`perfsim.analysis.validate.run_row`, the
function `perfsim validate` uses, with the measured figures read back from the
grid's validation.csv (the runs/ folders that `--reuse-measured` reads are not
kept in git). Prints throughput MAPE, worst row and rows over 10 % per profile and
grid; with traces/cpu-2core.json it reproduces the shipped tables. Used to compare
a `calibrate --quick` profile with a full one (docs/validation.md, step 12):
calibrate both on the machine the measurements were taken on, when it is quiet.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import types
from pathlib import Path

import pandas as pd

from perfsim.analysis import validate as v
from perfsim.calibrate.compare import refreshed
from perfsim.errors import ConfigError
from perfsim.profile import load_profile

GRIDS = ("gpt2-tiny-dp2", "gpt2-tiny-pp2", "gpt2-tiny-pp2-gpipe", "digits-mlp-dp2", "digits-mlp-pp2")
STORED = Path(__file__).resolve().parents[1] / "traces" / "validation"


def repredict(grid: Path, profile_path: str, work: Path) -> tuple[dict, dict]:
    """(summary of the re-prediction, summary stored in the grid's CSV)."""
    return v.summarize(repredict_frame(grid, profile_path, work)), v.summarize(pd.read_csv(grid / "validation.csv"))


def repredict_frame(grid: Path, profile_path: str, work: Path, drift_checked: bool = False,
                    row_drift_checked: bool = False, hold: float = 0.10) -> pd.DataFrame:
    """The grid's rows re-predicted with ``profile_path`` beside their stored measurements;
    ``drift_checked``: with that profile's compute as the grid's drift check timed it right
    after the runs (``drift-check.json`` beside the table; :func:`perfsim.calibrate.compare.refreshed`);
    ``row_drift_checked``: each row with the compute its own check timed right before its runs
    (``perfsim validate --row-drift``: ``row-drift/<row>.json``), and two more columns:
    ``row_drift`` (that check's median compute ratio to the profile, ``c_i``) and ``row_held_still``
    (``c_i' / c_i`` within ``hold`` of 1, ``c_i'`` the next check's: the next row's, or the grid's
    check after its runs for the last row) -- docs/validation.md, "The CPU band priced with each
    row's own drift check"."""
    stored = json.loads((grid / "summary.json").read_text())
    df = pd.read_csv(grid / "validation.csv")
    work.mkdir(parents=True)
    if drift_checked:
        fresh = refreshed(load_profile(profile_path), load_profile(str(grid / "drift-check.json")))
        profile_path = str(work / "profile.json")
        fresh.save(profile_path)
    for f in grid.glob("workload-*.json"):  # the runtime model's workload, as measured
        shutil.copy(f, work / f.name)
    bws = tuple(dict.fromkeys(None if isinstance(b, float) and math.isnan(b) else float(b)
                              for b in df.bandwidth_bps))
    # a schedule grid's and a TP grid's own axes (validate writes them as columns, not into ``base``)
    schedules = tuple(dict.fromkeys(df.schedule)) if "schedule" in df and df.schedule.nunique() > 1 else ()
    tps = tuple(int(t) for t in dict.fromkeys(df.tp)) if "tp" in df else (1,)
    sp = bool("sequence_parallel" in df and df.sequence_parallel.astype(bool).any())
    plan = v.ValidationPlan(base=stored["base"], bandwidths=bws, compresses=tuple(dict.fromkeys(df.compress)),
                            grad_compresses=tuple(dict.fromkeys(df.grad_compress)), schedules=schedules,
                            tps=tps, sequence_parallel=sp, steps=stored["steps"],
                            dataset_limit=stored.get("dataset_limit"), profile=profile_path,
                            link_model=stored.get("link_model", "profile"), out=str(work))
    profile = load_profile(profile_path)
    checks = _row_checks(grid, df, profile) if row_drift_checked else None
    rows = []
    for i, (row, (_, rec)) in enumerate(zip(plan.rows(), df.iterrows())):
        assert (row["compress"], row["grad_compress"]) == (rec.compress, rec.grad_compress), (grid, i)
        assert row.get("schedule", rec.get("schedule")) == rec.get("schedule"), (grid, i)
        assert int(row.get("tp", 1)) == int(rec.get("tp", 1)), (grid, i)
        measured = {k[len("measured_"):]: rec[k] for k in df.columns if k.startswith("measured_")}
        measured["measured_steps"] = rec.measured_steps

        def stored_run(_measured=measured, **_):
            return types.SimpleNamespace(summary=_measured)

        if checks is None:
            rows.append(v.run_row(plan, row, profile, i, runner=stored_run))
            continue
        now, c_i, c_next = checks[i]
        out = v.run_row(plan, row, refreshed(profile, now), i, runner=stored_run)
        out.update(row_drift=c_i, row_held_still=abs(c_next / c_i - 1) <= hold)
        rows.append(out)
    return pd.DataFrame(rows)


def _row_checks(grid: Path, df: pd.DataFrame, profile) -> list[tuple]:
    """Per row: (its drift check's profile, its compute ratio ``c_i``, the next check's ``c_i'``)."""
    from perfsim.calibrate.compare import compute_drift

    nows = []
    for i, rec in df.iterrows():
        name = rec.get("row_drift_file")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{grid}: row {i} has no drift check of its own (measured without --row-drift)")
        nows.append(load_profile(str(grid / "row-drift" / Path(name).name)))
    ratios = [compute_drift(n, profile) for n in nows]
    after = compute_drift(load_profile(str(grid / "drift-check.json")), profile)
    return [(n, c, ratios[i + 1] if i + 1 < len(ratios) else after) for i, (n, c) in enumerate(zip(nows, ratios))]


def row_drift_report(profile_path: str, folder: Path) -> int:
    """Every grid of ``folder`` measured with ``perfsim validate --row-drift``, re-predicted at each
    row's own compute speed: per row its check's ratio ``c_i``, whether it held still and its error,
    then how many rows held still (docs/validation.md, "The CPU band priced with each row's own
    drift check")."""
    grids = sorted(p.name for p in folder.iterdir() if (p / "validation.csv").is_file())
    total = held = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, g in enumerate(grids):
            df = repredict_frame(folder / g, profile_path, Path(tmp) / str(n), row_drift_checked=True)
            for _, r in df.iterrows():
                err = 100 * (r.predicted_iteration_s / r.measured_iteration_s - 1)
                print(f"{g:26s} {r.compress:15s} {r.grad_compress:15s} {str(r.schedule):17s} "
                      f"c_i {r.row_drift:.3f}  held still {'yes' if r.row_held_still else 'no ':3s}  error {err:+6.1f} %")
            print(f"{g}: {int(df.row_held_still.sum())} of {len(df)} rows held still")
            total, held = total + len(df), held + int(df.row_held_still.sum())
    print(f"all grids: {held} of {total} rows held still ({held / total:.0%})")
    return 0


def main(profiles: list[str]) -> int:
    if profiles[:1] == ["--row-drift"]:
        folder = Path(profiles[2]) if len(profiles) == 3 else None
        if folder is None or not folder.is_dir() or not any(folder.glob("*/validation.csv")):
            print("usage: python scripts/repredict_validation.py --row-drift PROFILE FOLDER (FOLDER: grids "
                  f"measured with perfsim validate --row-drift; got {' '.join(profiles[1:]) or 'nothing'})",
                  file=sys.stderr)
            return 2
        try:
            return row_drift_report(profiles[1], folder)
        except ConfigError as exc:  # a profile that cannot be read, a grid measured without --row-drift
            print(f"repredict_validation: {exc}", file=sys.stderr)
            return 2
    if not profiles:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for n, path in enumerate(profiles):
            for g in GRIDS:
                m, old = repredict(STORED / g, path, Path(tmp) / str(n) / g)
                print(f"{Path(path).name:24s} {g:20s} MAPE {m['mape_pct']:5.1f} %  worst {m['worst_pct']:5.1f} %  "
                      f"rows > 10 %: {m['rows_over_10pct']}/{m['rows']}  (shipped: {old['mape_pct']:.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
