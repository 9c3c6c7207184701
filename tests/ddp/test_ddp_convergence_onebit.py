"""1-bit Adam and 1-bit LAMB at lr 1e-2 and 1e-3 train to within 2x of their uncompressed
optimizers' loss on the same budget: scripts/ddp_convergence.py's training in a real 2-rank
gloo job (tests/ddp/test_ddp_convergence.py holds the gradient compressors; a job of its
own, so the two can run on different workers of ``make test``)."""

from __future__ import annotations

import pytest

from _helpers import above_2x, convergence_table

ONEBIT = ["onebit-adam@0.01", "onebit-adam@0.001", "onebit-lamb@0.01", "onebit-lamb@0.001"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return convergence_table(tmp_path_factory.mktemp("conv1bit"), 150, ONEBIT, onebit=True)


@pytest.mark.slow
def test_every_onebit_optimizer_within_2x_of_fp32(table):
    assert set(ONEBIT) <= set(table) and len(table) == 8  # + their 4 uncompressed baselines
    assert not above_2x(table), f"final loss / baseline above 2x: {above_2x(table)}"
