"""Predict, once, each row of the open multi-node training sets other than Megatron-LM's Table 1, and
report the error, signed: (predicted - measured) / measured iteration time, negative = too fast.

Data (``SETS``; each file's ``selection_rule`` was written before any row was predicted, its sources,
quotes and what is assumed are in the file):

- ``traces/open/megatron-selective-recompute-2205.05198.json``: Korthikanti et al., "Reducing
  Activation Recomputation in Large Transformer Models", arXiv:2205.05198, Tables 3 and 5 (175B,
  530B, 1T on 64-512 A100 80GB; full recomputation, and sequence parallelism with selective
  recomputation);
- ``traces/open/bloom-176b-jean-zay.json``: BLOOM-176B on 384 A100 80GB of Jean Zay (BigScience
  tr11, Megatron-DeepSpeed, bf16, ZeRO-1);
- ``traces/open/nemo-h100-performance.json``: NeMo 24.07's performance table on DGX-H100 (fp8), the
  multi-node rows whose recipe perfsim can express (GPT3-5B on 64 H100s; the file's ``candidates``
  say why each other row is out).

Reported apart (``ONE_NODE_SETS``, not in the multi-node figures):
``traces/open/megatron-22b-one-node-2205.05198.json``, the same paper's 22B model on one node of 8
A100 80GB (TP 8): whether the multi-node sets' optimism is there on one node at their shapes.

Each row is predicted with its stated configuration and perfsim's defaults for the rest, by
``scripts/megatron_open_data.py``'s :func:`predict_row` (one description of how a Megatron-style row
is handed to ``perfsim.api.predict``), given the set's ``system.predict`` and
``configuration.predict`` keywords and the row's own ``recompute`` / ``sequence_parallel`` (a keyword
given as null is left to perfsim's default: the H100 set's node fabric). Nothing is fitted to these rows.

    python scripts/open_training_data.py            # every row, per set and over all rows (~5 s)
    python scripts/open_training_data.py --check    # the transcription checks and the stored figures
    python scripts/open_training_data.py --update   # store the figures as each file's 'reported' block
    python scripts/open_training_data.py --per-layer   # and one layer's time where a set reports it
    python scripts/open_training_data.py --only bloom --set p2p_exchange=deepspeed   # a second look, one set
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = (ROOT / "traces" / "open" / "megatron-selective-recompute-2205.05198.json",
        ROOT / "traces" / "open" / "bloom-176b-jean-zay.json",
        ROOT / "traces" / "open" / "nemo-h100-performance.json")
#: open single-node rows at the multi-node sets' shapes, reported apart (not in the multi-node figures):
#: whether their optimism is there on one node already (each file's ``selection_rule`` says why)
ONE_NODE_SETS = (ROOT / "traces" / "open" / "megatron-22b-one-node-2205.05198.json",)
#: the row columns that are predict keywords of their own
ROW_KEYWORDS = ("recompute", "sequence_parallel")
#: how far a stored figure may be from the recomputed one (the stored ones are rounded as printed)
TOLERANCE = dict(s=0.005, pct=0.005)
#: how far a source's whole-number model TFLOP/s per GPU (NeMo's tables) may be from the one recomputed
#: from its iteration time with 3 passes: the rounding, and NeMo's count being ~0.1 % above eq. 7's
MODEL_TFLOPS_TOLERANCE = 1.0
#: A100 dense fp16/bf16 peak the sources divide by (Korthikanti et al.: 'A100 peak = 312 TFLOPS/sec')
A100_PEAK = 312e12


def megatron_module():
    """``scripts/megatron_open_data.py`` as a module (its ``load``, ``predict_row``, ``summary``)."""
    spec = importlib.util.spec_from_file_location("megatron_open_data", ROOT / "scripts" / "megatron_open_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MOD = megatron_module()


def load_sets(paths=SETS) -> list[tuple[Path, dict, list[dict]]]:
    """(path, metadata, rows) of each set (``megatron_open_data.load``)."""
    return [(p, *MOD.load(p)) for p in paths]


def row_keywords(doc: dict, row: dict) -> dict:
    """The predict keywords a row adds to :func:`predict_row`'s: the set's system and configuration
    ``predict`` blocks, then the row's own :data:`ROW_KEYWORDS`."""
    kw = dict(doc["system"].get("predict", {}))
    kw.update(doc.get("configuration", {}).get("predict", {}))
    kw.update({k: row[k] for k in ROW_KEYWORDS if k in row})
    return kw


