"""Checking a job (``make_config``) leaves nothing behind: without ``out`` it named a fresh
``perfsim-run-*`` temporary folder on every call -- ``perfsim run --grad-compress onebit-adam``
without ``--out`` checked its job once for the header and so left an empty folder beside the run's,
and 516 such empty folders had piled up in this machine's /tmp. Only ``run`` makes one."""

import tempfile
from pathlib import Path

from perfsim.runtime import _entry
from perfsim.runtime._entry import UNSET_OUT, make_config


def test_checking_a_job_creates_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = make_config(model="gpt2-tiny", pp=2, steps=2)
    assert cfg.out == UNSET_OUT and not Path(UNSET_OUT).exists()
    assert list(tmp_path.iterdir()) == []
    assert make_config(model="gpt2-tiny", pp=2, steps=2) == cfg  # the same job, the same config


def test_the_run_trains_into_a_fresh_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = _entry.make_config(create_out=True, model="gpt2-tiny", pp=2, steps=2)
    made = list(tmp_path.iterdir())
    assert [str(p) for p in made] == [cfg.out] and made[0].name.startswith("perfsim-run-")
