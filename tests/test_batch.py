"""perfsim/batch.py: the one worker pool behind plan and sweep (issue 38)."""

import os
import re
from pathlib import Path

import pytest

from perfsim import batch
from perfsim.batch import BatchRunner
from perfsim.errors import ConfigError


def _square_all(xs, offset=0):
    return [x * x + offset for x in xs], os.getpid()


def test_in_process_and_pool_give_the_same_results_in_order():
    batches = [[1, 2], [3], [4, 5, 6]]
    with BatchRunner(1) as serial:
        assert not serial.parallel
        here = serial.map(_square_all, batches, 1)
    assert [r for r, _ in here] == [[2, 5], [10], [17, 26, 37]]
    assert {pid for _, pid in here} == {os.getpid()}
    if batch.fork_context() is None:
        pytest.skip("torch is loaded in this test process: the runner stays in-process")
    with BatchRunner(2) as pool:
        assert pool.parallel
        there = pool.map(_square_all, batches, 1)
        done = sorted(r for r, _ in pool.as_completed(_square_all, batches, 1))
    assert [r for r, _ in there] == [r for r, _ in here]  # map keeps the order
    assert done == sorted(r for r, _ in here)  # as_completed: every batch once
    assert os.getpid() not in {pid for _, pid in there}  # the work ran in the workers


def test_bad_settings_are_one_line():
    with pytest.raises(ConfigError, match="backend='ray'"):
        BatchRunner(2, backend="ray")
    with pytest.raises(ConfigError, match="jobs=0"):
        BatchRunner(0)
    with pytest.raises(ConfigError, match="only with backend=dask"):
        BatchRunner(2, dask_scheduler="tcp://x:1")


def test_plan_and_sweep_share_the_one_pool():
    """Two worker pools (plan, sweep) were one too many: both run on BatchRunner and no
    other module of perfsim starts a process pool."""
    from perfsim import plan_search
    from perfsim.analysis import sweep

    assert plan_search.BatchRunner is sweep.BatchRunner is BatchRunner
    pkg = Path(batch.__file__).parent
    pools = re.compile(r"ProcessPoolExecutor\(|multiprocessing\.Pool\(|\.Pool\(|dask\.compute\(")
    starters = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if pools.search(p.read_text()))
    assert starters == ["batch.py"]
