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

Unselected coordinates: the paper sends the selected values as they are and
says nothing of the others, so one step's decoded gradient is ``(K/n) g`` in
expectation: with ``0.25`` three quarters of every gradient would be lost
(docs/ddp.md has the convergence it cost). Each worker therefore keeps a
*memory* ``h`` of what it has not sent -- error feedback ("Sparsified SGD with Memory", Stich, Cordonnier & Jaggi,
arXiv:1809.07599; "Error Feedback Fixes SignSGD and other Gradient Compression
Schemes", Karimireddy et al., arXiv:1901.09847) -- with the compensation
coefficient ``alpha`` of ECQ-SGD (Wu et al., "Error Compensated Quantized SGD and its Applications to
Large-scale Distributed Optimization", arXiv:1806.08054, eq. 5-7, ``beta = 1``)::

    a_t     = g_t + alpha h_t                      (eq. 7's argument)
    send      Q(a_t[S_t])                          (S_t: the shared K coordinates)
    h_{t+1} = h_t + g_t - a_t[S_t]                 (eq. 6: unsent gradient accumulates;
                                                    a selected coordinate keeps (1 - alpha) h)

``alpha = 1`` is the papers' plain memory: every backlog goes out in one burst
when its coordinate is drawn (after ``n/K - 1`` steps on average), and with SGD
at momentum 0.9 those bursts made training oscillate (docs/ddp.md). ECQ-SGD's
small ``alpha`` (its Sec. 6, Table 2: 0.01-0.1 with ``beta = 1``; 0.15 did not
converge) releases a backlog gradually, a fraction ``alpha`` per draw, and keeps
``lambda = alpha^2 gamma + (1 - alpha)^2 < 1`` (the condition after its Lemma 2;
``gamma = 1 - K/n`` for the sparsifier). :data:`COMPENSATION` is the top of
that range. Only the sparsification error is remembered: the
max-norm quantizer is unbiased (Lemma 1 of the multiscale paper). The memory
never travels (wire format and ``dp_plan`` unchanged), is kept per tensor name
(``name=``, default ``""``, like ECQ's error) and in :meth:`state_dict`, so a
restored compressor continues bit-identically; it is per worker, so a
checkpoint belongs to its world size. It belongs to the data-parallel exchange
(:meth:`allreduce_mean`, one instance per gradient bucket, step after step);
:meth:`compress` -- the one-payload interface, which also carries pipeline
activations, a different batch every call -- stays the paper's memoryless operator.

Norm granularity: the quantizer keeps one shared norm per
:func:`norm_chunk` selected values -- ``FRACTION`` times qsgd-maxnorm's default
chunk (:func:`perfsim.compression.qsgd.default_chunk`), i.e. as many norms per
gradient coordinate as ``qsgd-maxnorm``, at least 32 values per norm (the
4-byte norm costs at most 1 bit per value): QSGD's variance bound grows with
``sqrt(d)/s``, and a coordinate drawn every ``n/K`` steps averages its rounding
noise over ``K/n`` times fewer draws than under ``qsgd-maxnorm``.
The multi-scale variant keeps one norm (its per-coordinate scales adapt).

With ``:scaled`` the selected values are multiplied by ``n/K`` before
quantization instead, which makes one step's estimator unbiased (``E = g``) at
the price of ``n/K`` times the variance; it keeps no memory.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Sequence

from perfsim._lazy import torch

from perfsim.compression.args import SpecArg, complete
from perfsim.compression.base import Compressor, Payload, check_float, check_input, numel_of, passes
from perfsim.compression.maxnorm import SCALE_BITS_ARG, MaxNormQuantizer
from perfsim.compression.qsgd import BITS_ARG, default_chunk, generator
from perfsim.compression.registry import register
from perfsim.errors import ConfigError, NonFiniteError

_INDEX_SALT = 0x52414E444B  # "RANDK": keeps index draws apart from rounding draws
#: ECQ-SGD's compensation coefficient alpha for the memory of unsent coordinates
#: (ECQ-SGD, arXiv:1806.08054, eq. 7; its recommended range 0.01-0.1 with beta = 1)
COMPENSATION = 0.1
#: fewest selected values per shared norm: a 4-byte norm adds at most 1 bit per value
MIN_NORM_CHUNK = 32


def norm_chunk(fraction: float, s: int) -> int:
    """Selected values per shared norm for ``fraction`` and ``s`` levels: the
    same norms per gradient coordinate as ``qsgd-maxnorm`` (``fraction *
    default_chunk(s)``), at least :data:`MIN_NORM_CHUNK`."""
    return max(MIN_NORM_CHUNK, math.ceil(fraction * default_chunk(s) - 1e-9))


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
    reduce_scatter_reason = ("its shared random coordinates are spread over the whole tensor, "
                             "not over each rank's shard")
    stateful = True

    def __init__(self, fraction: float, inner: MaxNormQuantizer, scaled: bool = False, seed: int = 0):
        self.fraction, self.inner, self.scaled, self.seed = float(fraction), inner, bool(scaled), int(seed)
        self._step = 0
        self._cache: tuple | None = None
        self.alpha = COMPENSATION
        self.memory: dict[str, torch.Tensor] = {}  # name -> h (module docstring), flat fp32
        if not inner.multiscale and inner.chunk == 0:
            inner.chunk = norm_chunk(self.fraction, inner.s)

    @property
    def error_feedback(self) -> bool:
        """Whether unsent coordinates are remembered (the unscaled sparsifier, see
        the module docstring); ``:scaled`` is unbiased per step and keeps none."""
        return not self.scaled

    def error(self, name: str = "") -> torch.Tensor | None:
        """A copy of the memory of tensor ``name`` (None before its first step)."""
        m = self.memory.get(name)
        return None if m is None else m.clone()

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

    def _select(self, x: torch.Tensor, name: str | None,
                commit: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared indices of this call and the values to quantize; advances the
        step and, with error feedback and a ``name`` (None: no memory), the memory
        of ``name`` (``x`` is checked by the caller). With a ``commit`` list the memory
        update is appended to it as a callable instead (run once the exchange succeeded)."""
        flat = x.detach().reshape(-1).to(torch.float32)
        n = flat.numel()
        remember = self.error_feedback and name is not None
        mem = self.memory.get(name) if remember else None
        if mem is not None and mem.numel() != n:
            raise ConfigError(f"{self.spec}: memory {name!r} has {mem.numel()} elements, got a tensor of "
                              f"{n}; pass a distinct name= per gradient tensor")
        idx = self.indices(n).to(flat.device)
        self._step += 1
        if remember and n:
            sub = torch.index_select(flat, 0, idx)  # 3x faster than flat[idx] on a CPU
            if mem is None:  # h_0 = 0: a_0 = g_0, h_1 = g_0 off the selection
                def update():
                    self.memory[name] = flat.clone().index_fill_(0, idx, 0.0)
            else:
                mem = mem.to(flat.device)
                sub.add_(torch.index_select(mem, 0, idx), alpha=self.alpha)  # a_t[S] = (g + alpha h)[S]

                def update():
                    mem.add_(flat).index_add_(0, idx, sub, alpha=-1.0)       # h + g - a_t[S]
                    self.memory[name] = mem
            if commit is None:
                update()
            else:
                commit.append(update)
            return idx, sub
        sub = torch.index_select(flat, 0, idx)  # 3x faster than flat[idx] on a CPU
        if self.scaled and idx.numel():
            sub = sub * (n / idx.numel())
        return idx, sub

    def codec_traffic(self, shape: Sequence[int]):
        """The GPU's kernels of :meth:`compress` / :meth:`decompress`: the finiteness check
        (read 4 n), the selection of the ``K`` shared coordinates (12 bytes a kept value),
        the inner quantizer's over them; decode: the inner decode, the zeroed output (4 n),
        the scatter (16 bytes a kept value). The coordinates themselves are drawn on the
        host's CPU (:meth:`indices`): not a GPU kernel, not priced here."""
        n = numel_of(shape)
        k = self.k_of(n)
        enc, dec = self.inner.codec_traffic((k,))
        return passes(4 * n, 12 * k) + enc, dec + passes(4 * n, 16 * k)

    def compress(self, x: torch.Tensor, *, key=None, norm=None, scale_index=None) -> Payload:
        """Encode the selected coordinates of ``x`` (no memory, see the module
        docstring); ``norm`` / ``scale_index`` are the shared values of the
        selected sub-vector (see :meth:`MaxNormQuantizer.compress`)."""
        check_input(x)
        step = self._step
        _, sub = self._select(x, None)
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

    def allreduce_mean(self, x: torch.Tensor, group=None, *, name: str = "") -> torch.Tensor:
        """Average ``x`` over ``group``: the selected coordinates (with this worker's
        memory of tensor ``name``) through the inner quantizer's allreduce, zeros elsewhere."""
        check_float(x)
        step = self._step
        try:
            check_input(x)
        except ConfigError:  # NaN/Inf here: the inner exchange tells every rank (a +Inf norm)
            sub = torch.full((self.k_of(x.numel()),), float("nan"), dtype=torch.float32, device=x.device)
            self.inner.allreduce_mean(sub, group)  # raises NonFiniteError on every rank
            raise  # (an empty selection exchanges nothing: this rank's own error)
        commit: list = []
        _, sub = self._select(x, name, commit)
        try:
            mean_sub = self.inner.allreduce_mean(sub, group)
        except NonFiniteError:  # another rank's NaN/Inf: nothing of this call is kept
            self._step = step
            raise
        for update in commit:  # the memory moves only once the exchange succeeded
            update()
        return self._scatter(mean_sub, x.shape, step, x.dtype)

    def dp_codec(self, x: torch.Tensor, world_size: int):
        """:meth:`allreduce_mean`'s own local work without its collective: select the
        coordinates (with an error-feedback memory, under a name of its own) and the
        inner quantizer's lane encode; its lane decode, then the scatter back to
        ``x``'s shape. Each call advances the step, as a training step does."""
        check_input(x)
        step = self._step
        _, sub = self._select(x, "dp_codec")  # the memory's first call, outside the timing
        inner = self.inner.dp_codec(sub, world_size)
        if inner is None:
            return None
        inner_encode, inner_decode = inner

        def encode():
            self._select(x, "dp_codec")
            return inner_encode()

        def decode():
            return self._scatter(inner_decode(), x.shape, step, x.dtype)
        return encode, decode

    def state_dict(self) -> dict[str, Any]:
        return {"step": self._step, "inner": self.inner.state_dict(),
                "memory": {k: v.detach().cpu().clone() for k, v in self.memory.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        extra = set(state) - {"step", "inner", "memory"}
        if extra:
            raise ConfigError(f"{self.spec}: unexpected state keys {sorted(extra)}")
        memory = state.get("memory", {})
        if memory and not self.error_feedback:
            raise ConfigError(f"{self.spec}: state holds an error-feedback memory, but the scaled "
                              "variant keeps none (saved with another spec?)")
        self._step = int(state.get("step", 0))
        self.inner.load_state_dict(state.get("inner", {}))
        self.memory = {str(k): torch.as_tensor(v, dtype=torch.float32).reshape(-1).clone()
                       for k, v in memory.items()}

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
