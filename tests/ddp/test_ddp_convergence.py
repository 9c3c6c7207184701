"""Every perfsim.ddp gradient compressor trains to within 2x of fp32's loss on the same
budget, with Adam and with SGD: a real 2-rank gloo job running scripts/ddp_convergence.py's
training (the script that makes docs/ddp.md's table and curves). The 1-bit optimizers are
tests/ddp/test_ddp_convergence_onebit.py's: a job of their own, so the two can run on
different workers of ``make test``."""

from __future__ import annotations

import pytest

from _helpers import above_2x, convergence_table


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return convergence_table(tmp_path_factory.mktemp("conv"), 150, None, onebit=False)


@pytest.mark.slow
def test_every_method_within_2x_of_fp32(table):
    assert len(table) >= 20  # 9 compressors x 2 optimizers (+ baselines)
    for opt in ("adam", "sgd"):
        assert f"{opt}/randk-maxnorm:0.25:4" in table  # the sparsifier is held too (its memory)
    assert not above_2x(table), f"final loss / baseline above 2x: {above_2x(table)}"


@pytest.mark.slow
def test_baselines_learn(table):
    """The comparison means something: fp32 training really reduces the loss (ln 10 = 2.30 at start)."""
    assert float(table["adam/fp32"]["final_loss"]) < 0.5 and float(table["sgd/fp32"]["final_loss"]) < 0.5
