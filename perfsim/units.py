"""Unit parsing at the edge. Inside perfsim everything is SI: bits per second,
seconds, bytes. Strings such as ``"100Mbps"``, ``"5ms"`` or ``"64MB"`` are parsed
once, here, and never again.

Conventions (decimal prefixes, as network rates are quoted):
  bandwidth: ``bps``, ``Kbps``, ``Mbps``, ``Gbps``, ``Tbps`` (bits per second), and
  the byte forms ``B/s``, ``KB/s``, ``MB/s``, ``GB/s`` (x8); case-insensitive.
  A bare number is bits per second.
  time: ``s``, ``ms``, ``us``, ``ns``; a bare number is seconds.
  size: ``B``, ``KB``, ``MB``, ``GB`` (decimal) and ``KiB``, ``MiB``, ``GiB``.
"""

from __future__ import annotations

import math
import re

from perfsim.errors import ConfigError

_NUM = r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"

_RATE_BITS = {"": 1.0, "bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12,
              "bit/s": 1.0, "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9, "kbit": 1e3,
              "mbit": 1e6, "gbit": 1e9}
_RATE_BYTES = {"b/s": 8.0, "kb/s": 8e3, "mb/s": 8e6, "gb/s": 8e9, "tb/s": 8e12,
               "bps_bytes": 8.0}
_TIME = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
         "min": 60.0}
_SIZE = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _split(text: str, what: str) -> tuple[float, str]:
    if not isinstance(text, str):
        text = str(text)
    m = re.fullmatch(r"\s*" + _NUM + r"\s*([A-Za-zµ/]*)\s*", text)
    if not m:
        raise ConfigError(f"{what} {text!r}: not a number with a unit")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise ConfigError(f"{what} {text!r}: not finite")
    return value, m.group(2)


def parse_bandwidth(text: str | float, what: str = "bandwidth") -> float:
    """Parse a link rate such as ``"100Mbps"`` or ``"12.5MB/s"`` into bits/second (> 0)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        value, unit = _split(text, what)
    key = unit.lower()
    if unit.endswith("B/s") or unit == "Bps":  # byte forms keep the capital B
        scale = _RATE_BYTES.get(key if unit != "Bps" else "bps_bytes")
    else:
        scale = _RATE_BITS.get(key)
    if scale is None:
        raise ConfigError(f"{what} {text!r}: unknown unit {unit!r} "
                          "(use bps, Kbps, Mbps, Gbps or B/s, KB/s, MB/s, GB/s)")
    bps = value * scale
    if not bps > 0 or not math.isfinite(bps):
        raise ConfigError(f"{what} {text!r}: must be a positive rate")
    return bps


def parse_time(text: str | float, what: str = "time", allow_zero: bool = True) -> float:
    """Parse a duration such as ``"5ms"`` into seconds (>= 0, or > 0)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        value, unit = _split(text, what)
    scale = _TIME.get(unit.lower() if unit != "µs" else unit)
    if scale is None:
        raise ConfigError(f"{what} {text!r}: unknown unit {unit!r} (use s, ms, us, ns)")
    seconds = value * scale
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError(f"{what} {text!r}: must be {'>=' if allow_zero else '>'} 0")
    return seconds


def parse_size(text: str | int, what: str = "size") -> int:
    """Parse a byte count such as ``"64MB"`` or ``"1GiB"`` into bytes (>= 0)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        value, unit = _split(text, what)
    scale = _SIZE.get(unit.lower())
    if scale is None:
        raise ConfigError(f"{what} {text!r}: unknown unit {unit!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    n = value * scale
    if n < 0:
        raise ConfigError(f"{what} {text!r}: must be >= 0")
    return int(round(n))


def split_list(text: str) -> list[str]:
    """Split a comma list from a flag (``"1Gbps,100Mbps"``), dropping blanks."""
    return [part.strip() for part in str(text).split(",") if part.strip()]


def format_bandwidth(bps: float) -> str:
    """Inverse of :func:`parse_bandwidth` for display: ``1e8 -> "100Mbps"``."""
    for scale, unit in ((1e12, "Tbps"), (1e9, "Gbps"), (1e6, "Mbps"), (1e3, "Kbps")):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bps"


def format_time(seconds: float) -> str:
    """Human display of a duration."""
    if seconds >= 1:
        return f"{seconds:.3g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g}ms"
    return f"{seconds * 1e6:.3g}us"


def format_bytes(n: float) -> str:
    """Human display of a byte count (decimal)."""
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}B"
