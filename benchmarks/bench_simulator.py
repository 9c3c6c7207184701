"""Simulator speed: wall time and simulated events per second.

    python benchmarks/bench_simulator.py [--quick]

Cases (issue 3, "Speed"): the default config; a 25-point sweep (5 bandwidths x
5 pipeline compressions); PP 8 x DP 128 (1024 devices) one iteration; PP 16 x
DP 512 (8192 devices); the same sizes with a heterogeneous topology (every
replica simulated, since replicas see different links); and a linearity check
(wall time per event as the number of micro-batches grows).
Events are SimPy events scheduled (``Environment._eid``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from perfsim.api import predict  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def hetero_topology(nodes: int, seed: int = 0) -> str:
    """A geo-distributed-style topology: nodes in 4 regions, 10 Gbps/1 ms inside a
    region, 100 Mbps - 1 Gbps / 20-80 ms across, plus a few random slow pairs."""
    rng = random.Random(seed)
    region = [i * 4 // nodes for i in range(nodes)]
    cross = {}
    for a in range(4):
        for b in range(a + 1, 4):
            cross[a, b] = cross[b, a] = (rng.choice([1e8, 3e8, 1e9]), rng.uniform(0.02, 0.08))
    bw = [[0.0] * nodes for _ in range(nodes)]
    lat = [[0.0] * nodes for _ in range(nodes)]
    for i in range(nodes):
        for j in range(nodes):
            if i != j:
                bw[i][j], lat[i][j] = (1e10, 1e-3) if region[i] == region[j] else cross[region[i], region[j]]
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"bandwidth_matrix": bw, "latency_matrix": lat}, f)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 8192-device heterogeneous case")
    args = ap.parse_args(argv)
    predict()  # warm imports and caches
    rows = []

    def report(name, results, wall):
        results = results if isinstance(results, list) else [results]
        events = sum(r.summary["events"] for r in results)
        rows.append((name, len(results), events, wall))
        print(f"{name:<44} configs={len(results):>3} events={events:>9,} wall={wall:7.3f}s "
              f"events/s={events / wall:>10,.0f}", flush=True)

    r, w = timed(lambda: predict())
    report("default (GPT2-1.5B, pp8, m32, 10Gbps)", r, w)
    grid = [dict(bandwidth=b, compress=c) for b in ("10Gbps", "1Gbps", "500Mbps", "300Mbps", "100Mbps")
            for c in ("fp32", "fp16", "directq:fw4bw8", "aqsgd:fw3bw6", "aqsgd:fw2bw4")]
    r, w = timed(lambda: [predict(**g) for g in grid])
    report("25-point sweep (5 bandwidths x 5 compressions)", r, w)
    r, w = timed(lambda: predict(pp=8, dp=128, bandwidth="1Gbps", grad_compress="qsgd-maxnorm:4"))
    report("PP 8 x DP 128 (1024 devices)", r, w)
    r, w = timed(lambda: predict(pp=16, dp=512, macro_batch=64, bandwidth="1Gbps",
                                 grad_compress="qsgd-maxnorm:4"))
    report("PP 16 x DP 512 (8192 devices)", r, w)
    topo = hetero_topology(1024)
    r, w = timed(lambda: predict(pp=8, dp=128, bandwidth="1Gbps", topology=topo, grad_compress="qsgd-maxnorm:4"))
    report("PP 8 x DP 128 heterogeneous topology", r, w)
    os.unlink(topo)
    if not args.quick:
        topo = hetero_topology(8192)
        r, w = timed(lambda: predict(pp=16, dp=512, macro_batch=64, topology=topo,
                                     grad_compress="qsgd-maxnorm:4"))
        report("PP 16 x DP 512 heterogeneous topology", r, w)
        os.unlink(topo)
    print("linearity (default model, 100Mbps, aqsgd:fw3bw6):")
    for m in (32, 64, 128, 256):
        r, w = timed(lambda: predict(macro_batch=m, bandwidth="100Mbps", compress="aqsgd:fw3bw6"))
        ev = r.summary["events"]
        print(f"  m={m:<4} events={ev:>8,} wall={w:.3f}s  us/event={w / ev * 1e6:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
