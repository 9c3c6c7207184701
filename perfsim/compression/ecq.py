"""ECQ-SGD: error-compensated quantized SGD (Wu et al., "Error Compensated Quantized
SGD and its Applications to Large-scale Distributed Optimization", arXiv:1806.08054,
Sec. 4, eq. 5-9).

``ecq:BITS[:alpha=A][:beta=B][:bucket=D]`` (defaults from the paper's CIFAR-10
setting, Sec. 6 footnote: ``alpha=0.01``, ``beta=1.0``, L2 norm; the bucket is
:func:`perfsim.compression.qsgd.default_chunk` -- 512 for 4 bits -- rather than
the paper's 4096 with 4 levels, see there).

Each worker keeps the accumulated quantization error ``h`` (eq. 5 / 6)::

    g~_t = Q(g_t + alpha * h_t)                     (eq. 7)
    h_{t+1} = beta * h_t + (g_t - g~_t)             (eq. 6),  h_0 = 0
    i.e. h_t = sum_{t'<t} beta^(t-1-t') (g_t' - g~_t')   (eq. 5)

with ``Q`` the QSGD quantizer on the L2 norm of each bucket, ``s`` levels
(eq. 8-9; ``s = 2**(BITS-1) - 1`` so the ``r = ceil(log2(2s+1))`` bit codes of
Sec. 4 fill ``BITS`` bits). The payload is the same as ``qsgd``'s: one fp32
norm per bucket plus densely packed codes.

Not allreduce-compatible: Alg. 1 *broadcasts* each worker's quantized gradient
and every worker averages what it receives; the norms (hence the grids) differ
per worker and per step, so codes cannot be added -- the exchange is an
allgather (the default :meth:`Compressor.allreduce_mean`).

State: ``h`` is kept per gradient tensor, keyed by ``name`` (pass
``name=`` to :meth:`compress` / :meth:`allreduce_mean` when one instance serves
several tensors; the default name is ``""``). ``state_dict`` holds every ``h``
and the random step counter; a restored compressor continues bit-identically.
"""

from __future__ import annotations

from typing import Any, Sequence

from perfsim._lazy import torch

from perfsim.compression.args import SpecArg
from perfsim.compression.base import Payload, check_float, numel_of, passes
from perfsim.compression.qsgd import (BITS_ARG, BucketQuantizer, _SeededCompressor, chunk_for_bits, decode_passes,
                                      flat_f32, levels_for_bits, stochastic_passes, to_dtype_saturating)
from perfsim.kernels._workspace import workspace
from perfsim.compression.registry import register
from perfsim.errors import ConfigError, NonFiniteError


