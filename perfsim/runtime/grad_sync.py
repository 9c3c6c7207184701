"""Data-parallel gradient synchronisation through the compression library.

Two entry points share one bucketing scheme and one per-bucket state:

* **DDP communication hooks** a user can register on their own
  ``DistributedDataParallel`` model::

      state = attach(ddp_model, "qsgd-maxnorm:4")            # registers the hook
      ...; loss.backward(); opt.step()
      ckpt["grad_sync"] = state.state_dict()                 # every error-feedback state

  or, by hand: ``state, hook = compression_hook("ecq:2"); ddp.register_comm_hook(state, hook)``.
  The hook averages each gradient bucket with ``compressor.allreduce_mean(bucket,
  group)``, which performs exactly the compressor's ``dp_plan`` (the collectives
  the simulator models). One compressor per bucket, so error feedback (ECQ-SGD)
  is kept per bucket and checkpointed per bucket.

* :func:`sync_gradients` for pipeline stages, which are not DDP modules: after a
  pipeline flush each stage averages its gradients over its data-parallel group
  with the same buckets and compressors (``pp x dp`` runs).

Specs (``--grad-compress``): ``none``/``fp32`` (plain allreduce), ``fp16``, ``bf16``,
``qsgd-maxnorm:BITS``, ``qsgd-maxnorm-multiscale:BITS``, ``randk-maxnorm:FRACTION:BITS``,
``ecq:BITS``, ``qsgd:BITS`` (any registered compressor spec works), ``powersgd:RANK
[:start=N]`` -- torch's own PowerSGD hook (Vogels et al. 2019) as the baseline,
not a re-implementation -- and ``onebit-adam[:warmup=N]`` / ``onebit-lamb[:warmup=N]``,
for which gradients are *not* averaged here: the 1-bit optimizers
(:mod:`perfsim.runtime.onebit_optim`) exchange compressed momentum themselves, so
the hook is a no-op (local gradients pass through).

Buckets follow DDP's convention (reverse parameter order, a 25 MB cap,
``DistributedDataParallel(bucket_cap_mb=25)``); a bucket is identified by the
names of its first and last parameter and its length, which stays valid across
DDP's bucket rebuild after the first iteration and across a resume.
"""

from __future__ import annotations

import copy
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from perfsim.errors import ConfigError

STATE_FORMAT = "perfsim-gradsync"
STATE_VERSION = 1
DEFAULT_BUCKET_CAP_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb=25
ONEBIT_OPTIMIZERS = ("onebit-adam", "onebit-lamb")


# ----------------------------------------------------------------- spec parsing
@dataclass(frozen=True)
class GradSpec:
    """A parsed ``--grad-compress`` spec.

    kind: ``compressor`` (a compression-library compressor averages each bucket),
      ``powersgd`` (torch's PowerSGD hook) or ``optimizer`` (a 1-bit optimizer
      exchanges momentum; gradients are not synchronised here).
    text: the spec as given (canonical lower case).
    compressor: compressor spec for ``kind == "compressor"`` (``fp32`` for none).
    rank: PowerSGD matrix approximation rank.
    start_iter: PowerSGD's vanilla-allreduce iterations before compressing
      (torch requires >= 2 with error feedback).
    optimizer: ``onebit-adam`` / ``onebit-lamb`` for ``kind == "optimizer"``.
    warmup: 1-bit optimizer warm-up steps (None: the optimizer's default).
    exchange: what the 1-bit optimizer compresses: ``preconditioned`` (momentum
      divided by the frozen Adam denominator) or ``momentum`` (the papers' exact
      choice); None: the optimizer's default. See :mod:`perfsim.runtime.onebit_optim`.
    """

    kind: str
    text: str
    compressor: str = ""
    rank: int = 0
    start_iter: int = 2
    optimizer: str = ""
    warmup: int | None = None
    exchange: str | None = None

    def __post_init__(self):
        if self.kind not in ("compressor", "powersgd", "optimizer"):
            raise ValueError(f"GradSpec.kind={self.kind!r}: not compressor/powersgd/optimizer")
        if self.kind == "powersgd" and (self.rank < 1 or self.start_iter < 2):
            raise ConfigError(f"grad compression {self.text!r}: rank must be >= 1 and start >= 2")
        if self.warmup is not None and self.warmup < 0:
            raise ConfigError(f"grad compression {self.text!r}: warmup must be >= 0")


