"""A hostile pass over the commands (issue 39), every probe kept as a regression test.

Organised by probe: no stale results, no lost sweep work, no abbreviations, one
validator per concept, hints that work, and the smaller edges. Each test failed
before the change it guards.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import perfsim
from perfsim.errors import ConfigError

from _helpers import run_cli, run_cli_here

# a small, quick prediction (a two-stage tiny transformer on the default profile's V100)
TINY = ["--model", "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=128", "--pp", "2"]


# ---------------------------------------------------------------- no abbreviations

@pytest.mark.parametrize("argv", [
    ["predict", "--ep", "8"],            # was silently --epochs 8
    ["predict", "--band", "1Gbps"],      # was silently --bandwidth
    ["sweep", "--band", "1Gbps,10Gbps"],
    ["plan", "--band", "1Gbps"],
    ["validate", "--prof", "x.json"],
    ["run", "--ste", "3"],
])
def test_options_are_never_abbreviated(argv):
    r = run_cli_here(*argv)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "unrecognized arguments" in r.stderr and argv[1] in r.stderr


def test_every_parser_refuses_abbreviations():
    """Every parser and subparser perfsim builds, not just the ones probed above."""
    from perfsim.cli import build_parser

    parser = build_parser()
    stack, seen = [parser], 0
    while stack:
        p = stack.pop()
        assert p.allow_abbrev is False, p.prog
        seen += 1
        for action in p._actions:
            stack.extend(getattr(action, "choices", None).values()
                         if isinstance(getattr(action, "choices", None), dict) else ())
    assert seen >= 9  # perfsim and its eight commands + completion


@pytest.mark.parametrize("name", ["predict", "sweep", "plan", "run", "validate", "calibrate"])
def test_the_api_refuses_unknown_keywords(name):
    with pytest.raises(ConfigError, match="ep"):
        getattr(perfsim, name)(ep=8)
