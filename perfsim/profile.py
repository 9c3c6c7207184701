"""Calibration profiles: measured costs the simulator is fed with.

Format (version 1)
------------------
A profile is one JSON file::

    {"format": "perfsim-profile",
     "version": 1,
     "metadata": {"machine": ..., "device": ..., "torch": ..., "date": ..., ...},
     "records": [ {"op": "layer_fwd", "name": "block0", "model": "gpt2-xl",
                   "micro_batch": 1, "time_s": 0.0075, ...}, ... ]}

``records`` is long-format: ``pandas.DataFrame(profile.records)`` gives one row
per measurement. Columns (absent = unknown/not applicable):

=============== ==============================================================
``op``          ``layer_fwd``, ``layer_bwd``, ``stage_fwd``, ``stage_bwd``,
                ``encode``, ``decode``, ``p2p``, ``allreduce``, ``allgather``,
                ``alltoall``, ``optimizer``, ``stage_optimizer`` (one whole
                stage's step, timed as a pipeline rank runs it), ``frame_send``
                / ``frame_recv`` (host time of execute mode's message framing
                around a pipeline message of ``size_bytes`` wire bytes: pack +
                isend; post + unpack), or a stored fit ``fit_<op>``
``name``        layer name (``block3``), compressor spec (``directq:4``, or a
                family ``directq``, or ``*`` for any), stage (``stage2`` or
                ``*``), or backend (``nccl``, ``gloo``)
``model``       model preset the record belongs to (compute records)
``micro_batch`` samples per micro-batch (compute records)
``size_bytes``  input size in bytes (encode/decode: the fp32 tensor; collectives:
                each rank's buffer; optimizer: the fp32 parameter bytes)
``world_size``  ranks in a collective; for ``stage_*`` records, pipeline stages
``dtype``       compute / wire dtype
``time_s``      median time in seconds
``spread_s``    spread (IQR or std) in seconds
``repeats``     number of timed repetitions
``alpha_s``, ``beta_s_per_byte``  only for ``fit_<op>`` records:
                ``time = alpha_s + size_bytes * beta_s_per_byte``
``source``      free text: where the number comes from (paper table, estimate)
=============== ==============================================================

Fits are derived by the reader when not stored: an ordinary least-squares
line ``time = alpha + beta * bytes`` through the raw records of an op (and
name), clipped at zero -- the alpha-beta (Hockney) model used by every
collective-cost model since Hockney (1994) and in NCCL-tests' bus bandwidth.

A file whose ``format`` is not ``perfsim-profile`` or whose ``version`` is not
one this reader knows is refused with a :class:`ConfigError`; it is never
silently misread. Version history: 1 (this one).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from perfsim.errors import ConfigError

FORMAT = "perfsim-profile"
VERSION = 1
SUPPORTED_VERSIONS = (1,)

COMPUTE_OPS = ("layer_fwd", "layer_bwd", "stage_fwd", "stage_bwd")
CODEC_OPS = ("encode", "decode")
COMM_OPS = ("p2p", "allreduce", "allgather", "alltoall", "broadcast")
OTHER_OPS = ("optimizer", "stage_optimizer", "frame_send", "frame_recv", "interference")
#: achieved rates of operator classes (perfsim.calibrate.efficiency): ``flops`` and
#: ``size_bytes`` say what the operator computes and must move at least
EFFICIENCY_OPS = ("gemm", "attention", "elementwise", "norm", "adamw")
BASE_OPS = COMPUTE_OPS + CODEC_OPS + COMM_OPS + OTHER_OPS + EFFICIENCY_OPS
KNOWN_OPS = BASE_OPS + tuple(f"fit_{op}" for op in CODEC_OPS + COMM_OPS + OTHER_OPS)

#: every column a record may carry (unknown keys are rejected)
RECORD_COLUMNS = ("op", "name", "model", "micro_batch", "size_bytes", "world_size", "dtype",
                  "time_s", "spread_s", "repeats", "alpha_s", "beta_s_per_byte", "source",
                  "flops")

#: name of the default profile shipped with perfsim
DEFAULT_PROFILE = "default-v100-aqsgd"


def shape_text(shape) -> str:
    """``(8, 64, 128)`` -> ``8x64x128``: how a record names the exact tensor shape
    it was timed at (``shape=`` in ``source``)."""
    return "x".join(str(int(d)) for d in shape)


def _at_exact_shape(rec: dict) -> bool:
    """A point timed at one exact shape (a pipeline boundary, in situ): it prices
    that boundary, not the per-byte line through the size sweep."""
    return any(part.startswith("shape=") for part in str(rec.get("source", "")).split("; "))


@dataclass(frozen=True)
class Fit:
    """``time = alpha_s + size_bytes * beta_s_per_byte`` (Hockney alpha-beta model)."""

    alpha_s: float
    beta_s_per_byte: float

    def __call__(self, nbytes: float) -> float:
        return self.alpha_s + max(0.0, float(nbytes)) * self.beta_s_per_byte

    @property
    def bandwidth_bps(self) -> float:
        """Asymptotic bandwidth in bits/s (inf when beta is 0)."""
        return math.inf if self.beta_s_per_byte <= 0 else 8.0 / self.beta_s_per_byte


def fit_alpha_beta(sizes: Iterable[float], times: Iterable[float]) -> Fit:
    """Least-squares alpha-beta fit of ``times`` against ``sizes`` (both clipped at 0).
    One point -> pure per-byte cost through the origin."""
    xs, ys = [float(s) for s in sizes], [float(t) for t in times]
    if not xs:
        raise ConfigError("alpha-beta fit: no records")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if n == 1 or sxx == 0:
        return Fit(0.0, my / mx) if mx > 0 else Fit(my, 0.0)
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    beta = max(beta, 0.0)
    alpha = max(my - beta * mx, 0.0)
    return Fit(alpha, beta)


def _check_record(i: int, rec: Any, where: str) -> dict:
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
    elif op in CODEC_OPS + COMM_OPS + OTHER_OPS:
        need = ("size_bytes", "time_s")
    elif op in EFFICIENCY_OPS:
        need = ("size_bytes", "time_s", "flops", "dtype")
    for f in need:
        if f not in rec:
            raise ConfigError(f"{where}: records[{i}] ({op}) lacks field {f!r}")
    for f in ("time_s", "spread_s", "alpha_s", "beta_s_per_byte", "size_bytes", "micro_batch",
              "world_size", "repeats", "flops"):
        if f in rec and rec[f] is not None:
            v = rec[f]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{where}: records[{i}].{f}={v!r} must be a finite number >= 0")
    return dict(rec)


@dataclass
class Profile:
    """A loaded, validated profile. ``records`` are plain dicts (pandas-friendly)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    # ------------------------------------------------------------ I/O
    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> "Profile":
        """Validate a parsed JSON document."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: not a JSON object")
        if data.get("format") != FORMAT:
            raise ConfigError(f"{where}: format={data.get('format')!r}, expected {FORMAT!r}")
        version = data.get("version")
        if version not in SUPPORTED_VERSIONS:
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
        return cls([_check_record(i, r, where) for i, r in enumerate(records)], dict(metadata), None)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Profile":
        """Read and validate a profile file; ``ConfigError`` naming the file on any problem."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ConfigError(f"profile {str(p)!r}: cannot read ({exc.strerror or exc})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"profile {str(p)!r}: malformed JSON ({exc.msg}, line {exc.lineno})") from None
        prof = cls.from_dict(data, where=f"profile {str(p)!r}")
        prof.path = str(p)
        return prof

    @classmethod
    def default(cls) -> "Profile":
        """The embedded default profile (GPT2-1.5B on V100s, AQ-SGD paper Table 3)."""
        return cls.load(default_profile_path())

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "metadata": self.metadata,
                "records": self.records}

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file + rename); validates first."""
        from perfsim.result import atomic_write_text

        Profile.from_dict(self.to_dict(), where="profile being saved")
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    def add(self, **record) -> None:
        """Append one validated record (used by ``perfsim calibrate``)."""
        self.records.append(_check_record(len(self.records), record, "profile record"))

    def dataframe(self):
        """The records as a pandas DataFrame (imports pandas lazily)."""
        import pandas as pd

        return pd.DataFrame(self.records, columns=[c for c in RECORD_COLUMNS
                                                    if any(c in r for r in self.records)])

    # ------------------------------------------------------------ queries
    def select(self, op: str, **match) -> list[dict[str, Any]]:
        """Records of ``op`` whose fields equal ``match`` (None values ignored)."""
        return [r for r in self.records if r["op"] == op
                and all(v is None or r.get(k) == v for k, v in match.items())]

    def models(self) -> set[str]:
        return {r["model"] for r in self.records if r["op"] in COMPUTE_OPS}

    def compute_time(self, model: str, layer: str, micro_batch: int, op: str = "fwd") -> float | None:
        """Measured time of one layer's forward (``op='fwd'``) or backward pass for
        one micro-batch, or None if the profile has no record of it.

        If only other micro-batch sizes were measured, the nearest one is scaled
        linearly in the number of samples (compute of a transformer layer is
        linear in the batch at fixed sequence length, Kaplan et al. 2020, Sec. 2.1;
        a calibrated profile at the wanted size is better)."""
        return self._scaled(f"layer_{_fb(op)}", dict(model=model, name=layer), micro_batch)

    def stage_compute(self, model: str, stage: int, micro_batch: int, op: str = "fwd",
                      num_stages: int | None = None) -> float | None:
        """Measured time of a whole pipeline stage (``stage<k>`` or ``*`` records)
        for one micro-batch, or None."""
        for name in (f"stage{stage}", "*"):
            t = self._scaled(f"stage_{_fb(op)}", dict(model=model, name=name, world_size=num_stages),
                             micro_batch)
            if t is not None:
                return t
        return None

    def stage_measured(self, model: str, stage: int, first: int, last: int, micro_batch: int,
                       op: str = "fwd", num_stages: int | None = None) -> float | None:
        """Measured time of a whole stage for THE SAME partition, or None.

        Only ``stage<k>`` records of ``num_stages`` stages at exactly ``micro_batch``
        whose ``layers=<first>-<last>`` (``last`` inclusive, as ``perfsim calibrate``
        writes it in ``source``) names the same layers count: a whole-stage timing
        includes the per-call and autograd-graph overheads that a sum of per-layer
        records misses, but only for the layers it timed. ``*`` records (the
        paper-derived default profile's) are not whole-stage measurements of a
        given partition and are ignored here (see :meth:`stage_compute`)."""
        return self._same_partition(f"stage_{_fb(op)}", model, stage, first, last, num_stages,
                                    micro_batch)

    def stage_optimizer_measured(self, model: str, stage: int, first: int, last: int,
                                 num_stages: int | None = None) -> float | None:
        """Measured optimizer step of a whole stage of THE SAME partition (the
        ``stage_optimizer`` records of ``perfsim calibrate --stages``), or None."""
        return self._same_partition("stage_optimizer", model, stage, first, last, num_stages)

    def _same_partition(self, op: str, model: str, stage: int, first: int, last: int,
                        num_stages: int | None, micro_batch: int | None = None) -> float | None:
        """``time_s`` of the first ``op`` record of ``stage<k>`` whose ``layers=<first>-<last>``
        names the same layers (and, when given, the same micro-batch), or None."""
        want = f"{int(first)}-{int(last)}"
        for r in self.select(op, model=model, name=f"stage{int(stage)}", world_size=num_stages):
            if micro_batch is not None and r.get("micro_batch") != micro_batch:
                continue
            if _source_fields(r.get("source")).get("layers") == want:
                return float(r["time_s"])
        return None

    def _scaled(self, op: str, match: dict, micro_batch: int) -> float | None:
        recs = self.select(op, **match)
        if not recs:
            return None
        exact = [r for r in recs if r["micro_batch"] == micro_batch]
        if exact:
            return float(exact[0]["time_s"])
        near = min(recs, key=lambda r: (abs(math.log(r["micro_batch"] or 1) - math.log(micro_batch)),
                                        -r["micro_batch"]))
        return float(near["time_s"]) * micro_batch / max(1, near["micro_batch"])

    def effective_flops(self) -> float | None:
        """FLOP/s implied by compute records that carry ``flops`` (forward only):
        the fallback rate for a model the profile did not measure."""
        recs = [r for r in self.records if r["op"] == "layer_fwd" and r.get("flops") and r["time_s"] > 0]
        if not recs:
            return self.metadata.get("effective_flops")
        return sum(r["flops"] for r in recs) / sum(r["time_s"] for r in recs)

    def _fit(self, op: str, name: str | None = None) -> Fit | None:
        """Stored ``fit_<op>`` record or a fit of raw records, most specific name
        first: exact spec (``directq:4``), family (``directq``), then ``*``."""
        candidates = [None] if name is None else _name_chain(name)
        for cand in candidates:
            for r in self.records:
                if r["op"] == f"fit_{op}" and (cand is None or r["name"] == cand):
                    return Fit(float(r["alpha_s"]), float(r["beta_s_per_byte"]))
            raw = [r for r in self.records if r["op"] == op and (cand is None or r["name"] == cand)
                   and not _at_exact_shape(r)]
            if raw:
                return fit_alpha_beta([r["size_bytes"] for r in raw], [r["time_s"] for r in raw])
        return None

    def encode_time(self, spec: str, nbytes: float, shape=None, model: str | None = None) -> float:
        """Time to compress an fp32 tensor of ``nbytes`` with compressor ``spec``
        (fixed + per-byte cost). ``shape`` / ``model``: a pipeline boundary's
        exact shape and model; a point calibrated in situ at that boundary
        (``shape=AxBxC`` in its source, timed after the stage's own step; the
        same model's first) wins over the fit. ``fp32`` is a real call too
        (execute mode copies the activation into the message) and costs its
        measurement when the profile has one; ``none`` and a compressor the
        profile does not know cost nothing (documented optimism: calibrate it
        with ``perfsim calibrate``)."""
        return self._codec("encode", spec, nbytes, shape, model)

    def decode_time(self, spec: str, nbytes: float, shape=None, model: str | None = None) -> float:
        """Time to decompress back to an fp32 tensor of ``nbytes`` (``shape`` and
        ``model`` as for :meth:`encode_time`)."""
        return self._codec("decode", spec, nbytes, shape, model)

    def _codec(self, op: str, spec: str, nbytes: float, shape=None, model: str | None = None) -> float:
        if spec == "none" or nbytes <= 0:
            return 0.0
        if shape is not None:
            tag = "shape=" + shape_text(shape)
            exact = [r for r in self.records if r["op"] == op and r.get("name") == spec
                     and tag in str(r.get("source", "")).split("; ")]
            exact = [r for r in exact if r.get("model") == model] or exact
            if exact:
                times = sorted(r["time_s"] for r in exact)
                return times[len(times) // 2]
        if spec == "fp32":  # only its own measurement: the ``*`` fit is for compressors
            if not any(r["op"] in (op, f"fit_{op}") and r.get("name") == "fp32" for r in self.records):
                return 0.0
        fit = self._fit(op, spec)
        return fit(nbytes) if fit else 0.0

    def framing_time(self, side: str, wire_bytes: float) -> float:
        """Host time execute mode spends framing one pipeline message of
        ``wire_bytes`` on the ``send`` side (header, one buffer, isend) or the
        ``recv`` side (posting the receive, unpacking); 0 when not calibrated."""
        if side not in ("send", "recv"):
            raise ValueError(f"framing side {side!r}: send or recv")
        fit = self._fit(f"frame_{side}", None)
        return fit(wire_bytes) if fit and wire_bytes > 0 else 0.0

    def collective_fit(self, op: str, name: str | None = None) -> Fit | None:
        """Alpha-beta fit of a measured collective (``p2p``, ``allreduce`` ...),
        or None when the profile measured none."""
        if op not in COMM_OPS:
            raise ConfigError(f"collective op {op!r}: not one of {COMM_OPS}")
        return self._fit(op, name)

    def optimizer_time(self, param_bytes: float) -> float | None:
        """Optimizer step time for ``param_bytes`` of fp32 parameters, or None."""
        fit = self._fit("optimizer", None)
        return fit(param_bytes) if fit else None


def _fb(op: str) -> str:
    op = op.lower()
    if op in ("fwd", "f", "forward"):
        return "fwd"
    if op in ("bwd", "b", "backward"):
        return "bwd"
    raise ConfigError(f"compute op {op!r}: expected 'fwd' or 'bwd'")


def _source_fields(source: Any) -> dict[str, str]:
    """``key=value`` pairs of a record's free-text ``source`` (``;``-separated)."""
    out: dict[str, str] = {}
    for part in str(source or "").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _name_chain(spec: str) -> list[str]:
    """``aqsgd:3:m8`` -> ``['aqsgd:3:m8', 'aqsgd:3', 'aqsgd', '*']``, from the spec's
    canonical text (:class:`perfsim.compression.spec.Spec`: ``DirectQ:4`` is ``directq:4``)."""
    from perfsim.compression.spec import parse_spec

    try:
        spec = parse_spec(spec, "compressor").text
    except ConfigError:
        pass  # not a compressor spec (an op name such as "messenger"): as given
    parts = spec.split(":")
    return [":".join(parts[:k]) for k in range(len(parts), 0, -1)] + ["*"]


def default_profile_path() -> Path:
    """Where the embedded default profile lives: package data (installed) or
    the repository's ``traces/`` folder (source checkout)."""
    here = Path(__file__).resolve().parent
    for cand in (here / "data" / f"{DEFAULT_PROFILE}.json",
                 here.parent / "traces" / f"{DEFAULT_PROFILE}.json"):
        if cand.exists():
            return cand
    raise ConfigError(f"default profile {DEFAULT_PROFILE}.json not found in perfsim/data or traces/")


def load_profile(spec: str | os.PathLike | Profile | None) -> Profile:
    """A Profile from a path, an already-loaded Profile, or None (the default)."""
    if spec is None or spec == "" or spec == "default":
        return Profile.default()
    if isinstance(spec, Profile):
        return spec
    p = Path(spec)
    if not p.exists() and not p.suffix:
        # a bare name such as "default-v100-aqsgd": shipped names, traces/ and package data
        from perfsim.packaged import DATA, NAMES

        if str(spec) in NAMES["profile"]:
            return Profile.load(DATA / NAMES["profile"][str(spec)])
        for folder in (default_profile_path().parent, Path(__file__).resolve().parent.parent / "traces"):
            if (folder / f"{spec}.json").exists():
                return Profile.load(folder / f"{spec}.json")
    return Profile.load(p)