def _kv(arg: str, spec: str, allowed: Sequence[str]) -> tuple[str, str]:
    if "=" not in arg:
        raise ConfigError(f"grad compression {spec!r}: expected key=value, got {arg!r}")
    key, value = arg.split("=", 1)
    if key not in allowed:
        raise ConfigError(f"grad compression {spec!r}: unknown option {key!r} "
                          f"(known: {', '.join(allowed)})")
    return key, value


def _int(value: str, spec: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"grad compression {spec!r}: {what}={value!r} is not an integer") from None


def parse_grad_spec(spec: str) -> GradSpec:
    """Parse a data-parallel gradient compression spec (see the module docstring).

    Compressor specs are validated by building one compressor, so a bad bit
    width fails here, naming the spec.
    """
    if isinstance(spec, GradSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"grad compression {spec!r}: empty")
    text = spec.strip().lower()
    name, *args = text.split(":")
    if name in ONEBIT_OPTIMIZERS:
        warmup, exchange = None, None
        for arg in args:
            key, value = _kv(arg, spec, ("warmup", "exchange"))
            if key == "warmup":
                warmup = _int(value, spec, "warmup")
            elif value in ("preconditioned", "momentum"):
                exchange = value
            else:
                raise ConfigError(f"grad compression {spec!r}: exchange={value!r} "
                                  "(choose preconditioned or momentum)")
        return GradSpec("optimizer", text, optimizer=name, warmup=warmup, exchange=exchange)
    if name == "powersgd":
        if not args:
            raise ConfigError(f"grad compression {spec!r}: powersgd needs a rank, e.g. powersgd:2")
        rank = _int(args[0], spec, "rank")
        start = 2
        for arg in args[1:]:
            _, value = _kv(arg, spec, ("start",))
            start = _int(value, spec, "start")
        return GradSpec("powersgd", text, rank=rank, start_iter=start)
    if name == "none":
        text = "fp32"
    from perfsim.compression import make_compressor

    make_compressor(text)  # validates; raises ConfigError naming the spec
    return GradSpec("compressor", text, compressor=text)


# ----------------------------------------------------------------- buckets
def _bucket_key(names: Sequence[str], numel: int) -> str:
    return f"{names[0]}..{names[-1]}:{numel}" if names else f"empty:{numel}"


def make_buckets(sizes: Sequence[tuple[str, int, int]],
                 cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES) -> list[list[int]]:
    """Group parameters into buckets like DDP: reverse order (gradients become
    ready roughly back to front), closing a bucket once it reaches ``cap_bytes``.
    ``sizes`` holds ``(name, numel, element_size)``; returns lists of indices."""
    if cap_bytes <= 0:
        raise ConfigError(f"bucket cap {cap_bytes}: must be > 0 bytes")
    buckets: list[list[int]] = []
    cur: list[int] = []
    cur_bytes = 0
    for i in reversed(range(len(sizes))):
        cur.append(i)
        cur_bytes += sizes[i][1] * sizes[i][2]
        if cur_bytes >= cap_bytes:
            buckets.append(cur)
            cur, cur_bytes = [], 0
    if cur:
        buckets.append(cur)
    return buckets


class _FlatBucket:
    """Duck-typed ``torch.distributed.GradBucket`` over a flat buffer, so torch's
    PowerSGD hook can run on pipeline-stage gradients outside DDP."""

    def __init__(self, index: int, count: int, buffer: torch.Tensor, shapes: list[torch.Size],
                 params: list[torch.Tensor]):
        self._index, self._count, self._buffer = index, count, buffer
        self._params = params
        views, offset = [], 0
        for shape in shapes:
            n = shape.numel()
            views.append(buffer[offset:offset + n].view(shape))
            offset += n
        self._views = views

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def is_last(self) -> bool:
        return self._index == self._count - 1

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer.copy_(tensor)


