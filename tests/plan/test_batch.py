"""perfsim/batch.py: the one worker pool behind plan and sweep (issue 38)."""

import os
import re
import subprocess
import sys
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


def test_pool_gives_the_in_process_results():
    """In a fresh interpreter (no torch loaded, so the runner forks): map keeps the order,
    as_completed yields every batch once, and the work runs in the workers."""
    code = """
import os, sys
sys.path.insert(0, {tests!r})
from test_batch import _square_all
from perfsim.batch import BatchRunner
batches = [[1, 2], [3], [4, 5, 6]]
with BatchRunner(2) as pool:
    assert pool.parallel
    there = pool.map(_square_all, batches, 1)
    done = sorted(r for r, _ in pool.as_completed(_square_all, batches, 1))
assert [r for r, _ in there] == [[2, 5], [10], [17, 26, 37]], there
assert done == sorted([[2, 5], [10], [17, 26, 37]]), done
assert os.getpid() not in {{pid for _, pid in there}}
assert "torch" not in sys.modules
print("ok")
""".format(tests=str(Path(__file__).parent))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


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
    import ast

    pkg = Path(batch.__file__).parent
    for user in ("plan_search.py", "analysis/sweep.py"):  # both take the runner from perfsim.batch
        tree = ast.parse((pkg / user).read_text())
        assert any(isinstance(n, ast.ImportFrom) and n.module == "perfsim.batch"
                   and "BatchRunner" in [a.name for a in n.names] for n in ast.walk(tree)), user
    pools = re.compile(r"ProcessPoolExecutor\(|multiprocessing\.Pool\(|\.Pool\(|dask\.compute\(")
    starters = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if pools.search(p.read_text()))
    assert starters == ["batch.py"]
