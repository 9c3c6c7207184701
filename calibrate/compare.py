"""How a new profile's measurements compare with another profile's (drift check).

A shared VM drifts: on the Intel Xeon 2-core VM a calibration 20 minutes after another
timed the layers 25-35 % slower, then matched again (docs/validation.md). Before trusting
a stored profile, time a quick calibration and compare: :func:`compare_profiles` pairs
the records that describe the same measurement (every field but the measured ones) and
gives, per group of ops, the median ratio new / old.
"""

from __future__ import annotations

import statistics

from perfsim.profile.format import CODEC_OPS, COMM_OPS, COMPUTE_OPS

#: record fields that are measurements (or their bookkeeping), not what was measured
MEASURED = frozenset({"time_s", "spread_s", "repeats", "mean_s", "allreduce_s", "source", "samples",
                      "alpha_s", "beta_s_per_byte", "max_rel_error", "points", "threads", "cache"})
#: groups of ops reported together
GROUPS = {"compute": COMPUTE_OPS + ("optimizer", "stage_optimizer"),
          "codecs": CODEC_OPS,
          "communication": COMM_OPS + ("frame_send", "frame_recv")}


def _key(rec: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in rec.items() if k not in MEASURED))


def compare_profiles(new, old) -> dict[str, tuple[float, int]]:
    """``{group: (median of new time / old time, pairs)}`` over the records both
    profiles measured (:data:`GROUPS`); groups without a pair are left out."""
    old_times = {}
    for r in old.records:
        if r.get("time_s", 0) > 0:
            old_times[_key(r)] = float(r["time_s"])
    out = {}
    for group, ops in GROUPS.items():
        ratios = [float(r["time_s"]) / old_times[_key(r)] for r in new.records
                  if r.get("op") in ops and r.get("time_s", 0) > 0 and _key(r) in old_times]
        if ratios:
            out[group] = (statistics.median(ratios), len(ratios))
    return out


def comparison_text(result: dict[str, tuple[float, int]], old_name: str, tolerance: float = 0.10) -> str:
    """One line: each group's ratio, and whether ``old_name`` still describes this machine."""
    if not result:
        return f"compare: no measurement in common with {old_name}"
    parts = [f"{g} {r:.2f}x ({n})" for g, (r, n) in result.items()]
    off = [g for g, (r, _) in result.items() if abs(r - 1.0) > tolerance]
    verdict = (f"{', '.join(off)} differ by more than {tolerance:.0%}: re-calibrate before predicting with it"
               if off else f"within {tolerance:.0%}")
    return f"compare with {old_name} (new / old, median of matched records): {', '.join(parts)} -- {verdict}"


def drift_check(profile, model: str, micro_batch: int, out: str) -> dict[str, tuple[float, int]] | None:
    """Time ``model``'s layers at ``micro_batch`` on this machine now, as ``profile``'s
    calibration timed them (its ranks, concurrency and statistic, from
    ``metadata["calibration"]``; the new profile is written to ``out``), and compare
    (:func:`compare_profiles`). None when the profile holds no layer records of that
    model and micro-batch, or was measured on another kind of device."""
    meta = profile.metadata or {}
    device = meta.get("device", "cpu")
    if not str(device).startswith("cpu"):
        return None
    if not any(r.get("op") == "layer_fwd" and r.get("model") == model and r.get("micro_batch") == micro_batch
               for r in profile.records):
        return None
    from perfsim.calibrate.calibration import calibrate

    cal = meta.get("calibration", {})
    now = calibrate(out, progress=False, model=model, micro_batch=str(micro_batch), stages="", codecs="none",
                    comm="none", ranks=int(cal.get("ranks", 2)), concurrent=bool(cal.get("concurrent_compute")),
                    statistic=str(cal.get("statistic", "median")), device="cpu",
                    command=f"validate's drift check of {model} at micro-batch {micro_batch}")
    return compare_profiles(now, profile)
