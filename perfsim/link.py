"""One transport model: the :class:`Link` the engine sends over, nominal or calibrated.

A link is what a message of ``s`` bytes costs between two nodes::

    t(s) = latency_s + overhead_s + max(0, s - burst_bytes) / rate      (rate in bytes/s)

* ``rate``: the payload rate a long back-to-back transfer achieves (line rate x
  transport efficiency: TCP/IP framing, NCCL protocol overhead);
* ``overhead_s``: the fixed cost per message (the backend's per-message work,
  syscalls, veth/bridge traversal) on top of the propagation ``latency_s``;
* ``burst_bytes``: a token-bucket shaper's depth (Linux ``tc tbf``, as execute
  mode's emulated links install it, :mod:`perfsim.shaping`): after the link idled,
  that many bytes leave at once (tc-tbf(8));
* ``protocol``: ``eager`` (bytes start when sent) or ``rendezvous`` (they start
  once the receiver posted its receive; gloo's TCP pairs are receiver-driven).

Two constructors, one model: :meth:`Link.nominal` (a rate as given, times a NIC
kind's cited efficiency, :data:`perfsim.fabrics.NIC_KINDS`) and
:meth:`Link.calibrated` (what ``perfsim calibrate --emulate-bandwidth`` measured
at that nominal rate: fitted rate, per-message fixed cost, shaper burst).
:func:`resolve_links` picks for ``predict``, ``sweep`` and ``validate`` alike:
the calibrated link when the profile measured that rate, else the nominal one.
Host framing of each message (``frame_send``/``frame_recv``) is charged by the
plan as host time (:mod:`perfsim.engine.plan`), not here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfsim._lazy import np

from perfsim.errors import ConfigError

#: what the simulator is told about the link (``System.link_model``)
LINK_MODELS = ("auto", "calibrated", "nominal")
#: point-to-point protocols the engine models
P2P_PROTOCOLS = ("eager", "rendezvous")
#: messages up to this size fit inside every emulated link's token bucket
#: (perfsim.shaping.tbf_burst_bytes: burst >= 16 x 1514 B), so they cost the same at any rate
POOL_MAX_BYTES = 16384


@dataclass(frozen=True)
class Link:
    """An inter-node link (module docstring). Rates in bits/s, times in s."""

    rate_bps: float
    latency_s: float = 0.0
    overhead_s: float = 0.0
    burst_bytes: float = 0.0
    protocol: str = "eager"
    control_latency_s: float | None = None
    nominal_bps: float | None = None
    source: str = "nominal"

    def __post_init__(self):
        if not self.rate_bps > 0:
            raise ConfigError(f"link rate={self.rate_bps!r}: must be > 0")
        for name in ("latency_s", "overhead_s", "burst_bytes"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"link {name}={getattr(self, name)!r}: must be >= 0")
        if self.protocol not in P2P_PROTOCOLS:
            raise ConfigError(f"p2p_protocol={self.protocol!r}: choose from {', '.join(P2P_PROTOCOLS)}")

    @property
    def one_way_s(self) -> float:
        """Fixed one-way cost of a message: propagation + per-message overhead."""
        return self.latency_s + self.overhead_s

    @property
    def efficiency(self) -> float:
        """Achieved / nominal rate (1 when no nominal rate is known)."""
        return self.rate_bps / self.nominal_bps if self.nominal_bps else 1.0

    def time(self, nbytes: float) -> float:
        """Uncontended time of one message after an idle spell (module formula)."""
        return self.one_way_s + max(0.0, nbytes - self.burst_bytes) * 8.0 / self.rate_bps

    @classmethod
    def nominal(cls, bandwidth_bps: float, latency_s: float = 0.0, *, efficiency: float = 1.0,
                burst_bytes: float = 0.0, protocol: str = "eager",
                control_latency_s: float | None = None, source: str = "nominal") -> "Link":
        """A link of nominal rate ``bandwidth_bps`` carrying ``efficiency`` of it as payload."""
        if not 0 < efficiency <= 1:
            raise ConfigError(f"link efficiency={efficiency!r}: must be in (0, 1]")
        return cls(bandwidth_bps * efficiency, latency_s, 0.0, burst_bytes, protocol,
                   control_latency_s, bandwidth_bps, source)

    @classmethod
    def calibrated(cls, profile, nominal_bps: float | None, latency_s: float = 0.0, *,
                   op: str = "p2p") -> "Link | None":
        """The link ``perfsim calibrate`` measured at ``nominal_bps`` (None: loopback),
        or None when the profile has no such measurement.

        ``op="p2p"``: execute mode's own message path (``messenger`` records), else the
        backend's raw p2p. ``op="allreduce"``: the 2-rank allreduce, whose ring is one
        exchange of S bytes with two latency-bound steps (T = S/B + 2 latency), so the
        per-step overhead is half the fitted fixed cost. Rate: slope through the
        bandwidth-bound sizes (:func:`fit_token_bucket`); fixed cost: the expected
        small-message time (:func:`pooled_small_message_s`); burst: the bucket the
        emulation configured (:func:`perfsim.shaping.tbf_burst_bytes`), in payload
        bytes, else the fitted one. Memoised per profile, keyed also on its record count (as
        :meth:`perfsim.profile.ProfileCosts.fit`; :meth:`perfsim.profile.Profile.forget` drops it):
        a planner resolves the same few links for every candidate.
        """
        memo = profile.__dict__.setdefault("_link_cache", {}) if hasattr(profile, "__dict__") else {}
        key = (op, nominal_bps, latency_s, len(profile.records))
        if key not in memo:
            memo[key] = cls._calibrated(profile, nominal_bps, latency_s, op)
        return memo[key]

    @classmethod
    def _calibrated(cls, profile, nominal_bps: float | None, latency_s: float, op: str) -> "Link | None":
        """:meth:`calibrated`, computed."""
        # lazy: perfsim --help does not load perfsim.calibrate.profile_io
        from perfsim.calibrate.profile_io import comm_name

        backend = profile.metadata.get("backend", "gloo")
        names = [comm_name(backend, nominal_bps)] if op == "allreduce" else \
            [comm_name("messenger", nominal_bps), comm_name(backend, nominal_bps)]
        for name in names:
            raw = sorted(_records(profile, op, name), key=lambda r: r["size_bytes"])
            if len(raw) < 3:
                continue
            sizes, times = [r["size_bytes"] for r in raw], [r["time_s"] for r in raw]
            fit = fit_token_bucket(sizes, times)
            if fit is None:  # never bandwidth-bound (fast loopback): slope of the two largest
                (s0, t0), (s1, t1) = (sizes[-2], times[-2]), (sizes[-1], times[-1])
                beta = (t1 - t0) / (s1 - s0) if s1 > s0 and t1 > t0 else t1 / s1
                rate_Bps, alpha = 1.0 / beta, sorted(times[:3])[len(times[:3]) // 2]
            else:
                rate_Bps, alpha = fit.rate_Bps, fit.alpha_s
            pooled = pooled_small_message_s(profile, op, name.split("@")[0]) if nominal_bps else None
            if pooled is not None:
                alpha = pooled
            elif any("mean_s" in r for r in raw[:3]):
                alpha = sorted(_expected_s(r) for r in raw[:3])[len(raw[:3]) // 2]
            # alpha is the middle small message's time: if the fitted burst clearly exceeds
            # that message, it passed inside the burst and alpha is the fixed cost; else it
            # paid its bytes at the rate and the burst absorbed them
            burst = float(fit.burst_bytes) if fit is not None and nominal_bps else 0.0
            if pooled is not None:
                # lazy: perfsim --help does not load perfsim.shaping
                from perfsim.shaping import tbf_burst_bytes

                # tbf counts frame bytes; achieved / nominal is the payload share of a frame
                burst = tbf_burst_bytes(nominal_bps) * min(1.0, 8.0 * rate_Bps / nominal_bps)
            if pooled is not None or burst > 2 * sizes[1]:
                fixed = alpha
            else:
                fixed = max(0.0, alpha - sizes[1] / rate_Bps)
                burst = max(0.0, burst - sizes[1])
            overhead = fixed / 2 if op == "allreduce" else fixed
            return cls(8.0 * rate_Bps, latency_s, overhead, burst, "eager", None,
                       nominal_bps, f"profile {op} {name}")
        return None


def resolve_link(profile, nominal_bps: float, latency_s: float, *, op: str, model: str = "auto",
                 efficiency: float = 1.0, burst_bytes: float = 0.0, protocol: str = "eager",
                 control_latency_s: float | None = None) -> Link:
    """The link predict, sweep and validate all use (module docstring).

    ``model``: ``auto`` (calibrated when the profile measured ``nominal_bps``, else
    nominal), ``calibrated`` (must be measured) or ``nominal``. Explicit
    ``burst_bytes``/``protocol``/``control_latency_s`` override the calibration's."""
    if model not in LINK_MODELS:
        raise ConfigError(f"link_model={model!r}: choose from {', '.join(LINK_MODELS)}")
    link = None
    if model != "nominal" and profile is not None and getattr(profile, "records", None):
        link = Link.calibrated(profile, nominal_bps, latency_s, op=op)
        if link is None and model == "calibrated":
            raise ConfigError(f"link_model=calibrated: profile {getattr(profile, 'path', '')!r} has no "
                              f"{op} measurement at {nominal_bps:g} bit/s")
    if link is None:
        return Link.nominal(nominal_bps, latency_s, efficiency=efficiency, burst_bytes=burst_bytes,
                            protocol=protocol, control_latency_s=control_latency_s)

    return replace(link, burst_bytes=burst_bytes or link.burst_bytes, protocol=protocol,
                   control_latency_s=control_latency_s)


