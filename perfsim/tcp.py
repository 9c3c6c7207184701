"""A TCP connection's window over a long link: the rate ceiling of one message's connections.

A TCP sender keeps at most one window ``W`` of unacknowledged bytes in flight and a window
drains once per round trip, so one connection moves at most ``W / RTT`` whatever the line
rate (the bandwidth-delay product argument: M. Mathis, J. Semke, J. Mahdavi, T. Ott, "The
macroscopic behavior of the TCP congestion avoidance algorithm", CCR 27(3), 1997, where the
window, not loss, is the limit; windows beyond 64 KiB need RFC 7323's window scaling). A
message carried by ``c`` connections at once (NCCL's socket transport splits it over its
sockets) moves at most::

    rate = min(link rate, c x W / RTT),      RTT = 2 x one-way latency of the link

Linux bounds ``W`` by the socket buffers that receive-buffer and send-buffer autotuning grow
up to (``Documentation/networking/ip-sysctl.rst``, Linux 6.x)::

    W = min(tcp_wmem[max], payload_share x tcp_rmem[max])
    payload_share = 1 - 2^-s   (s = tcp_adv_win_scale > 0),   2^s   (s <= 0)

* ``tcp_rmem`` max, default 6 MiB ("between 131072 and 6MB, depending on RAM size"): the
  receiver's buffer, of which only ``payload_share`` is advertised as window -- the rest
  pays for per-packet overhead (``tcp_win_from_space``; ``tcp_adv_win_scale`` default 1:
  half). Since Linux 6.6 the kernel measures the share per socket instead of reading the
  sysctl (commit dfa2f0483360 "tcp: get rid of sysctl_tcp_adv_win_scale": "with the
  default sysctl_tcp_adv_win_scale value, we expect to store 50% of payload per allocated
  chunk of memory"), starting from the same 50 %;
* ``tcp_wmem`` max, default 4 MiB ("between 64K and 4MB, depending on RAM size"): the
  sender's buffer, which holds every unacknowledged byte until it is acknowledged;
* ``tcp_window_scaling`` 0: the window field's 16 bits, 65,535 bytes (RFC 7323 Sec. 2).

With the defaults ``W`` = min(4 MiB, 3 MiB) = 3 MiB: one connection over 80 ms of round
trip carries at most 3 MiB x 8 / 0.08 s = 315 Mbit/s.

Connections per peer (:attr:`perfsim.fabrics.NicKind.tcp_connections`): gloo opens one TCP
pair per peer; NCCL's socket transport opens ``NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD``
data sockets per peer and channel and splits each message over them (NCCL documentation,
Environment Variables: both default 1 on generic Ethernet, 2 and 8 on AWS; NCCL
``src/transport/net_socket.cc``, ``ncclSocketGetNsockNthread``), so 1 unless set.

Slow start after idle (:class:`SlowStart`, below): a connection idle for longer than its RTO
restarts from a smaller window (Linux ``tcp_cwnd_restart``, RFC 2861), priced per pipeline
message by the flow backend from each connection's last send and window.

Not modelled: loss and the congestion-control dynamics it drives (Mathis et al.'s
``MSS / (RTT sqrt(p))`` regime), the slow start of a connection's first message, BBR's
pacing, the autotuning ramp of a new connection's buffers, and buffers a program sets itself
(``SO_RCVBUF``/``SO_SNDBUF`` switch autotuning off, bounded by ``net.core.rmem_max``).
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from perfsim.errors import ConfigError
from perfsim.units import parse_size

#: the word settings of ``System.tcp_window`` (else a window in bytes)
TCP_WINDOW_MODES = ("auto", "off")
#: largest window without RFC 7323 window scaling (a 16-bit field)
UNSCALED_WINDOW_BYTES = 65535
#: where a Linux host keeps the TCP sysctls (``perfsim calibrate --comm`` reads them)
PROC_IPV4 = "/proc/sys/net/ipv4"
#: ``metadata`` key of a profile holding the host's TCP sysctls (:func:`read_host`)
PROFILE_KEY = "tcp"


@dataclass(frozen=True)
class TcpHost:
    """The Linux sysctls that bound one connection's window (module docstring); sizes in bytes."""

    #: ``net.ipv4.tcp_rmem`` max: the receive buffer autotuning grows up to
    rmem_max: int = 6 * 2**20
    #: ``net.ipv4.tcp_wmem`` max: the send buffer autotuning grows up to
    wmem_max: int = 4 * 2**20
    #: ``net.ipv4.tcp_adv_win_scale``: the payload share of the receive buffer
    adv_win_scale: int = 1
    #: ``net.ipv4.tcp_window_scaling``: RFC 7323 window scaling on
    window_scaling: bool = True
    #: where the values come from
    source: str = "Linux defaults (Documentation/networking/ip-sysctl.rst, Linux 6.x)"

    def __post_init__(self):
        for name in ("rmem_max", "wmem_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"tcp {name}={v!r}: must be a size in bytes > 0")
        if isinstance(self.adv_win_scale, bool) or not isinstance(self.adv_win_scale, int) \
                or not -31 <= self.adv_win_scale <= 31:
            raise ConfigError(f"tcp adv_win_scale={self.adv_win_scale!r}: an integer in [-31, 31] "
                              "(Documentation/networking/ip-sysctl.rst)")

    @property
    def payload_share(self) -> float:
        """Share of the receive buffer advertised as window (``tcp_win_from_space``)."""
        s = self.adv_win_scale
        return 1.0 - 2.0 ** -s if s > 0 else 2.0 ** s

    @property
    def window_bytes(self) -> float:
        """``min(wmem max, payload share x rmem max)``, 65,535 without window scaling."""
        w = min(float(self.wmem_max), self.payload_share * self.rmem_max)
        return w if self.window_scaling else min(w, float(UNSCALED_WINDOW_BYTES))


#: the host Linux gives a connection when nothing else is known
LINUX_DEFAULTS = TcpHost()


@dataclass(frozen=True)
class TcpWindow:
    """The window of each connection and how many carry one message: ``window_bytes`` None
    is no ceiling (``tcp_window off``, or a transport that is not TCP)."""

    window_bytes: float | None
    connections: int = 1
    source: str = ""

    def rate_cap_bps(self, rtt_s: float) -> float:
        """``connections x W x 8 / rtt_s`` bits/s; infinite without a window or a round trip."""
        if self.window_bytes is None or not rtt_s > 0:
            return math.inf
        return self.connections * self.window_bytes * 8.0 / rtt_s

    def facts(self, rtt_s: float | None = None) -> dict[str, Any]:
        """What a prediction reports (``summary["tcp_window"]`` ...): the window, the
        connections, the source and, given the round trip, the ceiling in bits/s."""
        out: dict[str, Any] = {"tcp_window": _describe(self), "tcp_window_bytes": self.window_bytes,
                               "tcp_connections": self.connections if self.window_bytes is not None else None,
                               "tcp_window_source": self.source}
        if rtt_s is not None:
            cap = self.rate_cap_bps(rtt_s)
            out["tcp_rate_cap_bps"] = cap if math.isfinite(cap) else None
        return out


NO_WINDOW = TcpWindow(None, 1, "off")


def _describe(w: TcpWindow) -> str:
    if w.window_bytes is None:
        return f"off: {w.source}" if w.source and w.source != "off" else "off"
    n = w.connections
    return f"{w.window_bytes / 2**20:.3g} MiB x {n} connection{'s' if n != 1 else ''}: {w.source}"


def parse_tcp_window(value: Any, what: str = "tcp_window") -> str | int:
    """``auto`` / ``off`` / a window in bytes (``"3MiB"``, ``3145728``) -> the word or int bytes > 0;
    ConfigError naming ``what`` otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}={value!r}: auto, off or a window in bytes (e.g. 3MiB)")
    if isinstance(value, (int, float)):  # whole bytes: 0.4 is no window, as 0 is
        if not math.isfinite(value) or round(value) <= 0:
            raise ConfigError(f"{what}={value!r}: a window must be > 0 bytes (or auto, off)")
        return int(round(value))
    text = str(value).strip()
    if text.lower() in TCP_WINDOW_MODES:
        return text.lower()
    if not text or not (text[0].isdigit() or text[0] in ".-+"):
        raise ConfigError(f"{what}={value!r}: auto, off or a window in bytes (e.g. 3MiB)")
    size = parse_size(text, what) if not text.startswith("-") else 0
    if size <= 0:
        raise ConfigError(f"{what}={value!r}: a window must be > 0 bytes (or auto, off)")
    return size


def host_from_metadata(metadata: Mapping[str, Any] | None, where: str = "profile") -> TcpHost | None:
    """The :class:`TcpHost` a profile recorded (``metadata["tcp"]``, :func:`read_host`), or None."""
    rec = (metadata or {}).get(PROFILE_KEY)
    if not isinstance(rec, Mapping):
        return None
    try:
        rmem, wmem = rec["tcp_rmem"], rec["tcp_wmem"]
        return TcpHost(int(rmem[2]), int(wmem[2]), int(rec.get("tcp_adv_win_scale", 1)),
                       bool(int(rec.get("tcp_window_scaling", 1))),
                       f"{where}: the calibrated host's sysctls ({rec.get('kernel') or 'Linux'})")
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: metadata.tcp is malformed ({exc}); expected tcp_rmem and "
                          "tcp_wmem as [min, default, max]") from None


def resolve(setting: Any, connections: int | None, default_connections: int | None,
            metadata: Mapping[str, Any] | None = None, where: str = "profile") -> TcpWindow:
    """The window of a job's inter-node connections. ``setting``: ``auto`` (the profile's
    host, ``metadata``, when it recorded one, else :data:`LINUX_DEFAULTS`), ``off``, or a
    window in bytes; ``connections``: per message, None = ``default_connections`` (the NIC
    kind's; None there: not a TCP transport, no window)."""
    setting = parse_tcp_window(setting)
    if default_connections is None or setting == "off":
        return TcpWindow(None, 1, "off" if setting == "off" else "not a TCP transport")
    n = default_connections if connections is None else connections
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"tcp_connections={connections!r}: must be an integer >= 1")
    if setting == "auto":
        host = host_from_metadata(metadata, where) or LINUX_DEFAULTS
        return TcpWindow(host.window_bytes, n, host.source)
    return TcpWindow(float(setting), n, "given")


