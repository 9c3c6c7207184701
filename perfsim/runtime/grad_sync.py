"""Data-parallel gradient synchronisation: the machinery behind :mod:`perfsim.ddp`.

One state (:class:`GradSync`, public as :class:`perfsim.ddp.CompressionState`) and
one reduction (:func:`reduce_bucket`) serve both entry points:

* the DDP communication hook :func:`perfsim.ddp.hook` (user scripts), and
* :func:`sync_gradients` for pipeline stages, which are not DDP modules
  (``perfsim run``'s ``pp x dp`` runs, through ``CompressionState.sync``).

Both average the state's *canonical* buckets (:func:`make_buckets`: reverse
parameter order, DDP's cap, ``DistributedDataParallel(bucket_cap_mb=25)`` by
default -- the buckets the simulator charges); a bucket is keyed by the names of
its first and last parameter and its length, so error feedback, random counters
and PowerSGD's memories survive DDP's bucket rebuild and a restart. A
compressor's ``allreduce_mean`` performs exactly its ``dp_plan`` (the collectives
the simulator models), and the byte counters sum that plan.

Specs (``--grad-compress``): ``none``/``fp32`` (plain allreduce), ``fp16``, ``bf16``,
``qsgd-maxnorm:BITS``, ``qsgd-maxnorm-multiscale:BITS``, ``randk-maxnorm:FRACTION:BITS``,
``ecq:BITS``, ``qsgd:BITS`` (any registered compressor spec works), ``powersgd:RANK
[:start=N]`` -- torch's own PowerSGD hook (Vogels et al. 2019) as the baseline,
not a re-implementation -- and ``onebit-adam[:warmup=N]`` / ``onebit-lamb[:warmup=N]``,
for which gradients are *not* averaged here: the 1-bit optimizers
(:mod:`perfsim.runtime.onebit_optim`, built by :func:`perfsim.ddp.onebit_optimizer`)
exchange compressed momentum themselves behind a no-op DDP hook (:func:`noop_hook`).

A NaN/Inf gradient on any rank makes every rank raise the same ConfigError naming the
step (:attr:`GradSync.steps` + 1), the bucket, the parameter and the rank
(:meth:`GradSync.refuse`, :mod:`perfsim.runtime.nonfinite`), the bucket's state unchanged;
the casts (``fp32``/``fp16``/``bf16``) pass NaN/Inf through, as DDP's allreduce does.
"""

from __future__ import annotations

import copy
import gc
import time
import zlib
from typing import Any, Iterable, Sequence

from perfsim._lazy import torch

from perfsim.compression import Compressor, check_spec, make_compressor
from perfsim.errors import ConfigError, NonFiniteError
from perfsim.runtime.nonfinite import culprits, describe, local_code

STATE_FORMAT = "perfsim-gradsync"
STATE_VERSION = 1
DEFAULT_BUCKET_CAP_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb=25
# the spec is a value of the compression library (torch-free: the simulator holds it too)
from perfsim.compression.spec import (  # noqa: E402,F401  (re-exported)
    DEFAULT_WARMUP, WARMUP_FRACTION, Spec, parse_spec)
