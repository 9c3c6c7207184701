"""The bound of every numeric predict parameter is one fact (:attr:`perfsim.param_table.Param.bound`):
the refusal where a value is parsed (:func:`perfsim.params.normalize`) and the one where its config
field is validated state it, and both enforce it.

`perfsim predict --cpu-adam-rate -5` said "must be a finite number >= 0", then `--cpu-adam-rate 0`
was refused with "> 0"; moe_capacity_factor (>= 0 / > 0), moe_imbalance (>= 0 / > 0 / >= 1),
bucket_size (>= 0 / >= 1 byte) said two bounds too, and straggler_cv / jitter_cv's "< 1" was
checked only after parsing. The cases below are generated from the table, so a bound changed in
one place and not the other fails here."""

from __future__ import annotations

import pytest

from perfsim import params
from perfsim.config import Strategy, System
from perfsim.errors import ConfigError
from perfsim.param_table import NUMBER_KINDS

BOUNDED = [p for p in params.PARAMS if p.kind in NUMBER_KINDS]
#: what a config field needs beside it to be valid on its own
NEEDS = {"host_overhead_s": {"gpu": "h100"}}


def _outside(p) -> list[float]:
    """Values just outside the bound: below it (at it, when it must be exceeded), at the upper one."""
    step = 1 if p.kind in ("int", "size") else 0.5
    out = [p.lower - step] + ([p.lower] if p.above else [])
    return out + ([p.below] if p.below is not None else [])


def _inside(p) -> float:
    return p.lower + (0.5 if p.kind in ("float", "bandwidth", "time") else 1) if p.above else p.lower


def _stated(p) -> str:
    return "positive" if p.kind == "bandwidth" else p.bound  # the units parser's words for "> 0"


def _config(p, value):
    where, field = p.target.split(".")
    return (Strategy if where == "strategy" else System)(**{field: value}, **NEEDS.get(field, {}))


def test_every_numeric_parameter_states_a_bound():
    assert {p.name for p in BOUNDED} >= {"cpu_adam_rate", "moe_capacity_factor", "moe_imbalance", "bucket_size",
                                         "straggler_cv", "pp", "latency", "bandwidth"}
    assert params.BY_NAME["cpu_adam_rate"].bound == "> 0" and params.BY_NAME["straggler_cv"].bound == ">= 0 and < 1"


@pytest.mark.parametrize("p", BOUNDED, ids=lambda p: p.name)
def test_the_bound_stated_is_the_bound_enforced(p):
    for v in _outside(p):
        with pytest.raises(ConfigError) as parsed:
            params.normalize(p.name, v)
        assert _stated(p) in str(parsed.value), (v, str(parsed.value))
    inside = _inside(p)
    params.normalize(p.name, inside)  # accepted where it is parsed ...
    if p.target is None or p.choices:  # resolved by predict itself, or a choice that names its values
        return
    _config(p, params.normalize(p.name, inside))  # ... and where its field is validated
    for v in _outside(p):
        with pytest.raises(ConfigError) as checked:
            _config(p, v)
        assert p.bound in str(checked.value), (v, str(checked.value))


def test_cpu_adam_rate_zero_is_refused_where_it_is_parsed():
    """The reported case: one message, the same bound, for -5 and for 0."""
    for v in ("-5", "0"):
        with pytest.raises(ConfigError, match=r"--cpu-adam-rate='%s': must be a finite number > 0" % v):
            params.normalize("cpu_adam_rate", v, cli=True)
    assert params.normalize("cpu_adam_rate", "1e9") == 1e9
