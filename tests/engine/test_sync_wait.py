"""Synchronisation wait: the iteration waits for the slowest of the job's GPUs
(perfsim.engine.sync_wait): order statistics, growth with ranks, averaging over micro-batches."""

import math

import numpy as np
import pytest

from perfsim.api import predict
from perfsim.errors import ConfigError
from perfsim.engine.sync_wait import expected_max_normal, sync_wait_s


def test_expected_maximum_of_normals():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)  # exact for 2
    assert expected_max_normal(8) == pytest.approx(1.4236, rel=0.01)  # David & Nagaraja's table
    rng = np.random.default_rng(0)
    for n in (4, 32, 256):  # Monte Carlo
        assert expected_max_normal(n) == pytest.approx(rng.standard_normal((4000, n)).max(axis=1).mean(), rel=0.03)
    grows = [expected_max_normal(n) for n in (2, 8, 64, 512, 4096)]
    assert grows == sorted(grows) and all(g < math.sqrt(2 * math.log(n)) for g, n in zip(grows, (2, 8, 64, 512, 4096)))


def test_static_spread_stays_dynamic_jitter_averages_over_micro_batches():
    assert sync_wait_s(10.0, 64, 8, 0.0, 0.0) == 0.0 and sync_wait_s(10.0, 1, 8, 0.05, 0.05) == 0.0
    static = [sync_wait_s(10.0, 64, m, 0.01, 0.0) for m in (1, 4, 16)]
    assert static == pytest.approx([10.0 * 0.01 * expected_max_normal(64)] * 3)
    dyn = [sync_wait_s(10.0, 64, m, 0.0, 0.04) for m in (1, 4, 16)]
    assert dyn[1] == pytest.approx(dyn[0] / 2) and dyn[2] == pytest.approx(dyn[0] / 4)
    both = sync_wait_s(10.0, 64, 4, 0.01, 0.04)
    assert both == pytest.approx(10.0 * math.sqrt(0.01 ** 2 + 0.04 ** 2 / 4) * expected_max_normal(64))


def test_predict_adds_the_wait_for_the_slowest_gpu():
    kw = dict(model="gpt2", gpu="a100", tp=2, pp=2, dp=4, gpus_per_node=8, micro_batch=2, global_batch=64,
              nic="1x100Gbps:infiniband")
    base, slow = predict(**kw), predict(**kw, straggler_cv=0.02)
    assert base.summary["sync_wait_s"] == 0.0
    busiest = max(r["compute_s"] + r["tp_comm_s"] for r in slow.stages)
    wait = 0.02 * busiest * expected_max_normal(16)
    assert slow.summary["sync_wait_s"] == pytest.approx(wait)
    assert slow.summary["iteration_s"] == pytest.approx(base.summary["iteration_s"] + wait)
    assert slow.summary["throughput_samples_per_s"] == pytest.approx(64 / slow.summary["iteration_s"])
    more = predict(**dict(kw, dp=32, global_batch=512), straggler_cv=0.02)  # more ranks, longer wait
    assert more.summary["sync_wait_s"] > wait
    with pytest.raises(ConfigError, match="straggler_cv=1.5"):
        predict(**kw, straggler_cv=1.5)