from perfsim.compression.spec import OPTIMIZERS as ONEBIT_OPTIMIZERS  # noqa: E402,F401


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
    import torch.distributed as dist  # lazy: torch is heavy, needed only here

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
        self._prototype = None
        if isinstance(spec, Compressor):  # the edge: a built compressor's canonical spec, read once
            self._prototype = spec
            self.spec = parse_spec(spec.spec or spec.name, "grad")
        else:
            self.spec = check_spec(parse_spec(spec, "grad"))  # a Spec passes through unparsed
        if bucket_cap_bytes <= 0:
            raise ConfigError(f"bucket_cap_bytes={bucket_cap_bytes}: must be > 0")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed={seed!r}: must be an integer (identical on every rank)")
        if process_group is not None and not isinstance(process_group, torch.distributed.ProcessGroup):
            raise ConfigError(f"process_group={process_group!r}: expected a torch.distributed ProcessGroup "
                              "or None (the DDP model's own group)")
        self.process_group = process_group
        self.seed = int(seed)
        self.bucket_cap_bytes = int(bucket_cap_bytes)
        self.compressors: dict[str, Any] = {}
        self._names: dict[int, str] = {}
        self._pos: dict[int, int] = {}
        self._named: list[tuple[str, torch.Tensor]] = []
        self._groups: list[list[torch.Tensor]] | None = None
        self.powersgd = None
        self.total_bytes = 0
        self.steps = 0  # completed synchronisations (optimizer steps): named in NaN/Inf errors
        self._ps_key: dict[int, str] = {}       # PowerSGD bucket index -> bucket key
        self._ps_pending: dict[str, dict] = {}  # loaded PowerSGD buffers not yet installed
        if self.spec.family == "hook":
            # lazy: torch is heavy, needed only here
            from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

            self.powersgd = PowerSGDState(process_group, matrix_approximation_rank=self.spec.rank,
                                          start_powerSGD_iter=self.spec.start_iter,
                                          min_compression_rate=self.spec.min_rate,
                                          random_seed=self.seed)
        self.reset_stats()

    # -- naming
    def bind(self, named_parameters: Iterable[tuple[str, torch.Tensor]]) -> "GradSync":
        """Learn parameter names and order so buckets get stable keys and one
        canonical layout (done by :func:`attach` and :func:`sync_gradients`, and
        by the hook itself on its first call, see :meth:`bind_from_bucket`). A
        DistributedDataParallel model also gives its bucket cap (``bucket_cap_mb``):
        the canonical buckets are then the ones its DDP forms, however the state was bound."""
        if hasattr(named_parameters, "named_parameters"):  # a module (DDP: its wrapped module)
            cap = getattr(named_parameters, "bucket_bytes_cap", None)
            if cap:
                self.bucket_cap_bytes = int(cap)
            named_parameters = getattr(named_parameters, "module", named_parameters).named_parameters()
        named = list(named_parameters)
        self._named = named
        self._groups = None
        self._names = {id(p): name for name, p in named}
        self._pos = {id(p): i for i, (_, p) in enumerate(named)}
        return self

    def bind_from_bucket(self, params: Sequence[torch.Tensor]) -> None:
        """Bind to the DistributedDataParallel model that owns ``params`` (the hook was
        registered the torch way, ``ddp.register_comm_hook(state, hook)``, so the state
        never saw the model). DDP keeps no public link from a bucket to its module, so
        the live DDP objects are searched once (:func:`owning_ddp`)."""
        ddp = owning_ddp(params)
        if ddp is None:
            raise ConfigError("perfsim.ddp hook: cannot find the DistributedDataParallel model of this "
                              "gradient bucket; use perfsim.ddp.attach(model, spec) or state.bind(model)")
        self.bind(ddp)  # its parameters and its bucket cap
        if self.process_group is None:
            self.process_group = getattr(ddp, "process_group", None)
            if self.powersgd is not None and self.process_group is not None:
                self.powersgd.process_group = self.process_group

    def key_for(self, index: int, params: Sequence[torch.Tensor], numel: int) -> str:
        names = [self._names.get(id(p), "") for p in params]
        if names and all(names):
            return _bucket_key(names, numel)
        return f"bucket{index}:{numel}"

    def groups(self) -> list[list[torch.Tensor]]:
        """The canonical buckets of the bound parameters (those requiring a gradient):
        :func:`make_buckets` over the model's parameter order with this state's cap --
        the buckets the simulator charges -- whatever buckets DDP forms."""
        if self._groups is None:
            named = [(n, p) for n, p in self._named if p.requires_grad]
            idx = make_buckets([(n, p.numel(), p.element_size()) for n, p in named], self.bucket_cap_bytes)
            self._groups = [[named[i][1] for i in b] for b in idx]
        return self._groups

    # -- compressors
    def compressor(self, key: str):
        """The compressor of bucket ``key`` (created on first use)."""
        comp = self.compressors.get(key)
        if comp is None:
            if self._prototype is not None:
                comp = copy.deepcopy(self._prototype)
            else:
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
        self._count(sum(s.nbytes for s in comp.dp_plan(tuple(flat.shape), world)))
        return out

    def refuse(self, index: int, params: Sequence[torch.Tensor], flat: torch.Tensor,
               refused_here: bool = False, code: int | None = None) -> None:
        """Raise the one ConfigError of a refused exchange of canonical bucket ``index``
        (``flat``: this rank's gradients of ``params``), the same on every rank: the
        step, the bucket with its parameter names, the parameter and the rank of the first
        NaN/Inf. Every rank calls it at the same point -- the exchange itself told all of
        them (:mod:`perfsim.runtime.nonfinite`) -- and one error-path all-gather of an
        int64 per rank names the culprit. ``code``: this rank's
        :func:`~perfsim.runtime.nonfinite.local_code`, when ``flat`` no longer holds the input."""
        if code is None:
            views = list(torch.split(flat.reshape(-1), [p.numel() for p in params])) if params else []
            code = local_code(views, refused_here)
        codes = culprits(code, self.process_group, flat.device)
        names = [self._names.get(id(p)) or f"#{self._pos.get(id(p), i)}" for i, p in enumerate(params)]
        span = (names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}") if names else "empty"

        def name_of(i: int) -> str:
            return f"parameter {names[i]} {tuple(params[i].shape)}"
        raise ConfigError(f"perfsim.ddp {self.spec.text}: gradient {describe(codes, name_of)} at step "
                          f"{self.steps + 1}, bucket {index} ({span}); nothing of this bucket was averaged "
                          "or remembered -- NaN/Inf gradients, or training diverged (a smaller lr, "
                          "gradient clipping)")

    def _count(self, nbytes: int) -> None:
        self.stats["bytes"] += int(nbytes)
        self.stats["buckets"] += 1
        self.total_bytes += int(nbytes)

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
                               "world_size": _world(self.process_group),
                               "wire_bytes": int(self.total_bytes), "steps": int(self.steps),
                               "buckets": {k: c.state_dict() for k, c in self.compressors.items()}}
        if self.powersgd is not None:
            out["powersgd"] = _powersgd_state(self.powersgd, self._ps_key, self._ps_pending)
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
        saved_world, world = state.get("world_size"), _world(self.process_group)
        if saved_world is not None and int(saved_world) != world and self._world_bound():
            raise ConfigError(f"grad-sync state: saved with {saved_world} data-parallel ranks, this run "
                              f"has {world}; its error-feedback buffers are per rank and cannot be "
                              "re-sharded -- resume with the same world size or start the state afresh")
        self.seed = int(state.get("seed", self.seed))
        self.total_bytes = int(state.get("wire_bytes", 0))
        self.steps = int(state.get("steps", 0))
        self.compressors = {}
        for key, comp_state in state.get("buckets", {}).items():
            self.compressor(key).load_state_dict(comp_state)
        if self.powersgd is not None and "powersgd" in state:
            self._ps_key = {}
            self._ps_pending = _load_powersgd_state(self.powersgd, state["powersgd"])
        self._loaded = set(self.compressors) | set(self._ps_pending)  # checked by expect_buckets

    def expect_buckets(self, keys: Iterable[str]) -> None:
        """Refuse, before any exchange, a loaded state whose buckets are not this model's
        (``keys``: the bucket keys of the first step after :meth:`load_state_dict`): their
        error feedback would sit unused and the resumed run start afresh without a word --
        parameters renamed (``torch.compile`` prefixes ``_orig_mod.``), another bucket cap,
        another model. Checked once; the same on every rank (keys come from names and sizes)."""
        keys = sorted(set(keys))
        loaded, self._loaded = getattr(self, "_loaded", None), None
        lost = sorted((loaded or set()) - set(keys))
        if lost:
            ours = ", ".join(map(repr, keys[:2])) + (", ..." if len(keys) > 2 else "")
            raise ConfigError(f"grad-sync state: the checkpoint's bucket {lost[0]!r} is not one of this "
                              f"model's ({ours}): parameter names (torch.compile "
                              "adds '_orig_mod.'), the bucket cap or the model changed since it was saved, "
                              "and its error feedback would be dropped -- resume with the same model and "
                              "bucket_cap_mb, or start the state afresh")

    def _world_bound(self) -> bool:
        """Whether this method's state depends on the world size: error feedback
        and PowerSGD memories are per rank, and stochastic rounding draws with the
        rank as salt. Plain casts (fp32/fp16/bf16) carry no state."""
        return self.spec.family == "hook" or not self.spec.compressor.cast


