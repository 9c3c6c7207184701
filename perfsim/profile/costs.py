"""Cost queries over a profile's records: compute, codec, framing, collectives, optimizer.

Every size-dependent cost is the alpha-beta (Hockney) model
``time = alpha + beta * bytes`` -- the latency-bandwidth model used by every
collective-cost model since Hockney, "The communication challenge for MPP:
Intel Paragon and Meiko CS-2" (Parallel Computing 20, 1994), and in NCCL-tests'
bus bandwidth. There is one fit, :func:`fit_alpha_beta`: ``perfsim calibrate``
stores it as ``fit_<op>`` records (:mod:`perfsim.calibrate.fit`) and the queries
below fit the raw records with it when no fit is stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from perfsim.calibrate.profile_io import comm_name
from perfsim.collectives import DEFAULT_CALLS
from perfsim.compression.spec import parse_spec
from perfsim.errors import ConfigError
from perfsim.job import TIMED_OPTIMIZER
from perfsim.profile.format import COMM_OPS
from perfsim.schedules import PLAIN_SCHEDULES


@dataclass(frozen=True)
class Fit:
    """``time = alpha_s + size_bytes * beta_s_per_byte`` (Hockney alpha-beta model).

    ``points`` and ``max_rel_error`` (worst relative residual) describe the fit's
    quality when it was fitted here; 0 and None for a fit read from a record
    that does not say."""

    alpha_s: float
    beta_s_per_byte: float
    points: int = 0
    max_rel_error: float | None = None

    def __call__(self, nbytes: float) -> float:
        return self.alpha_s + max(0.0, float(nbytes)) * self.beta_s_per_byte

    @property
    def bandwidth_Bps(self) -> float:
        """Asymptotic bandwidth in bytes/s (inf when beta is 0)."""
        return math.inf if self.beta_s_per_byte <= 0 else 1.0 / self.beta_s_per_byte

    @property
    def bandwidth_bps(self) -> float:
        """Asymptotic bandwidth in bits/s (inf when beta is 0)."""
        return 8.0 * self.bandwidth_Bps


def fit_alpha_beta(sizes: Iterable[float], times: Iterable[float]) -> Fit:
    """The alpha-beta fit of ``times`` (s) against ``sizes`` (bytes).

    Sizes of one calibration span several decades (1 KB to hundreds of MB). An
    ordinary least-squares line is dominated by the largest points: its alpha
    absorbs their noise and a 1 KB message can come out several times off. So
    the fit minimises the *relative* residual ``sum(((alpha + beta s) - t) / t)^2``
    (least squares weighted by ``1/t``): every size counts alike, and the
    small-message cost that dominates a pipeline of small boundaries is right.

    Both coefficients are non-negative (a negative latency or bandwidth is no
    physical answer): when the unconstrained solution has a negative one, the
    better of the two one-coefficient fits (pure latency, pure per-byte cost)
    under the same criterion is taken. With one size only (alpha and beta cannot
    be told apart) the fit is the per-byte cost through the origin, so a cost
    timed at one size scales with the bytes; points with a time <= 0 or a size
    < 0 are ignored. ConfigError when no point is left."""
    pts = [(float(s), float(t)) for s, t in zip(sizes, times)]
    pts = [(s, t) for s, t in pts if math.isfinite(s) and math.isfinite(t) and s >= 0 and t > 0]
    if not pts:
        raise ConfigError("alpha-beta fit: no records with a positive time")
    # weighted normal equations, rows (1/t, s/t) against 1; sizes scaled by the
    # largest so that the 2x2 system stays well conditioned across decades
    scale = max(s for s, _ in pts) or 1.0
    w = [(1.0 / t, s / scale / t) for s, t in pts]
    a11 = sum(u * u for u, _ in w)
    a12 = sum(u * v for u, v in w)
    a22 = sum(v * v for _, v in w)
    b1 = sum(u for u, _ in w)
    b2 = sum(v for _, v in w)
    det = a11 * a22 - a12 * a12
    one_size = len({s for s, _ in pts}) == 1
    alpha = beta = -1.0
    if not one_size and det > 1e-12 * a11 * a22:
        alpha, beta = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det / scale
    if alpha < 0 or beta < 0:
        only_a = b1 / a11                                # argmin sum((a - t) / t)^2
        only_b = b2 / a22 / scale if a22 > 0 else 0.0    # argmin sum((b s - t) / t)^2
        err_a = sum((only_a / t - 1.0) ** 2 for _, t in pts)
        err_b = sum((only_b * s / t - 1.0) ** 2 for s, t in pts)
        if a22 > 0 and (one_size or err_b < err_a):
            alpha, beta = 0.0, only_b
        else:
            alpha, beta = only_a, 0.0
    worst = max(abs(alpha + beta * s - t) / t for s, t in pts)
    return Fit(float(alpha), float(beta), len(pts), float(worst))


class ProfileCosts:
    """The cost queries of :class:`perfsim.profile.Profile` (a mixin over its
    ``records``, ``metadata`` and ``select``; the format side is
    :class:`perfsim.profile.format.ProfileFile`)."""

    records: list[dict[str, Any]]
    metadata: dict[str, Any]
    select: Callable[..., list[dict[str, Any]]]

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
                       op: str = "fwd", num_stages: int | None = None, tp: int = 1,
                       sequence_parallel: bool = False, schedule: str | None = None) -> float | None:
        """Measured time of a whole stage for THE SAME partition, or None.

        Only ``stage<k>`` records of ``num_stages`` stages at exactly ``micro_batch``
        whose ``layers`` fact (``[first, last]``, ``last`` inclusive, as ``perfsim
        calibrate --stages`` records it) names the same layers count: a whole-stage timing
        includes the per-call and autograd-graph overheads that a sum of per-layer
        records misses, but only for the layers it timed. ``*`` records (the
        paper-derived default profile's) are not whole-stage measurements of a
        given partition and are ignored here (see :meth:`stage_compute`). ``tp`` /
        ``sequence_parallel``: one tensor-parallel rank's compute without its
        collectives (``perfsim calibrate --tp``); a record without a ``tp`` fact is a
        single rank's (tp 1). ``schedule``: records timed under that schedule win
        (interleaved 1F1B's chunks and ZB-H1's split backward cost more per call than
        1F1B's stages; ``perfsim calibrate --stage-schedule``), then those of a plain
        schedule (1F1B, GPipe, or a record without one), then any."""
        return self._same_partition(f"stage_{_fb(op)}", model, stage, first, last, num_stages,
                                    micro_batch, tp, sequence_parallel, schedule)

    def stage_optimizer_measured(self, model: str, stage: int, first: int, last: int,
                                 num_stages: int | None = None, schedule: str | None = None) -> float | None:
        """Measured optimizer step of a whole stage of THE SAME partition (the
        ``stage_optimizer`` records of ``perfsim calibrate --stages``), or None."""
        return self._same_partition("stage_optimizer", model, stage, first, last, num_stages,
                                    schedule=schedule)

    def _same_partition(self, op: str, model: str, stage: int, first: int, last: int,
                        num_stages: int | None, micro_batch: int | None = None, tp: int = 1,
                        sequence_parallel: bool = False, schedule: str | None = None) -> float | None:
        """``time_s`` of the ``op`` record of ``stage<k>`` whose ``layers`` are
        ``[first, last]`` (and, when given, of the same micro-batch), timed on ``tp``
        ranks (with or without sequence parallelism), or None; among several, the first
        timed under ``schedule``, else under a plain one (:meth:`stage_measured`)."""
        want = [int(first), int(last)]
        found = []
        for r in self.select(op, model=model, name=f"stage{int(stage)}", world_size=num_stages):
            if micro_batch is not None and r.get("micro_batch") != micro_batch:
                continue
            if (r.get("tp") or 1) != tp or bool(r.get("sequence_parallel")) != bool(sequence_parallel and tp > 1):
                continue
            if (r.get("recompute") or "none") != "none":  # the engine prices recomputation per layer
                continue
            if r.get("layers") == want:
                found.append(r)
        if not found:
            return None

        def rank(r) -> int:
            timed = str(r.get("schedule") or "1f1b").lower()
            return 0 if schedule and timed == schedule.lower() else 1 if timed in PLAIN_SCHEDULES else 2

        return float(min(found, key=rank)["time_s"])

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

    def fit(self, op: str, name: str | None = None, call: str | None = None) -> Fit | None:
        """The alpha-beta fit of ``op`` (``encode``, ``p2p``, ``optimizer``...), or None:
        a stored ``fit_<op>`` record, else :func:`fit_alpha_beta` of the raw records
        (in-situ points at one exact shape excluded: they price that boundary, not
        the per-byte line). Most specific name first: the exact spec
        (``directq:4``), its family (``directq``), then ``*``; ``name=None``: any.
        A collective kind's records count only for the torch call they timed:
        ``call`` (None: the kind's default, :data:`perfsim.collectives.DEFAULT_CALLS`).
        Memoised per profile (keyed also on the record count, so records added later
        are seen): a planner prices the same few codecs a million times."""
        cache = self.__dict__.setdefault("_fit_cache", {})
        key = (op, name, call, len(self.records))
        if key in cache:
            return cache[key]
        out = None
        for cand in [None] if name is None else name_chain(name):
            fit = self._fit_named(op, cand, call)
            if fit is not None:
                out = fit
                break
        cache[key] = out
        return out

    def _fit_named(self, op: str, name: str | None, call: str | None = None) -> Fit | None:
        """:meth:`fit` for exactly ``name`` (None: any name)."""
        want = call or DEFAULT_CALLS.get(op)

        def same_call(r: dict) -> bool:
            return want is None or (r.get("call") or DEFAULT_CALLS.get(op)) == want

        for r in self.records:
            if r["op"] == f"fit_{op}" and (name is None or r["name"] == name) and same_call(r):
                return Fit(float(r["alpha_s"]), float(r["beta_s_per_byte"]),
                           int(r.get("points", 0)), r.get("max_rel_error"))
        raw = [r for r in self.records if r["op"] == op and (name is None or r["name"] == name)
               and "shape" not in r and same_call(r)]
        if raw:
            return fit_alpha_beta([r["size_bytes"] for r in raw], [r["time_s"] for r in raw])
        return None

    def encode_time(self, spec: str, nbytes: float, shape=None, model: str | None = None) -> float:
        """Time to compress an fp32 tensor of ``nbytes`` with compressor ``spec``
        (fixed + per-byte cost). ``shape`` / ``model``: a pipeline boundary's
        exact shape and model; a point calibrated in situ at that boundary
        (a record with that ``shape`` fact, timed after the stage's own step; the
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
            want = [int(d) for d in shape]
            exact = [r for r in self.select(op, name=spec) if r.get("shape") == want]
            exact = [r for r in exact if r.get("model") == model] or exact
            if exact:
                times = sorted(r["time_s"] for r in exact)
                return times[len(times) // 2]
        if spec == "fp32":  # only its own measurement: the ``*`` fit is for compressors
            if not (self.select(op, name="fp32") or self.select(f"fit_{op}", name="fp32")):
                return 0.0
        fit = self.fit(op, spec)
        return fit(nbytes) if fit else 0.0

    def dp_codec_time(self, op: str, spec: str, nbytes: float) -> float | None:
        """Seconds of compressor ``spec``'s own local work before (``op="encode"``) or
        after (``"decode"``) the collectives of one data-parallel exchange of an fp32
        buffer of ``nbytes`` (``dp_encode`` / ``dp_decode`` records, timed in as many
        concurrent processes as the calibration's ranks), or None when not measured."""
        if op not in ("encode", "decode"):
            raise ValueError(f"dp codec op {op!r}: encode or decode")
        fit = self.fit(f"dp_{op}", spec) if nbytes > 0 else None
        return fit(nbytes) if fit else None

    def framing_time(self, side: str, wire_bytes: float) -> float:
        """Host time execute mode spends framing one pipeline message of
        ``wire_bytes`` on the ``send`` side (header, one buffer, isend) or the
        ``recv`` side (posting the receive, unpacking); 0 when not calibrated."""
        if side not in ("send", "recv"):
            raise ValueError(f"framing side {side!r}: send or recv")
        fit = self.fit(f"frame_{side}", None)
        return fit(wire_bytes) if fit and wire_bytes > 0 else 0.0

    def fsdp_host_time(self, name: str) -> float | None:
        """FSDP2's own host seconds (hooks, DTensor bookkeeping, unshard / reshard; not its
        collectives nor its copies) per pass of one sharding unit or of the root:
        ``name`` is ``unit_forward``, ``unit_backward``, ``root_forward`` or
        ``root_backward`` (``fsdp_host`` records, :mod:`perfsim.calibrate.fsdp_host`; the
        mean where several were measured), or None when the profile has none."""
        if name not in ("unit_forward", "unit_backward", "root_forward", "root_backward"):
            raise ValueError(f"fsdp host time {name!r}: unit_forward, unit_backward, root_forward or root_backward")
        recs = self.select("fsdp_host", name=name)
        return sum(r["time_s"] for r in recs) / len(recs) if recs else None

    def collective_fit(self, op: str, name: str | None = None) -> Fit | None:
        """Alpha-beta fit of a measured collective (``p2p``, ``allreduce`` ...),
        or None when the profile measured none."""
        if op not in COMM_OPS:
            raise ConfigError(f"collective op {op!r}: not one of {COMM_OPS}")
        return self.fit(op, name)

    def collective_ratio(self, kind: str, call: str, nbytes: float,
                         nominal_bps: float | None = None) -> float | None:
        """Measured time of collective ``kind`` as torch's ``call`` issues it, on a
        per-rank buffer of ``nbytes``, over the backend's allreduce of the same buffer
        (the same ranks, the same link): on the link emulated at ``nominal_bps`` when
        the profile measured ``call`` there, else on loopback; None when it measured
        ``call`` on neither (the ring model stands, :func:`perfsim.collectives.plan`).

        Each record's ratio is its ``time_s`` over its ``allreduce_s`` (the allreduce
        timed at that size in the same sweep, so load and the link's state divide
        out; several sweeps: their mean at each size); between measured sizes the ratio is interpolated linearly in
        ``log(size)``, beyond them the nearest one holds. A shaped link's times are
        no alpha-beta line (a token bucket passes small messages at once), so two
        fits' quotient can be far from the measured ratio at the sizes that matter;
        records without ``allreduce_s`` fall back to it (this kind's fit over the
        allreduce's, :meth:`fit`)."""
        if kind not in COMM_OPS:
            raise ConfigError(f"collective op {kind!r}: not one of {COMM_OPS}")
        backend = self.metadata.get("backend", "gloo")
        for name in ([comm_name(backend, nominal_bps)] if nominal_bps else []) + [backend]:
            by_size: dict[float, list[float]] = {}
            for r in self.records:
                if (r["op"] == kind and r.get("name") == name and r.get("allreduce_s") and r["size_bytes"] > 0
                        and (r.get("call") or DEFAULT_CALLS[kind]) == call):
                    by_size.setdefault(float(r["size_bytes"]), []).append(float(r["time_s"]) / float(r["allreduce_s"]))
            if by_size:  # several sweeps: the mean ratio at each size; linear in log(size), ends held
                import numpy as np  # lazy: numpy is heavy, needed only here

                sizes = sorted(by_size)
                return float(np.interp(math.log(max(float(nbytes), 1.0)), [math.log(x) for x in sizes],
                                       [sum(by_size[x]) / len(by_size[x]) for x in sizes]))
            own, ref = self._fit_named(kind, name, call), self._fit_named("allreduce", name)
            if own is not None and ref is not None and ref(nbytes) > 0:
                return own(nbytes) / ref(nbytes)
        return None

    def measured_allreduce_s(self, nbytes: float, world_size: int, nominal_bps: float | None) -> float | None:
        """The backend's allreduce of a per-rank buffer of ``nbytes`` on ``world_size``
        ranks as the profile timed it over the link emulated at ``nominal_bps``: linear
        in log(time) against log(size) between the measured sizes; None outside them,
        at another world size, or where that link was not measured."""
        if not nominal_bps or nbytes <= 0:
            return None
        name = comm_name(self.metadata.get("backend", "gloo"), nominal_bps)
        by_size: dict[float, list[float]] = {}
        for r in self.records:
            if (r["op"] == "allreduce" and r.get("name") == name and int(r.get("world_size", 0)) == world_size
                    and not r.get("call") and r.get("size_bytes", 0) > 0 and r.get("time_s", 0) > 0):
                by_size.setdefault(float(r["size_bytes"]), []).append(float(r["time_s"]))
        sizes = sorted(by_size)
        if len(sizes) < 2 or not sizes[0] <= nbytes <= sizes[-1]:
            return None
        import numpy as np  # lazy: numpy is heavy, needed only here

        logt = [math.log(sum(by_size[x]) / len(by_size[x])) for x in sizes]
        return float(math.exp(np.interp(math.log(nbytes), [math.log(x) for x in sizes], logt)))

    def optimizer_time(self, param_bytes: float) -> float | None:
        """Optimizer step time for ``param_bytes`` of fp32 parameters, or None (the optimizer
        :meth:`timed_optimizer` names)."""
        fit = self.fit("optimizer", None)
        return fit(param_bytes) if fit else None

    def timed_optimizer(self) -> str:
        """The optimizer (:data:`perfsim.job.OPTIMIZERS`) whose steps the profile's ``optimizer``
        and ``stage_optimizer`` records timed (their ``optimizer`` fact: ``perfsim calibrate``
        times adamw, adam or sgd); adamw where no record says (the paper-derived default
        profile's Adam)."""
        for r in self.records:
            if r["op"] in ("optimizer", "stage_optimizer", "fit_optimizer") and r.get("optimizer"):
                return TIMED_OPTIMIZER.get(str(r["optimizer"]).lower(), "adamw")
        return "adamw"


def _fb(op: str) -> str:
    op = op.lower()
    if op in ("fwd", "f", "forward"):
        return "fwd"
    if op in ("bwd", "b", "backward"):
        return "bwd"
    raise ConfigError(f"compute op {op!r}: expected 'fwd' or 'bwd'")


def name_chain(spec: str) -> list[str]:
    """``aqsgd:3:m8`` -> ``['aqsgd:3:m8', 'aqsgd:3', 'aqsgd', '*']``, from the spec's
    canonical text (:class:`perfsim.compression.spec.Spec`: ``DirectQ:4`` is ``directq:4``)."""
    try:
        spec = parse_spec(spec, "compressor").text
    except ConfigError:
        pass  # not a compressor spec (an op name such as "messenger"): as given
    parts = spec.split(":")
    return [":".join(parts[:k]) for k in range(len(parts), 0, -1)] + ["*"]
