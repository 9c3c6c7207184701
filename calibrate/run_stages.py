"""Whole-stage compute timed in situ, by a short execute-mode run.

``perfsim calibrate --stages`` records each stage's forward, backward and optimizer
step as a pipeline rank runs them, which a pipeline prediction reads before its
per-layer records. The harness in :mod:`perfsim.calibrate.compute` drives execute
mode's stage modules by the schedule in ``--ranks`` processes that each time every
stage; on the Intel Xeon 2-core VM three calibrations of one day timed stage 0 of the
2-stage split at 6.02, 8.88 and 5.53 ms per forward while the runs computed it alike
each time (docs/validation.md, "Interference, re-measured"). ``--stage-timing run``
(the default on a CPU without ``--quick``) instead runs execute mode itself for a few steps -- ``pp`` stages and
``ranks / pp`` replicas over loopback, the runs' own processes, threads and schedule
-- and takes each stage's compute from what the run measured, as ``--tp`` does for a
tensor-parallel rank (:mod:`perfsim.calibrate.tensor_parallel`). Each schedule of
``--stage-schedule`` gets a run of its own, read from the run's trace chunk by chunk: an
interleaved 1F1B chunk and ZB-H1's backward split in two cost more per layer than a 1F1B
stage (docs/validation.md, "Each schedule timed in situ").
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class RunStageConfig:
    """One measurement: ``model`` split into ``pp`` pipeline ranks at ``micro_batch``,
    driven by ``schedule`` (any of :mod:`perfsim.schedules`: interleaved 1F1B cuts the
    model into ``pp x virtual_stages`` chunks, ZB-H1 splits each backward in two)."""

    model: str
    micro_batch: int
    pp: int
    ranks: int = 2  # processes of the run: pp stages x (ranks // pp) replicas
    microbatches: int = 4  # per step, as the validation runs use
    schedule: str = "1f1b"
    steps: int = 8  # the run's first step (warm-up) is left out of what is recorded
    device: str = "cpu"

    @property
    def dp(self) -> int:
        return max(1, self.ranks // self.pp)


def chunk_compute(trace_events: list[dict], first_step: int) -> dict[int, tuple[list[float], list[float]]]:
    """{chunk: (forward seconds, backward seconds)} of every micro-batch a run's trace
    (:attr:`perfsim.result.Result.trace_events`, compute actions named as
    :class:`perfsim.schedules.Action`) shows from ``first_step`` on, one sample per rank,
    step and micro-batch; a backward is the sum of its parts (ZB-H1's I and W)."""
    from perfsim.schedules import FORWARD, Action

    parts: tuple[dict, dict] = ({}, {})  # forward, backward: (chunk, rank, step, mb) -> seconds
    for e in trace_events:
        step = (e.get("args") or {}).get("step")
        if e.get("cat") != "compute" or step is None or step < first_step:
            continue
        a = Action.parse(str(e["name"]))
        into = parts[0 if a.kind == FORWARD else 1]
        key = (a.stage, e.get("pid"), step, a.microbatch)
        into[key] = into.get(key, 0.0) + float(e["dur"]) / 1e6
    out: dict[int, tuple[list[float], list[float]]] = {}
    for i, into in enumerate(parts):
        for key, t in into.items():
            out.setdefault(key[0], ([], []))[i].append(t)
    return out


def measure_run_stages(cfg: RunStageConfig) -> list[dict]:
    """``stage_fwd``, ``stage_bwd`` and ``stage_optimizer`` records of every stage (model
    chunk; the facts of the harness's records, ``source`` naming the run, ``schedule`` the
    one that ran): forward and backward ``time_s`` the calibration's statistic (the
    median) over the chunk's micro-batches in the run's trace (every replica, every step
    but the first); the optimizer step replica 0's mean, shared between a rank's chunks
    by their parameters. ``world_size`` is the number of stages (chunks) a prediction of
    this schedule cuts the model into (``pp``, the pipeline ranks, where they differ)."""
    from perfsim.calibrate.timing import summarize
    from perfsim.runtime import run
    from perfsim.runtime.config import RunConfig

    job = dict(model=cfg.model, pp=cfg.pp, dp=cfg.dp, micro_batch=cfg.micro_batch,
               macro_batch=cfg.microbatches * cfg.micro_batch, schedule=cfg.schedule)
    shape = RunConfig(**job)
    table = shape.table()
    with tempfile.TemporaryDirectory(prefix="perfsim-calibrate-stages-") as tmp:
        result = run(**job, steps=cfg.steps, out=tmp, device=cfg.device)
    spec, ranges = shape.spec(), shape.stage_ranges()
    layers = spec.layers()
    first = int(result.summary.get("start_step") or 0) + 1  # the warm-up step is not what a run measures
    per_chunk = chunk_compute(result.trace_events, first)
    params = [sum(lay.params for lay in layers[a:b]) for a, b in ranges]
    source = (f"calibrate --stage-timing run: perfsim run --pp {cfg.pp} --dp {cfg.dp} "
              f"--schedule {cfg.schedule}, {cfg.steps} steps")
    out = []
    for k, (a, b) in enumerate(ranges):
        base = {"model": spec.name, "name": f"stage{k}", "micro_batch": cfg.micro_batch,
                "world_size": table.num_stages, **({"pp": cfg.pp} if table.num_stages != cfg.pp else {}),
                "size_bytes": 4 * cfg.micro_batch * math.prod(layers[b - 1].out_shape), "dtype": "float32",
                "device": cfg.device, "params": params[k], "layers": f"{a}-{b - 1}",
                "schedule": cfg.schedule, "microbatches": cfg.microbatches, "concurrent_ranks": cfg.pp * cfg.dp,
                "source": source}
        fwd, bwd = per_chunk.get(k, ([], []))
        for op, times in (("stage_fwd", fwd), ("stage_bwd", bwd)):
            if not times:
                return [{"op": op, "skipped": f"the pp={cfg.pp} {cfg.schedule} run measured no micro-batch "
                                              f"of stage {k}"}]
            out.append({"op": op, **base, **summarize(times).record()})
        device = table.stage_device[k]
        opt = [float(r["optimizer_s"]) for r in result.stages if int(r["stage"]) == device and int(r["replica"]) == 0]
        mine = sum(params[j] for j, d in enumerate(table.stage_device) if d == device)
        if opt and opt[0] > 0 and mine > 0:
            out.append({"op": "stage_optimizer", **base, "optimizer": "adamw", "size_bytes": 4 * base["params"],
                        "time_s": opt[0] * params[k] / mine, "spread_s": 0.0, "repeats": 1})
    return out
