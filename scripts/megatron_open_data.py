"""Predict every row of Megatron-LM's weak-scaling table (GPT 1.7B-1T on 32-3072 A100s) and
report the error, signed: (predicted - measured) / measured iteration time, negative = too fast.

Data: ``traces/open/megatron-weak-scaling-2104.04473.json`` (Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473,
Table 1; source, system, each row's configuration as Megatron-LM's ``examples/sc21/run_table_1.sh``
states it, and what is still assumed are in the file). The table gives achieved teraFLOP/s per
GPU with FLOPs counted by the paper's eq. (3), ``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))``;
the measured iteration time is ``F / (TFLOP/s x GPUs)``. Nothing is fitted to these rows.

Each row is predicted with its stated configuration: micro-batch, interleaved 1F1B with the
stated model chunks per device where there are several (non-interleaved 1F1B otherwise), and
the data-parallel implementation (:data:`DDP_IMPL`: ``torch`` overlaps a bucketed all-reduce
with the last backward, ``local`` reduces Megatron's contiguous buffer after it).

    python scripts/megatron_open_data.py                          # each row as stated
    python scripts/megatron_open_data.py --assumed                # micro-batch 1, 1F1B, local DDP (before 2026-11-27)
    python scripts/megatron_open_data.py --micro-batch 1,2,4      # every row at these micro-batches
    python scripts/megatron_open_data.py --schedule 1f1b --ddp local   # override one stated dimension
    python scripts/megatron_open_data.py --set nic_sharing=false  # any predict keyword, to switch a mechanism
    python scripts/megatron_open_data.py --candidates             # each candidate mechanism, switched on
    python scripts/megatron_open_data.py --single-node --set p2p_exchange=blocking   # its effect on one node
    python scripts/megatron_open_data.py --batched-exchange       # Megatron-LM's blocking p2p exchanges
    python scripts/megatron_open_data.py --exact-kernels          # every kernel of a layer, bytes as its code moves them
    python scripts/megatron_open_data.py --single-node --exact-kernels   # the same on the single-node A100 data
    python scripts/megatron_open_data.py --exact-kernels --refit  # refit the A100 curve with them first (~5-10 min)
    python scripts/megatron_open_data.py --exact-items            # each exact item alone, on the p = 1 rows
    python scripts/megatron_open_data.py --gemm-quantization waves   # GEMM tile and wave quantization on

``--candidates`` switches on, one at a time, each mechanism proposed for the rows being too
fast (:data:`CANDIDATES`: every value from its cited source, none fitted to these rows) and
prints MAPE and mean signed error over all rows and over the deep rows (>= 8 pipeline stages),
and each row's *compute factor* (:func:`compute_factor`): how much slower its compute and the
idle time that scales with it would have to run for the prediction to meet the measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
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


#: predict keywords of each ``--DDP-impl`` of Megatron-LM (why: the data file's
#: ``configuration.ddp_impl``). torch: PyTorch DDP -- every micro-batch but the last under
#: ``no_sync()``, then buckets of 25 MiB of fp16 gradients (perfsim counts a bucket in fp32
#: bytes: 50 MiB) all-reduced while the last backward runs, copied into and out of each bucket
#: (Li et al., "PyTorch Distributed", arXiv:2006.15704, Sec. 3.2.3). local: Megatron-LM's own,
#: one contiguous buffer all-reduced in place after the whole backward.
DDP_IMPL: dict[str, dict] = {
    "torch": dict(overlap=True, grad_buffer="bucketed", bucket_size="50MiB"),
    "local": dict(overlap=False, grad_buffer="contiguous"),
}
#: every row's configuration before the stated one was stored (``--assumed``)
ASSUMED = dict(micro_batch=1, schedule="1f1b", ddp_impl="local")


def row_config(row: dict, micro_batch: int | None = None, schedule: str | None = None,
               ddp_impl: str | None = None, assumed: bool = False) -> tuple[int, str, int, str]:
    """(micro-batch, schedule, model chunks per device, DDP implementation) of ``row``: as the
    file states it (``assumed``: :data:`ASSUMED`), each overridden where given. An interleaved
    schedule runs the stated chunks where the row states several, else :func:`megatron_chunks`."""
    base = ASSUMED if assumed else dict(micro_batch=row["micro_batch"], ddp_impl=row["ddp_impl"],
                                        schedule="interleaved-1f1b" if row["virtual_stages"] > 1 else "1f1b")
    mb = base["micro_batch"] if micro_batch is None else micro_batch
    sched = base["schedule"] if schedule is None else schedule
    ddp = base["ddp_impl"] if ddp_impl is None else ddp_impl
    if ddp not in DDP_IMPL:
        raise ValueError(f"ddp_impl {ddp!r}: expected one of {', '.join(DDP_IMPL)}")
    v = 1
    if sched.startswith("interleaved"):
        stated = 1 if assumed else row["virtual_stages"]
        v = stated if stated > 1 else megatron_chunks(row["layers"] // row["pp"])
    return mb, sched, v, ddp


def predict_row(row: dict, doc: dict, micro_batch: int | None = None, schedule: str | None = None,
                ddp_impl: str | None = None, assumed: bool = False, **extra) -> dict:
    """perfsim's prediction of one row in its configuration (:func:`row_config`; ``extra``: more
    predict keywords, which win; one given as None is left to perfsim's default, e.g.
    ``intra_node_bandwidth=None``: the GPU preset's own node fabric instead of the A100 node's 229 GB/s)."""
    from perfsim.api import predict

    w, sy = doc["workload"], doc["system"]
    t, p, n = row["tp"], row["pp"], row["gpus"]
    mb, sched, v, ddp = row_config(row, micro_batch, schedule, ddp_impl, assumed)
    kw = dict(model=f"gpt:layers={row['layers']},hidden={row['hidden']},heads={row['heads']},"
                    f"seq={w['seq_len']},vocab={w['vocab']}",
              gpu=sy["gpu"], tp=t, pp=p, dp=n // (t * p), micro_batch=mb,
              global_batch=row["global_batch"], gpus_per_node=sy["gpus_per_node"], nic=sy["nic"],
              intra_node_bandwidth="229GB/s", precision="fp16", recompute="full", schedule=sched,
              attention="megatron", allow_oom=True, **DDP_IMPL[ddp])
    if v > 1:
        kw["virtual_stages"] = v
    kw.update(extra)
    return predict(**{k: v for k, v in kw.items() if v is not None}).summary


def megatron_chunks(layers_per_device: int) -> int:
    """Model chunks per device of Megatron-LM's interleaved schedule: each chunk holds a whole number
    of layers (``--num-layers-per-virtual-pipeline-stage`` must divide the layers of a pipeline
    stage; Megatron-LM README, "interleaved pipelining schedule"), so the fewest chunks above one
    that divide ``layers_per_device`` (3 for the 529.6B row's 3 layers, where 2 would split a layer)."""
    return next((v for v in range(2, layers_per_device + 1) if layers_per_device % v == 0), 1)


def evaluate(doc: dict, rows: list[dict], micro_batch: int | None = None, schedule: str | None = None,
             ddp_impl: str | None = None, assumed: bool = False, **extra) -> list[dict]:
    """Per row: its configuration, predicted and measured iteration time and TFLOP/s, signed
    error, fits, the 80 % interval and whether it holds the measurement."""
    w = doc["workload"]
    out = []
    for row in rows:
        mb, sched, v, ddp = row_config(row, micro_batch, schedule, ddp_impl, assumed)
        s = predict_row(row, doc, micro_batch, schedule, ddp_impl, assumed, **extra)
        meas = measured_time(row, w["vocab"], w["seq_len"])
        pred = s["iteration_s"]
        low, high = s.get("iteration_s_low"), s.get("iteration_s_high")
        out.append(dict(row, run_micro_batch=mb, run_schedule=sched, run_virtual_stages=v, run_ddp=ddp,
                        predicted_s=pred, measured_s=meas, error=(pred - meas) / meas,
                        predicted_tflops=model_flops(row, w["vocab"], w["seq_len"]) / (pred * row["gpus"]) / 1e12,
                        fits=s["fits"], peak_gib=s["peak_memory_gib"], pipeline_s=s.get("pipeline_s"),
                        compute_s=s["compute_s"], idle_s=s["idle_s"], dp_sync_s=s["dp_sync_s"],
                        tp_comm_s=s.get("tp_comm_s", 0.0), p2p_s=s["comm_s"], low_s=low, high_s=high,
                        in_interval=None if low is None else low <= meas <= high))
    return out


#: the mechanisms proposed for the rows' optimism, each switched on alone at a value with a source
#: (label, predict keywords, why this value); docs/model.md, "Open multi-node data"
CANDIDATES: tuple[tuple[str, dict, str], ...] = (
    ("p2p latency per hop", dict(latency="6.6us"),
     "NCCL's per-step network latency, Simple protocol (src/graph/tuning.cc hwLat; perfsim.collectives.PROTOCOLS)"),
    ("p2p bytes: whole activation per TP rank", dict(tp_send="full"),
     "no scatter/gather: t copies of each boundary activation cross the NICs (an upper bound on bytes per hop)"),
    ("p2p bandwidth: half the NIC rate", dict(nic="8x100Gbps:infiniband"),
     "each hop at half of HDR's 200 Gb/s (a lower bound on what a GPU's own HCA moves)"),
    ("interleaved schedule (extra p2p)", dict(schedule="interleaved-1f1b"),
     "PTD-P as the paper describes it (interleaved 1F1B): v x the p2p messages, a smaller bubble; rows "
     "stated without chunks get the fewest Megatron-LM accepts (megatron_chunks)"),
    ("p2p rendezvous", dict(p2p_protocol="rendezvous"),
     "Megatron-LM's 2021 p2p waits on its batch_isend_irecv requests, then torch.cuda.synchronize(): "
     "a boundary moves once the receiver has posted its receive (NCCL p2p runs a kernel on both ends)"),
    ("blocking p2p exchanges", dict(p2p_exchange="blocking", p2p_protocol="rendezvous"),
     "Megatron-LM 2021 runs each compute step, then one batch_isend_irecv of its sends and the next step's "
     "receives, waited on, then torch.cuda.synchronize() (perfsim.schedules.exchange_rows); messages of "
     "more than NCCL's buffer move once the receiver is in its own exchange"),
    ("stage balance: partition by compute", dict(partition="balanced"),
     "the uniform split charges the head on the last stage; balanced moves blocks off it"),
    ("host time per operator at its bound", dict(host_overhead="80us"),
     "the top of kernel_s's range (perfsim.engine.curve_bounds): per-micro-batch launch cost"),
    ("synchronisation wait", dict(straggler_cv=0.01),
     "1 % speed spread between GPUs (Sinha et al., arXiv:2208.11035, report up to 8 % ranges)"),
    ("NCCL protocols", dict(collective_model="nccl"),
     "the message-size curve of NCCL's tuner (src/graph/tuning.cc)"),
    ("no gradient accumulation fusion (2021)", dict(grad_accumulation="autograd"),
     "each micro-batch's fp16 weight gradients added into param.grad, 6 bytes per parameter after the first "
     "micro-batch: the data file's configuration.grad_accumulation (fusion came to Megatron-LM in 2022)"),
    ("TP all-reduce at 200 GB/s busbw", dict(intra_node_bandwidth="200GB/s"),
     "nccl-tests all_reduce_perf on other A100 NVLink nodes: ~200 GB/s on an 8 x A100-SXM4-80GB HGX "
     "(NVIDIA/nccl-tests#149), 208 GB/s on an NV12 pair (#178); the single-node data's node: 229"),
)


def compute_factor(r: dict) -> float:
    """How much slower a row's compute (and the idle time that scales with it: the bubble) would
    have to run for the prediction to meet the measurement: ``1 + (measured - predicted) /
    (compute + idle)`` (> 1: the model's compute is too fast). A mechanism that scales with the
    pipeline depth (the bubble, per-hop messages) cannot give one factor to rows whose bubble
    differs."""
    return 1.0 + (r["measured_s"] - r["predicted_s"]) / (r["compute_s"] + r["idle_s"])


def candidates(doc: dict, rows: list[dict], micro_batch: int | None = None, assumed: bool = False,
               ) -> list[tuple[str, str, list[dict]]]:
    """(label, source, rows evaluated) for the rows' configuration (stated, or ``assumed``), then
    for each of :data:`CANDIDATES` switched on alone."""
    out = [("as stated", "", evaluate(doc, rows, micro_batch, assumed=assumed))]
    for label, kw, why in CANDIDATES:
        kw = dict(kw)
        out.append((label, why, evaluate(doc, rows, micro_batch, kw.pop("schedule", None), assumed=assumed, **kw)))
    return out


def summary(res: list[dict]) -> tuple[float, float]:
    """(MAPE %, mean signed error %) of ``res``."""
    e = [r["error"] for r in res]
    return 100 * sum(map(abs, e)) / len(e), 100 * sum(e) / len(e)


def worst(res: list[dict]) -> dict:
    """The row with the largest absolute error."""
    return max(res, key=lambda r: abs(r["error"]))


def bubble(r: dict) -> float:
    """The 1F1B bubble over the compute, ``(p - 1) / (m v)`` (Narayanan et al., arXiv:2104.04473,
    Sec. 2.2: m micro-batches per replica, v model chunks per device)."""
    m = r["global_batch"] // (r["gpus"] // (r["tp"] * r["pp"])) // r["run_micro_batch"]
    return (r["pp"] - 1) / (m * r["run_virtual_stages"])


@contextlib.contextmanager
def exact_kernels():
    """Predictions inside price each transformer block with every kernel Megatron-LM's layer
    launches and the bytes each really moves (:func:`perfsim.models.ops.block_ops` ``exact``: the
    QKV bias add, the context copy, bias gradients, residual-gradient sums, one-pass dropout
    backwards, the causal softmax's triangle, LayerNorm's five-pass backward). An experiment of
    this script: the engine reads ``perfsim.engine.compute.block_ops``, swapped here and restored."""
    import perfsim.engine.compute as compute

    plain = compute.block_ops
    compute.block_ops = functools.partial(plain, exact=True)
    try:
        yield
    finally:
        compute.block_ops = plain


#: the items of :func:`perfsim.models.ops.block_ops` ``exact``, each by the kernels it adds or restates
EXACT_ITEMS: tuple[tuple[str, frozenset], ...] = tuple((label, frozenset(names)) for label, names in (
    ("QKV bias add", ("qkv_bias",)),
    ("context copy", ("context_copy",)),
    ("row-parallel bias gradients", ("proj_bias_grad", "mlp_down_bias_grad")),
    ("residual-gradient sums", ("norm1_input_grad_accumulate", "norm2_input_grad_accumulate")),
    ("LayerNorm five-pass backward", ("norm1", "norm2")),
    ("bias-dropout-add one-pass backward", ("dropout_residual1", "dropout_residual2")),
    ("attention dropout one-pass backward", ("attn_dropout",)),
    ("causal softmax's triangle", ("softmax",)),
))


@contextlib.contextmanager
def exact_item(names: frozenset):
    """Like :func:`exact_kernels`, for one item only: the default block with the exact list's kernels
    named ``names`` substituted (restated) or added."""
    import perfsim.engine.compute as compute

    plain = compute.block_ops

    def block(*a, **k):
        exact = {op.name: op for op in plain(*a, **k, exact=True)}
        ops = [exact[op.name] if op.name in names else op for op in plain(*a, **k)]
        return ops + [exact[n] for n in sorted(names) if n in exact and n not in {op.name for op in ops}]

    compute.block_ops = block
    try:
        yield
    finally:
        compute.block_ops = plain


def calibrate_module():
    """``scripts/calibrate_a100.py`` as a module (its rows, splits, predictions and fit)."""
    spec = importlib.util.spec_from_file_location("calibrate_a100", ROOT / "scripts" / "calibrate_a100.py")
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)
    return cal