def read_host(proc: str | Path = PROC_IPV4) -> dict[str, Any] | None:
    """This host's TCP sysctls as a profile records them (``metadata["tcp"]``): ``tcp_rmem``,
    ``tcp_wmem`` ([min, default, max] bytes), ``tcp_adv_win_scale``, ``tcp_window_scaling``,
    ``tcp_congestion_control``, ``tcp_slow_start_after_idle`` and the kernel; read from
    ``/proc/sys/net/ipv4`` (no root needed). None where they cannot be read (not Linux)."""
    root = Path(proc)

    def text(name: str) -> str:
        return (root / name).read_text().strip()

    try:
        out: dict[str, Any] = {"tcp_rmem": [int(x) for x in text("tcp_rmem").split()],
                               "tcp_wmem": [int(x) for x in text("tcp_wmem").split()]}
    except (OSError, ValueError):
        return None
    if len(out["tcp_rmem"]) != 3 or len(out["tcp_wmem"]) != 3:
        return None
    for name, conv in (("tcp_adv_win_scale", int), ("tcp_window_scaling", int),
                       ("tcp_congestion_control", str), ("tcp_slow_start_after_idle", int)):
        try:
            out[name] = conv(text(name))
        except (OSError, ValueError):
            pass
    out["kernel"] = f"{platform.system()} {platform.release()}"
    return out


