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
tensor-parallel rank (:mod:`perfsim.calibrate.tensor_parallel`).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class RunStageConfig:
    """One measurement: ``model`` split into ``pp`` stages at ``micro_batch``."""

    model: str
    micro_batch: int
    pp: int
    ranks: int = 2  # processes of the run: pp stages x (ranks // pp) replicas
    microbatches: int = 4  # per step, as the validation runs use
    schedule: str = "1f1b"
    steps: int = 8  # the run skips its first step (warm-up) in what it measures
    device: str = "cpu"

    @property
    def dp(self) -> int:
        return max(1, self.ranks // self.pp)


def measure_run_stages(cfg: RunStageConfig) -> list[dict]:
    """``stage_fwd``, ``stage_bwd`` and ``stage_optimizer`` records of every stage
    (the facts of the harness's records, ``source`` naming the run): forward and
    backward ``time_s`` the calibration's statistic (the median) over the stage's
    micro-batches of their compute (each the run's mean over its measured steps and
    replicas), the optimizer step replica 0's mean."""
    from perfsim.calibrate.timing import summarize
    from perfsim.runtime import run
    from perfsim.runtime.config import RunConfig

    job = dict(model=cfg.model, pp=cfg.pp, dp=cfg.dp, micro_batch=cfg.micro_batch,
               macro_batch=cfg.microbatches * cfg.micro_batch, schedule=cfg.schedule)
    shape = RunConfig(**job)
    with tempfile.TemporaryDirectory(prefix="perfsim-calibrate-stages-") as tmp:
        result = run(**job, steps=cfg.steps, out=tmp, device=cfg.device)
    spec, ranges = shape.spec(), shape.stage_ranges()
    layers = spec.layers()
    source = (f"calibrate --stage-timing run: perfsim run --pp {cfg.pp} --dp {cfg.dp} "
              f"--schedule {cfg.schedule}, {cfg.steps} steps")
    out = []
    for k, (a, b) in enumerate(ranges):
        base = {"model": spec.name, "name": f"stage{k}", "micro_batch": cfg.micro_batch, "world_size": cfg.pp,
                "size_bytes": 4 * cfg.micro_batch * math.prod(layers[b - 1].out_shape), "dtype": "float32",
                "device": cfg.device, "params": sum(lay.params for lay in layers[a:b]), "layers": f"{a}-{b - 1}",
                "schedule": cfg.schedule, "microbatches": cfg.microbatches, "concurrent_ranks": cfg.pp * cfg.dp,
                "source": source}
        rows = [r for r in result.microbatches if int(r["stage"]) == k]
        for op, key in (("stage_fwd", "fwd_compute_s"), ("stage_bwd", "bwd_compute_s")):
            times = [float(r[key]) for r in rows if r.get(key)]
            if not times:
                return [{"op": op, "skipped": f"the pp={cfg.pp} run measured no micro-batch of stage {k}"}]
            out.append({"op": op, **base, **summarize(times).record()})
        opt = [float(r["optimizer_s"]) for r in result.stages if int(r["stage"]) == k and int(r["replica"]) == 0]
        if opt and opt[0] > 0:
            out.append({"op": "stage_optimizer", **base, "optimizer": "adamw", "size_bytes": 4 * base["params"],
                        "time_s": opt[0], "spread_s": 0.0, "repeats": 1})
    return out
