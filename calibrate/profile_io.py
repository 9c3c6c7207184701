"""Turn calibration measurements into a :class:`perfsim.profile.Profile`.

The measurement modules return plain dict records with a few more columns than
the profile format's record schema (``threads``, ``wire_bytes``,
``emulated_bandwidth_bps``...). The profile keeps its strict column list
(unknown keys are refused so a misspelt field never goes unnoticed), so the
extra facts travel in the free-text ``source`` column as ``key=value`` pairs
(:func:`parse_source` reads them back) and the few a simulator needs -- the
links measured under emulation -- are summarised in ``metadata["network"]``.

Naming of communication records: ``name`` is the backend (``gloo``, ``nccl``)
for the loopback / native measurements and ``<backend>@<rate>`` (``gloo@100Mbps``)
for measurements over an emulated link of that nominal rate.
"""

from __future__ import annotations

from typing import Any

from perfsim.units import format_bandwidth


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def comm_name(backend: str, emulated_bps: float | None) -> str:
    """``gloo`` or ``gloo@100Mbps``."""
    return backend if emulated_bps is None else f"{backend}@{format_bandwidth(emulated_bps)}"


def to_profile_record(rec: dict, columns: tuple[str, ...]) -> dict:
    """Keep the profile's columns; fold the rest into ``source`` (``k=v; ...``)."""
    out = {k: v for k, v in rec.items() if k in columns and v is not None}
    extra = {k: v for k, v in rec.items() if k not in columns and v is not None}
    parts = [str(rec["source"])] if rec.get("source") else []
    parts += [f"{k}={_fmt(v)}" for k, v in extra.items()]
    if parts:
        out["source"] = "; ".join(["calibrate"] + parts) if "calibrate" not in parts[0] else "; ".join(parts)
    else:
        out["source"] = "calibrate"
    return out


def parse_source(text: str | None) -> dict[str, str]:
    """``"calibrate; threads=1; device=cpu"`` -> ``{"threads": "1", "device": "cpu"}``."""
    out = {}
    for part in (text or "").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def network_summary(records: list[dict]) -> list[dict]:
    """One entry per measured link (``p2p`` of a backend or of ``messenger``, and
    ``allreduce``, loopback or ``@<rate>``): fixed cost, achieved payload rate,
    protocol efficiency (achieved / nominal) and the shaper's burst
    (:func:`perfsim.link.fit_token_bucket`), for ``metadata["network"]``."""
    from perfsim.link import fit_token_bucket

    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r.get("op") in ("p2p", "allreduce") and "time_s" in r and "size_bytes" in r:
            groups.setdefault((r["op"], r["name"]), []).append(r)
    out = []
    for (op, name), rows in groups.items():
        nominal = rows[0].get("emulated_bandwidth_bps")
        entry = {"op": op, "name": name, "nominal_bps": nominal,
                 "emulated_latency_s": rows[0].get("emulated_latency_s"),
                 "alpha_s": min(rows, key=lambda r: r["size_bytes"])["time_s"],
                 "rate_bps": None, "efficiency": None, "burst_bytes": None}
        link = fit_token_bucket([r["size_bytes"] for r in rows], [r["time_s"] for r in rows])
        if link is not None:
            entry.update(alpha_s=link.alpha_s, rate_bps=8 * link.rate_Bps, burst_bytes=link.burst_bytes)
            if nominal:
                entry["efficiency"] = 8 * link.rate_Bps / nominal
        out.append(entry)
    return out


def build_profile(records: list[dict], metadata: dict):
    """A validated Profile from measurement records and metadata."""
    from perfsim.profile import RECORD_COLUMNS, Profile

    clean = [to_profile_record(r, tuple(RECORD_COLUMNS)) for r in records if "skipped" not in r]
    meta = dict(metadata)
    net = network_summary(records)
    if net:
        meta["network"] = net
    return Profile.from_dict({"format": "perfsim-profile", "version": 1, "metadata": meta,
                              "records": clean}, where="calibrated profile")