def _powersgd_state(ps, index_key: dict[int, str], pending: dict[str, dict]) -> dict[str, Any]:
    """torch's ``PowerSGDState.__getstate__`` (its public checkpoint API), made
    ``weights_only``-loadable and keyed by bucket *names*: torch keys error and
    P/Q memories by bucket index, which is not stable across a restart."""
    st = ps.__getstate__()
    name, keys, pos, has_gauss, gauss = st.pop("rng").get_state()
    per_bucket: dict[str, dict] = {k: dict(v) for k, v in pending.items()}
    for what in ("error_dict", "p_memory_dict", "q_memory_dict"):
        for idx, tensor in st.pop(what).items():
            per_bucket.setdefault(index_key.get(int(idx), f"index{int(idx)}"), {})[what] = tensor.clone()
    st.pop("compression_stats_logging_frequency", None)
    st.pop("next_stats_report", None)
    return {"slots": {k: v for k, v in st.items() if isinstance(v, (int, float, bool))},
            "buckets": per_bucket,
            "rng": {"name": name, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                    "has_gauss": int(has_gauss), "gauss": float(gauss)}}


def _load_powersgd_state(ps, st: dict[str, Any]) -> dict[str, dict]:
    """Restore through ``PowerSGDState.__setstate__``; returns the per-bucket
    memories, installed by the hook when it meets each bucket (by name)."""
    import numpy as np  # lazy: numpy is heavy, needed only here

    group = ps.process_group
    full = ps.__getstate__()
    full.update(st["slots"])
    r = st["rng"]
    full["rng"] = np.random.RandomState()
    full["rng"].set_state((r["name"], r["keys"].numpy().astype(np.uint32), r["pos"], r["has_gauss"],
                           r["gauss"]))
    full["error_dict"], full["p_memory_dict"], full["q_memory_dict"] = {}, {}, {}
    ps.__setstate__(full)
    ps.process_group = group  # __setstate__ resets it to the default group
    return {k: dict(v) for k, v in st["buckets"].items()}


