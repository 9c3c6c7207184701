"""The rank layout of a ``perfsim run`` job: which global rank runs which (stage, replica,
tensor-parallel rank). Torch-free, so that the launcher checks a job's layout (and names a failed
rank by its place) without importing torch before its ranks start."""

from __future__ import annotations

from dataclasses import dataclass

from perfsim.errors import ConfigError
from perfsim.job import PLACEMENT_DIMS, place, unplace


@dataclass(frozen=True)
class RankLayout:
    """Ranks of a TP x DP x PP job numbered along the job's ``placement``, innermost
    first (:attr:`perfsim.job.Job.placement`, :func:`perfsim.job.place`: the simulator's
    devices are numbered the same way), then through ``order``."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    #: the rank that runs each position of the placement (a permutation; None: the
    #: identity). Under torchrun a rank's number fixes its host, so this places stages
    #: on nodes (``perfsim run --device-order``)
    order: tuple[int, ...] | None = None
    #: rank order, innermost first (perfsim.job.PLACEMENT_DIMS; Megatron-LM's tp, dp, pp)
    placement: tuple[str, ...] = PLACEMENT_DIMS

    def __post_init__(self):
        for name in ("tp", "dp", "pp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name}={v!r}: must be an integer >= 1")
        if self.order is not None:
            if sorted(self.order) != list(range(self.world_size)):
                raise ConfigError(f"device_order={','.join(map(str, self.order))!r}: must be a permutation "
                                  f"of the ranks 0..{self.world_size - 1}")
            if self.tp > 1:
                raise ConfigError("device_order: not with tp > 1 (the TP device mesh numbers ranks itself)")

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    def _sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "dp": self.dp, "pp": self.pp}

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(stage, replica, tp_rank)`` of a global rank."""
        c = unplace(self.placement, self._sizes(), rank if self.order is None else self.order.index(rank))
        return c["pp"], c["dp"], c["tp"]

    def rank(self, stage: int, replica: int, tp_rank: int = 0) -> int:
        position = place(self.placement, self._sizes(), {"tp": tp_rank, "dp": replica, "pp": stage})
        return position if self.order is None else self.order[position]

    def mesh_dims(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Shape and dimension names of the device mesh whose row-major rank numbering
        is this layout's (outermost placement dimension first; no ``order``, as TP requires)."""
        names = tuple(reversed(self.placement))
        return tuple(self._sizes()[d] for d in names), names

    def describe(self, rank: int) -> str:
        s, d, t = self.coords(rank)
        return f"rank {rank} (stage {s}, replica {d}" + (f", tp rank {t})" if self.tp > 1 else ")")

    def dp_group_ranks(self) -> list[list[int]]:
        """The data-parallel groups: one per (stage, tp rank)."""
        return [[self.rank(s, d, t) for d in range(self.dp)] for s in range(self.pp) for t in range(self.tp)]