@register
class ECQ(_SeededCompressor):
    """ECQ-SGD quantizer with accumulated, decayed error feedback (eq. 5-9)."""

    name = "ecq"
    example_spec = "ecq:4"
    allreduce_compatible = False
    stateful = True

    spec_args = (
        BITS_ARG,
        SpecArg("alpha", float, key=True, default=0.01, low=0, high=2, note="eq. 7; at most 1 + beta", metavar="A"),
        SpecArg("beta", float, key=True, default=1.0, low=0, high=1, note="eq. 5", metavar="B"),
        SpecArg("bucket", key=True, default=chunk_for_bits, low=0, note="0 = whole tensor", metavar="D"),
    )

    def __init__(self, bits: int, alpha: float, beta: float, bucket: int, seed: int = 0):
        self.bits, self.alpha, self.beta, self.bucket = int(bits), float(alpha), float(beta), int(bucket)
        if self.alpha > 1 + self.beta:  # Q unbiased (eq. 8-9): E[h_t+1] = (beta - alpha) h_t by eq. 6-7
            raise ConfigError(f"ecq: alpha={alpha:g} with beta={beta:g}: alpha must be <= 1 + beta (the expected "
                              f"error h grows by |beta - alpha| = {abs(self.beta - self.alpha):g} per step beyond it)")
        self.s = levels_for_bits(self.bits)
        self.q = BucketQuantizer(self.s, self.bits, self.bucket)
        self.seed, self._step, self._salt = int(seed), 0, 0
        self.h: dict[str, torch.Tensor] = {}
        self.spec = self.canonical_spec()

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        return self.q.wire_bytes(numel_of(shape))

    def codec_traffic(self, shape: Sequence[int]):
        """ECQ-SGD (Wu et al., "Error Compensated Quantized SGD", arXiv:1806.08054, eqs. 6-7)
        as :meth:`compress` runs it: ``g + alpha h`` (12 n), the QSGD encode's passes
        (:func:`perfsim.compression.qsgd.stochastic_passes`, norms, packing), the decode of
        ``g~`` into the scratch (:func:`~perfsim.compression.qsgd.decode_passes` without
        the unpacking), ``g - g~`` (12 n), ``h <- beta h`` (8 n, when beta is not 1) and
        ``h += g - g~`` (12 n); decode: as QSGD's."""
        n, wire = numel_of(shape), self.wire_bytes(shape)
        dec = decode_passes(n, wire)
        enc = (12 * n, 4 * n, *stochastic_passes(n), n + wire, *dec[1:], 12 * n,
               *((8 * n,) if self.beta != 1.0 else ()), 12 * n)
        return passes(*enc), passes(*dec)

    def error(self, name: str = "") -> torch.Tensor | None:
        """A copy of the accumulated error ``h`` of tensor ``name`` (None before its first step)."""
        h = self.h.get(name)
        return None if h is None else h.clone()

    def compress(self, x: torch.Tensor, *, key=None, name: str = "") -> Payload:
        """Quantize ``x + alpha h`` (eq. 7) and update ``h`` in place (eq. 6).

        Passes: ``g + alpha h`` (scratch), the quantizer's (norms, scaling,
        rounding, packing), the decode of ``g~`` into scratch, ``g - g~`` and the
        update of ``h``; no temporaries of the tensor's size are allocated."""
        tensors, commit = self._encode(x, name)
        commit()
        return Payload(tensors, tuple(x.shape), x.dtype, {"name": name})

    def _check_h(self, x: torch.Tensor, name: str) -> None:
        h = self.h.get(name)
        if h is not None and h.numel() != x.numel():
            raise ConfigError(f"{self.spec}: error buffer {name!r} has {h.numel()} elements, got a tensor of "
                              f"{x.numel()}; pass a distinct name= per gradient tensor")

    def _encode(self, x: torch.Tensor, name: str):
        """(payload tensors, the update of ``h`` as a callable, eq. 6): :meth:`compress`
        runs it at once, :meth:`allreduce_mean` once the exchange succeeded."""
        check_float(x)
        self._check_h(x, name)
        g = flat_f32(x)
        n = g.numel()
        h = self.h.get(name)
        buf = workspace("ecq_t", n, torch.float32, g.device)  # the one float scratch
        t = g
        if h is not None and self.alpha != 0.0:
            t = torch.add(g, h, alpha=self.alpha, out=buf)
        norms, codes = self.q.encode(t, self._next_key(), self.spec, out=buf)  # y in place of t
        tensors = self.q.pack(norms, codes)
        diff = self.q.decode(codes, norms, buf)  # g~
        torch.sub(g, diff, out=diff)  # g - g~

        def commit():
            if h is None:
                self.h[name] = diff.clone()  # h_1 = beta * 0 + (g - g~)
            else:
                if self.beta != 1.0:
                    h.mul_(self.beta)
                h.add_(diff)
        return tensors, commit

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        n = numel_of(payload.shape)
        device = payload.tensors["codes"].device if "codes" in payload.tensors else None
        return to_dtype_saturating(self.q.decompress(payload.tensors, n, device).reshape(payload.shape),
                                   payload.dtype)

    def allreduce_mean(self, x: torch.Tensor, group=None, *, name: str = "") -> torch.Tensor:
        """Alg. 1: every worker's quantized gradient to every worker (allgather), averaged.
        A NaN/Inf input is sent as Inf norms (:meth:`BucketQuantizer.refusal`): every
        rank raises :class:`perfsim.errors.NonFiniteError`, ``h`` and the step unchanged."""
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

        self._set_rank_salt(group)
        world = dist.get_world_size(group)
        check_float(x)
        self._check_h(x, name)
        step = self._step
        shape = tuple(x.shape)
        try:
            tensors, commit = self._encode(x, name)
        except ConfigError:  # NaN/Inf or a norm beyond float32: Inf norms tell every rank
            tensors, commit = self.q.refusal(x.numel(), x.device), None
        try:
            every = self.q.allgather(tensors, group, self.spec, refused=commit is None)
        except NonFiniteError:  # h and the step counter stay as they were
            self._step = step
            raise
        commit()  # eq. 6, once every rank's payload is in
        total = torch.zeros(shape, dtype=torch.float32, device=x.device)
        for tensors in every:
            total += self.decompress(Payload(tensors, shape, torch.float32))
        return to_dtype_saturating(total / world, x.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self._step, "h": {k: v.clone() for k, v in self.h.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        extra = set(state) - {"step", "h"}
        if extra:
            raise ConfigError(f"{self.spec}: unexpected state keys {sorted(extra)}")
        self._step = int(state.get("step", 0))
        self.h = {str(k): torch.as_tensor(v, dtype=torch.float32).clone() for k, v in state.get("h", {}).items()}
