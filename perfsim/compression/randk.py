"""Global random-k sparsification + max-norm quantization (S. Vineeth, "Unbiased
Single-scale and Multi-scale Quantizers for Distributed Optimization", arXiv:2109.12497).

``randk-maxnorm:FRACTION:BITS[:scaled]`` -- GlobalRandKMaxNorm, Sec. 3.3: every
worker picks the *same* ``K = ceil(FRACTION * n)`` coordinates uniformly at
random (without replacement) and applies QSGDMaxNorm (Sec. 3.1) to them.
``randk-maxnorm-multiscale:FRACTION:BITS[:SCALE_BITS,...][:scaled]`` --
GlobalRandKMaxNormMultiScale, Sec. 3.4, the same with QSGDMaxNormMultiScale.

The indices never travel: they come from a generator seeded with
``(seed, step)`` -- ``seed`` identical on all workers, ``step`` a counter held
in the state and advanced once per call on every worker -- so all workers agree
and a restored run picks the same coordinates. Only the ``K`` codes on the
shared max norm of the selected values (plus the norm, and for the multi-scale
variant the scale indices) are sent, and they sum under allreduce exactly as in
``qsgd-maxnorm`` (see :mod:`perfsim.compression.maxnorm` for the accumulation width).

Scaling: the paper sends the selected values as they are, so the decoded
gradient has expectation ``(K/n) g`` (zero elsewhere). With ``:scaled`` the
selected values are multiplied by ``n/K`` before quantization, which makes the
estimator unbiased (``E = g``) at the price of ``n/K`` times the variance.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Sequence

from perfsim._lazy import torch

from perfsim.compression.args import SpecArg, complete
from perfsim.compression.base import Compressor, Payload, check_input, numel_of
from perfsim.compression.maxnorm import SCALE_BITS_ARG, MaxNormQuantizer
from perfsim.compression.qsgd import BITS_ARG, generator
from perfsim.compression.registry import register
from perfsim.errors import ConfigError

_INDEX_SALT = 0x52414E444B  # "RANDK": keeps index draws apart from rounding draws


_UNSEEN = 2**31 - 1
_TLS = threading.local()  # per-thread first-occurrence tables, {n: int32 tensor}


def first_occurrences(draws: torch.Tensor, n: int) -> torch.Tensor:
    """The distinct values of ``draws`` (int64 in ``[0, n)``) in order of first occurrence.

    A scatter-min of the draw positions into an ``n``-entry int32 table marks
    each value's first position; the table is kept (all ``_UNSEEN``) between
    calls and only the drawn entries are reset, so a call costs O(len(draws))."""
    if draws.numel() >= _UNSEEN:
        raise ConfigError(f"{draws.numel()} random draws: too many")
    tables = _TLS.__dict__.setdefault("first", {})
    first = tables.get(n)
    if first is None:
        if len(tables) >= 2:
            tables.pop(next(iter(tables)))
        first = tables[n] = torch.full((n,), _UNSEEN, dtype=torch.int32)
    pos = torch.arange(draws.numel(), dtype=torch.int32)
    try:
        first.scatter_reduce_(0, draws, pos, "amin")
        return draws[first[draws] == pos]
    finally:
        first.index_fill_(0, draws, _UNSEEN)


class _GlobalRandK(Compressor):
    allreduce_compatible = True
    stateful = True

    def __init__(self, fraction: float, inner: MaxNormQuantizer, scaled: bool = False, seed: int = 0):
        self.fraction, self.inner, self.scaled, self.seed = float(fraction), inner, bool(scaled), int(seed)
        self._step = 0
        self._cache: tuple | None = None

    def k_of(self, n: int) -> int:
        """Number of selected coordinates: ``ceil(fraction * n)`` (0 for an empty tensor)."""
        return min(n, math.ceil(self.fraction * n - 1e-9)) if n else 0

    def indices(self, n: int, step: int | None = None) -> torch.Tensor:
        """The shared coordinates of call ``step`` (default: the next call): ``K``
        distinct indices, every K-subset equally likely.

        Drawn on the CPU from ``(seed, step)`` only, so identical on every worker
        and device. For small ``K`` we draw with replacement and keep the first
        ``K`` *distinct* values in order of first occurrence -- sequential
        sampling with replacement that skips repeats is sampling without
        replacement, so this is a uniform random ordered K-sample. Duplicates are
        found with a scatter-min of draw positions (O(draws), no sort of the
        ~1.25 K draws). Large ``K`` (``4K >= n``)
        use ``randperm(n)``. The last result is cached for decode."""
        step = self._step if step is None else step
        k = self.k_of(n)
        cached = self._cache
        if cached is not None and cached[0] == (n, step):
            return cached[1]
        g = generator(self.seed, _INDEX_SALT, step)
        if 4 * k >= n:
            # int32 draws the same permutation as int64, ~2.5x faster for n ~ 1e6
            idx = torch.randperm(n, generator=g, dtype=torch.int32)[:k].long()
        else:
            draws = torch.empty(0, dtype=torch.int64)
            while True:
                draws = torch.cat([draws, torch.randint(n, (k + k // 4 + 16,), generator=g)])
                distinct = first_occurrences(draws, n)
                if distinct.numel() >= k:
                    idx = distinct[:k]
                    break
        self._cache = ((n, step), idx)
        return idx

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        return self.inner.wire_bytes((self.k_of(numel_of(shape)),))

    def dp_plan(self, shape, world_size, *, backend: str = "gloo"):
        return self.inner.dp_plan((self.k_of(numel_of(shape)),), world_size, backend=backend)

    def _select(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.detach().reshape(-1).to(torch.float32)
        idx = self.indices(flat.numel()).to(flat.device)
        self._step += 1
        sub = torch.index_select(flat, 0, idx)  # 3x faster than flat[idx] on a CPU
        if self.scaled and idx.numel():
            sub = sub * (flat.numel() / idx.numel())
        return idx, sub

    def compress(self, x: torch.Tensor, *, key=None, norm=None, scale_index=None) -> Payload:
        """Encode the selected coordinates; ``norm`` / ``scale_index`` are the shared
        values of the selected sub-vector (see :meth:`MaxNormQuantizer.compress`)."""
        check_input(x)
        step = self._step
        _, sub = self._select(x)
        inner = self.inner.compress(sub, norm=norm, scale_index=scale_index)
        return Payload(inner.tensors, tuple(x.shape), x.dtype, {"step": step, "k": sub.numel()})

    def _scatter(self, values: torch.Tensor, shape, step: int, dtype) -> torch.Tensor:
        n = numel_of(shape)
        out = torch.zeros(n, dtype=torch.float32, device=values.device)
        out.index_copy_(0, self.indices(n, step).to(values.device), values.to(torch.float32))
        return out.reshape(shape).to(dtype)

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        """Decode; the indices are re-derived from ``payload.meta['step']`` (shared, not sent)."""
        k = payload.meta["k"]
        sub = self.inner.decompress(Payload(payload.tensors, (k,), torch.float32))
        return self._scatter(sub, payload.shape, payload.meta["step"], payload.dtype)

    def allreduce_mean(self, x: torch.Tensor, group=None) -> torch.Tensor:
        check_input(x)
        step = self._step
        _, sub = self._select(x)
        mean_sub = self.inner.allreduce_mean(sub, group)
        return self._scatter(mean_sub, x.shape, step, x.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self._step, "inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        extra = set(state) - {"step", "inner"}
        if extra:
            raise ConfigError(f"{self.spec}: unexpected state keys {sorted(extra)}")
        self._step = int(state.get("step", 0))
        self.inner.load_state_dict(state.get("inner", {}))

    @classmethod
    def from_values(cls, values=None, seed: int = 0) -> "_GlobalRandK":
        """Build from :attr:`spec_args` values: the inner max-norm quantizer gets ``bits``
        (and ``scale_bits``) and shares the spec."""
        v = complete(cls.spec_args, values or {})
        inner = MaxNormQuantizer(v["bits"], v.get("scale_bits", ()), seed=seed)
        comp = cls(v["fraction"], inner, scaled=v["scaled"], seed=seed)
        comp.spec = comp.inner.spec = comp.canonical_spec()
        return comp

    def spec_values(self) -> dict:
        return {"fraction": self.fraction, "bits": self.inner.bits,
                "scale_bits": self.inner.scale_bits[1:], "scaled": self.scaled}


_FRACTION = SpecArg("fraction", float, low=0, high=1, low_open=True)
_SCALED = SpecArg("scaled", default=False, words={"scaled": True})


@register
class RandKMaxNorm(_GlobalRandK):
    """GlobalRandKMaxNorm (arXiv:2109.12497 Sec. 3.3)."""

    name = "randk-maxnorm"
    example_spec = "randk-maxnorm:0.01:4"

    spec_args = (_FRACTION, BITS_ARG, _SCALED)


@register
class RandKMaxNormMultiScale(_GlobalRandK):
    """GlobalRandKMaxNormMultiScale (arXiv:2109.12497 Sec. 3.4)."""

    name = "randk-maxnorm-multiscale"
    example_spec = "randk-maxnorm-multiscale:0.01:4:8"

    spec_args = (_FRACTION, BITS_ARG, SCALE_BITS_ARG, _SCALED)
