"""How a new profile's measurements compare with another profile's (drift check).

A shared VM drifts: on the Intel Xeon 2-core VM a calibration 20 minutes after another
timed the layers 25-35 % slower, then matched again (docs/validation.md). Before trusting
a stored profile, time a quick calibration and compare: :func:`compare_profiles` pairs
the records that describe the same measurement (every field but the measured ones) and
gives, per group of ops, the median ratio new / old.
"""

from __future__ import annotations

import math
import statistics

from perfsim.profile.format import CODEC_OPS, COMM_OPS, COMPUTE_OPS
from perfsim.schedules import PLAIN_SCHEDULES

#: record fields that are measurements (or their bookkeeping), not what was measured
MEASURED = frozenset({"time_s", "spread_s", "repeats", "mean_s", "allreduce_s", "source", "samples",
                      "alpha_s", "beta_s_per_byte", "max_rel_error", "points", "threads", "cache"})
#: groups of ops reported together
GROUPS = {"compute": COMPUTE_OPS + ("optimizer", "stage_optimizer"),
          "codecs": CODEC_OPS,
          "communication": COMM_OPS + ("frame_send", "frame_recv", "fsdp_host")}


def _key(rec: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in rec.items() if k not in MEASURED))


def _label(rec: dict) -> str:
    """What a record measured, briefly: ``stage_fwd gpt2-tiny stage0 mb 8 pp 2``."""
    parts = [str(rec.get("op")), str(rec.get("model", "")), str(rec.get("name", ""))]
    if rec.get("micro_batch"):
        parts.append(f"mb {rec['micro_batch']}")
    if str(rec.get("op", "")).startswith("stage") and rec.get("world_size"):
        parts.append(f"pp {rec.get('pp', rec['world_size'])}")
        if str(rec.get("schedule", "1f1b")) not in ("1f1b", "None"):
            parts.append(str(rec["schedule"]))
    if rec.get("size_bytes") and not rec.get("model"):
        parts.append(f"{rec['size_bytes']} B")
    return " ".join(p for p in parts if p)


def compare_profiles(new, old) -> dict[str, tuple[float, int, tuple[float, str]]]:
    """``{group: (median of new time / old time, pairs, (worst ratio, its record))}`` over
    the records both profiles measured (:data:`GROUPS`); groups without a pair are left
    out. The worst pair is the one furthest from 1 in log scale: a median can hide the
    one record a prediction leans on (a whole stage's time, say)."""
    old_times = {}
    for r in old.records:
        if r.get("time_s", 0) > 0:
            old_times[_key(r)] = float(r["time_s"])
    out = {}
    for group, ops in GROUPS.items():
        pairs = [(float(r["time_s"]) / old_times[_key(r)], r) for r in new.records
                 if r.get("op") in ops and r.get("time_s", 0) > 0 and _key(r) in old_times]
        if pairs:
            worst, rec = max(pairs, key=lambda p: abs(math.log(p[0])))
            out[group] = (statistics.median(p[0] for p in pairs), len(pairs), (worst, _label(rec)))
    return out


def comparison_text(result: dict[str, tuple], old_name: str, tolerance: float = 0.10) -> str:
    """One line: each group's ratio, and whether ``old_name`` still describes this machine
    (naming each group's record furthest off, where it is off by more than ``tolerance``)."""
    if not result:
        return f"compare: no measurement in common with {old_name}"
    parts = [f"{g} {r[0]:.2f}x ({r[1]})" for g, r in result.items()]
    off = [g for g, r in result.items() if abs(r[0] - 1.0) > tolerance]
    verdict = (f"{', '.join(off)} differ by more than {tolerance:.0%}: re-calibrate before predicting with it"
               if off else f"within {tolerance:.0%}")
    worst = [f"{r[2][1]} {r[2][0]:.2f}x" for r in result.values() if len(r) > 2 and abs(r[2][0] - 1.0) > tolerance]
    if worst:
        verdict += f"; furthest: {', '.join(worst)}"
    return f"compare with {old_name} (new / old, median of matched records): {', '.join(parts)} -- {verdict}"


