"""The one compressor interface that the simulator and the runtime share.

A :class:`Compressor` turns a tensor into a :class:`Payload` (packed bytes plus
scales / metadata) and back. It knows, *without running*, how many bytes its
payload puts on the wire (:meth:`Compressor.wire_bytes`) and, for data-parallel
gradient exchange, which collectives it needs (:meth:`Compressor.dp_plan`). The
simulator asks these two methods; the runtime executes :meth:`compress`,
:meth:`decompress` and :meth:`allreduce_mean`, which perform exactly the plan.

Compared with GRACE (compressor / memory / communicator), the error-feedback
"memory" lives inside the compressor as explicit, checkpointable state
(:meth:`state_dict` / :meth:`load_state_dict`), and the wire size and the
communication plan are first-class so that a simulator can ask for them.

Randomness (stochastic rounding, random-k indices) is derived from
``(seed, step)`` counters held in the state, so sender and receiver and every
data-parallel worker can agree on it, and a restored run draws the same bits.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from perfsim._lazy import torch

from perfsim.compression.args import SpecArg, complete, format_spec, format_syntax, parse_args
from perfsim.errors import ConfigError, NonFiniteError

# -- collective kinds a dp_plan may contain ---------------------------------
P2P = "p2p"
ALLREDUCE = "allreduce"  # ring allreduce; reduce op in CommStep.reduce
ALLGATHER = "allgather"  # every rank contributes nbytes, receives (N-1)*nbytes
ALLTOALL = "alltoall"  # every rank sends nbytes/N to each peer
BROADCAST = "broadcast"
REDUCE_SCATTER = "reduce_scatter"  # every rank ends with its 1/N of the reduced buffer
COLLECTIVE_KINDS = (P2P, ALLREDUCE, ALLGATHER, ALLTOALL, BROADCAST, REDUCE_SCATTER)


@dataclass(frozen=True)
class CommStep:
    """One collective of a data-parallel exchange, as the simulator models it.

    ``nbytes`` is the size of each rank's *input* buffer to the collective (for an
    allgather: one rank's contribution; for an alltoall: one rank's whole send
    buffer). ``reduce`` is ``sum``, ``max`` or ``min`` for an allreduce.
    """

    kind: str
    nbytes: int
    reduce: str = "sum"
    label: str = ""

    def __post_init__(self):
        if self.kind not in COLLECTIVE_KINDS:
            raise ValueError(f"CommStep.kind={self.kind!r}: not one of {COLLECTIVE_KINDS}")
        if self.nbytes < 0:
            raise ValueError(f"CommStep.nbytes={self.nbytes}: must be >= 0")


@dataclass
class Payload:
    """What one compressor call puts on the wire.

    ``tensors`` are the bytes that travel (packed codes, scales, indices...);
    their total size is :attr:`nbytes` and equals ``Compressor.wire_bytes`` for
    the same shape. ``shape`` / ``dtype`` describe the original tensor; both
    ends know them from the configuration, so they are not counted as wire bytes.
    ``meta`` holds small host-side values that never travel separately (e.g. a
    step counter both sides share).
    """

    tensors: dict[str, torch.Tensor]
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None  # None: float32 (set in __post_init__; no torch at import)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.dtype is None:
            self.dtype = torch.float32

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass(frozen=True)
class CodecPass:
    """One kernel of a compressor's encode or decode on a GPU, for the simulator to price
    (:mod:`perfsim.engine.codec_cost`): a memory-bound pass moving ``nbytes`` (read +
    written), or a GEMM ``(m, n, k)`` in fp32 (PowerSGD's factors)."""

    nbytes: float = 0.0
    gemm: tuple[int, int, int] | None = None


def passes(*nbytes: float) -> tuple[CodecPass, ...]:
    """Memory-bound passes of these byte counts, in order."""
    return tuple(CodecPass(float(b)) for b in nbytes)


def numel_of(shape: Sequence[int]) -> int:
    """Number of elements of a shape (validated)."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ConfigError(f"shape {shape}: negative dimension")
    return math.prod(shape)


def check_float(x: torch.Tensor, name: str = "tensor") -> None:
    """The cheap half of :func:`check_input`: ``x`` is a floating-point tensor.

    For compressors that reduce every bucket anyway (an L2 norm or a max-abs
    scale): NaN/Inf propagate into that reduction, so checking its few values
    replaces a full ``isfinite`` pass over the data, which costs more than a
    whole 4-bit quantizer on a CPU."""
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ConfigError(f"{name}: dtype {x.dtype} is not floating point")


def check_input(x: torch.Tensor, name: str = "tensor") -> None:
    """Reject what no compressor can encode: non-float dtypes and NaN/Inf values.

    Empty tensors are fine (they compress to an empty payload).
    """
    check_float(x, name)
    # A finite sum proves every element finite (NaN/Inf propagate); only an
    # overflowing or non-finite sum needs the full elementwise scan (~30x slower).
    if x.numel() and not bool(torch.isfinite(x.sum())) and not bool(torch.isfinite(x).all()):
        raise ConfigError(f"{name}: contains NaN or Inf; refusing to compress")


#: bytes per element of the torch dtypes sizes are computed for (no torch needed)
ITEMSIZE = {"int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2,
            "bfloat16": 2, "float32": 4, "float64": 8}


def sum_dtype_name(levels: int, world_size: int) -> str:
    """Name of the smallest signed integer dtype that holds the sum of ``world_size``
    codes in ``[-levels, levels]`` without overflow (the multi-scale paper, App. A,
    sums int8 codes; with many workers that overflows silently -- we widen instead)."""
    bound = int(levels) * int(world_size)
    for name, limit in (("int8", 127), ("int16", 32767), ("int32", 2**31 - 1)):
        if bound <= limit:
            return name
    return "int64"


def sum_dtype_for(levels: int, world_size: int) -> torch.dtype:
    """The torch dtype :func:`sum_dtype_name` names."""
    return getattr(torch, sum_dtype_name(levels, world_size))


class Compressor(ABC):
    """Base class of every compressor. Subclasses set the class attributes and
    implement ``wire_bytes``, ``compress`` and ``decompress``.

    Class attributes:
      name: registry name (``directq``).
      spec_args: the spec's arguments (:class:`perfsim.compression.args.SpecArg`),
        from which the base parses ``name:arg1:arg2`` (:meth:`from_args`), fills
        defaults (:meth:`from_values`) and writes the canonical :attr:`spec`
        (:meth:`canonical_spec`, which each constructor stores). Each argument
        names a constructor parameter.
      spec_syntax: how to write it on the command line (``directq:BITS[:det][:bucket=N]``);
        derived from ``spec_args`` unless a class sets it.
      example_spec: a representative spec (``perfsim compressors`` lists it).
      allreduce_compatible: payloads of several workers can be summed in the
        compressed domain (integer codes on a shared scale). Otherwise the
        data-parallel exchange needs an allgather (or, for 1-bit, the 3-phase
        compressed allreduce).
      stateful: keeps state across calls (error feedback, message buffers).
      reduce_scatter_compatible: the summed payload can be split into chunks that are
        each rank's shard of the gradient, so the sum-allreduce of :meth:`dp_plan`
        becomes a reduce-scatter (ZeRO-2/3, :meth:`reduce_scatter_plan`); otherwise
        :attr:`reduce_scatter_reason` says why not.
    """

    name: ClassVar[str] = ""
    spec_syntax: ClassVar[str] = ""
    example_spec: ClassVar[str] = ""
    allreduce_compatible: ClassVar[bool] = False
    reduce_scatter_compatible: ClassVar[bool] = False
    reduce_scatter_reason: ClassVar[str] = ("its payloads carry per-worker scales or indices, so "
                                            "they cannot be summed chunk by chunk (it all-gathers them)")
    stateful: ClassVar[bool] = False
    spec_args: ClassVar[tuple[SpecArg, ...]] = ()
    #: the float32 payload tensor (per-bucket scales) through which the default
    #: :meth:`allreduce_mean` tells every rank that one rank's input was NaN/Inf (+Inf
    #: scales); None: that rank raises alone
    refusal_lane: ClassVar[str | None] = None

    #: the canonical spec this instance was built from (``directq:4``)
    spec: str = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name and "spec_syntax" not in cls.__dict__:
            cls.spec_syntax = format_syntax(cls.name, cls.spec_args)

    # ------------------------------------------------------------- building
    @classmethod
    def from_args(cls, args: Sequence[str], **context) -> "Compressor":
        """Build from the arguments of a spec (``["4", "det"]`` of ``directq:4:det``),
        parsed and checked by :attr:`spec_args`. ``context`` (``seed=``) goes to
        the constructor."""
        values = parse_args(cls.name, cls.spec_args, args, syntax=cls.spec_syntax,
                            example=cls.example_spec)
        return cls.from_values(values, **context)

    @classmethod
    def from_values(cls, values: Mapping[str, Any] | None = None, **context) -> "Compressor":
        """Build from typed argument values by name (``{"bits": 4}``); the others
        take their :attr:`spec_args` defaults. Default: ``cls(**values, **context)``."""
        return cls(**complete(cls.spec_args, values or {}), **context)

    def spec_values(self) -> dict[str, Any]:
        """This instance's value of every :attr:`spec_args` argument, by name
        (default: the attribute of that name)."""
        return {a.name: getattr(self, a.name) for a in self.spec_args}

    def canonical_spec(self) -> str:
        """The canonical spec of this instance's values (each checked against
        :attr:`spec_args`): what :attr:`spec` holds."""
        return format_spec(self.name, self.spec_args, self.spec_values())

    # ------------------------------------------------------------- sizes
    @abstractmethod
    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        """Exact bytes one :meth:`compress` of a tensor of ``shape`` puts on the
        wire. ``warmup=True`` asks for the algorithm's uncompressed phase (AQ-SGD's
        first visit of a sample, 1-bit Adam's warm-up); for most compressors it
        is the same number."""

    def payload_nbytes(self, shape: Sequence[int], *, key: torch.Tensor | None = None) -> int:
        """Exact bytes the *next* :meth:`compress` (or :meth:`decompress`) of a tensor
        of ``shape`` with this ``key`` moves, as this instance's current state
        tells -- so a receiver can size a buffer before the payload arrives
        (execute mode pre-posts its pipeline receives). Default: ``wire_bytes``;
        compressors whose size depends on state (AQ-SGD's first visits) override it."""
        return self.wire_bytes(shape)

    def codec_traffic(self, shape: Sequence[int]) -> tuple[tuple[CodecPass, ...], tuple[CodecPass, ...]]:
        """(encode, decode) kernels of one :meth:`compress` / :meth:`decompress` of an fp32
        tensor of ``shape`` on a GPU, each a :class:`CodecPass` (bytes read + written, or a
        GEMM): what the simulator prices a codec with on a GPU no profile timed. Default:
        one fused pass each way, as the Triton ``quantize_pack`` / ``unpack_dequantize``
        (:mod:`perfsim.kernels.quant`) and a dtype cast run: read the fp32 tensor, write the
        payload; read the payload, write fp32 (``benchmarks/bench_kernels.py`` counts the
        same minimum bytes). Compressors with more passes override it."""
        n, wire = numel_of(shape), self.wire_bytes(shape)
        return passes(4 * n + wire), passes(wire + 4 * n)

    def ratio(self, shape: Sequence[int]) -> float:
        """Wire bytes relative to sending the tensor as fp32."""
        n = numel_of(shape)
        return self.wire_bytes(shape) / (4 * n) if n else 1.0

    # ------------------------------------------------------------- data path
    @abstractmethod
    def compress(self, x: torch.Tensor, *, key: torch.Tensor | None = None) -> Payload:
        """Encode ``x``. ``key`` carries per-row sample ids for compressors that
        keep per-sample state (AQ-SGD); others ignore it."""

    @abstractmethod
    def decompress(self, payload: Payload, *, key: torch.Tensor | None = None) -> torch.Tensor:
        """Decode a payload back to a tensor of ``payload.shape``."""

    # ------------------------------------------------------------- data parallel
    def dp_plan(self, shape: Sequence[int], world_size: int) -> list[CommStep]:
        """The collectives that :meth:`allreduce_mean` performs for one gradient
        tensor of ``shape`` over ``world_size`` workers.

        Default: allreduce-compatible compressors allreduce their payload; the
        others allgather it (volume received grows with ``world_size - 1``).
        Compressors with side collectives (shared max-norm, scale sharing) or a
        3-phase exchange override this.
        """
        kind = ALLREDUCE if self.allreduce_compatible else ALLGATHER
        return [CommStep(kind, self.wire_bytes(shape), label=self.name)]

    def reduce_scatter_plan(self, shape: Sequence[int], world_size: int) -> list[CommStep]:
        """The collectives of a ZeRO-2/3 gradient exchange of ``shape``: :meth:`dp_plan`
        with its sum-allreduce of the payload as a reduce-scatter (each rank keeps the
        ``1/world_size`` chunk of the sum that is its shard; side allreduces of shared
        scales stay). Raises ConfigError naming the compressor where that is impossible."""
        if not self.reduce_scatter_compatible:
            raise ConfigError(f"grad_compress {self.spec or self.name!r}: cannot reduce-scatter ZeRO-2/3 "
                              f"gradients: {self.reduce_scatter_reason}")
        return [CommStep(REDUCE_SCATTER, st.nbytes, st.reduce, st.label)
                if st.kind == ALLREDUCE and st.reduce == "sum" else st
                for st in self.dp_plan(shape, world_size)]

    def allreduce_mean(self, x: torch.Tensor, group=None) -> torch.Tensor:
        """Average ``x`` over the data-parallel ``group`` through this compressor,
        performing exactly :meth:`dp_plan`'s collectives with torch.distributed.

        Default (allgather): every worker compresses, payload tensors are
        allgathered, each is decompressed and the results are averaged. A worker
        whose input is NaN/Inf sends +Inf in :attr:`refusal_lane` (where set): every
        worker raises :class:`perfsim.errors.NonFiniteError`, its state unchanged.
        """
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

        world = dist.get_world_size(group)
        lane = self.refusal_lane
        saved = self.state_dict() if lane else None
        refused = False
        try:
            payload = self.compress(x)
        except ConfigError:
            if not lane or not x.numel() or bool(torch.isfinite(x).all()):
                raise
            # NaN/Inf here: send a payload of the exact sizes with +Inf scales, so every rank
            # refuses after the same all-gathers (perfsim.runtime.nonfinite)
            payload = self.compress(torch.zeros_like(x))
            payload.tensors[lane] = torch.full_like(payload.tensors[lane], float("inf"))
            refused = True
        gathered: list[dict[str, torch.Tensor]] = [dict() for _ in range(world)]
        for key, t in payload.tensors.items():
            raw = t.contiguous().reshape(-1).view(torch.uint8)  # as bytes: gloo has no int16 (top-k indices)
            parts = [torch.empty_like(raw) for _ in range(world)]
            dist.all_gather(parts, raw, group=group)
            for rank, part in enumerate(parts):
                gathered[rank][key] = part.view(t.dtype).view(t.shape)
        if lane and (refused or not all(bool(torch.isfinite(g[lane]).all()) for g in gathered)):
            self.load_state_dict(saved)  # the random counters as before the call
            raise NonFiniteError(f"{self.spec}: NaN/Inf values on a rank; nothing exchanged", local=refused)
        total = torch.zeros(payload.shape, dtype=x.dtype, device=x.device)
        for tensors in gathered:
            total += self.decompress(Payload(tensors, payload.shape, payload.dtype, dict(payload.meta)))
        return total / world

    def dp_codec(self, x: torch.Tensor, world_size: int):
        """The local work of one :meth:`allreduce_mean` of ``x`` over ``world_size``
        workers, without its collectives, as ``(encode, decode)`` callables for
        calibration to time (``dp_encode`` / ``dp_decode`` records, preferred by the
        simulator's gradient buckets); None where that work is :meth:`compress` and
        :meth:`decompress` (the default exchange), priced by their own records."""
        return None

    # ------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit-identically (buffers, error feedback,
        random counters). Stateless compressors return ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ConfigError(f"{self.spec or self.name}: unexpected state keys {sorted(state)}")

    def release(self) -> None:
        """Free what outlives the process (files on disk) once no resume can need it:
        ``perfsim run`` calls it when a run completed. Most compressors hold nothing."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec or self.name!r})"


class SeedStepState:
    """Mixin: checkpointable state of compressors whose only state is the random
    counter ``(seed, step)`` (DirectQ, top-k)."""

    seed: int = 0
    step: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"step", "seed"}
        if unknown:
            raise ConfigError(f"{self.spec}: unexpected state keys {sorted(unknown)}")
        self.step = int(state.get("step", 0))
        self.seed = int(state.get("seed", self.seed))
