"""The premise of the closed-form replay (:mod:`perfsim.engine.replay`): no flows compete.

A replayed timeline records its flows per NIC (:class:`_Flows`; the consecutive flows of
one stream that touch merged into one interval, :func:`_chains`), and :func:`uncontended`
checks on them that max-min fair sharing -- the event loop's flow model,
:mod:`perfsim.network.flows` -- gave every flow its own rate: no NIC ever carries flows
whose rates add up to more than its capacity (:data:`CAPACITY_MARGIN`), and rates
max-min would treat as equal are not told apart (:data:`RATE_GAP`). With many flows a
sample of the resources is checked first (:data:`SAMPLE_EVERY`). When the check fails
the iteration goes to the event loop, the reference, so the answer stays exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfsim.network import Network

if TYPE_CHECKING:
    import numpy as np

#: flows sharing a NIC must leave this relative margin below its capacity (the
#: check adds rates in floating point; max-min itself needs any margin > 1e-12)
CAPACITY_MARGIN = 1e-6
#: distinct rates must differ by more than this (max-min treats rates within
#: 1e-12 of each other as equal)
RATE_GAP = 1e-10


class _Flows:
    """The flows of a replayed timeline, per NIC, for :func:`uncontended`. A *stream*
    (a connection, or a stage's data-parallel stream) runs its flows one after
    another: consecutive flows that touch (one ends when the next starts) are one
    interval, as the event loop retires a flow before its stream starts the next."""

    def __init__(self, network: Network):
        self.net = network
        self._cap8: dict = {}
        self._least: dict = {}
        self.res, self.start, self.end, self.rate = [], [], [], []  # numpy chunks
        self.rates: set[float] = set()

    def cap8(self, res) -> float:
        """A resource's capacity in bytes/s, as the flow scheduler computes it."""
        c = self._cap8.get(res)
        if c is None:
            c = self._cap8[res] = self.net.capacity(res) / 8.0
        return c

    def least(self, res: tuple) -> float:
        """The least capacity (bytes/s) of resources ``res`` (a stage's NICs: one per phase)."""
        c = self._least.get(res)
        if c is None:
            c = self._least[res] = min(self.cap8(x) for x in res)
        return c

    def add(self, res_ids: np.ndarray, start: np.ndarray, end: np.ndarray, rate: np.ndarray) -> None:
        """Flows ``i`` on resources ``res_ids[i]`` from ``start[i]`` to ``end[i]`` at ``rate[i]``."""
        self.res.append(res_ids)
        self.start.append(start)
        self.end.append(end)
        self.rate.append(rate)


def _chains(start: np.ndarray, end: np.ndarray, rate: np.ndarray):
    """Merge touching consecutive flows of a stream into intervals. Rows: flows in
    stream order; columns: independent streams. Returns (start, end, rate, column)
    per interval; an interval takes the largest rate of its flows."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    m = start.shape[0]
    head = np.ones(start.shape, bool)
    head[1:] = start[1:] != end[:-1]
    h = head.T.ravel()  # column by column: each column opens with a head
    first = np.flatnonzero(h)
    last = np.r_[first[1:] - 1, h.size - 1]
    return (start.T.ravel()[first], end.T.ravel()[last],
            np.maximum.reduceat(rate.T.ravel(), first), first // m)


#: :func:`uncontended` first checks every this many'th resource when there are more
#: flows than :data:`SAMPLE_ABOVE` (each resource's check is its own: contention found
#: on a few resources is contention, found for a tenth of the cost)
SAMPLE_EVERY = 16
SAMPLE_ABOVE = 1 << 16


def uncontended(flows: _Flows, res_cap: np.ndarray) -> bool:
    """True when all rates and capacities are equal or :data:`RATE_GAP` apart and no
    resource ever carries flows whose rates add up to more than its capacity (less
    :data:`CAPACITY_MARGIN`), except ``k`` flows of one rate ``f`` that fill it
    exactly (``capacity / k >= f`` in floating point, as max-min divides): then
    max-min gave every flow its own rate. The premise holds or fails per resource, so
    with many flows it is first checked on every :data:`SAMPLE_EVERY`'th resource
    alone: a contended timeline is told (False) at a fraction of the cost. (False only
    sends the iteration to the event loop, the reference, so the answer stays exact.)"""
    import numpy as np  # lazy: numpy is heavy, needed only here

    values = np.unique(np.concatenate([np.fromiter(flows.rates, float), res_cap]))
    if values.size > 1 and np.any(values[1:] <= values[:-1] * (1 + RATE_GAP)):
        return False
    if not flows.res:
        return True
    res = np.concatenate(flows.res)
    start, end, rate = (np.concatenate(x) for x in (flows.start, flows.end, flows.rate))
    if res.size > SAMPLE_ABOVE:
        few = res % SAMPLE_EVERY == 0
        if not _within(res[few], start[few], end[few], rate[few], res_cap):
            return False
    return _within(res, start, end, rate, res_cap)


def _within(res, start, end, rate, res_cap) -> bool:
    """:func:`uncontended`'s capacity check of flows ``i`` on ``res[i]`` from ``start[i]``
    to ``end[i]`` at ``rate[i]``."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    n = res.size
    # closed intervals: at one instant, starts come before ends (conservative)
    where = np.concatenate([res, res])
    kind = np.r_[np.zeros(n, np.int8), np.ones(n, np.int8)]
    idx = np.lexsort((kind, np.concatenate([start, end]), where))
    where, kind = where[idx], kind[idx]
    load = np.cumsum(np.concatenate([rate, -rate])[idx])
    active = np.cumsum(np.r_[np.ones(n, np.int64), -np.ones(n, np.int64)][idx])
    # running sums inside each resource: less what the resources before it left
    head = np.r_[True, where[1:] != where[:-1]]
    at = np.maximum.accumulate(np.where(head, np.arange(2 * n), 0))
    load -= np.r_[0.0, load][at]
    active -= np.r_[0, active][at]
    shared = (kind == 0) & (active >= 2)
    full = np.flatnonzero(shared & (load > res_cap[where] / (1 + CAPACITY_MARGIN)))
    if full.size == 0:
        return True
    # the flows active on a resource at an instant, exactly: by resource, then by start
    times = np.concatenate([start, end])[idx]
    order = np.lexsort((start, res))
    by_res, starts, ends, rates = res[order], start[order], end[order], rate[order]
    for i in full:
        r, t = where[i], times[i]
        lo, hi = np.searchsorted(by_res, r), np.searchsorted(by_res, r, "right")
        hi = lo + np.searchsorted(starts[lo:hi], t, "right")
        on = rates[lo:hi][ends[lo:hi] >= t]
        if on.min() != on.max() or res_cap[r] / on.size < on[0]:
            return False
    return True
