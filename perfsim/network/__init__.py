"""The network, behind one narrow interface (as ASTRA-sim's network API).

Read in this order:

* :mod:`.topology` -- the :class:`Topology` value (per node pair, a rate and a latency;
  regions for geo-distributed systems) and its files (``--topology``: TOML, JSON, CSV);
* :mod:`.collectives` -- collective pricing: where a group's members live, which link
  carries them, measured costs where the profile has them (algorithms:
  :mod:`perfsim.collectives`);
* :mod:`.analytic` -- the analytical :class:`Network`: full-duplex NICs (separate send
  and receive capacity per node), each pair of nodes a link of its own rate and
  latency (:class:`perfsim.link.Link`), devices of one node on a faster intra-node
  fabric; per device pair a :class:`Path_` (rate, latency, shared resources);
* :mod:`.backend` -- the :class:`NetworkBackend` protocol the engine's event loop talks
  to (send a message, post a receive, price and run a collective, per-link rates and
  capacities) and :func:`use_backend`, which plugs another backend in;
* :mod:`.flows` -- the one backend shipped, :class:`~perfsim.network.flows.FlowBackend`:
  max-min fair flows on the shared NICs, token-bucket egress, rendezvous (imported by
  the engine; it needs SimPy, so this package does not import it).

The layering inside the package (pyproject.toml, import-linter): ``flows`` over
``backend`` over ``analytic`` over ``collectives``, ``topology``.
"""

from __future__ import annotations

from perfsim.network.analytic import Network, Path_
from perfsim.network.backend import MessageHandler, NetworkBackend, current_backend, use_backend
from perfsim.network.collectives import collective_cost, collective_time, lockstep_link
from perfsim.network.topology import (Topology, load_topology, topology_from_csv, topology_from_dict,
                                      topology_from_rows)

__all__ = ["MessageHandler", "Network", "NetworkBackend", "Path_", "Topology", "collective_cost", "collective_time",
           "current_backend", "load_topology", "lockstep_link", "topology_from_csv", "topology_from_dict",
           "topology_from_rows", "use_backend"]