def refit(exact: bool = False, every: int = 2, iters: int = 150, gemm_quantization: str | None = None) -> int:
    """Refit the A100 curve as ``python scripts/calibrate_a100.py --every 2 --iters 150`` does (bounded
    Nelder-Mead on the calibration configurations, from the curve in the code; its validation
    split printed, never the held-out one), every block priced by :func:`exact_kernels` where
    ``exact``. The fitted curve stays on the ``a100-sxm4-80gb`` preset for this process (that
    script's ``set_curve``), so what is predicted next uses it; ``gemm_quantization``: fitted with
    that script's ``--gemm-quantization``. Its exit status."""
    flags = [] if gemm_quantization is None else ["--gemm-quantization", gemm_quantization]
    with exact_kernels() if exact else contextlib.nullcontext():
        return calibrate_module().main(["--every", str(every), "--iters", str(iters), *flags])


def single_node_effect(extra: dict, every: int = 1, exact: bool = False) -> list[tuple[str, int, float, float]]:
    """Does a mechanism switched on for this table worsen the single-node A100 data? Per split of
    ``scripts/calibrate_a100.py`` (calibration and validation; never the held-out one): (split,
    rows, MAPE % as that script predicts them, MAPE % with the predict keywords ``extra`` added).
    The rows are predicted by that script's own ``predict_row`` (one description of how they ran),
    its ``perfsim.api.predict`` given ``extra`` for the second pass (``exact``: also inside
    :func:`exact_kernels`); ``every``: every Nth row of each split only. Empty without the data."""
    import perfsim.api as api

    cal = calibrate_module()
    path = cal.data_path()
    if path is None:
        return []
    rows = cal.load_rows(path)
    out = []
    for split in ("calibration", "validation"):
        part = [r for r in rows if r["split"] == split][::every]
        base = cal.errors(part)
        plain = api.predict
        # predict_row imports it when called; ``extra`` wins over the keywords predict_row gives
        api.predict = lambda *args, **kw: plain(*args, **{**kw, **extra})
        try:
            with exact_kernels() if exact else contextlib.nullcontext():
                switched = cal.errors(part)
        finally:
            api.predict = plain
        out.append((split, len(part), 100 * sum(map(abs, base)) / len(base),
                    100 * sum(map(abs, switched)) / len(switched)))
    return out


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
    ap.add_argument("--micro-batch", default=None,
                    help="comma list: every row at these micro-batches (default: each row's stated one)")
    ap.add_argument("--schedule", default=None,
                    help="every row with this schedule (default: interleaved 1F1B where the row states "
                         "model chunks, 1F1B otherwise)")
    ap.add_argument("--ddp", default=None, choices=sorted(DDP_IMPL),
                    help="every row with this --DDP-impl (default: each row's stated one; DDP_IMPL)")
    ap.add_argument("--assumed", action="store_true",
                    help="the configuration assumed before it was stored: micro-batch 1, 1F1B, local DDP")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="an extra predict keyword (repeatable), e.g. nic_sharing=false")
    ap.add_argument("--candidates", action="store_true",
                    help="switch on each candidate mechanism alone (CANDIDATES)")
    ap.add_argument("--batched-exchange", action="store_true",
                    help="Megatron-LM's blocking p2p exchanges, one batch per compute step (the same as "
                         "--set p2p_exchange=blocking; perfsim.schedules.exchange_rows)")
    ap.add_argument("--exact-kernels", action="store_true",
                    help="every kernel of a block with the bytes it really moves (exact_kernels)")
    ap.add_argument("--exact-items", action="store_true",
                    help="instead: each item of --exact-kernels alone, its effect on the p = 1 rows (EXACT_ITEMS)")
    ap.add_argument("--refit", action="store_true",
                    help="first refit the A100 curve on the single-node calibration configurations with the "
                         "same kernels (refit: calibrate_a100.py --every 2 --iters 150), then predict with it")
    ap.add_argument("--gemm-quantization", default=None, metavar="Q",
                    help="price the A100's GEMMs with its curve's gemm_quantization Q: off or waves (GEMM tile "
                         "and wave quantization, perfsim.engine.gemm_waves; with --refit: fitted with it too)")
    ap.add_argument("--single-node", action="store_true",
                    help="instead: MAPE of the single-node A100 calibration and validation splits "
                         "(scripts/calibrate_a100.py) without and with the --set keywords")
    args = ap.parse_args(argv)
    from perfsim.errors import ConfigError  # lazy: as the script's other perfsim imports
    from perfsim.param_values import assignments

    try:
        mbs = [None] if args.micro_batch is None else [int(x) for x in args.micro_batch.split(",")]
        extra = {k: _value(v) for k, v in assignments(args.set).items()}  # a name twice: refused
        if args.batched_exchange:
            extra.setdefault("p2p_exchange", "blocking")
    except ConfigError as exc:  # (a ValueError: first)
        print(f"megatron_open_data: {exc}", file=sys.stderr)
        return 2
    except ValueError:
        print(f"megatron_open_data: bad --micro-batch {args.micro_batch!r}", file=sys.stderr)
        return 2
    if args.single_node and args.gemm_quantization is not None:
        print("megatron_open_data: --single-node with --gemm-quantization: use scripts/calibrate_a100.py --check "
              "--gemm-quantization Q", file=sys.stderr)
        return 2
    if args.single_node:
        res = single_node_effect(extra, exact=args.exact_kernels)
        if not res:
            print("megatron_open_data: no single-node A100 data (scripts/calibrate_a100.py: data_path)", file=sys.stderr)
            return 2
        for split, n, before, after in res:
            print(f"{split}: {n} rows, MAPE {before:.2f} % as calibrate_a100.py predicts them, "
                  f"{after:.2f} % with {extra}" + (" and exact kernels" if args.exact_kernels else ""))
        return 0
    if args.gemm_quantization is not None:
        try:
            calibrate_module().set_gemm_quantization(args.gemm_quantization)  # the data's a100-sxm4-80gb
        except ConfigError as exc:
            print(f"megatron_open_data: --gemm-quantization: {exc}", file=sys.stderr)
            return 2
    if args.refit:
        status = refit(args.exact_kernels, gemm_quantization=args.gemm_quantization)
        if status:
            return status
    doc, rows = load()
    try:
        with exact_kernels() if args.exact_kernels else contextlib.nullcontext():
            return _report(doc, rows, mbs, args, extra)
    except ConfigError as exc:
        print(f"megatron_open_data: {exc}", file=sys.stderr)
        return 2


