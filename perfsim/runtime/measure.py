"""Turn the ranks' timings into a measured :class:`perfsim.result.Result`.

Same schema as ``perfsim predict`` (:mod:`perfsim.result`), ``source="measured"``.

Definitions (all per optimizer step, averaged over the *measured* steps):

* measured steps: every step of this session except the first (warm-up of
  allocators and sockets); when the pipeline compressor has an uncompressed
  warm-up phase (AQ-SGD's first epoch: Alg. 1 of AQ-SGD, arXiv:2206.01299) and the run
  went past epoch 0, only steps of later epochs count, so throughput is that of
  the compressed phase; likewise the warm-up steps of 1-bit Adam / LAMB
  (uncompressed allreduce) are left out when compressed steps follow. ``summary["measured_steps"]`` says how many.
* ``iteration_s``: median over measured steps of the interval between the end
  of the previous step and the end of this one, the end being the last rank's
  end (after gradient sync and optimizer step).
The definitions are the simulator's (``perfsim/engine/report.py``), so rows compare:

* stage ``compute_s``: forward + backward compute; ``encode_s``: encode +
  decode; ``comm_s``: transfer time of the messages this stage *sent*, as its
  receivers measured it (``done - max(sent, posted)``, see
  :mod:`perfsim.runtime.pipeline`; it overlaps compute); ``dp_sync_s``:
  gradient averaging; ``idle_s``: ``iteration - compute - encode - optimizer``
  (waiting for data, for the gradient sync, or the bubble). ``comm_s`` is a
  lower bound: bytes that reached the receiver's socket buffer before it posted
  its receive are not seen; ``comm_upper_s`` (send start to delivery) is the
  upper bound (it includes a late receiver). Extra columns ``recv_comm_s`` /
  ``recv_wait_s``: transfer / waiting of what the stage received.
* summary ``compute_s`` / ``comm_s`` / ``encode_s`` / ``idle_s`` /
  ``dp_sync_s`` / ``optimizer_s``: mean over stage rows;
  ``bubble_fraction``: ``1 - sum_s busy_s / (p * T_pipe)`` with busy = compute
  + encode and ``T_pipe`` from the step's start to its last backward;
  ``pipeline_bytes`` / ``dp_bytes``: bytes all ranks put on the wire per step
  (payload bodies; headers are in ``overhead_bytes``).
* microbatches: ``fwd_comm_s`` / ``bwd_comm_s`` of (stage, mb) are the transfers
  of the activation / gradient that stage sent (as the simulator).
* links: ``bytes`` from the sender's count, ``busy_s`` from the receiver's
  transfer times, per step.
* tensor parallelism (:mod:`perfsim.runtime.tensor_parallel`): one stage row
  per rank (``tp_rank`` column); ``tp_comm_s``: the rank's TP collectives (as it
  sees them, waiting for its peers included), taken out of ``compute_s``;
  ``tp_bytes``: the buffers it hands to them; summary ``tp_comm_s`` is the mean over rows,
  ``tp_bytes`` the sum over ranks per step.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from perfsim import outputs
from perfsim.compression import make_pipeline_pair
from perfsim.result import LINK_COLUMNS, MICROBATCH_COLUMNS, STAGE_COLUMNS, Result, SUMMARY_COLUMNS


def _onebit_warmup(grad_compress) -> int | None:
    """1-bit optimizers' warm-up steps (None for gradient compressors); ``grad_compress``
    is the run's :class:`perfsim.compression.spec.Spec`."""
    return grad_compress.warmup_steps()


def _has_warmup(cfg) -> bool:
    shape = (cfg.micro_batch, 8)
    for spec in {cfg.compress, *cfg.boundary_compress.values()}:
        fw, _ = make_pipeline_pair(spec)
        if fw.wire_bytes(shape, warmup=True) != fw.wire_bytes(shape):
            return True
    return False


def measured_steps(cfg, gathered: list[dict]) -> list[int]:
    steps = sorted({r["step"] for g in gathered for r in g["records"]})
    if not steps:
        return []
    chosen = steps[1:] or steps
    if _has_warmup(cfg):
        epochs = {r["step"]: r["epoch"] for g in gathered for r in g["records"]}
        later = [s for s in chosen if epochs[s] >= 1]
        if later:
            chosen = later
    warm = {r["step"] for g in gathered for r in g["records"] if r.get("dp_warmup")}
    compressed = [s for s in chosen if s not in warm]
    return compressed or chosen


