"""Print README's accuracy table from stored measurements, re-predicted by the code as it is.

Rows: the A100 single-node data (held-out configurations, scripts/calibrate_a100.py), the
Megatron-LM paper's multi-node weak-scaling table (scripts/megatron_open_data.py) and every
CPU validation grid of traces/validation/ that scripts/repredict_validation.py can re-predict
(each against the profile it was measured with). Errors are signed: (predicted - measured) /
measured of the iteration time; negative = too fast. The date is the day the grid's
measurements were committed (git), the data and split are stated per row.

    python scripts/accuracy_table.py          # the markdown table README.md shows
    python scripts/accuracy_table.py --check  # exit 1 if README.md's table differs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (grid under traces/validation -- None: the CPU band's grids as one row, scripts/error_bands.py
#: CPU_BAND; what it is)
GRIDS = (
    (None, "gpt2-tiny: 2-stage pipelines (1F1B, GPipe, interleaved, ZB-H1, tied head), 2 replicas, "
                  "TP 2 with and without SP; AMD EPYC 2-core VM"),
    ("digits-mlp-pp2", "digits-mlp (2-6 ms steps), 2-stage pipeline, AMD EPYC"),
    ("digits-mlp-dp2", "digits-mlp, 2 replicas, AMD EPYC"),
    ("xeon/gpt2-tiny-pp2", "gpt2-tiny, 2-stage 1F1B pipeline, Intel Xeon 2-core VM"),
    ("xeon/gpt2-tiny-pp2-gpipe", "gpt2-tiny, 2-stage GPipe pipeline, Intel Xeon"),
    ("xeon/gpt2-tiny-pp2-tied", "gpt2-tiny, pipeline with a tied LM head, Intel Xeon"),
    ("xeon/gpt2-tiny-dp2", "gpt2-tiny, 2 replicas, Intel Xeon"),
)
BEGIN, END = "<!-- accuracy-table:begin -->", "<!-- accuracy-table:end -->"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _date(path: Path) -> str:
    out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT,
                         capture_output=True, text=True)
    return out.stdout.strip() or "uncommitted"


def _row(what: str, data: str, errors: list[float], date: str) -> str:
    n = len(errors)
    mape = 100 * sum(map(abs, errors)) / n
    signed = 100 * sum(errors) / n
    worst = 100 * max(errors, key=abs)
    return f"| {what} | {data} | {n} | {mape:.1f} % | {signed:+.1f} % | {worst:+.1f} % | {date} |"


def table() -> str:
    lines = ["| what | data and split | rows | MAPE | mean signed | worst row | measured |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    cal = _script("calibrate_a100")
    path = cal.data_path()
    if path is not None:
        held = [r for r in cal.load_rows(path) if r["split"] == "held-out"]
        lines.append(_row("GPT, Megatron-DeepSpeed, one 8 x A100 node (`--gpu a100`)",
                          "vTrain's public single-node runs; held-out configurations", cal.errors(held),
                          "vTrain, MICRO 2024"))
    mg = _script("megatron_open_data")
    doc, rows = mg.load()
    lines.append(_row("GPT 1.7B-1T, Megatron-LM, 32-3072 A100s on 8 x 200 Gb/s InfiniBand (`--gpu a100`)",
                      "the paper's weak-scaling table (arXiv:2104.04473 Table 1), each row as Megatron-LM's `examples/sc21/run_table_1.sh` runs it; every row",
                      [r["error"] for r in mg.evaluate(doc, rows)], "Narayanan et al., SC 2021"))
    rp = _script("repredict_validation")
    band = _script("error_bands").CPU_BAND  # the sitting the CPU band rests on, reported as one row
    band_grids = [ROOT / band.get("folder", "traces/validation") / g for g in band.get("grids", rp.GRIDS)]
    with tempfile.TemporaryDirectory() as tmp:
        for n, (grid, what) in enumerate(GRIDS):
            errors, profiles, dates = [], set(), set()
            folders = band_grids if grid is None else [rp.STORED / grid]
            for k, folder in enumerate(folders):
                profile = json.loads((folder / "summary.json").read_text())["profile"]
                df = rp.repredict_frame(folder, str(ROOT / profile), Path(tmp) / f"{n}-{k}")
                errors += [p / m - 1 for p, m in zip(df.predicted_iteration_s, df.measured_iteration_s)]
                profiles.add(Path(profile).name)
                dates.add(_date(folder / "validation.csv"))
            lines.append(_row(what, f"`perfsim run` (gloo, `tc` links) vs `{', '.join(sorted(profiles))}`; every row",
                              errors, " / ".join(sorted(dates))))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md's table differs")
    args = ap.parse_args(argv)
    text = table()
    print(text)
    if args.check:
        readme = (ROOT / "README.md").read_text()
        stored = readme.split(BEGIN, 1)[-1].split(END, 1)[0].strip() if BEGIN in readme else ""
        same = stored == text
        print("README.md's table " + ("matches" if same else "DIFFERS"), file=sys.stderr)
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
