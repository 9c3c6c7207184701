"""Fixtures shared by the test files.

Plain helper functions (free ports, running the CLI, spawning gloo ranks, the checks every
compressor must pass) live in ``tests/_helpers.py``: worker functions that run in spawned
processes need them importable by name, which a conftest is not meant to be.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def write_file(tmp_path):
    """``write_file(name, text)``: a file ``name`` holding ``text`` in this test's temp dir."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """``shared_run(**params) -> (Result, out folder)``: :func:`perfsim.runtime.run` of
    ``params`` (in a folder of its own), run once per test session and shared by every test that asks for the
    same params -- only for tests that read the Result and its files, never change them.
    Each run starts real ranks (a torch import each): tests of different files that
    need the same job (a 1F1B reference, say) pay for it once."""
    from perfsim.runtime import run

    done = {}

    def get(**params):
        key = tuple(sorted((k, repr(v)) for k, v in params.items()))
        if key not in done:
            out = tmp_path_factory.mktemp("shared_run")
            done[key] = run(out=str(out), **params), out
        return done[key]

    return get
