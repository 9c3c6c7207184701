"""Re-predict the shipped validation grids with other profiles, against their stored
measurements -- no new runs.

    python scripts/repredict_validation.py PROFILE [PROFILE ...]

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
from perfsim.profile import load_profile

GRIDS = ("gpt2-tiny-dp2", "gpt2-tiny-pp2", "gpt2-tiny-pp2-gpipe", "digits-mlp-dp2", "digits-mlp-pp2")
STORED = Path(__file__).resolve().parents[1] / "traces" / "validation"


def repredict(grid: Path, profile_path: str, work: Path) -> tuple[dict, dict]:
    """(summary of the re-prediction, summary stored in the grid's CSV)."""
    return v.summarize(repredict_frame(grid, profile_path, work)), v.summarize(pd.read_csv(grid / "validation.csv"))


def repredict_frame(grid: Path, profile_path: str, work: Path, drift_checked: bool = False) -> pd.DataFrame:
    """The grid's rows re-predicted with ``profile_path`` beside their stored measurements;
    ``drift_checked``: with that profile's compute as the grid's drift check timed it right
    after the runs (``drift-check.json`` beside the table; :func:`perfsim.calibrate.compare.refreshed`)."""
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
    rows = []
    for i, (row, (_, rec)) in enumerate(zip(plan.rows(), df.iterrows())):
        assert (row["compress"], row["grad_compress"]) == (rec.compress, rec.grad_compress), (grid, i)
        assert row.get("schedule", rec.get("schedule")) == rec.get("schedule"), (grid, i)
        assert int(row.get("tp", 1)) == int(rec.get("tp", 1)), (grid, i)
        measured = {k[len("measured_"):]: rec[k] for k in df.columns if k.startswith("measured_")}
        measured["measured_steps"] = rec.measured_steps

        def stored_run(_measured=measured, **_):
            return types.SimpleNamespace(summary=_measured)

        rows.append(v.run_row(plan, row, profile, i, runner=stored_run))
    return pd.DataFrame(rows)


def main(profiles: list[str]) -> int:
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