def _install_powersgd(state: "GradSync", index: int, key: str) -> None:
    """Point PowerSGD's bucket ``index`` at the memories saved for bucket ``key``."""
    ps = state.powersgd
    old = state._ps_key.get(index)
    if old is not None and old != key:  # DDP regrouped its buckets: park the old bucket's memories
        parked = state._ps_pending.setdefault(old, {})
        for what in ("error_dict", "p_memory_dict", "q_memory_dict"):
            if index in getattr(ps, what):
                parked[what] = getattr(ps, what).pop(index)
    state._ps_key[index] = key
    saved = state._ps_pending.pop(key, None)
    if saved:
        for what, tensor in saved.items():
            getattr(ps, what)[index] = tensor.clone()


def _powersgd_snapshot(ps, index: int) -> dict[str, Any]:
    """What one call of torch's ``powerSGD_hook`` on bucket ``index`` may change: it
    replaces the bucket's error tensor (a reference suffices), writes its P/Q memories in
    place (cloned: ``rank x (rows + cols)`` values), draws from ``rng`` and counts."""
    out: dict[str, Any] = {"slots": {k: getattr(ps, k) for k in (
        "iter", "total_numel_before_compression", "total_numel_after_compression", "next_stats_report")},
        "rng": ps.rng.get_state()}
    for what in ("error_dict", "p_memory_dict", "q_memory_dict"):
        table = dict(getattr(ps, what))
        if what != "error_dict" and index in table:
            table[index] = table[index].clone()
        out[what] = table
    return out


def _powersgd_restore(ps, saved: dict[str, Any]) -> None:
    for k, v in saved["slots"].items():
        setattr(ps, k, v)
    ps.rng.set_state(saved["rng"])
    for what in ("error_dict", "p_memory_dict", "q_memory_dict"):
        setattr(ps, what, saved[what])


