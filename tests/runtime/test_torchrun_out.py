"""Under torchrun every rank is its own process: without ``--out`` each made a temporary
folder of its own (rank 0's results in one, every other rank's checkpoint in another, so
``--resume`` found one rank's). ``run`` now asks for ``--out`` in one line. (``perfsim run``
always names one: ``perfsim-run`` unless given.)"""

import glob
import os
import tempfile

import pytest

from perfsim.errors import ConfigError
from perfsim.runtime import run


def test_run_under_torchrun_without_out_is_refused_before_anything_is_made(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "perfsim-run-*")))
    with pytest.raises(ConfigError, match="under torchrun needs --out"):
        run(model="digits-mlp", pp=1, dp=2, steps=1)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "perfsim-run-*"))) == before
