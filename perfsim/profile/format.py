"""The profile file format: schema, typed record fields, load/save, version migration.

A profile is one JSON file (the reference is ``docs/profile-format.md``)::

    {"format": "perfsim-profile",
     "version": 2,
     "metadata": {"machine": ..., "device": ..., "torch": ..., "date": ..., ...},
     "records": [ {"op": "layer_fwd", "name": "block0", "model": "gpt2-xl",
                   "micro_batch": 1, "time_s": 0.0075, "threads": 2, ...}, ... ]}

``records`` is long-format: ``pandas.DataFrame(profile.records)`` gives one row
per measurement. :data:`CORE_COLUMNS` say what was measured and how long it
took; :data:`FACTS` are the typed facts ``perfsim calibrate`` records beside a
measurement (thread count, wire bytes, exact tensor shape, a stage's layers...).
``source`` is free text only: where the number comes from.

Version history
---------------
* 1: the facts were ``key=value`` pairs inside ``source``
  (``"calibrate; threads=1; shape=8x128"``), and calibrate wrote a
  ``metadata["network"]`` summary of the measured links.
* 2 (this one): the facts are typed columns of their own; no
  ``metadata["network"]`` (the links are derived from the p2p / allreduce
  records by :meth:`perfsim.link.Link.calibrated`, one derivation, not a stored
  second copy that could disagree with it).

A version-1 file is migrated on load (:func:`migrate_v1`); :meth:`ProfileFile.save`
always writes version 2. A file whose ``format`` is not ``perfsim-profile`` or
whose ``version`` this reader does not know is refused with a
:class:`ConfigError`: it is never silently misread.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from perfsim import outputs
from perfsim.documents import read_document
from perfsim.errors import ConfigError

FORMAT = "perfsim-profile"
VERSION = 2
SUPPORTED_VERSIONS = (1, 2)

COMPUTE_OPS = ("layer_fwd", "layer_bwd", "stage_fwd", "stage_bwd")
#: ``dp_encode`` / ``dp_decode``: a compressor's own local work around the collectives
#: of one data-parallel exchange (``Compressor.dp_codec``), where it is not encode / decode
CODEC_OPS = ("encode", "decode", "dp_encode", "dp_decode")
COMM_OPS = ("p2p", "allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast")
#: ``fsdp_host``: FSDP2's own host time per unit / root and pass (perfsim.calibrate.fsdp_host;
#: optional: a profile without it prices that time as 0, with a note)
OTHER_OPS = ("optimizer", "stage_optimizer", "frame_send", "frame_recv", "interference", "fsdp_host")
#: achieved rates of operator classes (perfsim.calibrate.efficiency): ``flops`` and
#: ``size_bytes`` say what the operator computes and must move at least
EFFICIENCY_OPS = ("gemm", "attention", "elementwise", "norm", "adamw")
BASE_OPS = COMPUTE_OPS + CODEC_OPS + COMM_OPS + OTHER_OPS + EFFICIENCY_OPS
KNOWN_OPS = BASE_OPS + tuple(f"fit_{op}" for op in CODEC_OPS + COMM_OPS + OTHER_OPS)

#: what was measured and how long it took (docs/profile-format.md)
CORE_COLUMNS = ("op", "name", "model", "micro_batch", "size_bytes", "world_size", "dtype",
                "time_s", "spread_s", "repeats", "alpha_s", "beta_s_per_byte", "source", "flops")

_INT, _FLOAT, _STR = "int", "float", "str"
#: typed facts beside a measurement: name -> type (``int``, ``float``, ``str``,
#: ``shape``: a list of ints, ``layers``: ``[first, last]``, last inclusive)
FACTS: dict[str, str] = {
    "device": _STR,            # torch device the measurement ran on
    "backend": _STR,           # communication backend (gloo, nccl)
    "threads": _INT,           # torch intra-op threads
    "params": _INT,            # parameters of the timed layer / stage
    "layer_index": _INT,       # index of the timed layer in its model
    "layers": "layers",        # a stage's layers, [first, last]
    "schedule": _STR,          # pipeline schedule a stage was timed under
    "microbatches": _INT,      # micro-batches per step of that schedule
    "pp": _INT,                # its pipeline ranks, where they differ from world_size
                               # (its stages: an interleaved schedule's model chunks)
    "tp": _INT,                # tensor-parallel ranks a stage was timed on (absent: 1)
    "sequence_parallel": _INT, # 1: that stage ran with sequence parallelism
    "optimizer": _STR,         # optimizer of an ``optimizer`` record
    "call": _STR,              # the torch.distributed call a collective record timed, when
                               # not its kind's default (perfsim.collectives.DEFAULT_CALLS)
    "allreduce_s": _FLOAT,     # the backend's allreduce of the same buffer, timed in the same
                               # sweep: what a measured kind's cost is relative to
    "concurrent_ranks": _INT,  # ranks computing at once while timed
    "wire_bytes": _INT,        # a codec's payload bytes on the wire
    "cache": _STR,             # cold, warm or after-layer-step (codec timings)
    "shape": "shape",          # the exact tensor shape of an in-situ boundary point
    "mean_s": _FLOAT,          # mean of the repeats (``time_s`` is their median)
    "emulated_bandwidth_bps": _FLOAT,  # the emulated link's nominal rate
    "emulated_latency_s": _FLOAT,      # and its one-way latency
    "points": _INT,            # fit records: points fitted
    "max_rel_error": _FLOAT,   # fit records: worst relative residual
    "size_min": _INT,          # fit records: smallest size fitted
    "size_max": _INT,          # fit records: largest size fitted
    "folded": _INT,            # 1: a layer's 0 s record is a measurement -- its time is
                               # counted in its stage's other layers (the default profile's
                               # embed / head, folded into the paper's equal stages)
    "recompute": _STR,         # a backward record timed with activation recomputation
                               # inside it (perfsim.config.RECOMPUTE; absent: none): the
                               # default profile's, whose paper checkpointed every block
}
#: version-1 ``source`` facts that only restated a record's own columns
#: (``1 / beta_s_per_byte``, ``flops / time_s``, ``size_bytes / time_s``): dropped
DERIVED_V1 = ("bandwidth_Bps", "achieved_tflops", "achieved_gbps")

#: every column a record may carry (unknown keys are rejected)
RECORD_COLUMNS = CORE_COLUMNS + tuple(FACTS)

#: name of the default profile shipped with perfsim
DEFAULT_PROFILE = "default-v100-aqsgd"

_NUMERIC = ("time_s", "spread_s", "alpha_s", "beta_s_per_byte", "size_bytes", "micro_batch",
            "world_size", "repeats", "flops")


def shape_text(shape) -> str:
    """``(8, 64, 128)`` -> ``8x64x128`` (how version 1 wrote a shape)."""
    return "x".join(str(int(d)) for d in shape)


def _number(v: Any, integer: bool) -> int | float:
    if isinstance(v, str):
        v = float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError("not a finite number")
    if integer:
        if v != int(v):
            raise ValueError("not an integer")
        return int(v)
    return float(v)


def fact_value(name: str, value: Any) -> Any:
    """``value`` as fact ``name``'s type (text forms of version 1 accepted:
    ``"8x128"`` for a shape, ``"0-3"`` for layers); ValueError when it is not one."""
    kind = FACTS[name]
    if kind == _STR:
        if not isinstance(value, str):
            raise ValueError("not text")
        return value
    if kind in (_INT, _FLOAT):
        out = _number(value, kind == _INT)
        if out < 0:
            raise ValueError("negative")
        return out
    if isinstance(value, str):
        value = value.split("x") if kind == "shape" else value.split("-")
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError("not a list")
    out = [_number(v, True) for v in value]
    if any(v < 0 for v in out) or (kind == "layers" and (len(out) != 2 or out[0] > out[1])):
        raise ValueError("bad range" if kind == "layers" else "negative dimension")
    return out


def check_record(i: int, rec: Any, where: str) -> dict:
    """A validated copy of record ``i`` (ConfigError naming ``where`` and the field)."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: records[{i}] is not an object")
    unknown = set(rec) - set(RECORD_COLUMNS)
    if unknown:
        raise ConfigError(f"{where}: records[{i}] has unknown field(s) {sorted(unknown)}")
    op = rec.get("op")
    if op not in KNOWN_OPS:
        raise ConfigError(f"{where}: records[{i}].op={op!r} unknown (known: {', '.join(BASE_OPS)}, fit_<op>)")
    if "name" not in rec:
        raise ConfigError(f"{where}: records[{i}] ({op}) lacks field 'name'")
    if op.startswith("fit_"):
        need = ("alpha_s", "beta_s_per_byte")
    elif op in COMPUTE_OPS:
        need = ("model", "micro_batch", "time_s")
    elif op in EFFICIENCY_OPS:
        need = ("size_bytes", "time_s", "flops", "dtype")
    else:
        need = ("size_bytes", "time_s")
    for f in need:
        if f not in rec:
            raise ConfigError(f"{where}: records[{i}] ({op}) lacks field {f!r}")
    for f in _NUMERIC:
        if f in rec and rec[f] is not None:
            v = rec[f]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{where}: records[{i}].{f}={v!r} must be a finite number >= 0")
    out = dict(rec)
    for f in FACTS:
        if f in out:
            try:
                out[f] = fact_value(f, out[f])
            except ValueError as exc:
                raise ConfigError(f"{where}: records[{i}].{f}={out[f]!r}: {exc} "
                                  f"(expected {FACTS[f]})") from None
    if "recompute" in out:
        from perfsim.config import RECOMPUTE  # lazy: the profile format sits below the job's options
        if out["recompute"] not in RECOMPUTE:
            raise ConfigError(f"{where}: records[{i}].recompute={out['recompute']!r} unknown "
                              f"(one of {', '.join(RECOMPUTE)})")
    return out


