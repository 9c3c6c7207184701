"""What one simulated iteration returns, from either engine.

The event loop (:mod:`perfsim.engine.sim`) and the closed-form replay
(:mod:`perfsim.engine.replay`) fill the same :class:`SimOutput` -- per device of each
simulated replica its :class:`DeviceStats`, per micro-batch its columns, per link its
bytes and busy time -- which :mod:`perfsim.engine.report` turns into a ``Result``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DeviceStats:
    """What one pipeline device of one replica did in the iteration (seconds, bytes)."""

    #: forward and backward compute, without tensor-parallel collectives
    compute_s: float = 0.0
    #: encode and decode of pipeline messages (and their host framing)
    codec_s: float = 0.0
    optimizer_s: float = 0.0
    #: from a bucket's readiness to the end of its collectives, summed over buckets
    dp_sync_s: float = 0.0
    #: pipeline bytes sent (data-parallel bytes: SimOutput.dp_bytes_per_rank)
    bytes_sent: float = 0.0
    #: from the start of each message sent to its delivery, summed
    comm_s: float = 0.0
    tp_comm_s: float = 0.0
    #: when the device finished its schedule row, and its optimizer step
    last_backward_end: float = 0.0
    end: float = 0.0
    #: compute stretched by overlapping communication
    interference_s: float = 0.0


@dataclass
class SimOutput:
    iteration_s: float
    pipeline_s: float
    devices: dict[tuple[int, int], DeviceStats]
    micro: dict[tuple[int, int, int], dict[str, float]]  # (replica, stage, mb) -> columns
    links: dict[tuple[int, int, str], list[float]]  # (src, dst, kind) -> [bytes, busy_s]
    replicas: list[int]
    dp_bytes_per_rank: dict[int, float]
    events: int
    trace: list[dict] = field(default_factory=list)
    collective_algos: tuple[str, ...] = ()
    engine: str = "event loop"  # or "replay" (perfsim.engine.replay)
