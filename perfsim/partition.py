"""Pipeline partition: which contiguous layers each stage holds.

One function shared by the simulator (``perfsim predict``) and the runtime
(``perfsim run``), so both place the same layers on the same stage
(ARCHITECTURE.md, rule 1: one source of truth).

A model is the layer list of :mod:`perfsim.models.specs`. A partition splits it
into ``num_stages`` non-empty contiguous ranges ``[start, end)``. The default
balances *parameters* (the classic linear-partition problem: minimise the
largest stage weight, solved exactly by dynamic programming); ties are broken
towards equal layer counts, then towards earlier cuts, so the answer is
deterministic. ``by="layers"`` balances the layer count, ``by="flops"`` the
forward FLOPs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from perfsim.errors import ConfigError

BALANCE_BY = ("params", "layers", "flops")


def layer_weights(layers: Sequence, by: str = "params") -> list[float]:
    """The weight of each layer under criterion ``by``."""
    if by not in BALANCE_BY:
        raise ConfigError(f"partition by={by!r}: choose from {', '.join(BALANCE_BY)}")
    if by == "layers":
        return [1.0] * len(layers)
    if by == "params":
        return [float(layer.params) for layer in layers]
    return [float(layer.flops_fwd) for layer in layers]


def partition_weights(weights: Sequence[float], num_stages: int) -> list[tuple[int, int]]:
    """Split ``weights`` into ``num_stages`` non-empty contiguous ranges minimising
    the heaviest range (linear partition, exact DP, O(n^2 p)).

    Tie-break: among optimal splits, the one whose largest layer count is smallest,
    then the lexicographically earliest cut positions.
    """
    n = len(weights)
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ConfigError(f"pp={num_stages!r}: must be an integer >= 1")
    if num_stages > n:
        raise ConfigError(f"pp={num_stages}: the model has only {n} partitionable layers")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))

    @lru_cache(maxsize=None)
    def best(start: int, stages: int) -> tuple[float, int, tuple[int, ...]]:
        # returns (max weight, max layer count, cuts) for layers[start:] in `stages` ranges
        if stages == 1:
            return prefix[n] - prefix[start], n - start, ()
        out = None
        for end in range(start + 1, n - stages + 2):
            w_here = prefix[end] - prefix[start]
            w_rest, c_rest, cuts = best(end, stages - 1)
            cand = (max(w_here, w_rest), max(end - start, c_rest), (end,) + cuts)
            if out is None or cand < out:
                out = cand
        return out

    _, _, cuts = best(0, num_stages)
    bounds = (0,) + cuts + (n,)
    return [(bounds[i], bounds[i + 1]) for i in range(num_stages)]


def partition(layers: Sequence, num_stages: int, by: str = "params") -> list[tuple[int, int]]:
    """Stage ranges ``[(start, end), ...]`` for a model's ``layers()`` list."""
    return partition_weights(layer_weights(layers, by), num_stages)


def partition_model(spec, num_stages: int, by: str = "params") -> list[tuple[int, int]]:
    """Stage ranges for a :mod:`perfsim.models.specs` spec (GPTSpec / MLPSpec)."""
    return partition(spec.layers(), num_stages, by)