# ----------------------------------------------------------------- measurement helpers
def records_of(profile, op: str) -> list[dict]:
    """The profile's records of ``op``: its memoised index (:meth:`perfsim.profile.ProfileFile.select`)
    where it has one -- a planner resolves the same links thousands of times -- else a scan."""
    select = getattr(profile, "select", None)
    return select(op) if select is not None else [r for r in profile.records if r["op"] == op]


def _records(profile, op: str, name: str) -> list[dict]:
    return [r for r in records_of(profile, op) if r.get("name") == name]


def _expected_s(rec: dict) -> float:
    """A small message's expected time: the mean of its repeats (the ``mean_s``
    fact ``perfsim calibrate`` records), else its ``time_s``. Small messages can
    be bimodal (a fast path, or a wait for the next kernel timer tick): the
    median of a few repeats lands on either mode, while a run of many messages
    pays the mean (linearity of expectation)."""
    return float(rec.get("mean_s", rec["time_s"]))


def pooled_small_message_s(profile, op: str, base: str) -> float | None:
    """Expected time of a burst-resident small message, pooled over every emulated rate.

    A message that fits in the shaper's token bucket never waits for the rate, so
    its time is one quantity at any rate; the repeat-weighted mean of every
    ``<base>@<rate>`` record up to :data:`POOL_MAX_BYTES` uses all samples (one
    rate's 60 repeats gave 0.09-1.2 ms in two quiet calibrations). None when the
    profile has no such records with a recorded mean."""
    total = weight = 0.0
    for r in records_of(profile, op):
        name = str(r.get("name", ""))
        if not name.startswith(f"{base}@") or r["size_bytes"] > POOL_MAX_BYTES:
            continue
        if "mean_s" not in r:
            continue
        n = float(r.get("repeats") or 1)
        total += n * _expected_s(r)
        weight += n
    return total / weight if weight else None


