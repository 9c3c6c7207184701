"""Fixed + per-byte cost fits (alpha-beta) of measured points.

The latency-bandwidth ("alpha-beta", Hockney 1994) model of a message or a
kernel: ``time(bytes) = alpha + beta * bytes``. ``alpha`` is the fixed cost
(launch, syscalls, protocol handshake, one network latency), ``1 / beta`` the
effective bandwidth in bytes per second.

Sizes span several decades (1 KB to hundreds of MB), so an ordinary least
squares fit is dominated by the largest points and predicts small messages
badly. We minimise the *relative* residual ``sum(((alpha + beta s) - t) / t)^2``
(weighted least squares with weights ``1/t``), so every size counts alike,
and we constrain both coefficients to be non-negative (a negative latency is
not a physical answer; when the unconstrained solution has one, the other is
refitted alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AlphaBeta:
    """time = alpha_s + beta_s_per_byte * bytes."""

    alpha_s: float
    beta_s_per_byte: float
    points: int
    max_rel_error: float

    def predict(self, nbytes) -> np.ndarray | float:
        return self.alpha_s + self.beta_s_per_byte * np.asarray(nbytes, dtype=float)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")


def fit_alpha_beta(sizes, times) -> AlphaBeta:
    """Fit ``time = alpha + beta * size`` (non-negative, relative error weighted)."""
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    keep = np.isfinite(s) & np.isfinite(t) & (t > 0)
    s, t = s[keep], t[keep]
    if len(s) == 0:
        raise ValueError("fit_alpha_beta: no valid points")
    if len(s) == 1 or np.ptp(s) == 0:
        return AlphaBeta(float(np.median(t)), 0.0, len(s), 0.0)
    w = 1.0 / t
    A = np.stack([np.ones_like(s), s], axis=1) * w[:, None]
    b = t * w
    (alpha, beta), *_ = np.linalg.lstsq(A, b, rcond=None)
    if alpha < 0 or beta < 0:
        # one coefficient alone: the better (relative) of pure latency / pure bandwidth
        a_only = float(np.sum(w * w * t) / np.sum(w * w))  # argmin sum((a - t)/t)^2
        b_only = float(np.sum(w * w * s * t) / np.sum(w * w * s * s))
        err_a = np.sum(((a_only - t) / t) ** 2)
        err_b = np.sum(((b_only * s - t) / t) ** 2)
        alpha, beta = (a_only, 0.0) if err_a <= err_b else (0.0, b_only)
    pred = alpha + beta * s
    return AlphaBeta(float(alpha), float(beta), len(s), float(np.max(np.abs(pred - t) / t)))


def fit_records(records: list[dict], op: str, group_keys=("name",), extra: dict | None = None
                ) -> list[dict]:
    """``fit_<op>`` records: one alpha-beta fit per group of ``op`` records.

    Each fit record carries the group's key columns plus ``alpha_s``,
    ``beta_s_per_byte``, ``bandwidth_Bps`` (1/beta), ``points`` and
    ``max_rel_error`` (the worst relative residual, a quality flag).
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
               "bandwidth_Bps": f.bandwidth_bytes_per_s if f.beta_s_per_byte > 0 else None,
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