# ----------------------------------------------------------------- state
def _world(group) -> int:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


class GradSync:
    """Per-bucket gradient-averaging state (the ``state`` of the DDP hook).

    Holds one compressor per bucket, built lazily from the spec (or deep-copied
    from a prototype compressor), so error-feedback state is per bucket; torch's
    ``PowerSGDState`` for ``powersgd``; counters of bytes sent (from the
    compressors' ``dp_plan``, the same numbers the simulator uses) and wall time.
    """

    def __init__(self, spec, process_group=None, *, seed: int = 0,
                 bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES):
        from perfsim.compression import Compressor

        self._prototype = None
        if isinstance(spec, Compressor):
            self._prototype = spec
            self.spec = GradSpec("compressor", spec.spec or spec.name, compressor=spec.spec or spec.name)
        else:
            self.spec = parse_grad_spec(spec)
        if bucket_cap_bytes <= 0:
            raise ConfigError(f"bucket_cap_bytes={bucket_cap_bytes}: must be > 0")
        self.process_group = process_group
        self.seed = int(seed)
        self.bucket_cap_bytes = int(bucket_cap_bytes)
        self.compressors: dict[str, Any] = {}
        self._names: dict[int, str] = {}
        self._pos: dict[int, int] = {}
        self.powersgd = None
        if self.spec.kind == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

            self.powersgd = PowerSGDState(process_group, matrix_approximation_rank=self.spec.rank,
                                          start_powerSGD_iter=self.spec.start_iter,
                                          random_seed=self.seed)
        self.reset_stats()

    # -- naming
    def bind(self, named_parameters: Iterable[tuple[str, torch.Tensor]]) -> "GradSync":
        """Learn parameter names and order so buckets get stable keys and one
        canonical layout (done by :func:`attach` and :func:`sync_gradients`)."""
        named = list(named_parameters)
        self._names = {id(p): name for name, p in named}
        self._pos = {id(p): i for i, (_, p) in enumerate(named)}
        return self

    def key_for(self, index: int, params: Sequence[torch.Tensor], numel: int) -> str:
        names = [self._names.get(id(p), "") for p in params]
        if names and all(names):
            return _bucket_key(names, numel)
        return f"bucket{index}:{numel}"

    def canonical_order(self, params: Sequence[torch.Tensor]) -> list[int] | None:
        """Permutation putting a bucket's parameters in reverse model order (the
        layout :func:`make_buckets` builds), or None when already so / unknown.

        DDP's first-iteration buckets list parameters front to back and its
        rebuilt ones back to front; compressing in one canonical layout keeps
        per-bucket error feedback aligned across the rebuild and a resume.
        """
        pos = [self._pos.get(id(p)) for p in params]
        if not pos or any(q is None for q in pos):
            return None
        order = sorted(range(len(pos)), key=lambda i: -pos[i])
        return None if order == list(range(len(pos))) else order

    # -- compressors
    def compressor(self, key: str):
        """The compressor of bucket ``key`` (created on first use)."""
        comp = self.compressors.get(key)
        if comp is None:
            if self._prototype is not None:
                comp = copy.deepcopy(self._prototype)
            else:
                from perfsim.compression import make_compressor

                comp = make_compressor(self.spec.compressor,
                                       seed=(self.seed * 1_000_003 + zlib.crc32(key.encode())) % 2**31)
            self.compressors[key] = comp
        return comp

    def allreduce_mean(self, key: str, flat: torch.Tensor) -> torch.Tensor:
        """Average one flat bucket over the group through bucket ``key``'s compressor."""
        world = _world(self.process_group)
        if world == 1 or flat.numel() == 0:
            return flat
        comp = self.compressor(key)
        t0 = time.perf_counter()
        out = comp.allreduce_mean(flat, self.process_group)
        self.stats["time_s"] += time.perf_counter() - t0
        self.stats["bytes"] += sum(s.nbytes for s in comp.dp_plan(tuple(flat.shape), world))
        self.stats["buckets"] += 1
        return out

    # -- measurement
    def reset_stats(self) -> None:
        self.stats = {"bytes": 0, "time_s": 0.0, "buckets": 0}

    def pop_stats(self) -> dict[str, float]:
        """Bytes each rank fed to collectives and wall time since the last call."""
        out = dict(self.stats)
        self.reset_stats()
        return out

    # -- checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Every error-feedback state (per bucket) and PowerSGD's state; only
        tensors / numbers / strings, so ``torch.load(weights_only=True)`` reads it."""
        out: dict[str, Any] = {"format": STATE_FORMAT, "version": STATE_VERSION,
                               "spec": self.spec.text, "seed": self.seed,
                               "buckets": {k: c.state_dict() for k, c in self.compressors.items()}}
        if self.powersgd is not None:
            out["powersgd"] = _powersgd_state(self.powersgd)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError("grad-sync state: not a perfsim-gradsync state dict")
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"grad-sync state: version {state.get('version')!r} unsupported "
                              f"(this perfsim reads {STATE_VERSION})")
        if state.get("spec") != self.spec.text:
            raise ConfigError(f"grad-sync state: saved for {state.get('spec')!r}, "
                              f"this run uses {self.spec.text!r}")
        self.seed = int(state.get("seed", self.seed))
        self.compressors = {}
        for key, comp_state in state.get("buckets", {}).items():
            self.compressor(key).load_state_dict(comp_state)
        if self.powersgd is not None and "powersgd" in state:
            _load_powersgd_state(self.powersgd, state["powersgd"])


def _powersgd_state(ps) -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = ps.rng.get_state()
    return {"iter": int(ps.iter),
            "error": {int(k): v.clone() for k, v in ps.error_dict.items()},
            "p": {int(k): v.clone() for k, v in ps.p_memory_dict.items()},
            "q": {int(k): v.clone() for k, v in ps.q_memory_dict.items()},
            "rng": {"name": name, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                    "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "numel_before": int(ps.total_numel_before_compression),
            "numel_after": int(ps.total_numel_after_compression)}


def _load_powersgd_state(ps, st: dict[str, Any]) -> None:
    import numpy as np

    ps.iter = int(st["iter"])
    ps.error_dict = {int(k): v.clone() for k, v in st["error"].items()}
    ps.p_memory_dict = {int(k): v.clone() for k, v in st["p"].items()}
    ps.q_memory_dict = {int(k): v.clone() for k, v in st["q"].items()}
    r = st["rng"]
    ps.rng.set_state((r["name"], r["keys"].numpy().astype(np.uint32), r["pos"], r["has_gauss"],
                      r["gauss"]))
    ps.total_numel_before_compression = int(st["numel_before"])
    ps.total_numel_after_compression = int(st["numel_after"])


# ----------------------------------------------------------------- DDP hooks
def _done(tensor: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def compressed_allreduce_hook(state: GradSync, bucket):  # no return annotation: DDP checks it literally
    """DDP communication hook: average ``bucket`` through its compressor.

    The compressors' collectives are synchronous, so the returned future is
    already complete (DDP only needs a Future of the averaged flat buffer).
    """
    buf = bucket.buffer()
    params = list(bucket.parameters())
    order = state.canonical_order(params)
    sizes = [p.numel() for p in params]
    if order is None or sum(sizes) != buf.numel():
        out = state.allreduce_mean(state.key_for(bucket.index(), params, buf.numel()), buf)
        if out is not buf:
            buf.copy_(out)
        return _done(buf)
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    flat = torch.cat([buf[offsets[i]:offsets[i + 1]] for i in order])
    out = state.allreduce_mean(state.key_for(bucket.index(), [params[i] for i in order], buf.numel()), flat)
    at = 0
    for i in order:
        buf[offsets[i]:offsets[i + 1]].copy_(out[at:at + sizes[i]])
        at += sizes[i]
    return _done(buf)


def noop_hook(state, bucket):  # no return annotation: DDP checks it literally
    """DDP hook that communicates nothing: each rank keeps its local gradient.
    Used with the 1-bit optimizers, which exchange compressed momentum."""
    return _done(bucket.buffer())


def powersgd_hook(state: GradSync, bucket):  # no return annotation: DDP checks it literally
    """torch's own ``powerSGD_hook`` on ``state.powersgd`` (wrapped only to count
    wall time)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    ps = state.powersgd
    compressing = ps.iter >= ps.start_powerSGD_iter
    before = ps.total_numel_after_compression
    t0 = time.perf_counter()
    out = powerSGD_hook(ps, bucket).wait()
    state.stats["time_s"] += time.perf_counter() - t0
    numel = (ps.total_numel_after_compression - before) if compressing else out.numel()
    state.stats["bytes"] += numel * out.element_size()
    state.stats["buckets"] += 1
    return _done(out)


