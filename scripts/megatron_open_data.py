"""Predict every row of Megatron-LM's weak-scaling table (GPT 1.7B-1T on 32-3072 A100s) and
report the error, signed: (predicted - measured) / measured iteration time, negative = too fast.

Data: ``traces/open/megatron-weak-scaling-2104.04473.json`` (Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473,
Table 1; source, system and the assumptions this script makes are in the file). The table
gives achieved teraFLOP/s per GPU with FLOPs counted by the paper's eq. (3),
``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))``; the measured iteration time is
``F / (TFLOP/s x GPUs)``. Nothing is fitted to these rows.

    python scripts/megatron_open_data.py                          # the stated assumptions
    python scripts/megatron_open_data.py --micro-batch 1,2,4      # sensitivity to the micro-batch
    python scripts/megatron_open_data.py --schedule interleaved-1f1b
    python scripts/megatron_open_data.py --set nic_sharing=false  # any predict keyword, to switch a mechanism
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "traces" / "open" / "megatron-weak-scaling-2104.04473.json"


def load(path: Path = DATA) -> tuple[dict, list[dict]]:
    """(the file's metadata, one dict per row keyed by its ``columns``)."""
    doc = json.loads(path.read_text())
    return doc, [dict(zip(doc["columns"], r)) for r in doc["rows"]]


def model_flops(row: dict, vocab: int, seq: int) -> float:
    """FLOPs of one iteration, the paper's eq. (3) (arXiv:2104.04473 Sec. 5.1; full recomputation)."""
    B, l, h = row["global_batch"], row["layers"], row["hidden"]
    return 96.0 * B * seq * l * h * h * (1 + seq / (6.0 * h) + vocab / (16.0 * l * h))


def param_count(row: dict, vocab: int, seq: int) -> float:
    """Parameters, the paper's eq. (2): ``12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))``."""
    l, h = row["layers"], row["hidden"]
    return 12.0 * l * h * h * (1 + 13.0 / (12 * h) + (vocab + seq) / (12.0 * l * h))


def measured_time(row: dict, vocab: int, seq: int) -> float:
    return model_flops(row, vocab, seq) / (row["tflops_per_gpu"] * 1e12 * row["gpus"])


def predict_row(row: dict, doc: dict, micro_batch: int = 1, schedule: str = "1f1b", **extra) -> dict:
    """perfsim's prediction of one row under the file's assumptions (``extra``: more predict keywords)."""
    from perfsim.api import predict

    w, sy = doc["workload"], doc["system"]
    t, p, n = row["tp"], row["pp"], row["gpus"]
    kw = dict(model=f"gpt:layers={row['layers']},hidden={row['hidden']},heads={row['heads']},"
                    f"seq={w['seq_len']},vocab={w['vocab']}",
              gpu=sy["gpu"], tp=t, pp=p, dp=n // (t * p), micro_batch=micro_batch,
              global_batch=row["global_batch"], gpus_per_node=sy["gpus_per_node"], nic=sy["nic"],
              intra_node_bandwidth="229GB/s", precision="fp16", recompute="full", schedule=schedule,
              overlap=False, grad_buffer="contiguous", allow_oom=True)
    kw.update(extra)
    return predict(**kw).summary


def evaluate(doc: dict, rows: list[dict], micro_batch: int = 1, schedule: str = "1f1b", **extra) -> list[dict]:
    """Per row: predicted and measured iteration time and TFLOP/s, signed error, fits."""
    w = doc["workload"]
    out = []
    for row in rows:
        s = predict_row(row, doc, micro_batch, schedule, **extra)
        meas = measured_time(row, w["vocab"], w["seq_len"])
        pred = s["iteration_s"]
        out.append(dict(row, predicted_s=pred, measured_s=meas, error=(pred - meas) / meas,
                        predicted_tflops=model_flops(row, w["vocab"], w["seq_len"]) / (pred * row["gpus"]) / 1e12,
                        fits=s["fits"], peak_gib=s["peak_memory_gib"], pipeline_s=s.get("pipeline_s"),
                        compute_s=s["compute_s"], idle_s=s["idle_s"], dp_sync_s=s["dp_sync_s"],
                        tp_comm_s=s.get("tp_comm_s", 0.0)))
    return out


def summary(res: list[dict]) -> tuple[float, float]:
    """(MAPE %, mean signed error %) of ``res``."""
    e = [r["error"] for r in res]
    return 100 * sum(map(abs, e)) / len(e), 100 * sum(e) / len(e)


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return float(text) if any(c in text for c in ".e") else int(text)
    except ValueError:
        return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--micro-batch", default="1", help="comma list (default 1, the stated assumption)")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="an extra predict keyword (repeatable), e.g. nic_sharing=false")
    args = ap.parse_args(argv)
    try:
        mbs = [int(x) for x in args.micro_batch.split(",")]
        extra = {k.strip(): _value(v.strip()) for k, v in (s.split("=", 1) for s in args.set)}
    except ValueError:
        print(f"megatron_open_data: bad --micro-batch {args.micro_batch!r} or --set {args.set!r}", file=sys.stderr)
        return 2
    doc, rows = load()
    print(f"{doc['name']} -- {doc['source'].split(',')[0]}, {len(rows)} rows; error = (predicted - measured) / "
          "measured iteration time, negative = too fast")
    for mb in mbs:
        res = evaluate(doc, rows, mb, args.schedule, **extra)
        print(f"\nmicro-batch {mb}, {args.schedule}" + (f", {extra}" if extra else ""))
        print("| params (B) | t | p | d | measured s | predicted s | TFLOP/s meas / pred | error | fits | "
              "predicted compute / TP / DP sync / idle s |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
        for r in res:
            print(f"| {r['params_b']} | {r['tp']} | {r['pp']} | {r['gpus'] // (r['tp'] * r['pp'])} | "
                  f"{r['measured_s']:.2f} | {r['predicted_s']:.2f} | {r['tflops_per_gpu']} / "
                  f"{r['predicted_tflops']:.1f} | {100 * r['error']:+.1f} % | "
                  f"{'yes' if r['fits'] else 'NO'} ({r['peak_gib']:.0f} GiB) | {r['compute_s']:.2f} / "
                  f"{r['tp_comm_s']:.2f} / {r['dp_sync_s']:.2f} / {r['idle_s']:.2f} |")
        m, s = summary(res)
        print(f"micro-batch {mb}: MAPE {m:.1f} %, mean signed error {s:+.1f} % "
              f"({sum(r['error'] < 0 for r in res)} of {len(res)} rows too fast)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