def compute_drift(now, profile) -> float:
    """A drift check's median compute ratio to the profile it re-timed (:func:`compare_profiles`'
    ``compute`` group), NaN when they share no compute record."""
    ratios = compare_profiles(now, profile)
    return ratios["compute"][0] if "compute" in ratios else math.nan


def _on_cpu(profile) -> bool:
    """The profile was measured on a CPU (its ``device``; a profile that names none counts as one)."""
    return str((profile.metadata or {}).get("device", "cpu")).startswith("cpu")


def can_drift_check(profile, model: str, micro_batch: int) -> bool:
    """Whether :func:`drift_check` can time ``model`` again as ``profile`` timed it: a CPU profile
    holding layer records of that model at that micro-batch."""
    if not _on_cpu(profile):
        return False
    return any(r.get("op") == "layer_fwd" and r.get("model") == model and r.get("micro_batch") == micro_batch
               for r in profile.records)


def drift_check(profile, model: str, micro_batch: int, out: str, pp: int = 1,
                schedule: str | None = None, tp: int = 1) -> dict[str, tuple] | None:
    """Time ``model``'s layers at ``micro_batch`` on this machine now, as ``profile``'s
    calibration timed them (its ranks, concurrency and statistic, from
    ``metadata["calibration"]``; the new profile is written to ``out``), and compare
    (:func:`compare_profiles`); also its whole ``pp``-stage records, as the profile timed
    them (micro-batches per step, schedule, harness or run), which a ``pp``-stage
    prediction reads first: those of ``schedule`` when the profile has them; and, with
    ``tp`` > 1, its TP ranks' records of that degree (``calibrate --tp``), which a TP
    prediction reads instead of splitting the layers. None when the profile holds no
    layer records of that model and micro-batch, or was measured on another kind of
    device."""
    if not can_drift_check(profile, model, micro_batch):
        return None
    from perfsim.calibrate.calibration import plan_calibration, run_calibration

    cal = (profile.metadata or {}).get("calibration", {})
    stages = [r for r in profile.records if r.get("op") == "stage_fwd" and r.get("model") == model
              and r.get("micro_batch") == micro_batch and r.get("pp", r.get("world_size")) == pp
              and r.get("schedule")]
    stage = next((r for r in stages if str(r["schedule"]) == (schedule or "").lower()), stages[0] if stages else None)
    staging = dict(stages=str(pp), stage_microbatches=int(stage.get("microbatches", 4)),
                   stage_schedule=str(stage["schedule"]),  # timed as they were (before the flag: harness)
                   stage_timing=str(cal.get("stage_timing", "harness"))) if stage else dict(stages="")
    timed_tp = tp > 1 and any(r.get("op") == "stage_fwd" and r.get("model") == model and r.get("micro_batch") == micro_batch
                              and int(r.get("tp", 1)) == tp for r in profile.records)
    plan = plan_calibration(model=model, micro_batch=str(micro_batch), **staging, codecs="none", comm="none",
                            ranks=int(cal.get("ranks", 2)), concurrent=bool(cal.get("concurrent_compute")),
                            statistic=str(cal.get("statistic", "median")), device="cpu",
                            tp=str(tp) if timed_tp else "")
    # a check compares with the profile: its own stage-versus-layer ratios stay in its metadata, unsaid
    now = run_calibration(plan, out, progress=False, warn=False,
                          command=f"validate's drift check of {model} at micro-batch {micro_batch}")
    return compare_profiles(now, profile)