_FACT_TEXT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)$")


def split_source(text: str | None) -> tuple[str, dict[str, str]]:
    """A version-1 ``source``: ``"calibrate; threads=1; shape=8x128"`` ->
    ``("calibrate", {"threads": "1", "shape": "8x128"})``. Only the known facts
    (and the derived ones, :data:`DERIVED_V1`) are split off; every other part,
    ``=`` or not, stays in the free text."""
    keep, facts = [], {}
    for part in str(text or "").split(";"):
        m = _FACT_TEXT.match(part)
        if m and (m.group(1) in FACTS or m.group(1) in DERIVED_V1):
            facts[m.group(1)] = m.group(2).strip()
        elif part.strip():
            keep.append(part.strip())
    return "; ".join(keep), facts


def migrate_v1(data: dict) -> dict:
    """A version-1 document as version 2: the known ``key=value`` facts of each
    record's ``source`` become typed fields (derived ones are dropped), and the
    ``metadata["network"]`` summary is dropped (module docstring). Typing errors
    are checked by :func:`check_record` afterwards."""
    records = []
    for rec in data.get("records") or []:
        if isinstance(rec, dict) and isinstance(rec.get("source"), str):
            text, facts = split_source(rec["source"])
            rec = {k: v for k, v in rec.items() if k != "source"}
            if text:
                rec["source"] = text
            for k, v in facts.items():
                if k in FACTS and k not in rec:
                    rec[k] = v
        records.append(rec)
    metadata = data.get("metadata", {})
    if isinstance(metadata, dict):
        metadata = {k: v for k, v in metadata.items() if k != "network"}
    return {**data, "version": VERSION, "metadata": metadata, "records": records}


