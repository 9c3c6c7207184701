"""The SimPy discrete-event engine behind ``perfsim predict``.

Read in this order: :mod:`.plan` (what each stage computes and sends, asked
from the compressors and the profile), :mod:`.flows` (max-min fair sharing of
NICs), :mod:`.sim` (devices replaying the schedule tables, p2p and
data-parallel collectives), :mod:`.report` (the Result tables).
"""

from __future__ import annotations

from perfsim.engine.plan import Plan, build_plan
from perfsim.network import Network


def replica_classes(network: Network, pp: int, dp: int) -> list[list[int]]:
    """Group replicas whose pipelines see identical links (rate and latency of
    every hop, both directions, and the NIC rates of their nodes); one
    representative per group is simulated. Without a topology, or with a
    uniform one, there is one group. When replicas share nodes (their NICs
    would be shared) on a non-uniform topology, every replica is its own group."""
    topo = network.topology
    if dp == 1 or topo is None or topo.is_uniform():
        return [list(range(dp))]
    gpn = network.system.gpus_per_node
    if gpn > 1 and pp % gpn:
        return [[r] for r in range(dp)]
    groups: dict[tuple, list[int]] = {}
    for r in range(dp):
        key = []
        for s in range(pp - 1):
            a, b = r * pp + s, r * pp + s + 1
            fw, bw = network.path(a, b), network.path(b, a)
            key.append((fw.bandwidth_bps, fw.latency_s, bw.bandwidth_bps, bw.latency_s,
                        len(fw.resources)))
        if topo.nic_bps is not None:
            key.append(tuple(topo.nic_bps[network.node(r * pp + s)] for s in range(pp)))
        groups.setdefault(tuple(key), []).append(r)
    return list(groups.values())


def simulate(workload, strategy, system, profile, *, trace: bool = False, symmetric: bool | None = None):
    """Simulate one steady-state iteration (and the warm-up one when the pipeline
    compressor has a different first-epoch wire size, or a 1-bit optimizer syncs
    uncompressed for its first steps); return a Result.

    ``symmetric``: None groups replicas into classes (:func:`replica_classes`);
    False simulates every replica (the reference for tests); True forces one."""
    from perfsim.engine.report import build_result
    from perfsim.engine.sim import Simulation

    plan = build_plan(workload, strategy, profile)
    network = Network(system, strategy.pp * strategy.dp, profile)
    dp = strategy.dp
    if symmetric is None:
        classes = replica_classes(network, strategy.pp, dp)
    else:
        classes = [list(range(dp))] if symmetric else [[r] for r in range(dp)]
    reps = [c[0] for c in classes]
    weights = {c[0]: len(c) for c in classes}
    out = Simulation(plan, network, strategy.schedule, replicas=reps, trace=trace, profile=profile).run()
    warm = None
    if plan.has_warmup or plan.onebit_warmup_steps:
        warm = Simulation(plan, network, strategy.schedule, warmup=True, replicas=reps, profile=profile).run()
    return build_result(out, warm, plan, workload, strategy, system, weights=weights, network=network)


__all__ = ["Plan", "build_plan", "replica_classes", "simulate"]