# ---------------------------------------------------------------- slow start after idle

#: the settings of ``System.tcp_slow_start_after_idle``
SLOW_START_MODES = ("auto", "on", "off")
#: RFC 6928's initial window, Linux ``TCP_INIT_CWND`` (include/net/tcp.h): the restart window
INIT_CWND_SEGMENTS = 10
#: Linux ``TCP_RTO_MIN`` (include/net/tcp.h: ``HZ / 5``), the floor of the RTO's variance term
RTO_MIN_S = 0.2
#: payload bytes of one segment over Ethernet MTU 1500 with RFC 7323 timestamps (the numerator of
#: :data:`perfsim.fabrics.NIC_KINDS`' ``ethernet`` efficiency, 1448 / 1538)
MSS_BYTES = 1448


def rto_s(rtt_s: float) -> float:
    """Linux's retransmission timeout on a path of steady round trip ``rtt_s``:
    ``srtt + max(TCP_RTO_MIN, 4 mdev)`` (``__tcp_set_rto`` in include/net/tcp.h; ``tcp_rtt_estimator``
    in net/ipv4/tcp_input.c keeps the variance term ``rttvar_us`` at least ``tcp_rto_min_us``), so
    ``rtt + 200 ms`` when the round trip does not vary (RFC 6298 Sec. 2 with Linux's floor)."""
    return rtt_s + RTO_MIN_S


