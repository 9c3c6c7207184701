"""Stored alpha-beta fits: ``fit_<op>`` records of measured points.

The fit itself is :func:`perfsim.profile.costs.fit_alpha_beta` (relative-error
weighted, non-negative; its docstring says why): the one the simulator uses
when a profile stores no fit, so a stored fit and a refit of the same raw
records agree.
"""

from __future__ import annotations

from perfsim.profile.costs import Fit, fit_alpha_beta

__all__ = ["Fit", "fit_alpha_beta", "fit_records"]


def fit_records(records: list[dict], op: str, group_keys=("name",), extra: dict | None = None
                ) -> list[dict]:
    """``fit_<op>`` records: one alpha-beta fit per group of ``op`` records.

    Each fit record carries the group's key columns plus ``alpha_s``,
    ``beta_s_per_byte``, ``points``, ``max_rel_error`` (the worst relative
    residual, a quality flag) and the sizes fitted (``size_min``, ``size_max``).
    """
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("op") == op:
            groups.setdefault(tuple(r.get(k) for k in group_keys), []).append(r)
    out = []
    for key, rows in groups.items():
        f = fit_alpha_beta([r["size_bytes"] for r in rows], [r["time_s"] for r in rows])
        rec = {"op": f"fit_{op}", **dict(zip(group_keys, key)),
               "alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte,
               "points": f.points, "max_rel_error": f.max_rel_error,
               "size_min": min(r["size_bytes"] for r in rows),
               "size_max": max(r["size_bytes"] for r in rows)}
        for k in ("world_size", "dtype", "device", "backend", "emulated_bandwidth_bps",
                  "emulated_latency_s"):
            if k in rows[0] and k not in rec:
                rec[k] = rows[0][k]
        rec.update(extra or {})
        out.append(rec)
    return out
