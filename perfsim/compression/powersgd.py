"""PowerSGD (Vogels et al. 2019) through torch's built-in DDP communication hook.

``powersgd:RANK[:start=ITER][:min_rate=R]``. The compression itself is *not*
reimplemented: it is ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``
with a ``PowerSGDState(matrix_approximation_rank=RANK,
start_powerSGD_iter=ITER, min_compression_rate=R)``. This class only knows what
that hook puts on the wire, so the simulator can ask:

* a gradient of shape ``(n, *rest)`` is viewed as an ``n x m`` matrix,
  ``m = prod(rest)`` (the hook's ``tensor.view(tensor.shape[0], -1)``), with
  rank ``r = min(n, m, RANK)``; it is compressed when the hook's
  ``_should_compress`` says so -- ``(n + m) r * min_rate < n m`` -- and then
  costs two fp32 allreduces, ``P`` (``n r`` floats) and ``Q`` (``m r`` floats),
  i.e. ``(n + m) r * 4`` bytes;
* otherwise (1-D tensors such as biases, small matrices) the tensor is
  allreduced uncompressed in fp32, as the hook does;
* during the first ``start`` iterations the hook runs a plain allreduce
  (``wire_bytes(..., warmup=True)``). torch requires ``start >= 2`` with error
  feedback / warm start (its defaults, kept here); perfsim's default is 2.

``compress`` / ``decompress`` of a single tensor are not offered -- PowerSGD runs
only inside the collective (both power-iteration halves are allreduces); they
raise a ConfigError saying so. Use :meth:`register_ddp_hook` on a
``DistributedDataParallel`` model, or :meth:`allreduce_mean`, which feeds one
tensor through the very same hook function (a one-tensor gradient bucket).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from perfsim._lazy import torch

from perfsim.compression.base import ALLREDUCE, CodecPass, CommStep, Compressor, Payload, check_input, numel_of
from perfsim.compression.args import SpecArg
from perfsim.compression.registry import register
from perfsim.errors import ConfigError


class _OneTensorBucket:
    """The part of ``torch.distributed.GradBucket`` that ``powerSGD_hook`` uses
    (GradBucket has no Python constructor): a flat buffer and its one gradient view."""

    def __init__(self, tensor: torch.Tensor, index: int):
        self._buffer = tensor.detach().reshape(-1).to(torch.float32).clone()
        self._grads = [self._buffer.view(tensor.shape)]
        self._index = index

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._grads

    def index(self):
        return self._index

    def is_last(self):
        return True

    def parameters(self):  # pragma: no cover - only used by stats logging of some versions
        return []


@register
class PowerSGD(Compressor):
    """PowerSGD rank-``RANK`` low-rank compression, via torch's ``powerSGD_hook``."""

    name = "powersgd"
    example_spec = "powersgd:4"
    allreduce_compatible = True  # P and Q are plain fp32 allreduces
    reduce_scatter_reason = "its low-rank factors P and Q are all-reduced whole, not reduce-scattered"
    stateful = True

    spec_args = (
        SpecArg("rank", low=1),
        SpecArg("start", key=True, default=2, low=2, metavar="ITER",
                note="torch's PowerSGD needs it with error feedback"),
        SpecArg("min_rate", float, key=True, default=2.0, low=0, low_open=True, metavar="R"),
    )

    def __init__(self, rank: int, start: int, min_rate: float, seed: int = 0):
        self.rank, self.start, self.min_rate, self.seed = int(rank), int(start), float(min_rate), int(seed)
        self._state = None  # PowerSGDState, created on first use (needs a process group)
        self._indices: dict[tuple, int] = {}
        self.spec = self.canonical_spec()

    # ------------------------------------------------------------ sizes
    def matrix_plan(self, shape: Sequence[int]) -> tuple[bool, int, int, int]:
        """(compressed?, n, m, r) exactly as ``powerSGD_hook`` decides for one tensor."""
        shape = tuple(int(d) for d in shape)
        numel = numel_of(shape)
        if numel == 0 or not shape:
            return False, numel, 1, 0
        n = shape[0]
        m = numel // n
        r = min(n, m, self.rank)
        compress = (n + m) * r * self.min_rate < n * m  # torch's _should_compress
        return compress, n, m, r

    def codec_traffic(self, shape: Sequence[int]):
        """One tensor through torch's ``powerSGD_hook`` (Vogels et al., "PowerSGD",
        arXiv:1905.13727, Alg. 1, with error feedback): encode adds the error (12 bytes a
        value), keeps a copy of the input (8), ``P = M Q`` (a GEMM), orthogonalises ``P``
        (a pass over its ``n r`` values), ``Q = M^T P`` (a GEMM); decode is ``P Q^T`` written
        into the tensor (a GEMM) and the new error (12). A tensor it leaves uncompressed:
        nothing. A flat tensor (a gradient bucket seen whole) as the near-square matrix of
        its values: the two GEMMs' work ``2 n m r`` is the same for any shape of ``n m``
        values, their efficiency is not (an approximation)."""
        shape = tuple(int(d) for d in shape)
        if len(shape) == 1 and shape[0] > 1:
            rows = max(1, math.isqrt(shape[0]))
            shape = (rows, shape[0] // rows)
        ok, n, m, r = self.matrix_plan(shape)
        if not ok:
            return (), ()
        v = n * m
        return ((CodecPass(12 * v), CodecPass(8 * v), CodecPass(gemm=(n, r, m)), CodecPass(8 * n * r),
                 CodecPass(gemm=(m, r, n))),
                (CodecPass(gemm=(n, m, r)), CodecPass(12 * v)))

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        ok, n, m, r = self.matrix_plan(shape)
        if warmup or not ok:
            return 4 * numel_of(shape)
        return 4 * (n + m) * r

    def dp_plan(self, shape: Sequence[int], world_size: int) -> list[CommStep]:
        """Uncompressed tensors: one fp32 allreduce; matrices: allreduce P, then Q."""
        ok, n, m, r = self.matrix_plan(shape)
        if not ok:
            return [CommStep(ALLREDUCE, 4 * numel_of(shape), "sum", f"{self.spec} uncompressed")]
        return [CommStep(ALLREDUCE, 4 * n * r, "sum", f"{self.spec} P"),
                CommStep(ALLREDUCE, 4 * m * r, "sum", f"{self.spec} Q")]

    def warmup_plan(self, shape: Sequence[int]) -> list[CommStep]:
        """What the hook does during its first ``start`` iterations: a plain allreduce."""
        return [CommStep(ALLREDUCE, 4 * numel_of(shape), "sum", f"{self.spec} warm-up allreduce")]

    # ------------------------------------------------------------ data path
    def compress(self, x: torch.Tensor, *, key=None) -> Payload:
        raise ConfigError("powersgd: PowerSGD runs only as a DDP communication hook "
                          "(torch's powerSGD_hook): use PowerSGD.register_ddp_hook(model) or "
                          "allreduce_mean(x, group); there is no single-tensor compress/decompress")

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        raise ConfigError("powersgd: PowerSGD runs only as a DDP communication hook; no decompress")

    def make_state(self, process_group=None):
        """torch's ``PowerSGDState`` for this spec (error feedback and warm start on)."""
        # lazy: torch is heavy, needed only here
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        return ps.PowerSGDState(process_group=process_group, matrix_approximation_rank=self.rank,
                                start_powerSGD_iter=self.start, min_compression_rate=self.min_rate,
                                use_error_feedback=True, warm_start=True, random_seed=self.seed)

    def register_ddp_hook(self, ddp_model, process_group=None):
        """Register torch's ``powerSGD_hook`` on a ``DistributedDataParallel`` model; returns the state."""
        # lazy: torch is heavy, needed only here
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        state = self.make_state(process_group)
        ddp_model.register_comm_hook(state, ps.powerSGD_hook)
        return state

    def allreduce_mean(self, x: torch.Tensor, group=None, *, name: str | None = None) -> torch.Tensor:
        """Mean of ``x`` over ``group`` through torch's ``powerSGD_hook`` (one-tensor bucket).

        Each distinct ``name`` (default: the shape) gets its own bucket index, so
        its error-feedback and warm-start buffers persist across calls. The hook's
        iteration counter advances once per call (it counts buckets marked last)."""
        # lazy: torch is heavy, needed only here
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        check_input(x)
        if self._state is None:
            self._state = self.make_state(group)
        elif self._state.process_group is None and group is not None:
            self._state.process_group = group  # restored from a checkpoint
        key = (name,) if name is not None else tuple(x.shape)
        index = self._indices.setdefault(key, len(self._indices))
        bucket = _OneTensorBucket(x, index)
        out = ps.powerSGD_hook(self._state, bucket).wait()
        if isinstance(out, (list, tuple)):
            out = out[0]
        return out.view(x.shape).to(x.dtype)

    def state_dict(self) -> dict[str, Any]:
        """The hook's error-feedback and warm-start buffers and its iteration counter."""
        if self._state is None:
            return {}
        s = self._state
        return {"iter": s.iter, "indices": dict(self._indices), "rng": s.rng.get_state(),
                "error": {k: v.clone() for k, v in s.error_dict.items()},
                "p": {k: v.clone() for k, v in s.p_memory_dict.items()},
                "q": {k: v.clone() for k, v in s.q_memory_dict.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        extra = set(state) - {"iter", "indices", "rng", "error", "p", "q"}
        if extra:
            raise ConfigError(f"{self.spec}: unexpected state keys {sorted(extra)}")
        self._state = self.make_state(None)
        self._state.iter = int(state["iter"])
        self._indices = dict(state["indices"])
        if "rng" in state:
            self._state.rng.set_state(state["rng"])
        self._state.error_dict = {k: v.clone() for k, v in state["error"].items()}
        self._state.p_memory_dict = {k: v.clone() for k, v in state["p"].items()}
        self._state.q_memory_dict = {k: v.clone() for k, v in state["q"].items()}
