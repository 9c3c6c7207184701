"""The steady state of a token-bucket link (``perfsim.engine.steady_buckets``): the bucket an
iteration starts with is the one it leaves, ``T = f(T)``, found in fewer simulated runs than
bisection's 20, on synthetic ``f`` of the shapes the simulator gives and on real predictions."""

import pytest

import perfsim.engine as engine
from perfsim.api import build_configs, predict
from perfsim.engine import steady_buckets

DEPTH = 1e6
TOL = 1e-6


class _Net:
    """What steady_buckets reads of a run: its bucket depth and ``bucket_after``."""

    def __init__(self, f, start):
        self.burst, self.coll_burst, self.f, self.start = DEPTH, 0.0, f, start

    def bucket_after(self, period):
        return self.f(self.start)


class _Run:
    def __init__(self, f):
        self.f, self.trials = f, []

    def __call__(self, start):
        self.trials.append(dict(start))
        return type("Sim", (), {"net": _Net(self.f, start)})(), type("Out", (), {"iteration_s": 1.0})()


def _solve(f):
    full = {a: min(DEPTH, v) for a, v in f(dict.fromkeys(f.nodes, DEPTH)).items()}
    sim = type("Sim", (), {"net": type("N", (), {"burst": DEPTH, "coll_burst": 0.0,
                                                  "bucket_after": staticmethod(lambda p: full)})()})()
    run = _Run(f)
    return steady_buckets(sim, type("Out", (), {"iteration_s": 1.0})(), run, tol=TOL), run.trials


def _node_f(nodes, fn):
    def f(start):
        return {a: min(DEPTH, max(0.0, fn(a, start))) for a in nodes}

    f.nodes = nodes
    return f


# each f never falls as T grows and never grows faster than T (the property the solver relies on)
SHAPES = {
    # a bucket that never empties loses 243 kB a period until it does; below 4.7 kB it refills
    # 4.7 kB over the compute (the shape of a 10 MB --link-burst at 100 Mbps, qa7's job)
    "flat above, then steep": (lambda a, s: s[a] - 243e3 if s[a] > 250e3 else 4734.0 + 0.02 * s[a], 4830.6),
    "linear": (lambda a, s: 0.6 * s[a] + 120e3, 300e3),
    "a kink": (lambda a, s: min(0.9 * s[a] + 30e3, 0.1 * s[a] + 250e3), 250e3 / 0.9),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_fixed_point_of_one_node(shape):
    fn, root = SHAPES[shape]
    f = _node_f([0], fn)
    start, trials = _solve(f)
    assert start[0] == pytest.approx(root, abs=2 * TOL * DEPTH)
    assert abs(f(start)[0] - start[0]) <= 2 * TOL * DEPTH  # it is a steady state
    assert len(trials) < 20, trials  # bisection to 1e-6 of the depth takes 20


def test_nodes_that_drain_unlike_and_one_that_stays_full():
    f = _node_f([0, 1, 2], lambda a, s: (s[a] if a == 0 else
                                         0.5 * s[a] + 100e3 if a == 1 else
                                         max(s[a] - 50e3, 1e3 + 0.15 * s[a])))
    start, trials = _solve(f)
    assert start[0] == DEPTH and start[1] == pytest.approx(200e3, abs=2) and start[2] == pytest.approx(1e3 / 0.85, abs=2)
    assert len(trials) < 20


def test_a_bucket_that_refills_every_period_is_left_full():
    f = _node_f([0, 1], lambda a, s: DEPTH)
    assert _solve(f) == (None, [])


def _bisection(sim, out, run, tol=1e-6):
    """The reference: each node's bracket halved to ``tol`` of the depth (20 runs)."""
    full = sim.net.bucket_after(out.iteration_s)
    depth = max(sim.net.burst, sim.net.coll_burst) if full else 0.0
    if not full or all(t >= depth * (1 - tol) for t in full.values()):
        return None
    lo, hi = dict.fromkeys(full, 0.0), dict.fromkeys(full, depth)
    while max(hi[a] - lo[a] for a in full) > tol * depth:
        mid = {a: (lo[a] + hi[a]) / 2 for a in full}
        sim, out = run(mid)
        nxt = sim.net.bucket_after(out.iteration_s)
        for a in full:
            lo[a], hi[a] = (mid[a], hi[a]) if nxt.get(a, depth) >= mid[a] else (lo[a], mid[a])
    return {a: (lo[a] + hi[a]) / 2 for a in full}


JOBS = [
    dict(model="gpt2-small-byte", dp=4, pp=1, micro_batch=8, macro_batch=8, grad_compress="powersgd:2",
         bandwidth="100Mbps", link_burst="10MB"),
    dict(model="gpt2-tiny", global_batch=16, profile="traces/cpu-2core.json", bandwidth="100Mbps", pp=4),
]


@pytest.mark.parametrize("job", JOBS, ids=["10MB-bucket-dp4", "calibrated-tbf-pp4"])
def test_real_predictions_agree_with_bisection(job, monkeypatch):
    runs = []

    def counting(solver):
        def solve(sim, out, run, tol=1e-6):
            n = [0]

            def counted(b):
                n[0] += 1
                return run(b)

            res = solver(sim, out, counted, tol)
            runs.append(n[0])
            return res
        return solve

    monkeypatch.setattr(engine, "steady_buckets", counting(_bisection))
    ref = predict(**job).summary["iteration_s"]
    monkeypatch.setattr(engine, "steady_buckets", counting(steady_buckets))
    got = predict(**job).summary["iteration_s"]
    assert got == pytest.approx(ref, rel=1e-5)
    assert runs[0] == 20 and 0 < runs[1] < 12, runs


def test_the_answer_is_a_steady_state_of_the_simulator():
    """Started from what steady_buckets returns, a run leaves its buckets as it found them."""
    from perfsim.engine.sim import Simulation

    w, s, sy, p = build_configs(**JOBS[1])
    network, plan, _ = engine.plan_with_memory(w, s, sy, p, False)

    def run(buckets=None):
        sim = Simulation(plan, network, s.schedule, warmup=False, replicas=[0], profile=p)
        if buckets:
            sim.net.bucket_start = buckets
        return sim, sim.run()

    sim, out = run()
    depth = max(sim.net.burst, sim.net.coll_burst)
    start = steady_buckets(sim, out, run)
    assert start is not None and min(start.values()) < 0.9 * depth  # a bucket that does not refill
    sim, out = run(start)
    after = sim.net.bucket_after(out.iteration_s)
    assert all(abs(after[a] - start[a]) <= 2e-6 * depth for a in start), (start, after)
