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
