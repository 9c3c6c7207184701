"""Progress of a long command (``calibrate``, ``validate``, ``plan``) on stderr.

On a terminal a tqdm bar whose description says what is being measured; in a
log or CI (stderr not a TTY) no bar -- tqdm would write a carriage-return
update per point into the file -- but one plain line per stage with the time
the previous stage took, and with ``every`` seconds a plain line at most that
often while points advance (:data:`EVERY_ENV` overrides the interval).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from perfsim.errors import ConfigError

#: environment variable: seconds between two progress lines in a log (default: the command's)
EVERY_ENV = "PERFSIM_PROGRESS_EVERY"


def every_s(default: float) -> float:
    """The interval of progress lines in a log: :data:`EVERY_ENV` if set, else ``default``."""
    raw = os.environ.get(EVERY_ENV)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"{EVERY_ENV}={raw!r}: seconds >= 0")
    return value


class Progress:
    """``total`` points in ``unit``s; ``enabled=False`` (``--no-progress``) prints
    neither bar nor stage lines, only :meth:`note` messages."""

    def __init__(self, total: int, unit: str = "pt", *, enabled: bool = True, prefix: str = "",
                 stream: TextIO | None = None, every: float | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.prefix = prefix
        self.total = total
        self.done = 0
        self.bar = None
        self.unit = unit
        self.every = every
        self._t0 = self._last = time.perf_counter()
        self._stage: tuple[str, float, int] | None = None  # (name, start, points done at start)
        isatty = getattr(self.stream, "isatty", None)
        if enabled and isatty is not None and isatty():
            from tqdm import tqdm  # lazy: tqdm is heavy, needed only here

            self.bar = tqdm(total=total, unit=unit, dynamic_ncols=True, leave=True, file=self.stream)

    def stage(self, name: str) -> None:
        """A new stage begins: without a bar, one line for the stage that ended and
        one for this one."""
        self._end_stage()
        self._stage = (name, time.perf_counter(), self.done)
        if self.bar is None and self.enabled:
            self._line(f"{name} ...")

    def __call__(self, what: str) -> None:
        """One point done (``what``: the point, shown in the bar's description)."""
        self.advance(1, what)

    def advance(self, n: int, what: str | None = None) -> None:
        self.done += n
        if self.bar is not None:
            if what:
                self.bar.set_description_str(what[:60])
            self.bar.update(n)
        elif self.enabled and self.every is not None:
            now = time.perf_counter()
            if now - self._last >= self.every:
                self._last = now
                share = f" ({self.done / self.total:.0%})" if self.total else ""
                self._line(f"{self.done}/{self.total} {self.unit}{share}, {now - self._t0:.0f} s"
                           + (f": {what}" if what else ""))

    def set_total(self, total: int) -> None:
        """The number of points, once known."""
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            self._line(text, prefixed=False)

    def close(self) -> None:
        self._end_stage()
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _end_stage(self) -> None:
        if self._stage is not None and self.bar is None and self.enabled:
            name, t0, done0 = self._stage
            self._line(f"{name}: {self.done - done0} {'point' if self.done - done0 == 1 else 'points'} "
                       f"in {time.perf_counter() - t0:.1f} s ({self.done}/{self.total})")
        self._stage = None

    def _line(self, text: str, prefixed: bool = True) -> None:
        print(f"{self.prefix}{text}" if prefixed else text, file=self.stream, flush=True)
