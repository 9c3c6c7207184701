"""The protocol between the engine and a network backend, and how a backend is chosen.

As in ASTRA-sim's network API (the system layer schedules, the backend moves bytes:
``sim_send`` / ``sim_recv`` with a completion handler, on the backend's clock), the
engine (:mod:`perfsim.engine.sim`) keeps the schedule -- which device sends what,
when -- and asks a :class:`NetworkBackend` only to move it: a point-to-point message
(:meth:`~NetworkBackend.send`, the receiver's :meth:`~NetworkBackend.post_receive`),
a collective (:meth:`~NetworkBackend.collective` prices it, :meth:`~NetworkBackend.
run_collective` runs it), and the per-link rates and shared capacities it moves them
over (:meth:`~NetworkBackend.path`, :meth:`~NetworkBackend.capacity`). Unlike
ASTRA-sim, whose system layer splits a collective into messages, a collective is
handed over whole (its phases planned by :mod:`perfsim.collectives`), so a backend
may run it as fluid phases or split it into packets itself.

perfsim's one backend is :class:`perfsim.network.flows.FlowBackend` (max-min fair
flows, token-bucket egress, rendezvous). Another (packet-level, or an external
simulator) plugs in with :func:`use_backend`::

    with use_backend(MyBackend):        # MyBackend(env, network) -> NetworkBackend
        result = perfsim.predict(...)

The closed-form replay (:mod:`perfsim.engine.replay`) computes the flow backend's
timeline without running it; the engine uses it only for a backend whose
``replayable`` is true.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Callable, Generator, Hashable, Iterator, Protocol, Sequence

from perfsim.errors import ConfigError

if TYPE_CHECKING:
    import simpy

    from perfsim.collectives import Collective
    from perfsim.network.analytic import Network, Path_


class MessageHandler(Protocol):
    """Who a backend tells about a message's progress (the engine:
    :class:`perfsim.engine.messages.PipelineMessages`), with the ``msg`` it was handed in
    :meth:`NetworkBackend.send`; times on the SimPy clock."""

    def message_started(self, msg: Any) -> None:
        """Its bytes start moving."""

    def message_sent(self, msg: Any, start: float, end: float) -> None:
        """Its last byte left at ``end`` (its bytes moved from ``start``)."""

    def message_delivered(self, msg: Any, start: float) -> None:
        """It arrived (now); its bytes started moving at ``start``."""


class NetworkBackend(Protocol):
    """What the engine's event loop asks of the network (module docstring). Devices are
    GPU indices; sizes in bytes, rates in bits/s, times in the SimPy clock's seconds."""

    #: the analytical description the backend was built on (topology, links, prices)
    network: Network
    #: True only when :mod:`perfsim.engine.replay` computes this backend's timeline exactly
    replayable: bool

    def path(self, src: int, dst: int) -> Path_:
        """Rate, latency and shared resources of the link ``src -> dst``."""

    def capacity(self, resource: Any) -> float:
        """Rate (bits/s) of a shared resource named by a :class:`Path_`."""

    def collective(self, kind: str, nbytes: float, members: Sequence[int], call: str | None = None) -> Collective:
        """The plan of a collective ``kind`` of per-rank buffer ``nbytes`` on ``members``
        (algorithm, phases, bytes each rank puts on the wire). ``call``: the torch.distributed
        call that issues it, every rank in step, where the engine knows it (a backend may price
        it as the profile measured that call; the engine passes it only when it is set)."""

    def post_receive(self, key: Hashable, dst: int, src: int) -> None:
        """Device ``dst`` posts its receive of message ``key`` from ``src`` now."""

    def send(self, src: int, dst: int, nbytes: float, key: Hashable, lanes: int, handler: MessageHandler,
             msg: Any) -> None:
        """Move message ``key`` (``nbytes`` per lane, ``lanes`` tensor-parallel lanes side
        by side) from ``src`` to ``dst``, in order behind earlier messages on that pair,
        telling ``handler`` about ``msg`` (the engine's own record of it, passed back
        untouched -- ASTRA-sim's ``msg_handler`` and ``fun_arg``) as it goes."""

    def run_collective(self, coll: Collective, members: Sequence[int], simulated: set[int],
                       lanes: int = 1) -> Generator[simpy.Event, Any, list[tuple[int, int]]]:
        """SimPy process body running ``coll`` on ``members`` (``simulated``: the ones
        this simulation runs; ``lanes`` groups side by side); returns the links (src,
        dst) the simulated members sent on, for the engine's per-link accounting."""


#: builds a backend for one simulation: ``factory(env, network)``
BackendFactory = Callable[["simpy.Environment", "Network"], NetworkBackend]

_current: ContextVar[BackendFactory | None] = ContextVar("perfsim_network_backend", default=None)


def current_backend() -> BackendFactory | None:
    """The factory :func:`use_backend` installed here, None for the flow backend."""
    return _current.get()


@contextlib.contextmanager
def use_backend(factory: BackendFactory) -> Iterator[BackendFactory]:
    """Simulate with backends built by ``factory(env, network)`` inside the block
    (this thread or task only; nested blocks restore the outer choice)."""
    if not callable(factory):
        raise ConfigError(f"network backend {factory!r}: must be callable as factory(env, network)")
    token = _current.set(factory)
    try:
        yield factory
    finally:
        _current.reset(token)