def refreshed(profile, now):
    """``profile`` with the measurements of ``now`` wherever ``now`` measured the same thing
    (the pairs :func:`compare_profiles` matches: every field but the measured ones); the rest
    of ``profile`` (links, codecs, what ``now`` did not time) as it was. A drift check's
    profile (:func:`drift_check`) refreshes the calibration it re-timed: the layer and stage
    times of the moment it ran, with the calibration's communication costs."""
    from perfsim.profile import Profile

    new = {_key(r): r for r in now.records if r.get("time_s", 0) > 0}
    records = [{**r, **{k: v for k, v in new[_key(r)].items() if k in MEASURED}} if _key(r) in new else dict(r)
               for r in profile.records]
    return Profile(records=records, metadata={**profile.metadata, "refreshed_by": now.metadata.get("command", "")})


#: a CPU stage's record over the sum of its own layers' on a machine that held still: per-call
#: and autograd-graph overheads make it 1.01-1.12 (traces/cpu-2core.json, 2026-11-22); the band a
#: calibration's ratio must stay in before it is taken for the same machine (session 27: 1.14-1.82,
#: the stages timed 11 minutes after the layers; session 26: 0.73-0.83)
STEADY_STAGE_LAYER = (0.85, 1.35)
#: compared only where the stage's layers take at least this on average: digits-mlp's take 10-30 us,
#: where a stage call's own overhead is 1-4x its layers' sum on any machine
MIN_LAYER_S = 1e-3


def stage_layer_ratios(profile) -> dict[str, float]:
    """``{"<model> stage<k> <fwd|bwd> mb <m> pp <p> [<schedule>]": stage time / sum of its layers'}`` for
    every single-rank whole-stage record of a plain schedule (1F1B, GPipe) in a CPU profile (``perfsim calibrate --stages``) whose
    layers the profile also timed at the same micro-batch, each :data:`MIN_LAYER_S` or more on
    average: the two are measured apart, so their ratio says whether the machine's speed held in
    between (:data:`STEADY_STAGE_LAYER`)."""
    from perfsim.models.registry import get_model_spec  # lazy: the model registry is heavy

    if not _on_cpu(profile):
        return {}
    layer = {(r.get("model"), r.get("name"), r["op"], r.get("micro_batch")): float(r["time_s"])
             for r in profile.records if r["op"] in ("layer_fwd", "layer_bwd")}
    out = {}
    for r in profile.records:
        if r["op"] not in ("stage_fwd", "stage_bwd") or (r.get("tp") or 1) != 1 or not r.get("layers"):
            continue
        if str(r.get("schedule") or "1f1b").lower() not in PLAIN_SCHEDULES:
            continue  # interleaved chunks and ZB-H1's split backward cost more per call by design
        try:
            names = [layer_spec.name for layer_spec in get_model_spec(r["model"]).layers()]
        except Exception:  # noqa: BLE001 -- a model this perfsim no longer knows: nothing to compare
            continue
        first, last = r["layers"]
        op = "layer_" + r["op"][len("stage_"):]
        times = [layer.get((r["model"], n, op, r.get("micro_batch"))) for n in names[first:last + 1]]
        if not times or any(t is None for t in times) or sum(times) < MIN_LAYER_S * len(times):
            continue  # (layers of microseconds: the per-call overhead is the stage's time, not a drift)
        label = (f"{r['model']} {r['name']} {r['op'][len('stage_'):]} mb {r.get('micro_batch')} "
                 f"pp {r.get('pp', r.get('world_size'))}" + (f" {r['schedule']}" if r.get("schedule") else ""))
        out[label] = float(r["time_s"]) / sum(times)
    return out


def stage_layer_warnings(ratios: dict[str, float]) -> list[str]:
    """One stderr line per ratio of :func:`stage_layer_ratios` outside :data:`STEADY_STAGE_LAYER`."""
    lo, hi = STEADY_STAGE_LAYER
    return [f"calibrate: warning: {label} took {ratio:.2f}x the sum of its layers' ({lo}-{hi} on a machine "
            "that holds still): this machine's speed moved while it was timed; calibrate again when it is "
            "quiet, or check a prediction with perfsim validate --row-drift"
            for label, ratio in ratios.items() if not lo <= ratio <= hi]
