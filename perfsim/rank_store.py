"""How perfsim's ranks meet: a rendezvous store bound on a port the kernel picks as it binds.

Every launcher of real torch.distributed processes in perfsim (``perfsim run``'s
:mod:`perfsim.runtime.launch`, ``perfsim calibrate``'s comm ranks, the tests' spawned
ranks) meets here. The usual recipe -- bind port 0, read the port, close the socket,
hand the number to the ranks, whose rank 0 binds it later -- leaves a window in which
another process can take the port; the ranks then meet a stranger ("Connection reset
by peer", then a timeout; seen in a fresh-clone CI run). Here the store is created on
port 0 (:func:`serve`: the kernel picks the port as the store binds it, so nothing can
take it in between) and the others learn the bound port afterwards:

* :func:`hosted`: the launcher itself serves the store for the ranks it starts (they
  join it as clients, :func:`init_group`); as torchrun's agent does, whose
  ``--standalone`` rendezvous binds ``localhost:0`` and shares its store with the
  workers;
* :func:`handoff`: rank 0 serves it and hands the port to the others through a
  multiprocessing queue -- for ranks the launcher cannot reach on 127.0.0.1 (each in
  its own network namespace, ``perfsim calibrate --emulate-bandwidth``).

Without a hosted store (under torchrun, or ``perfsim run --emulate-bandwidth``, whose
rank 0 binds the fixed port 29500 in a network namespace of its own that no other
process shares), :func:`init_group` uses torch's standard ``env://`` rendezvous.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass, field

#: set in a rank's environment when its launcher serves the store at ``MASTER_ADDR:MASTER_PORT``
HOSTED_ENV = "PERFSIM_RANK_STORE"
HOSTED_VALUE = "hosted"
_joined: list[str] = []  # the backends of the groups this process joined (init_group)


def joined() -> bool:
    """Whether this process joined a process group through :func:`init_group`: a rank,
    which should leave with :func:`perfsim.procs.exit_rank` once it is done."""
    return bool(_joined)


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def serve(addr: str, world: int, timeout_s: float):
    """A TCPStore server on ``addr`` at a port the kernel picks as it binds (port 0);
    its ``port`` is the one to hand to the ranks."""
    import torch.distributed as dist  # lazy: loads torch; the launcher imports this module without it

    return dist.TCPStore(addr, 0, world, True, timeout=_timeout(timeout_s), wait_for_workers=False)


def join(addr: str, port: int, world: int, timeout_s: float):
    """A client of the store served at ``addr:port`` (waits up to ``timeout_s`` for it)."""
    import torch.distributed as dist  # lazy: loads torch; the launcher imports this module without it

    return dist.TCPStore(addr, int(port), world, False, timeout=_timeout(timeout_s))


@dataclass
class Host:
    """A store served by a launcher: where its ranks find it."""

    addr: str
    port: int
    store: object = field(repr=False)

    def env(self) -> dict[str, str]:
        """What a rank's environment needs to join it (:func:`init_group`)."""
        return {"MASTER_ADDR": self.addr, "MASTER_PORT": str(self.port), HOSTED_ENV: HOSTED_VALUE}


@contextlib.contextmanager
def hosted(world: int, timeout_s: float, addr: str = "127.0.0.1"):
    """Serve the ranks' store from this process while the body starts and watches them;
    yields a :class:`Host`. The store stops at exit: leave the body only once its ranks
    have stopped."""
    host = Host(addr, 0, serve(addr, world, timeout_s))
    host.port = host.store.port
    try:
        yield host
    finally:
        host.store = None  # the last reference: the server stops and its thread is joined here


def handoff(rank: int, world: int, timeout_s: float, addr: str, ports):
    """The store of ranks that meet without their launcher: rank 0 serves it (:func:`serve`)
    and puts its port on the multiprocessing queue ``ports`` once per other rank, which
    take it from there (waiting up to ``timeout_s``) and join."""
    if rank == 0:
        store = serve(addr, world, timeout_s)
        for _ in range(world - 1):
            ports.put(store.port)
        return store
    return join(addr, ports.get(timeout=timeout_s), world, timeout_s)


def init_group(backend: str, rank: int, world: int, timeout_s: float, store=None) -> None:
    """``dist.init_process_group`` over ``store``; without one, over the store the launcher
    serves (:func:`hosted`: ``MASTER_ADDR:MASTER_PORT`` with ``PERFSIM_RANK_STORE=hosted``
    in the environment), else torch's ``env://`` rendezvous (torchrun, a private namespace)."""
    import torch.distributed as dist  # lazy: loads torch; the launcher imports this module without it

    if store is None and os.environ.get(HOSTED_ENV) == HOSTED_VALUE:
        store = join(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, timeout_s)
    if store is None:
        # torch's env:// store (torchrun's agent store) outlives the group, and torch restarts
        # its group names when the default group is destroyed: a second group over it would
        # read the first one's gloo addresses under the same keys (a second perfsim.runtime.run
        # in one torchrun script: "Connection reset by peer", or a hang). Each group this
        # process joins meets under a prefix of its own (every rank joins as many, in order).
        store, rank, world = next(dist.rendezvous("env://", rank, world, timeout=_timeout(timeout_s)))
        store = dist.PrefixStore(f"perfsim-group{len(_joined)}", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=_timeout(timeout_s))
    _joined.append(backend)
