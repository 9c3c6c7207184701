"""Unit parsing at the edge. Inside perfsim everything is SI: bits per second,
seconds, bytes. Strings such as ``"100Mbps"``, ``"5ms"`` or ``"64MB"`` are parsed
once, here, and never again.

The convention (docs/usage.md, "Units"):
  * ``b`` is a bit, ``B`` a byte -- the case of the ``b`` decides, always.
  * Prefixes are decimal SI (k = 1e3, M = 1e6, G = 1e9, T = 1e12), written in
    either case (``100mb/s`` = ``100Mb/s``; there is no milli-bit). Sizes also
    take the binary ``KiB``, ``MiB``, ``GiB``, ``TiB``.
  * A rate ends in ``ps`` or ``/s``, both accepted: ``100Mbps`` = ``100Mb/s`` =
    ``100Mbit/s`` = 1e8 bit/s; ``100MBps`` = ``100MB/s`` = 8e8 bit/s.
  * Bandwidths, latencies and sizes written as text need a unit (a bare ``"200"`` is
    refused with a suggestion; only ``"0"`` is accepted for a latency or a size). Plain
    numbers from Python are SI (bit/s, seconds, bytes).
  * time: ``s``, ``ms``, ``us``/``µs``, ``ns``, ``min``. size: ``B``, ``KB``, ``MB``,
    ``GB``, ``TB`` and the binary forms.
"""

from __future__ import annotations

import math
import re

from perfsim.errors import ConfigError

_NUM = r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
#: ``<prefix><b|bit|B|Byte><ps|/s>``; the group ``unit`` keeps its case (b vs B)
_RATE = re.compile(r"(?P<prefix>[kKmMgGtT]?)(?P<unit>bit|b|Byte|B)(?P<per>ps|/s)?")
_TIME = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}
_SIZE = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


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


def _number(text) -> bool:
    return isinstance(text, (int, float)) and not isinstance(text, bool)


def parse_bandwidth(text: str | float, what: str = "bandwidth") -> float:
    """Parse a link rate such as ``"100Mbps"`` (bits) or ``"12.5MB/s"`` (bytes)
    into bits/second (> 0). Text needs a unit; a Python number is bit/s."""
    if _number(text):
        value, unit = float(text), None
    else:
        value, unit = _split(text, what)
    if unit == "" and not value > 0:  # no unit makes 0 a rate: no hint to give
        raise ConfigError(f"{what} {text!r}: must be a positive rate")
    if unit == "":
        raise ConfigError(f"{what} {text!r}: needs a unit, e.g. {value:g}Mbps "
                          "(b = bit, B = byte; bps or b/s)")
    scale = 1.0
    if unit is not None:
        m = _RATE.fullmatch(unit)
        if m is None or (m.group("per") is None and m.group("unit") != "bit"):
            raise ConfigError(f"{what} {text!r}: unknown unit {unit!r} "
                              "(use e.g. 100Mbps, 100Mb/s, 100Mbit/s for bits; 12.5MBps, 12.5MB/s for bytes)")
        scale = _PREFIX[m.group("prefix").lower()] * (8.0 if m.group("unit") in ("B", "Byte") else 1.0)
    bps = value * scale
    if not bps > 0 or not math.isfinite(bps):
        raise ConfigError(f"{what} {text!r}: must be a positive rate")
    return bps


def parse_time(text: str | float, what: str = "time", allow_zero: bool = True,
               hint_unit: str | None = None) -> float:
    """Parse a duration such as ``"5ms"`` into seconds (>= 0, or > 0). Text
    needs a unit (``"0"`` excepted); a Python number is seconds. The error for a
    bare number suggests it in ``hint_unit``; by default ``s`` for a timeout (``what``
    names one: ``--hang-timeout 30`` means 30 s, never 30 ms) and ``ms`` for the
    rest (latencies)."""
    if _number(text):
        value, unit = float(text), "s"
        if not math.isfinite(value):
            raise ConfigError(f"{what} {text!r}: not finite")
    else:
        value, unit = _split(text, what)
    if unit == "":
        if value != 0:
            hint = hint_unit or ("s" if "timeout" in what.lower() else "ms")
            raise ConfigError(f"{what} {text!r}: needs a unit, e.g. {value:g}{hint} (s, ms, us, ns)")
        unit = "s"
    scale = _TIME.get(unit if unit in ("µs", "ms", "s", "us", "ns", "min", "sec") else unit.lower())
    if scale is None:
        raise ConfigError(f"{what} {text!r}: unknown unit {unit!r} (use s, ms, us, ns)")
    seconds = value * scale
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError(f"{what} {text!r}: must be {'>=' if allow_zero else '>'} 0")
    return seconds


def parse_size(text: str | int, what: str = "size", minimum: int = 0) -> int:
    """Parse a byte count such as ``"64MB"`` or ``"1GiB"`` into bytes (>= ``minimum``, whole
    bytes). Text needs a unit (``"0"`` excepted: ``--bucket-size 25`` is not 25 bytes); a
    Python number is bytes."""
    if _number(text):
        value, unit = float(text), "B"
        if not math.isfinite(value):
            raise ConfigError(f"{what} {text!r}: not finite")
    else:
        value, unit = _split(text, what)
    if unit == "" and value != 0:
        raise ConfigError(f"{what} {text!r}: needs a unit, e.g. {value:g}MiB (B, KB, MB, GB, KiB, MiB, GiB)")
    if unit.endswith("b") or unit.endswith("bit"):
        stem = unit[:-3] if unit.endswith("bit") else unit[:-1]
        raise ConfigError(f"{what} {text!r}: {unit!r} is bits; a size is in bytes (B), "
                          f"e.g. {value:g}{stem[:1].upper() + stem[1:]}B")
    scale = _SIZE.get(unit.upper())
    if scale is None:
        raise ConfigError(f"{what} {text!r}: unknown unit {unit!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    n = int(round(value * scale)) if value * scale >= 0 else value * scale
    if n < minimum:
        raise ConfigError(f"{what} {text!r}: must be >= {minimum}")
    return n


#: the base unit of a kind of value (what a bare number used to mean) and a common larger one
EXAMPLE_UNITS = {"bandwidth": ("bps", "Mbps"), "time": ("s", "ms"), "size": ("B", "MiB"), "window": ("B", "MiB")}


def refuse_bare_number(value, what: str, kind: str, flag: str | None = None) -> None:
    """A file (a sweep file, a topology) mirrors the flags: a rate, time or size written as a
    non-zero number, without its unit, is refused (``bandwidth = 100`` is not 100 bit/s,
    ``latency = 5`` not 5 s); zero is unambiguous. ConfigError naming ``what`` = the value and
    two ways to write it (``flag``: the flag that takes it)."""
    if _number(value) and value != 0:
        base, other = EXAMPLE_UNITS[kind]
        raise ConfigError(f"{what} = {value!r} has no unit; write it as text with one: \"{value:g}{base}\" "
                          f"keeps its value, a unit such as {other} scales it" + (f" (as its flag {flag})" if flag else ""))


def split_list(text: str, what: str = "list") -> list[str]:
    """Split a comma list from a flag (``"1Gbps,100Mbps"``); blank text is no item.
    An empty element (``"10Gbps,,1Gbps"``, a trailing comma) is refused, naming it:
    dropping it would run a grid the user did not write."""
    if not str(text).strip():
        return []
    parts = [part.strip() for part in str(text).split(",")]
    for i, part in enumerate(parts):
        if not part:
            raise ConfigError(f"{what} {str(text)!r}: element {i + 1} of {len(parts)} is empty "
                              "(two commas in a row, or one at an end)")
    return parts


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
