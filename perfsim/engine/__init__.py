"""The SimPy discrete-event engine behind ``perfsim predict``.

Read in this order: :mod:`.plan` (what each stage computes and sends, asked
from the compressors and the profile), :mod:`.flows` (max-min fair sharing of
NICs), :mod:`.sim` (devices replaying the schedule tables, p2p and
data-parallel collectives), :mod:`.report` (the Result tables).
"""

from __future__ import annotations

from perfsim.engine.plan import Plan, build_plan
from perfsim.network import Network


def replicas_symmetric(network: Network, pp: int, dp: int) -> bool:
    """True when every replica sees the same links (so one can stand for all):
    no topology, a uniform topology, or per-replica identical pipeline paths and
    identical data-parallel ring links per stage."""
    topo = network.topology
    if dp == 1 or topo is None or topo.is_uniform():
        return True
    key = lambda p: (p.bandwidth_bps, p.latency_s, len(p.resources))  # noqa: E731
    for s in range(pp - 1):
        if len({key(network.path(r * pp + s, r * pp + s + 1)) for r in range(dp)}) > 1:
            return False
        if len({key(network.path(r * pp + s + 1, r * pp + s)) for r in range(dp)}) > 1:
            return False
    for s in range(pp):
        if len({key(p) for p in network.ring_paths([r * pp + s for r in range(dp)])}) > 1:
            return False
    if topo.nic_bps is not None and len(set(topo.nic_bps)) > 1:
        return False
    return True


def simulate(workload, strategy, system, profile, *, trace: bool = False, symmetric: bool | None = None):
    """Simulate one steady-state iteration (and the warm-up one when the pipeline
    compressor has a different first-epoch wire size); return a Result."""
    from perfsim.engine.report import build_result
    from perfsim.engine.sim import Simulation

    plan = build_plan(workload, strategy, profile)
    network = Network(system, strategy.pp * strategy.dp)
    if symmetric is None:
        symmetric = replicas_symmetric(network, strategy.pp, strategy.dp)
    out = Simulation(plan, network, strategy.schedule, symmetric=symmetric, trace=trace).run()
    warm = None
    if plan.has_warmup:
        warm = Simulation(plan, network, strategy.schedule, warmup=True, symmetric=symmetric).run()
    return build_result(out, warm, plan, workload, strategy, system)


__all__ = ["Plan", "build_plan", "replicas_symmetric", "simulate"]