def evaluate(doc: dict, rows: list[dict], extra: dict | None = None) -> list[dict]:
    """Per row: predicted and measured iteration time, signed error, the 80 % interval, fits;
    ``extra``: predict keywords that win over the row's (a mechanism switched on: a second look)."""
    out = []
    for row in rows:
        s = MOD.predict_row(row, doc, **{**row_keywords(doc, row), **(extra or {})})
        meas, pred = row["iteration_s"], s["iteration_s"]
        low, high = s.get("iteration_s_low"), s.get("iteration_s_high")
        out.append(dict(row, predicted_s=pred, measured_s=meas, error=(pred - meas) / meas,
                        fits=s["fits"], peak_gib=s["peak_memory_gib"], compute_s=s["compute_s"],
                        idle_s=s["idle_s"], dp_sync_s=s["dp_sync_s"], tp_comm_s=s.get("tp_comm_s", 0.0),
                        p2p_s=s["comm_s"], low_s=low, high_s=high,
                        in_interval=None if low is None else low <= meas <= high))
    return out


def model_flops(row: dict, vocab: int, seq: int, passes: int) -> float:
    """FLOPs of one iteration of GEMMs and attention, ``passes`` forward passes' worth (3: forward and
    backward, the 'model FLOPs' of Korthikanti et al., arXiv:2205.05198 eq. 7; 4: with the full
    recomputation, Narayanan et al., arXiv:2104.04473 eq. 3, as BLOOM's logs count them):
    ``24 passes B s l h^2 (1 + s/(6h) + V/(4 passes l h))`` (the logits, never recomputed, 6 B s h V)."""
    B, l, h = row["global_batch"], row["layers"], row["hidden"]
    return 24.0 * passes * B * seq * l * h * h * (1 + seq / (6.0 * h) + vocab / (4.0 * passes * l * h))


