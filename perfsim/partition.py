"""Pipeline partition: which contiguous layers each stage holds.

One function shared by the simulator (``perfsim predict``) and the runtime
(``perfsim run``), so both place the same layers on the same stage.

A model is the layer list of :mod:`perfsim.models.specs`. A partition splits it
into ``num_stages`` non-empty contiguous ranges ``[start, end)``. The default
balances *parameters* (the classic linear-partition problem: minimise the
largest stage weight; binary search over the candidate bounds with a greedy
fill, exact for contiguous partitions; ties: earlier stages take more), so the
answer is deterministic. The simulator calls :func:`partition_weights` with
per-layer fwd+bwd compute times instead of parameters; an explicit list of layer
counts per stage overrides both (:func:`parse_counts` reads ``"7,6,6"``).
``by="layers"`` balances the layer count, ``by="flops"`` the forward FLOPs.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING, Sequence

from perfsim.errors import ConfigError

if TYPE_CHECKING:
    from perfsim.models.specs import ModelSpec

BALANCE_BY = ("params", "layers", "flops")


def parse_counts(text: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """``"7,6,6"`` or a list -> layer counts per stage; None, ``""`` or ``balanced`` -> None
    (the balanced partition)."""
    if text is None or str(text).strip() in ("", "balanced"):
        return None
    try:
        items = str(text).split(",") if isinstance(text, str) else list(text)
        return tuple(int(str(x).strip()) for x in items)
    except (TypeError, ValueError):  # 5, [1.5], ["a"]: not a list of counts
        raise ConfigError(f"partition {text!r}: expected comma-separated layer counts") from None


def uniform_counts(names: Sequence[str], num_stages: int) -> tuple[int, ...]:
    """Megatron-LM's split of a transformer (``--partition uniform``): ``L / num_stages``
    blocks per stage, the remainder to the first stages, the embedding on the first stage
    and the head (and whatever follows the blocks) on the last; ``names`` are the layer
    names (``embed``, ``block0`` ...). Used by ``perfsim predict`` (with a GPU preset, its
    default) and ``perfsim run`` alike."""
    blocks = sum(1 for name in names if name.startswith("block"))
    if blocks < num_stages:
        raise ConfigError(f"partition=uniform: {blocks} blocks cannot fill {num_stages} stages")
    counts = [blocks // num_stages + (1 if s < blocks % num_stages else 0) for s in range(num_stages)]
    counts[0] += 1
    counts[-1] += len(names) - blocks - 1
    return tuple(counts)


def layer_weights(layers: Sequence, by: str = "params") -> list[float]:
    """The weight of each layer under criterion ``by``."""
    if by not in BALANCE_BY:
        raise ConfigError(f"partition by={by!r}: choose from {', '.join(BALANCE_BY)}")
    if by == "layers":
        return [1.0] * len(layers)
    if by == "params":
        return [float(layer.params) for layer in layers]
    return [float(layer.flops_fwd) for layer in layers]


def partition_weights(costs: Sequence[float], num_stages: int,
                      explicit: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` layer ranges, one per stage.

    ``explicit`` gives layer counts per stage (must have ``num_stages`` entries
    >= 1 summing to the layer count). Otherwise the slowest stage's cost is
    minimised (ties: earlier stages take more)."""
    n = len(costs)
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ConfigError(f"pp={num_stages!r}: must be an integer >= 1")
    if num_stages > n:
        raise ConfigError(f"pp={num_stages}: the model has only {n} layers, cannot fill {num_stages} stages")
    if explicit is not None:
        if len(explicit) != num_stages or any(c < 1 for c in explicit) or sum(explicit) != n:
            raise ConfigError(f"partition {','.join(map(str, explicit))}: does not fit {num_stages} stages "
                              f"of >= 1 layer covering {n} layers")
        ends = list(accumulate(explicit))
        return list(zip([0, *ends[:-1]], ends))

    def fill(limit: float) -> list[tuple[int, int]] | None:
        bounds, start = [], 0
        for s in range(num_stages):
            left = num_stages - s - 1
            end, acc = start, 0.0
            while end < n - left and (end == start or acc + costs[end] <= limit * (1 + 1e-12)):
                acc += costs[end]
                end += 1
            if acc > limit * (1 + 1e-12):
                return None
            bounds.append((start, end))
            start = end
        return bounds if start == n else None

    # candidate bounds: every contiguous sum is a possible optimum; binary search over them
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    lo_val = max(costs) if costs else 0.0
    cands = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)
                    if prefix[j] - prefix[i] >= lo_val} | {lo_val}) if n <= 400 else None
    if cands is not None:
        lo, hi = 0, len(cands) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if fill(cands[mid]) is not None:
                hi = mid
            else:
                lo = mid + 1
        best = fill(cands[lo])
    else:  # very deep models: bisection on the value
        lo, hi = lo_val, prefix[-1]
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if fill(mid) is not None else (mid, hi)
        best = fill(hi)
    return best


def partition_with_tail(costs: Sequence[float], num_stages: int, explicit: Sequence[int] | None,
                        tail: int) -> list[tuple[int, int]]:
    """:func:`partition_weights` with the last ``tail`` layers kept together on the last stage --
    a transformer's multi-token prediction modules and the LM head after them, which
    Megatron-Core builds on the post-process stage only (``GPTModel``'s ``mtp_process``) --
    balanced as one layer of their summed cost; an explicit partition must give the last stage
    at least ``tail`` layers."""
    n = len(costs)
    if tail <= 1 or tail > n:
        return partition_weights(costs, num_stages, explicit)
    if explicit is not None:
        if len(explicit) == num_stages and explicit[-1] < tail:
            raise ConfigError(f"partition {','.join(map(str, explicit))}: the last stage holds the multi-token "
                              f"prediction modules and the LM head, {tail} layers; it has {explicit[-1]}")
        return partition_weights(costs, num_stages, explicit)
    merged = [*costs[:n - tail], sum(costs[n - tail:])]
    bounds = partition_weights(merged, num_stages)
    return [*bounds[:-1], (bounds[-1][0], n)]


def partition(layers: Sequence, num_stages: int, by: str = "params") -> list[tuple[int, int]]:
    """Stage ranges ``[(start, end), ...]`` for a model's ``layers()`` list."""
    return partition_weights(layer_weights(layers, by), num_stages)


def partition_model(spec: ModelSpec, num_stages: int, by: str = "params",
                    explicit: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Stage ranges for a model spec (a :class:`perfsim.models.specs.ModelSpec`);
    ``explicit``: layer counts per stage (see :func:`partition_weights`)."""
    return partition_weights(layer_weights(spec.layers(), by), num_stages, explicit)