def restart_cwnd(cwnd: float, idle_s: float, rto: float, iw: int = INIT_CWND_SEGMENTS) -> float:
    """The congestion window (segments) a connection that held ``cwnd`` sends with after ``idle_s``
    of silence: Linux ``tcp_cwnd_restart`` (net/ipv4/tcp_output.c, RFC 2861 Sec. 3), applied when
    the idle spell exceeds one RTO: the window is halved once for every further RTO of the
    spell, never below the restart window ``min(iw, cwnd)``. Unchanged after a shorter spell."""
    if not idle_s > rto:
        return cwnd
    floor = min(float(iw), cwnd)
    c = int(cwnd)
    left = idle_s - rto
    while left > 0 and c > floor:
        c >>= 1
        left -= rto
    return max(float(c), floor)


def pipe_segments(rate_bps: float, rtt_s: float, mss: int = MSS_BYTES) -> float:
    """Segments in flight that keep a path of ``rate_bps`` busy for one round trip: its
    bandwidth-delay product ``b = rate x RTT / MSS``."""
    return rate_bps / 8.0 * rtt_s / mss


def full_cwnd(rate_bps: float, rtt_s: float, mss: int = MSS_BYTES) -> float:
    """The window a connection holds after a message that filled its path: ``2 b`` -- Linux lets
    slow start grow the window while it is below twice the segments in flight
    (``tcp_is_cwnd_limited``, include/net/tcp.h; RFC 7661's validated window), and a path's
    ``b`` segments are what it holds in flight at its rate (no queue, no loss: modelled)."""
    return max(float(INIT_CWND_SEGMENTS), 2.0 * math.ceil(pipe_segments(rate_bps, rtt_s, mss)))


def slow_start_delay(nbytes: float, rate_bps: float, rtt_s: float, cwnd: float,
                     mss: int = MSS_BYTES) -> tuple[float, float]:
    """``(extra seconds, window after)`` of a message of ``nbytes`` that starts with a window of
    ``cwnd`` segments on a path of ``rate_bps`` and round trip ``rtt_s``, against the same
    message at the full rate (``nbytes / rate``).

    Slow start by rounds (N. Cardwell, S. Savage, T. Anderson, "Modeling TCP Latency",
    IEEE INFOCOM 2000, Sec. II-B, without loss): round ``i`` sends ``w_i = cwnd 2^i`` segments
    (Linux adds one segment per segment acknowledged, ``tcp_slow_start``, so the window doubles
    per round trip with or without delayed ACKs) and the next round starts one RTT later, until
    the window covers the pipe, ``w_i >= b = rate RTT / MSS``; from then on the message moves at
    the rate. Round ``i`` leaves the link idle for ``RTT - w_i MSS / rate``, so with
    ``N = ceil(nbytes / MSS)`` segments::

        n* = min{n >= 0 : cwnd 2^n >= b}          rounds before the pipe is full
        k  = min{k >= 1 : cwnd (2^k - 1) >= N}    rounds a window-bound message needs
        j  = min(k - 1, n*)
        extra = j RTT - cwnd (2^j - 1) MSS / rate

    The window after: ``cwnd + N`` (one segment per segment acknowledged) while that is below
    :func:`full_cwnd`, else the full window."""
    if not (nbytes > 0 and rate_bps > 0 and rtt_s > 0 and math.isfinite(rate_bps)):
        return 0.0, cwnd
    cwnd = max(float(cwnd), 1.0)  # (a window holds at least one segment)
    full = full_cwnd(rate_bps, rtt_s, mss)
    if cwnd >= full:
        return 0.0, cwnd
    after = min(cwnd + math.ceil(nbytes / mss), full)
    b = pipe_segments(rate_bps, rtt_s, mss)
    if cwnd >= b:
        return 0.0, after
    segments = math.ceil(nbytes / mss)
    n_star = 0
    while cwnd * 2 ** n_star < b:
        n_star += 1
    k = 1
    while cwnd * (2 ** k - 1) < segments:
        k += 1
    j = min(k - 1, n_star)
    extra = j * rtt_s - cwnd * (2 ** j - 1) * mss * 8.0 / rate_bps
    return max(extra, 0.0), after


