"""Pipeline schedules as data.

A schedule is a pure function ``(num_stages, num_microbatches) -> list of
per-stage action lists``. Stage ``s`` executes ``table[s]`` in order. An
:class:`Action` prints as ``0F3`` (stage 0, forward, micro-batch 3), as in
torchtitan's schedule tables. The simulator (``perfsim.engine``) and the real
runtime (``perfsim.runtime``) both consume these tables: neither re-derives an
order of its own.

Communication is implied, not listed: a forward on stage ``s > 0`` first
receives micro-batch ``mb``'s activation from stage ``s-1``; a forward on stage
``s < p-1`` then sends it to ``s+1``. Backward mirrors this with gradients
flowing from ``s+1`` to ``s``.

References: GPipe (Huang et al., 2019) runs all forwards then all backwards;
1F1B (PipeDream-Flush, Narayanan et al., 2021) runs ``p - s - 1`` warm-up
forwards, then alternates one forward and one backward, then drains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from perfsim.errors import ConfigError

FORWARD = "F"
BACKWARD = "B"


@dataclass(frozen=True, order=True)
class Action:
    """One compute step of one stage on one micro-batch."""

    stage: int
    kind: str  # FORWARD or BACKWARD
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Inverse of ``str``: ``"0F3" -> Action(0, "F", 3)``."""
        for kind in (FORWARD, BACKWARD):
            if kind in text:
                stage, mb = text.split(kind)
                return cls(int(stage), kind, int(mb))
        raise ConfigError(f"action {text!r}: expected <stage>F<mb> or <stage>B<mb>")


Schedule = list[list[Action]]


def _check(num_stages: int, num_microbatches: int) -> None:
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ConfigError(f"num_stages={num_stages!r}: must be an integer >= 1")
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ConfigError(f"num_microbatches={num_microbatches!r}: must be an integer >= 1")


def gpipe(num_stages: int, num_microbatches: int) -> Schedule:
    """GPipe: every stage runs F0..F(m-1), then B0..B(m-1)."""
    _check(num_stages, num_microbatches)
    m = num_microbatches
    return [
        [Action(s, FORWARD, i) for i in range(m)] + [Action(s, BACKWARD, i) for i in range(m)]
        for s in range(num_stages)
    ]


def one_f_one_b(num_stages: int, num_microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush): ``min(p-s-1, m)`` warm-up forwards, then
    alternate F and B, then the remaining backwards. Stage ``s`` never holds more
    than ``min(p - s, m)`` un-backpropagated micro-batches."""
    _check(num_stages, num_microbatches)
    p, m = num_stages, num_microbatches
    table: Schedule = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions = [Action(s, FORWARD, i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:
            actions.append(Action(s, FORWARD, f))
            f += 1
            actions.append(Action(s, BACKWARD, b))
            b += 1
        actions.extend(Action(s, BACKWARD, i) for i in range(b, m))
        table.append(actions)
    return table


SCHEDULES: dict[str, Callable[[int, int], Schedule]] = {"gpipe": gpipe, "1f1b": one_f_one_b}


def get_schedule(name: str) -> Callable[[int, int], Schedule]:
    """Look a schedule up by name (``gpipe`` or ``1f1b``)."""
    try:
        return SCHEDULES[name.lower()]
    except KeyError:
        raise ConfigError(f"schedule {name!r}: unknown (choose from {', '.join(SCHEDULES)})") from None


def max_in_flight(actions: list[Action]) -> int:
    """Peak number of micro-batches forwarded but not yet backpropagated on one stage
    (activation-memory proxy)."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == FORWARD else -1
        peak = max(peak, live)
    return peak


def format_table(table: Schedule) -> str:
    """One line per stage, e.g. ``stage 0: 0F0 0F1 0B0 0B1``."""
    return "\n".join(f"stage {s}: " + " ".join(map(str, row)) for s, row in enumerate(table))
