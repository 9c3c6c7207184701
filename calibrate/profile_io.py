"""Turn calibration measurements into a :class:`perfsim.profile.Profile`.

The measurement modules return plain dict records: the profile's columns
(:data:`perfsim.profile.RECORD_COLUMNS`: what was measured, how long it took,
and the typed facts beside it such as ``threads``, ``wire_bytes``, ``shape``,
``mean_s``), a free-text ``source``, and bookkeeping that is not a measurement
(``skipped``: why an op was not measured). :func:`to_profile_record` keeps the
columns, types the facts and refuses any other key: a fact the format has no
field for is a gap in the format (add it to :data:`perfsim.profile.FACTS`),
never free text.

Naming of communication records: ``name`` is the backend (``gloo``, ``nccl``)
for the loopback / native measurements and ``<backend>@<rate>`` (``gloo@100Mbps``)
for measurements over an emulated link of that nominal rate.
"""

from __future__ import annotations

from perfsim.units import format_bandwidth


def comm_name(backend: str, emulated_bps: float | None) -> str:
    """``gloo`` or ``gloo@100Mbps``."""
    return backend if emulated_bps is None else f"{backend}@{format_bandwidth(emulated_bps)}"


def to_profile_record(rec: dict) -> dict:
    """One measurement as a profile record: None values left out, ``source``
    starting with ``calibrate`` (plus the measurement's own provenance, e.g.
    ``runtime`` layers), facts typed. ValueError naming an unknown key."""
    from perfsim.profile.format import DERIVED_V1, RECORD_COLUMNS, split_source

    text, facts = split_source(rec.get("source"))  # facts a module wrote as text
    out = {k: v for k, v in rec.items() if k != "source" and v is not None}
    unknown = set(out) - set(RECORD_COLUMNS)
    if unknown:
        raise ValueError(f"calibration record {rec.get('op')!r}: field(s) {sorted(unknown)} have no "
                         "column in the profile format (perfsim.profile.FACTS)")
    out.update({k: v for k, v in facts.items() if k not in DERIVED_V1 and k not in out})
    out["source"] = text if text.startswith("calibrate") else "; ".join(p for p in ("calibrate", text) if p)
    return out


def build_profile(records: list[dict], metadata: dict):
    """A validated Profile (current format version) from measurement records and metadata."""
    from perfsim.profile import FORMAT, VERSION, Profile

    clean = [to_profile_record(r) for r in records if "skipped" not in r]
    return Profile.from_dict({"format": FORMAT, "version": VERSION, "metadata": dict(metadata),
                              "records": clean}, where="calibrated profile")