def transcription_problems(doc: dict, rows: list[dict]) -> list[str]:
    """Where a row disagrees with itself or with the source's own figures: GPUs = tp x pp x dp, whole
    micro-batches per replica (and per pipeline stage's round with interleaving), and the stated MFU
    (Korthikanti: model FLOPs, 3 passes) or TFLOP/s (BLOOM: 4 passes) recomputed from the iteration
    time to the rounding of the quote; where the source gives tokens/s per GPU (NeMo), the iteration
    time is ``global batch x sequence / (tokens/s/GPU x GPUs)`` to the rounding of the stored time
    and its model TFLOP/s per GPU (3 passes) within :data:`MODEL_TFLOPS_TOLERANCE`."""
    w, bad = doc["workload"], []
    for i, r in enumerate(rows):
        mp = r["tp"] * r["pp"]
        if r["gpus"] % mp or r["global_batch"] % (r["gpus"] // mp * r["micro_batch"]):
            bad.append(f"row {i}: gpus {r['gpus']} / batch {r['global_batch']} do not split over tp x pp x dp")
            continue
        m = r["global_batch"] // (r["gpus"] // mp) // r["micro_batch"]
        if r["virtual_stages"] > 1 and (m % r["pp"] or (r["layers"] // r["pp"]) % r["virtual_stages"]):
            bad.append(f"row {i}: interleaving needs micro-batches and layers per stage divisible")
        if r.get("mfu") is not None:
            got = model_flops(r, w["vocab"], w["seq_len"], 3) / (r["iteration_s"] * r["gpus"] * A100_PEAK)
            # (the time is quoted to 0.01 s: a 1.10 s row's MFU is known to +-0.2 points from it)
            if abs(got - r["mfu"]) > max(0.0015, got * 0.005 / r["iteration_s"] + 0.0005):
                bad.append(f"row {i}: MFU {got:.4f} from its time, the source says {r['mfu']}")
        if r.get("tflops_per_gpu") is not None:
            got = model_flops(r, w["vocab"], w["seq_len"], 4) / (r["iteration_s"] * r["gpus"]) / 1e12
            if abs(got - r["tflops_per_gpu"]) > 0.05:
                bad.append(f"row {i}: {got:.2f} TFLOP/s from its time, the source says {r['tflops_per_gpu']}")
        if r.get("tokens_per_s_per_gpu") is not None:
            got = r["global_batch"] * w["seq_len"] / (r["tokens_per_s_per_gpu"] * r["gpus"])
            if abs(got - r["iteration_s"]) > 0.00005:
                bad.append(f"row {i}: {got:.4f} s from its tokens/s per GPU, the file says {r['iteration_s']}")
        if r.get("model_tflops_per_gpu") is not None:
            got = model_flops(r, w["vocab"], w["seq_len"], 3) / (r["iteration_s"] * r["gpus"]) / 1e12
            if abs(got - r["model_tflops_per_gpu"]) > MODEL_TFLOPS_TOLERANCE:
                bad.append(f"row {i}: {got:.1f} model TFLOP/s from its time, the source says "
                           f"{r['model_tflops_per_gpu']}")
    return bad


def figures(res: list[dict]) -> dict:
    """(rows, MAPE %, mean signed error %) of ``res`` (``megatron_open_data.summary``)."""
    mape, signed = MOD.summary(res)
    return dict(rows=len(res), mape_pct=round(mape, 2), mean_signed_pct=round(signed, 2))


def reported(res: list[dict]) -> dict:
    """The figures ``--update`` stores in a set's file and ``--check`` compares."""
    return dict(figures(res), predicted_s=[round(r["predicted_s"], 2) for r in res])


def check(want: dict | None, res: list[dict]) -> list[str]:
    """What differs between a set's recomputed figures and its stored ``reported`` block."""
    if not want:
        return ["no 'reported' block (run --update)"]
    got, bad = reported(res), []
    if want["rows"] != got["rows"]:
        return [f"{got['rows']} rows, {want['rows']} stored"]
    for f in ("mape_pct", "mean_signed_pct"):
        if abs(want[f] - got[f]) > TOLERANCE["pct"]:
            bad.append(f"{f}: {got[f]} != stored {want[f]}")
    bad += [f"row {i}: predicted {g} s != stored {w}" for i, (w, g) in
            enumerate(zip(want["predicted_s"], got["predicted_s"])) if abs(w - g) > TOLERANCE["s"]]
    return bad


def _print(name: str, res: list[dict]) -> None:
    print(f"\n{name}")
    print("| params (B) | t | p | d | mb | v | variant | measured s | predicted s | error | 80 % interval s | "
          "fits | predicted compute / TP / p2p / DP sync / idle s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | --- | --- |")
    for r in res:
        print(f"| {r['params_b']} | {r['tp']} | {r['pp']} | {r['gpus'] // (r['tp'] * r['pp'])} | {r['micro_batch']} | "
              f"{r['virtual_stages']} | {r['variant']} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} | "
              f"{100 * r['error']:+.1f} % | {MOD.outcome_cells(r)} |")
    print(f"MAPE {verdict(res)}")


def verdict(res: list[dict]) -> str:
    """MAPE, mean signed error, how many rows are too fast, and how many the 80 % interval holds."""
    f, held = figures(res), [r["in_interval"] for r in res if r["in_interval"] is not None]
    return (f"{f['mape_pct']:.1f} %, mean signed error {f['mean_signed_pct']:+.1f} % "
            f"({sum(r['error'] < 0 for r in res)} "
            f"of {len(res)} rows too fast); the 80 % interval holds {sum(held)} of {len(held)} measurements")


def per_layer(doc: dict, rows: list[dict]) -> list[dict]:
    """A set's ``per_layer`` times (one transformer layer's forward + backward, as Korthikanti et al.'s
    Table 4 reports them) against perfsim's: the difference between the set's first configuration
    at its stated layers ``L`` and at 2 layers, less the optimizer step's difference, over ``L - 2``
    (embedding, LM head and loss cancel; each variant with its own recomputation and sequence
    parallelism)."""
    block = doc["per_layer"]
    base, out = rows[0], []
    for v in (dict(zip(block["columns"], r)) for r in block["rows"]):
        kw = dict(row_keywords(doc, base), recompute=v["recompute"], sequence_parallel=v["sequence_parallel"])
        deep, shallow = (MOD.predict_row(dict(base, layers=n), doc, **kw) for n in (base["layers"], 2))
        layer_s = ((deep["iteration_s"] - deep["optimizer_s"]) - (shallow["iteration_s"] - shallow["optimizer_s"])) \
            / (base["layers"] - 2)
        out.append(dict(v, predicted_ms=1e3 * layer_s, error=1e3 * layer_s / v["combined_ms"] - 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--check", action="store_true",
                    help="check each file's transcription and compare with its 'reported' figures; exit 1 if "
                         "anything differs")
    ap.add_argument("--update", action="store_true", help="store the figures as each file's 'reported' block")
    ap.add_argument("--per-layer", action="store_true",
                    help="also one layer's forward + backward time where a set reports it (Korthikanti et al. Table 4)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="an extra predict keyword for every row (repeatable), e.g. p2p_exchange=deepspeed: a "
                         "second look with a mechanism switched on, not the rows' prediction")
    ap.add_argument("--only", metavar="TEXT", help="only the sets whose file name contains TEXT, e.g. bloom")
    args = ap.parse_args(argv)
    if args.check and args.update:
        print("open_training_data: --check or --update, not both", file=sys.stderr)
        return 2
    if (args.set or args.only) and (args.check or args.update):
        print("open_training_data: --set or --only with --check or --update: the stored figures are every "
              "row's own prediction", file=sys.stderr)
        return 2
    from perfsim.errors import ConfigError  # lazy: as megatron_open_data's perfsim imports
    from perfsim.param_values import assignments
    from perfsim.result import atomic_write_text

    try:
        extra = {k: MOD._value(v) for k, v in assignments(args.set).items()}  # a name twice: refused
    except ConfigError as exc:
        print(f"open_training_data: {exc}", file=sys.stderr)
        return 2

    print("open multi-node training data other than Megatron-LM's Table 1, each row predicted once as stated; "
          "error = (predicted - measured) / measured iteration time, negative = too fast")
    every, bad = [], []
    try:
        sets = [p for p in SETS + ONE_NODE_SETS if args.only is None or args.only in p.name]
        if not sets:
            print(f"open_training_data: --only {args.only!r}: no set's file name contains it "
                  f"({', '.join(p.name for p in SETS + ONE_NODE_SETS)})", file=sys.stderr)
            return 2
        for path, doc, rows in load_sets(sets):
            res = evaluate(doc, rows, extra)
            if path in ONE_NODE_SETS:
                if path == ONE_NODE_SETS[0] and every:  # (after every multi-node set)
                    print(f"\nall multi-node sets: {len(every)} rows, MAPE {verdict(every)}")
                _print(f"one node, reported apart: {doc['name']} ({path.relative_to(ROOT)}), {len(rows)} rows", res)
                if args.per_layer and "per_layer" in doc:
                    print("one layer, forward + backward (the iteration less embedding, head, loss and optimizer):")
                    print("| variant | measured ms | predicted ms | error |\n| --- | ---: | ---: | ---: |")
                    for v in per_layer(doc, rows):
                        print(f"| {v['variant']} | {v['combined_ms']:.1f} | {v['predicted_ms']:.1f} | "
                              f"{100 * v['error']:+.1f} % |")
            else:
                every += res
                _print(f"{doc['name']} ({path.relative_to(ROOT)}), {len(rows)} rows", res)
            if args.check:
                problems = transcription_problems(doc, rows) + check(doc.get("reported"), res)
                bad += [f"{path.name}: {b}" for b in problems]
            if args.update:
                raw = json.loads(path.read_text())
                raw["reported"] = reported(res)
                atomic_write_text(path, json.dumps(raw, indent=2) + "\n")
    except ConfigError as exc:
        print(f"open_training_data: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"check: {len(bad)} differ" + "".join(f"\n  {b}" for b in bad))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
