"""Collect the measured runs under traces/measured/ into three small tables.

    python traces/measured/summarize.py     # writes convergence.csv, throughput.csv, dp.csv here
"""
import csv
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rows(kind):
    for d in sorted((HERE / kind).glob("*/result.json")):
        data = json.loads(d.read_text())
        yield d.parent.name, data["summary"], [x["loss"] for x in data.get("losses", [])]


def write(name, table):
    if not table:
        return
    with open(HERE / name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(table)
    cols = list(table[0])
    print(f"\n{name}")
    print("  ".join(f"{c:>14.14s}" for c in cols))
    for r in table:
        print("  ".join(f"{r[c]:>14.4g}" if isinstance(r[c], float) else f"{str(r[c]):>14.14s}" for c in cols))


def main():
    conv = []
    for name, s, losses in rows("convergence"):
        conv.append({"compress": s["compress"], "steps": len(losses), "final_loss": s["final_loss"],
                     "loss_last10": s["loss_last10"], "loss_last_epoch": statistics.mean(losses[-32:]),
                     "pipeline_bytes": s["pipeline_bytes"]})
    write("convergence.csv", conv)
    groups = {}
    for name, s, _ in rows("throughput"):
        groups.setdefault((s["model"], s["bandwidth_bps"], s["compress"]), []).append(s)
    tput, base = [], {}
    for (model, bw, comp), runs in groups.items():
        thr = [r["throughput_samples_per_s"] for r in runs]
        med = statistics.median(thr)
        tput.append({"model": model, "bandwidth": bw, "compress": comp, "repeats": len(runs),
                     "samples_per_s": med, "min": min(thr), "max": max(thr),
                     "iteration_s": statistics.median(r["iteration_s"] for r in runs),
                     "pipeline_bytes": runs[0]["pipeline_bytes"],
                     "comm_s": statistics.median(r["comm_s"] for r in runs),
                     "encode_s": statistics.median(r["encode_s"] for r in runs),
                     "load_1m": max((r.get("load_average_1m") or 0.0) for r in runs)})
        if comp == "fp32":
            base[(model, bw)] = med
    for r in tput:
        r["speedup_vs_fp32"] = r["samples_per_s"] / base.get((r["model"], r["bandwidth"]), float("nan"))
    tput.sort(key=lambda r: (r["model"], -r["bandwidth"], r["compress"]))
    write("throughput.csv", tput)
    dp, base = [], {}
    for name, s, losses in rows("dp"):
        dp.append({"grad_compress": s["grad_compress"], "bandwidth": s["bandwidth_bps"],
                   "samples_per_s": s["throughput_samples_per_s"], "iteration_s": s["iteration_s"],
                   "dp_sync_s": s["dp_sync_s"], "dp_bytes": s["dp_bytes"], "final_loss": s["final_loss"],
                   "loss_last10": s["loss_last10"]})
        if s["grad_compress"] == "none":
            base[s["bandwidth_bps"]] = s["throughput_samples_per_s"]
    for r in dp:
        r["speedup_vs_fp32"] = r["samples_per_s"] / base.get(r["bandwidth"], float("nan"))
    write("dp.csv", dp)


if __name__ == "__main__":
    sys.exit(main())