def latency_in(cfg) -> str:
    """Who made an emulated run's one-way latency: ``kernel`` (tc netem: TCP saw the round trip,
    so its window bounds a connection as on a real long link, perfsim.tcp), ``application``
    (a kernel without sch_netem: the launcher told the messenger to delay deliveries,
    ``PERFSIM_APP_LATENCY_S``, perfsim.netem; the kernel's round trip stayed ~0, no window
    binds), or ``""`` (no emulated latency)."""
    if cfg.bandwidth_bps is None or not cfg.latency_s:
        return ""
    return "application" if float(os.environ.get("PERFSIM_APP_LATENCY_S", "0") or 0) else "kernel"


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def build_result(cfg, gathered: list[dict], dataset_name: str = "") -> Result:
    spec = cfg.spec()
    gathered = sorted(gathered, key=lambda g: g["rank"])
    by_rank = {g["rank"]: g for g in gathered}
    layout = cfg.layout
    steps = measured_steps(cfg, gathered)
    n = max(1, len(steps))
    recs = {(g["rank"], r["step"]): r for g in gathered for r in g["records"]}
    ends: dict[int, float] = {}
    starts: dict[int, float] = {}
    for (_, step), r in recs.items():
        ends[step] = max(ends.get(step, r["end"]), r["end"])
        starts[step] = min(starts.get(step, r["start"]), r["start"])
    iters = [ends[s] - ends[s - 1] if s - 1 in ends else ends[s] - starts[s] for s in steps]
    iteration_s = statistics.median(iters) if iters else float("nan")

    def sent_transfer(rank: int, step: int, mb: int, kind: str, what: str = "comm") -> float:
        """Transfer time (``what="span"``: send start to delivery) of what ``rank``
        sent, measured by its receiver."""
        g = by_rank[rank]
        peer = g["stage"] + (1 if kind == "fwd" else -1)
        if len(g.get("chunks", [0])) > 1:  # several stages per rank: the pipeline wraps around
            peer %= cfg.pp
        if not 0 <= peer < cfg.pp or peer == g["stage"]:
            return 0.0
        r = recs.get((layout.rank(peer, g["replica"], g.get("tp_rank", 0)), step))
        if r is None:
            return 0.0
        return r["micro"][mb].get(f"{kind}_{what}_s", 0.0)

    stages, micro_rows, links = [], {}, {}
    total_bytes = dp_bytes = overhead = tp_bytes = tied_bytes = 0.0
    for g in gathered:
        rank, stage = g["rank"], g["stage"]
        mine = [recs[(rank, s)] for s in steps if (rank, s) in recs]
        m = len(mine[0]["micro"]) if mine else 0
        comp = _mean(sum(x["fwd_compute_s"] + x["bwd_compute_s"] for x in r["micro"]) for r in mine)
        enc = _mean(sum(x["encode_s"] for x in r["micro"]) for r in mine)
        comm = _mean(sum(sent_transfer(rank, r["step"], mb, k) for mb in range(m) for k in ("fwd", "bwd"))
                     for r in mine)
        comm_upper = _mean(sum(sent_transfer(rank, r["step"], mb, k, "span") for mb in range(m)
                               for k in ("fwd", "bwd")) for r in mine)
        recv_comm = _mean(sum(x["fwd_comm_s"] + x["bwd_comm_s"] for x in r["micro"]) for r in mine)
        recv_wait = _mean(sum(x["fwd_wait_s"] + x["bwd_wait_s"] for x in r["micro"]) for r in mine)
        dps = _mean(r["dp_sync_s"] for r in mine)
        tpc = _mean(r.get("tp_comm_s", 0.0) for r in mine)
        tpb = _mean(r.get("tp_bytes", 0) for r in mine)
        tp_bytes += tpb
        opt = _mean(r["optimizer_s"] for r in mine)
        sent = _mean(sum(x["bytes_sent"] for x in r["micro"]) for r in mine)
        total_bytes += sent
        overhead += _mean(sum(x["overhead_bytes"] for x in r["micro"]) for r in mine)
        dp_bytes += _mean(r["dp_bytes"] for r in mine)
        tied_bytes += _mean(r.get("tied_bytes", 0) for r in mine)
        stages.append({"replica": g["replica"], "stage": stage, "compute_s": comp, "comm_s": comm,
                       "encode_s": enc, "idle_s": max(0.0, iteration_s - comp - enc - opt - tpc),
                       "dp_sync_s": dps, "bytes_sent": sent, "peak_inflight": g["peak_inflight"],
                       "optimizer_s": opt, "comm_upper_s": comm_upper, "recv_comm_s": recv_comm, "recv_wait_s": recv_wait,
                       "params": g["params"],
                       "layers": ",".join(f"{a}-{b - 1}" for a, b in g.get("chunks", [g["layers"]])),
                       "tp_rank": g.get("tp_rank", 0), "tp_comm_s": tpc, "tp_bytes": tpb})
        for r in mine:
            for mb, x in enumerate(r["micro"]):
                row = micro_rows.setdefault((stage, mb), {k: [] for k in MICROBATCH_COLUMNS[2:]})
                row["fwd_compute_s"].append(x["fwd_compute_s"])
                row["fwd_comm_s"].append(sent_transfer(rank, r["step"], mb, "fwd"))
                row["bwd_compute_s"].append(x["bwd_compute_s"])
                row["bwd_comm_s"].append(sent_transfer(rank, r["step"], mb, "bwd"))
                row["encode_s"].append(x["encode_s"])
            for dst, (nbytes, _) in r["links"].items():
                link = links.setdefault((rank, int(dst)), [0.0, 0.0])
                link[0] += nbytes / n
                kind = "fwd" if layout.coords(int(dst))[0] > stage else "bwd"  # by stage, not rank number
                link[1] += sum(sent_transfer(rank, r["step"], mb, kind) for mb in range(m)) / n
    microbatches = [{"stage": s, "microbatch": mb, **{k: _mean(v) for k, v in row.items()}}
                    for (s, mb), row in sorted(micro_rows.items())]
    link_rows = [{"src": s, "dst": d, "bytes": b, "busy_s": t} for (s, d), (b, t) in sorted(links.items())]

    # bubble (as the simulator, engine/report.py): 1 - sum_s busy_s / (p * T_pipe) per replica,
    # busy = compute + encode/decode, T_pipe = step start until the last backward ends
    bubbles = []
    for replica, tp_rank in ((d, t) for d in range(cfg.dp) for t in range(cfg.tp)):
        for step in steps:
            keys = [(layout.rank(s, replica, tp_rank), step) for s in range(cfg.pp)]
            rr = [recs[k] for k in keys if k in recs]
            if len(rr) != cfg.pp:
                continue
            t_pipe = max(r["pipe_end"] for r in rr) - min(r["start"] for r in rr)
            busy = sum(x["fwd_compute_s"] + x["bwd_compute_s"] + x["encode_s"] for r in rr for x in r["micro"])
            busy += sum(r.get("tp_comm_s", 0.0) for r in rr)  # inside the compute intervals
            if t_pipe > 0:
                bubbles.append(1.0 - busy / (cfg.pp * t_pipe))

    # loss: mean over replicas of the last stage's step loss
    per_step: dict[int, list[float]] = {}
    for g in gathered:
        for step, loss in g["loss_history"].items():
            per_step.setdefault(int(step), []).append(loss)
    losses = {s: _mean(v) for s, v in sorted(per_step.items())}
    last = list(losses.values())
    spe = gathered[0]["steps_per_epoch"]
    summary: dict[str, Any] = {
        "model": cfg.model, "bandwidth_bps": cfg.bandwidth_bps, "latency_s": cfg.latency_s,
        "compress": cfg.compress.text, "grad_compress": cfg.grad_compress.text, "schedule": cfg.schedule,
        "boundary_compress": cfg.boundary_compress.text, "device_order": ",".join(map(str, cfg.device_order or ())),
        "pp": cfg.pp, "dp": cfg.dp, "micro_batch": cfg.micro_batch, "macro_batch": cfg.macro_batch,
        "throughput_samples_per_s": cfg.macro_batch * cfg.dp / iteration_s if iteration_s > 0 else None,
        "throughput_tokens_per_s": (cfg.macro_batch * cfg.dp * spec.tokens_per_sample / iteration_s
                                    if iteration_s > 0 else None),
        "iteration_s": iteration_s,
        "bubble_fraction": _mean(bubbles) if bubbles else None,
        "compute_s": _mean(r["compute_s"] for r in stages), "comm_s": _mean(r["comm_s"] for r in stages),
        "encode_s": _mean(r["encode_s"] for r in stages), "idle_s": _mean(r["idle_s"] for r in stages),
        "dp_sync_s": _mean(r["dp_sync_s"] for r in stages),
        "optimizer_s": _mean(r["optimizer_s"] for r in stages),
        "pipeline_bytes": total_bytes, "dp_bytes": dp_bytes,
        "peak_inflight": max(g["peak_inflight"] for g in gathered),
        "epoch_s": iteration_s * spe, "source": "measured",
        "onebit_warmup": _onebit_warmup(cfg.grad_compress),
        "final_loss": last[-1] if last else None,
        "loss_last10": _mean(last[-10:]) if last else None,
        "steps": gathered[0]["steps"], "start_step": gathered[0]["start_step"],
        "measured_steps": len(steps), "steps_per_epoch": spe, "dataset": dataset_name,
        "partition": ",".join(str(b - a) for a, b in sorted(c for g in gathered
                                                            if g["replica"] == 0 and g.get("tp_rank", 0) == 0
                                                            for c in g.get("chunks", [g["layers"]]))),
        "virtual_stages": cfg.table().virtual_stages,
        "overhead_bytes": overhead, "seed": cfg.seed, "lr": cfg.lr, "optimizer": cfg.optimizer,
        "dataset_limit": cfg.dataset_limit,
        "device": cfg.device, "emulated": cfg.bandwidth_bps is not None, "latency_in": latency_in(cfg),
        "load_average_1m": _loadavg(),  # the machine may be shared: keep its load with the figures
        # tensor parallelism: per step, bytes all ranks hand to TP collectives
        # (perfsim.runtime.tensor_parallel), their time per stage row (taken out of compute_s)
        # tied embedding (perfsim.runtime.tied): wire bytes of its all-reduce, all ranks, per step
        "tied_embedding": cfg.tied_embedding, "tied_bytes": tied_bytes,
        "tp": cfg.tp, "sequence_parallel": cfg.sequence_parallel, "tp_bytes": tp_bytes, "zero": cfg.zero,
        "tp_comm_s": _mean(r["tp_comm_s"] for r in stages),
    }
    result = Result(summary, stages, microbatches, link_rows, trace_events(gathered))
    result.losses = losses
    return result