@dataclass(frozen=True)
class TokenBucketFit:
    """``time(s) = alpha + max(0, s - burst) / rate`` fitted to ping-pong points over a
    token-bucket-shaped link (tc-tbf(8)); ``rate_Bps`` is the payload rate achieved
    (the shaper counts frame bytes: 1448 of 1514 per frame, ~0.956 of nominal)."""

    alpha_s: float
    rate_Bps: float
    burst_bytes: float
    points: int


def fit_token_bucket(sizes, times, shaped_factor: float = 3.0) -> TokenBucketFit | None:
    """alpha: median time of the three smallest messages; the rate: least-squares
    slope through the points taking more than ``shaped_factor`` x alpha (>= 2
    needed, else None); the burst: mean of ``s - (t - alpha) * rate`` over them."""
    pts = sorted((float(s), float(t)) for s, t in zip(sizes, times) if t > 0 and s > 0)
    if len(pts) < 3:
        return None
    alpha = float(np.median([t for _, t in pts[:3]]))
    shaped = [(s, t) for s, t in pts if t > shaped_factor * alpha]
    if len(shaped) < 2:
        return None
    xs = np.array([s for s, _ in shaped])
    ys = np.array([t for _, t in shaped])
    slope = float(np.polyfit(xs, ys, 1)[0]) if np.ptp(xs) > 0 else 0.0
    if slope <= 0:
        return None
    rate = 1.0 / slope
    burst = float(np.mean(xs - (ys - alpha) * rate))
    return TokenBucketFit(alpha, rate, max(0.0, burst), len(shaped))
