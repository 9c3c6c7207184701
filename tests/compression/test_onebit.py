"""onebit: sign+scale payloads, error-feedback recurrence, the 3-phase compressed
allreduce over real gloo process groups."""

import math
import sys

import pytest
import torch

from perfsim.compression import make_compressor
from perfsim.compression.base import ALLGATHER, ALLTOALL
from perfsim.compression.onebit import OneBit, chunk_elems, onebit_error_bound
from perfsim.errors import ConfigError

from _helpers import assert_payload_is_wire_size, gloo_group, run_ranks, save_rank


def test_wire_bytes_and_plan():
    c = make_compressor("onebit")
    for shape in [(1000,), (3, 7), (0,), (), (9,)]:
        assert_payload_is_wire_size("onebit", shape)
    assert c.wire_bytes((1000,)) == 125 + 4
    assert c.wire_bytes((1000,), warmup=True) == 4000
    plan = c.dp_plan((1000,), 4)
    assert [s.kind for s in plan] == [ALLTOALL, ALLGATHER]
    chunk = chunk_elems(1000, 4)
    assert chunk == 256 and plan[0].nbytes == 4 * (32 + 4) and plan[1].nbytes == 32 + 4
    assert c.dp_plan((0,), 4) == []
    with pytest.raises(ConfigError):
        c.dp_plan((10,), 0)


def test_error_feedback_recurrence():
    """e_t = c_t - Q(c_t), c_t = x_t + e_{t-1}: the sum of what was sent equals the
    sum of the inputs minus the final error (Seide et al.; 1-bit LAMB Sec. 2.1)."""
    c = make_compressor("onebit")
    torch.manual_seed(0)
    xs = [torch.randn(50) for _ in range(30)]
    sent = torch.zeros(50, dtype=torch.float64)
    err = torch.zeros(50)
    for x in xs:
        y = c.decompress(c.compress(x))
        comp = x + err
        scale = comp.norm() / math.sqrt(50)
        assert torch.allclose(y, torch.where(comp >= 0, scale, -scale))
        err = comp - y
        assert torch.equal(c.worker_err["50"], err)
        assert float((comp - y).norm()) <= onebit_error_bound(comp) + 1e-5
        sent += y.double()
    total = sum(x.double() for x in xs)
    assert torch.allclose(sent, total - c.worker_err["50"].double(), atol=1e-4)
    # so the time-average of the sent values converges to that of the inputs
    assert float((sent - total).norm()) / len(xs) < 0.1 * float(total.norm()) / len(xs) + 0.1


def test_state_round_trip_and_simulation():
    xs = [torch.randn(37) for _ in range(3)]
    comps = [OneBit() for _ in range(3)]
    OneBit.simulate_allreduce(comps, xs)
    states = [c.state_dict() for c in comps]
    expect = OneBit.simulate_allreduce(comps, xs)
    fresh = [OneBit() for _ in range(3)]
    for c, st in zip(fresh, states):
        c.load_state_dict(st)
    got = OneBit.simulate_allreduce(fresh, xs)
    assert all(torch.equal(a, b) for a, b in zip(expect, got))
    assert all(torch.equal(got[0], g) for g in got)  # every rank ends with the same tensor
    with pytest.raises(ConfigError):
        fresh[0].load_state_dict({"nope": 1})


def test_bad_input():
    c = make_compressor("onebit")
    with pytest.raises(ConfigError):
        c.compress(torch.tensor([1.0, float("inf")]))
    with pytest.raises(ConfigError):
        c.compress(torch.tensor([1, 2]))
    with pytest.raises(ConfigError):
        make_compressor("onebit:4")
    z = torch.zeros(8)
    assert torch.equal(c.decompress(c.compress(z)), z)  # scale 0: exact zeros


# ---------------------------------------------------------------- real gloo
def _worker(rank, port, world, xs, steps, outdir):
    with gloo_group(rank, world, port):
        c = make_compressor("onebit")
        outs = [c.allreduce_mean(xs[rank]) for _ in range(steps)]
        save_rank(outdir, rank, {"outs": outs, "state": c.state_dict()})


@pytest.mark.skipif(sys.platform != "linux", reason="uses fork start method")
@pytest.mark.parametrize("world", [2, 3])
def test_allreduce_mean_over_gloo(world, tmp_path):
    torch.manual_seed(world)
    n, steps = 203, 40
    xs = [torch.randn(n) + 0.5 * r for r in range(world)]
    res = run_ranks(_worker, tmp_path, world, xs, steps, world=world, start_method="fork")
    # identical on every rank, and bit-identical to the in-process simulation
    comps = [OneBit() for _ in range(world)]
    mean = torch.stack(xs).mean(0)
    avg = torch.zeros(n, dtype=torch.float64)
    for t in range(steps):
        sim = OneBit.simulate_allreduce(comps, xs)
        for r in range(world):
            assert torch.equal(res[r]["outs"][t], sim[r]), (t, r)
        avg += sim[0].double()
        if t == 0:
            # first step (errors start at 0): ||Q(v) - v|| <= sqrt(2) ||v|| and ||Q(v)|| = ||v||
            # for the worker and the server compression give ||out - mean|| <= 2 sqrt(2) mean_r ||x_r||
            dev = float((sim[0] - mean).norm())
            assert dev <= 2 * math.sqrt(2) * sum(float(x.norm()) for x in xs) / world + 1e-4
    for r in range(world):
        assert torch.equal(res[r]["state"]["worker_err"][f"ar{n}w{world}"],
                           comps[r].state_dict()["worker_err"][f"ar{n}w{world}"])
    # error feedback: the time-average converges to the mean (O(1/T) residual)
    avg /= steps
    rel = float((avg - mean.double()).norm() / mean.norm())
    assert rel < 0.1, rel
    first = float((res[0]["outs"][0].double() - mean.double()).norm() / mean.norm())
    assert rel < first / 3