@dataclass(frozen=True)
class SlowStart:
    """Whether a TCP connection restarts slow start after an idle spell (``on``), with the
    parameters it restarts with; the flow backend keeps each connection's last send and
    window and charges :func:`slow_start_delay` (docs/model.md, "Slow start after idle")."""

    on: bool
    connections: int = 1
    iw: int = INIT_CWND_SEGMENTS
    mss: int = MSS_BYTES
    source: str = ""

    def delay(self, nbytes: float, rate_bps: float, rtt_s: float, cwnd: float | None,
              idle_s: float | None) -> tuple[float, float | None]:
        """``(extra seconds, window after)`` of one message of ``nbytes`` on a connection that
        held window ``cwnd`` (None: no history, a full window) and was idle ``idle_s``
        seconds: each of its ``connections`` sockets carries ``nbytes / c`` at ``rate / c``.
        A message without bytes, or a path without a round trip, leaves the window as it was."""
        if not self.on or not rtt_s > 0 or nbytes <= 0:
            return 0.0, cwnd
        c = self.connections
        rate, size = rate_bps / c, nbytes / c
        full = full_cwnd(rate, rtt_s, self.mss)
        w = full if cwnd is None else cwnd
        if idle_s is not None:
            w = restart_cwnd(w, idle_s, rto_s(rtt_s), self.iw)
        return slow_start_delay(size, rate, rtt_s, w, self.mss)

    def facts(self) -> dict[str, Any]:
        """What a prediction reports: ``tcp_slow_start_after_idle`` (on/off: why)."""
        return {"tcp_slow_start_after_idle": f"{'on' if self.on else 'off'}: {self.source}"}


def parse_slow_start(value: Any, what: str = "tcp_slow_start_after_idle") -> str:
    """``auto`` / ``on`` / ``off`` (also 1 / 0, true / false, the sysctl's own values) -> the word;
    ConfigError naming ``what`` otherwise."""
    if isinstance(value, bool):
        return "on" if value else "off"
    text = str(value).strip().lower()
    words = {"1": "on", "0": "off", "true": "on", "false": "off", "yes": "on", "no": "off"}
    text = words.get(text, text)
    if text not in SLOW_START_MODES:
        raise ConfigError(f"{what}={value!r}: auto, on or off (Linux net.ipv4.tcp_slow_start_after_idle)")
    return text


def resolve_slow_start(setting: Any, connections: int | None, default_connections: int | None,
                       metadata: Mapping[str, Any] | None = None) -> SlowStart:
    """Whether a job's inter-node TCP connections restart slow start after idle. ``auto``: on only
    where the profile's host recorded it (``metadata["tcp"]``, :func:`read_host`:
    ``tcp_slow_start_after_idle`` 1 and a congestion control without its own ``cong_control``
    hook -- Linux's ``tcp_slow_start_after_idle_check`` returns early for BBR, which keeps its
    bandwidth estimate over idle spells); a profile that recorded no host: off (not assumed: the
    effect is large and no run here had a kernel round trip to check it; docs/model.md).
    ``on`` prices Linux's defaults (sysctl 1, cubic); ``off``. Not a TCP transport
    (``default_connections`` None): off."""
    setting = parse_slow_start(setting)
    if default_connections is None:
        return SlowStart(False, source="not a TCP transport")
    if setting == "off":
        return SlowStart(False, source="off")
    n = default_connections if connections is None else connections
    if setting == "on":
        return SlowStart(True, n, source="on")
    rec = (metadata or {}).get(PROFILE_KEY)
    if isinstance(rec, Mapping) and ("tcp_slow_start_after_idle" in rec or "tcp_congestion_control" in rec):
        cc = str(rec.get("tcp_congestion_control") or "cubic")
        if not int(rec.get("tcp_slow_start_after_idle", 1)):
            return SlowStart(False, n, source="the calibrated host's tcp_slow_start_after_idle=0")
        if cc.lower().startswith("bbr"):
            return SlowStart(False, n, source=f"the calibrated host runs {cc} (no restart after idle)")
        return SlowStart(True, n, source=f"the calibrated host's tcp_slow_start_after_idle=1, {cc}")
    return SlowStart(False, n, source="auto, no host sysctls recorded (on prices Linux's defaults)")
