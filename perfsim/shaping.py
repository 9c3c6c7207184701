"""Linux ``tc tbf`` token-bucket shaping: the facts the emulated links and the link model share.

Execute mode emulates a slow link with a token-bucket filter (tc-tbf(8)) on every rank's
interface (:mod:`perfsim.netem`); the transport model (:mod:`perfsim.link`) prices a
calibrated link with that same bucket. Both read it here, so the link model never
imports the emulation (issue 38):

* :func:`tbf_burst_bytes` -- the bucket depth perfsim configures for a rate;
* :data:`MIN_RATE_BPS` .. :data:`MAX_RATE_BPS` and :func:`check_rate` -- the rates tc
  represents exactly with that bucket and a 200 ms queue (tbf keeps its bucket as a
  32-bit time in scheduler ticks and its queue limit in 32-bit bytes;
  docs/validation.md, "Measurement notes").
"""

from __future__ import annotations

from perfsim.errors import ConfigError
from perfsim.units import format_bandwidth

#: the range of rates tc's tbf shapes exactly with perfsim's bucket and queue
MIN_RATE_BPS = 10e3
MAX_RATE_BPS = 100e9


def tbf_burst_bytes(bandwidth_bps: float) -> int:
    """Token-bucket depth (frame bytes) of the tbf shaping an emulated link: at
    least rate/HZ (4 ms of traffic at HZ=250, or tbf cannot reach the rate) and
    16 full 1514-byte frames."""
    return max(16 * 1514, int(bandwidth_bps / 8 / 250))


def check_rate(bandwidth_bps: float, flag: str = "--emulate-bandwidth") -> None:
    """Refuse a rate tc's tbf cannot represent (module docstring), up front."""
    if not MIN_RATE_BPS <= bandwidth_bps <= MAX_RATE_BPS:
        raise ConfigError(f"{flag} {format_bandwidth(bandwidth_bps)}: tc shapes "
                          f"{format_bandwidth(MIN_RATE_BPS)} to {format_bandwidth(MAX_RATE_BPS)}")
