"""Whole-stage compute of one tensor-parallel rank, timed by execute mode itself.

A profile's single-rank layer records predict a TP rank by splitting them
(:func:`perfsim.engine.compute.tp_measured_split`: GEMMs and attention ``1/t``,
the rest replicated). That split knows nothing of what the TP implementation
adds per operator: ``perfsim run --tp`` builds Megatron's layout from
``torch.distributed.tensor.parallel``, whose DTensor dispatch costs host time
on every sharded operator, and on a CPU that time is of the order of the
operators themselves. So ``perfsim calibrate --tp T`` runs execute mode (one
stage, ``T`` ranks over loopback, the run's own threads per rank) for a few
steps and records each rank's forward and backward compute per micro-batch
with the TP collectives taken out (execute mode measures every collective it
issues and subtracts it from the micro-batch it interrupts,
:func:`perfsim.runtime.tensor_parallel.charge_step`). The simulator adds the
collectives itself, over the link it is asked about; with such a record, the
measured compute wins over the split (:meth:`perfsim.profile.Profile.stage_measured`).
"""

from __future__ import annotations

import math
import statistics
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class TPStageConfig:
    """One measurement: ``model`` on one stage of ``tp`` ranks at ``micro_batch``."""

    model: str
    micro_batch: int
    tp: int
    sequence_parallel: bool = False
    microbatches: int = 4  # per step, as the validation runs use (macro-batch 4 x micro-batch)
    steps: int = 8  # the run skips its first step (warm-up) in what it measures
    device: str = "cpu"


def measure_tp_stage(cfg: TPStageConfig) -> list[dict]:
    """``stage_fwd`` and ``stage_bwd`` records (facts ``tp``, ``sequence_parallel``,
    ``layers`` = the whole model) of one TP rank, from a short execute-mode run:
    ``time_s`` is the median over the micro-batches of their compute without
    collectives (each a mean over the run's measured steps), ``spread_s`` their
    interquartile range."""
    from perfsim.models.registry import get_model_spec
    from perfsim.runtime import run

    spec = get_model_spec(cfg.model)
    layers = spec.layers()
    with tempfile.TemporaryDirectory(prefix="perfsim-calibrate-tp-") as tmp:
        result = run(model=cfg.model, pp=1, dp=1, schedule="1f1b", tp=cfg.tp,
                     sequence_parallel=cfg.sequence_parallel or None,
                     micro_batch=cfg.micro_batch, macro_batch=cfg.microbatches * cfg.micro_batch,
                     steps=cfg.steps, out=tmp, device=cfg.device)
    rows = result.microbatches
    base = {"model": spec.name, "name": "stage0", "micro_batch": cfg.micro_batch, "world_size": 1,
            "size_bytes": 4 * cfg.micro_batch * math.prod(layers[-1].out_shape), "dtype": "float32",
            "device": cfg.device, "layers": f"0-{len(layers) - 1}", "tp": cfg.tp,
            "sequence_parallel": int(cfg.sequence_parallel), "microbatches": cfg.microbatches,
            "source": f"calibrate --tp: perfsim run --tp {cfg.tp}"
                      f"{' --sequence-parallel' if cfg.sequence_parallel else ''}, {cfg.steps} steps, "
                      "collectives taken out"}
    out = []
    for op, key in (("stage_fwd", "fwd_compute_s"), ("stage_bwd", "bwd_compute_s")):
        times = sorted(float(r[key]) for r in rows if r.get(key) is not None)
        if not times:
            return [{"op": op, "skipped": f"the tp={cfg.tp} run measured no micro-batch"}]
        q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
        out.append({"op": op, **base, "time_s": statistics.median(times), "spread_s": q[2] - q[0],
                    "repeats": len(times)})
    return out