def hook_for(state: GradSync):
    """The hook function matching ``state.spec``."""
    if state.spec.kind == "optimizer":
        return noop_hook
    if state.spec.kind == "powersgd":
        return powersgd_hook
    return compressed_allreduce_hook


def compression_hook(compressor, process_group=None, *, seed: int = 0):
    """Hook factory: ``(state, hook)`` for ``ddp.register_comm_hook(state, hook)``.

    ``compressor`` is a spec string (``"qsgd-maxnorm:4"``) or a
    :class:`~perfsim.compression.Compressor` instance used as a prototype (each
    bucket gets a deep copy, so per-bucket state stays separate).
    """
    state = GradSync(compressor, process_group, seed=seed)
    return state, hook_for(state)


def attach(ddp_model, spec, process_group=None, *, seed: int = 0) -> GradSync:
    """Register the hook for ``spec`` on a ``DistributedDataParallel`` model and
    return its state (keep it: ``state.state_dict()`` goes into checkpoints).

    ``process_group`` defaults to the DDP model's own group.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp_model, DistributedDataParallel):
        raise ConfigError(f"attach: expected a DistributedDataParallel model, got "
                          f"{type(ddp_model).__name__}")
    if process_group is None:
        process_group = getattr(ddp_model, "process_group", None)
    state = GradSync(spec, process_group, seed=seed,
                     bucket_cap_bytes=int(getattr(ddp_model, "bucket_bytes_cap", DEFAULT_BUCKET_CAP_BYTES)))
    state.bind(ddp_model.module.named_parameters())
    ddp_model.register_comm_hook(state, hook_for(state))
    return state


# ----------------------------------------------------------------- pipeline stages
def sync_gradients(params, state: GradSync, group=None) -> dict[str, float]:
    """Average the gradients of ``params`` over ``group`` in place, with the
    same buckets and per-bucket compressors as the DDP hook (for pipeline stages).

    ``params``: an iterable of tensors or of ``(name, tensor)`` pairs (names give
    stable bucket keys; ``module.named_parameters()``). Parameters without a
    gradient contribute zeros, as with DDP, so every rank builds the same buckets.
    ``group`` overrides ``state.process_group``. Returns this call's stats
    (bytes fed to collectives, wall seconds). With a 1-bit optimizer spec this is
    a no-op: the optimizer exchanges momentum itself.
    """
    if group is not None:
        state.process_group = group
        if state.powersgd is not None:
            state.powersgd.process_group = group
    items = list(params)
    named = [item if isinstance(item, tuple) else (f"p{i}", item) for i, item in enumerate(items)]
    named = [(n, p) for n, p in named if p.requires_grad]
    if state.spec.kind == "optimizer" or _world(state.process_group) == 1 or not named:
        return state.pop_stats()
    if not state._names:
        state.bind(named)
    plist = [p for _, p in named]
    buckets = make_buckets([(n, p.numel(), p.element_size()) for n, p in named], state.bucket_cap_bytes)
    for b_index, idxs in enumerate(buckets):
        ps = [plist[i] for i in idxs]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(torch.float32)
        if state.spec.kind == "powersgd":
            bucket = _FlatBucket(b_index, len(buckets), flat, [p.shape for p in ps], ps)
            powersgd_hook(state, bucket)
            out = bucket.buffer()
        else:
            out = state.allreduce_mean(state.key_for(b_index, ps, flat.numel()), flat)
        offset = 0
        for p in ps:
            n = p.numel()
            chunk = out[offset:offset + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += n
    return state.pop_stats()