def _report(doc: dict, rows: list[dict], mbs: list, args, extra: dict) -> int:
    if args.exact_items:
        return _print_exact_items(doc, [r for r in rows if r["pp"] == 1])
    if args.candidates:
        return _print_candidates(doc, rows, mbs[0], args.assumed)
    print(f"{doc['name']} -- {doc['source'].split(',')[0]}, {len(rows)} rows; error = (predicted - measured) / "
          "measured iteration time, negative = too fast")
    for mb in mbs:
        res = evaluate(doc, rows, mb, args.schedule, args.ddp, args.assumed, **extra)
        what = ("assumed: micro-batch 1, 1f1b, local DDP" if args.assumed else
                "as stated (examples/sc21/run_table_1.sh)") + \
            (", every kernel with its exact bytes" if args.exact_kernels else "") + \
            (", the A100 curve refitted with them" if args.refit else "") + \
            (f", gemm_quantization {args.gemm_quantization}" if args.gemm_quantization else "") + "".join(
            f", {k} {v} for every row" for k, v in (("micro-batch", mb), ("schedule", args.schedule),
                                                    ("DDP", args.ddp)) if v is not None)
        print(f"\n{what}" + (f", {extra}" if extra else ""))
        print("| params (B) | t | p | d | mb | v | DDP | measured s | predicted s | TFLOP/s meas / pred | error | "
              "80 % interval s | fits | predicted compute / TP / p2p / DP sync / idle s |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
        for r in res:
            print(f"| {r['params_b']} | {r['tp']} | {r['pp']} | {r['gpus'] // (r['tp'] * r['pp'])} | "
                  f"{r['run_micro_batch']} | {r['run_virtual_stages']} | {r['run_ddp']} | "
                  f"{r['measured_s']:.2f} | {r['predicted_s']:.2f} | {r['tflops_per_gpu']} / "
                  f"{r['predicted_tflops']:.1f} | {100 * r['error']:+.1f} % | {outcome_cells(r)} |")
        m, s = summary(res)
        w = worst(res)
        held = [r["in_interval"] for r in res if r["in_interval"] is not None]
        print(f"MAPE {m:.1f} %, mean signed error {s:+.1f} % ({sum(r['error'] < 0 for r in res)} of {len(res)} "
              f"rows too fast); worst row {w['params_b']}B {100 * w['error']:+.1f} %; the 80 % interval holds "
              f"{sum(held)} of {len(held)} measurements")
    return 0


def outcome_cells(r: dict) -> str:
    """A predicted row's last table cells: its 80 % interval (and whether it holds the measurement),
    whether it fits (peak GiB), and the predicted compute / TP / p2p / DP sync / idle seconds."""
    band = "-" if r["low_s"] is None else \
        f"{r['low_s']:.2f}-{r['high_s']:.2f} ({'holds' if r['in_interval'] else 'misses'})"
    return (f"{band} | {'yes' if r['fits'] else 'NO'} ({r['peak_gib']:.0f} GiB) | {r['compute_s']:.2f} / "
            f"{r['tp_comm_s']:.2f} / {r['p2p_s']:.2f} / {r['dp_sync_s']:.2f} / {r['idle_s']:.2f}")


def _print_exact_items(doc: dict, rows: list[dict]) -> int:
    base = evaluate(doc, rows)
    print("each item of block_ops(exact=True) alone (the rest as the default lists it): points of signed "
          "error it adds, per row")
    print("| item | " + " | ".join(f"{r['params_b']}B t={r['tp']}" for r in base) + " |")
    print("| --- |" + " ---: |" * len(base))
    print("| default (signed error) | " + " | ".join(f"{100 * r['error']:+.2f} %" for r in base) + " |")
    for label, names in EXACT_ITEMS:
        with exact_item(names):
            res = evaluate(doc, rows)
        print(f"| {label} | " + " | ".join(f"{100 * (r['error'] - b['error']):+.2f}" for r, b in zip(res, base)) + " |")
    return 0


def _print_candidates(doc: dict, rows: list[dict], micro_batch: int | None, assumed: bool) -> int:
    deep = [i for i, r in enumerate(rows) if r["pp"] >= 8]
    base = "assumed (micro-batch 1, 1F1B, local DDP)" if assumed else "as stated (examples/sc21/run_table_1.sh)"
    print(f"{base}{'' if micro_batch is None else f', micro-batch {micro_batch}'} unless the variant says; "
          f"signed error per row (rows in the file's order), deep = the {len(deep)} rows with >= 8 pipeline stages")
    print("| variant | MAPE | mean signed | mean signed, deep | per row | why this value |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for label, why, res in candidates(doc, rows, micro_batch, assumed):
        m, s = summary(res)
        _, sd = summary([res[i] for i in deep])
        per_row = " ".join(f"{100 * r['error']:+.1f}" for r in res)
        print(f"| {label} | {m:.1f} % | {s:+.1f} % | {sd:+.1f} % | {per_row} | {why} |")
        if label == "as stated":
            stated = res
    print("\ncompute factor per row (1 + (measured - predicted) / (compute + idle)), as stated:")
    for r in stated:
        print(f"  {r['params_b']}B  t={r['tp']} p={r['pp']} mb={r['run_micro_batch']} v={r['run_virtual_stages']}  "
              f"bubble (p-1)/(m v) {bubble(r):.3f}  factor {compute_factor(r):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