#: version -> migration of a document of that version to the next one
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: migrate_v1}


@dataclass
class ProfileFile:
    """A loaded, validated profile: plain-dict ``records`` (pandas-friendly),
    ``metadata`` and the ``path`` it came from. The cost queries are
    :class:`perfsim.profile.costs.ProfileCosts`; :class:`perfsim.profile.Profile` is both."""

    records: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile"):
        """Validate a parsed JSON document (an older version is migrated first)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: not a JSON object")
        if data.get("format") != FORMAT:
            raise ConfigError(f"{where}: format={data.get('format')!r}, expected {FORMAT!r}")
        version = data.get("version")
        if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
            newer = isinstance(version, int) and version > VERSION
            raise ConfigError(
                f"{where}: version={version!r} not supported (this perfsim reads "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))}"
                + ("; upgrade perfsim" if newer else "") + ")")
        records = data.get("records")
        if not isinstance(records, list):
            raise ConfigError(f"{where}: field 'records' missing or not a list")
        metadata = data.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ConfigError(f"{where}: field 'metadata' is not an object")
        extra = set(data) - {"format", "version", "metadata", "records"}
        if extra:
            raise ConfigError(f"{where}: unknown top-level field(s) {sorted(extra)}")
        data = {**data, "metadata": metadata}
        while data["version"] != VERSION:
            data = MIGRATIONS[data["version"]](data)
        return cls([check_record(i, r, where) for i, r in enumerate(data["records"])],
                   dict(data["metadata"]), None)

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Read and validate a profile file; ``ConfigError`` naming the file on any problem."""
        p = Path(path)
        prof = cls.from_dict(read_document(p, "profile", kind="json"), where=f"profile {str(p)!r}")
        prof.path = str(p)
        return prof

    @classmethod
    def default(cls):
        """The embedded default profile (GPT2-1.5B on V100s, AQ-SGD paper Table 3)."""
        return cls.load(default_profile_path())

    def to_dict(self) -> dict[str, Any]:
        """The document :meth:`save` writes (always the current version)."""
        return {"format": FORMAT, "version": VERSION, "metadata": self.metadata,
                "records": self.records}

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file + rename); validates first."""
        ProfileFile.from_dict(self.to_dict(), where="profile being saved")
        outputs.write_text(path, outputs.json_text(self.to_dict()))

    def add(self, **record) -> None:
        """Append one validated record."""
        self.records.append(check_record(len(self.records), record, "profile record"))

    def dataframe(self):
        """The records as a pandas DataFrame (imports pandas lazily)."""
        import pandas as pd  # lazy: pandas is heavy, needed only here

        return pd.DataFrame(self.records, columns=[c for c in RECORD_COLUMNS
                                                    if any(c in r for r in self.records)])

    def select(self, op: str, **match) -> list[dict[str, Any]]:
        """Records of ``op`` whose fields equal ``match`` (None values ignored). The
        records are indexed by op and each answer memoised (afresh when their count
        changes): a planner asks for the same records thousands of times."""
        index = self.__dict__.get("_by_op")
        if index is None or index[0] != len(self.records):
            by_op: dict[str, list] = {}
            for r in self.records:
                by_op.setdefault(r["op"], []).append(r)
            index = self.__dict__["_by_op"] = (len(self.records), by_op, {})
        try:
            key = (op, tuple(sorted(match.items())))
            hit = index[2].get(key)
        except TypeError:  # an unhashable value: not memoised
            key, hit = None, None
        if hit is None:
            hit = [r for r in index[1].get(op, ()) if all(v is None or r.get(k) == v for k, v in match.items())]
            if key is not None:
                index[2][key] = hit
        return list(hit)

    def models(self) -> set[str]:
        """Models the compute records belong to."""
        return {r["model"] for r in self.records if r["op"] in COMPUTE_OPS}


def default_profile_path() -> Path:
    """Where the embedded default profile lives: package data (installed) or
    the repository's ``traces/`` folder (source checkout)."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here / "data" / f"{DEFAULT_PROFILE}.json",
                 here.parent / "traces" / f"{DEFAULT_PROFILE}.json"):
        if cand.exists():
            return cand
    raise ConfigError(f"default profile {DEFAULT_PROFILE}.json not found in perfsim/data or traces/")