def owning_ddp(params: Sequence[torch.Tensor]):
    """The live ``DistributedDataParallel`` whose module holds ``params`` (None if none)."""
    from torch.nn.parallel import DistributedDataParallel  # lazy: torch is heavy, needed only here

    want = {id(p) for p in params}
    for obj in gc.get_objects():  # type(), not isinstance(): no __class__ lookups on proxies
        if issubclass(type(obj), DistributedDataParallel) and want <= {id(p) for p in obj.module.parameters()}:
            return obj
    return None


# ----------------------------------------------------------------- DDP hooks
def _done(tensor: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def noop_hook(state, bucket):  # no return annotation: DDP checks it literally
    """DDP hook that communicates nothing: each rank keeps its local gradient.
    Installed by :func:`perfsim.ddp.onebit_optimizer` (the 1-bit optimizers
    exchange compressed momentum); ``state`` (if any) counts the calls."""
    if state is not None and hasattr(state, "hook_calls"):
        state.hook_calls += 1
    return _done(bucket.buffer())


def reduce_bucket(state: GradSync, index: int, count: int, params: Sequence[torch.Tensor],
                  flat: torch.Tensor, is_last: bool) -> torch.Tensor:
    """Average one canonical bucket (``flat``: the gradients of ``params``, in
    order) over ``state.process_group`` with the spec's method; returns the mean.

    The one code path of the DDP hook (:mod:`perfsim.ddp`) and of pipeline
    stages (:func:`sync_gradients`). ``index`` is the bucket's position in the
    canonical bucketing (:func:`make_buckets`); PowerSGD keys its memories by it.
    """
    key = state.key_for(index, params, flat.numel())
    if state.spec.family != "hook":
        try:
            return state.allreduce_mean(key, flat)
        except NonFiniteError as exc:  # raised on every rank alike, the compressor unchanged
            state.refuse(index, params, flat, exc.local)
    # lazy: torch is heavy, needed only here
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    ps = state.powersgd
    _install_powersgd(state, index, key)
    saved = _powersgd_snapshot(ps, index)
    bucket = _FlatBucket(index, count, flat, [p.shape for p in params], list(params))
    bucket.is_last = lambda: is_last  # torch advances its iteration counter on the last bucket
    compressing = ps.iter >= ps.start_powerSGD_iter
    before = ps.total_numel_after_compression
    t0 = time.perf_counter()
    out = powerSGD_hook(ps, bucket).wait()
    state.stats["time_s"] += time.perf_counter() - t0
    if out.numel() and not bool(torch.isfinite(out.sum())):  # the same on every rank (allreduced)
        _powersgd_restore(ps, saved)  # NaN would poison the error feedback and the P/Q memories
        # torch's hook overwrote ``flat``; the callers' gradients (``.grad``, DDP's bucket) are intact
        grads = [p.grad if p.grad is not None else p.new_zeros(0) for p in params]
        state.refuse(index, params, out, code=local_code(grads))
    numel = (ps.total_numel_after_compression - before) if compressing else out.numel()
    state._count(numel * out.element_size())
    return out


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
    if state.spec.family == "optimizer" or _world(state.process_group) == 1 or not named:
        return state.pop_stats()
    if not state._names:
        state.bind(named)
    plist = [p for _, p in named]
    buckets = make_buckets([(n, p.numel(), p.element_size()) for n, p in named], state.bucket_cap_bytes)
    if getattr(state, "_loaded", None):
        state.expect_buckets(state.key_for(i, [plist[j] for j in idxs], sum(plist[j].numel() for j in idxs))
                             for i, idxs in enumerate(buckets))
    for b_index, idxs in enumerate(buckets):
        ps = [plist[i] for i in idxs]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(torch.float32)
        out = reduce_bucket(state, b_index, len(buckets), ps, flat, b_index == len(buckets) - 1)
        offset = 0
        for p in ps:
            n = p.numel()
            chunk = out[offset:offset + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += n
    state.steps += 1
    return state.pop_stats()