def trace_events(gathered: list[dict]) -> list[dict]:
    """Chrome trace: one process per replica, one thread per stage (and TP rank), times in us."""
    t_min = min((r["start"] for g in gathered for r in g["records"]), default=0.0)
    events: list[dict] = []
    tp = 1 + max((g.get("tp_rank", 0) for g in gathered), default=0)
    for g in gathered:
        tp_rank = g.get("tp_rank", 0)
        pid, tid = g["replica"], g["stage"] * tp + tp_rank
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": f"replica {pid}"}})
        where = f"stage {g['stage']}" + (f" tp {tp_rank}" if tp > 1 else "")
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": f"{where} (rank {g['rank']})"}})
        for r in g["records"]:
            for name, cat, t0, t1, args in r["events"]:
                events.append({"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                               "ts": (t0 - t_min) * 1e6, "dur": max(0.0, t1 - t0) * 1e6,
                               "args": {"step": r["step"], **args}})
    return events


#: what :func:`write_outputs` writes into a run folder, ``result.json`` (the one
#: :func:`load_result` reads) last
OUTPUT_FILES = ("summary.csv", "stages.csv", "microbatches.csv", "links.csv", "losses.csv", "trace.json",
                "result.json")


def write_outputs(result: Result, out: str | Path, gathered: list[dict] | None = None) -> None:
    """result.json, summary.csv, stages.csv, microbatches.csv, links.csv, losses.csv, trace.json.

    Every file is rendered before the first is written, then each is written atomically
    (:func:`perfsim.outputs.write_text`), ``result.json`` last: a failure while rendering
    leaves the folder as it was, and ``result.json`` never describes files not yet written."""
    out = Path(out)
    losses = result.losses
    data = result.to_json_dict()
    data["losses"] = [{"step": s, "loss": v} for s, v in losses.items()]
    texts = {"summary.csv": outputs.records_csv([result.row()], SUMMARY_COLUMNS),
             "stages.csv": outputs.records_csv(result.stages, STAGE_COLUMNS),
             "microbatches.csv": outputs.records_csv(result.microbatches, MICROBATCH_COLUMNS),
             "links.csv": outputs.records_csv(result.links, LINK_COLUMNS),
             "losses.csv": outputs.records_csv(data["losses"], ["step", "loss"]),
             "trace.json": result.trace_text(),
             "result.json": outputs.json_text(data, default=float)}
    for name in OUTPUT_FILES:
        outputs.write_text(out / name, texts[name])


def results_written(out: str | Path, steps: int) -> bool:
    """Whether run folder ``out`` holds every file :func:`write_outputs` writes, of a run that
    ended at step ``steps`` (``result.json``, written last, says so): a run killed after its
    final checkpoint but before or while writing them has not (nor has a folder holding an
    earlier, shorter session's results)."""
    out = Path(out)
    if not all((out / name).is_file() for name in OUTPUT_FILES):
        return False
    try:
        return int(json.loads((out / "result.json").read_text())["summary"]["steps"]) == int(steps)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def load_result(out: str | Path) -> Result:
    """Read back what :func:`write_outputs` wrote."""
    out = Path(out)
    data = json.loads((out / "result.json").read_text())
    trace = []
    if (out / "trace.json").exists():
        trace = json.loads((out / "trace.json").read_text()).get("traceEvents", [])
    result = Result(data["summary"], data["stages"], data["microbatches"], data["links"], trace)
    result.losses = {int(d["step"]): d["loss"] for d in data.get("losses", [])}
    return result
