"""1-bit Adam and 1-bit LAMB: optimizers that exchange compressed momentum.

Both are two-stage algorithms (Li et al. 2021, "1-bit LAMB: Communication Efficient
Large-Scale Large-Batch Training with LAMB's Convergence Speed", arXiv:2104.06069:
Sec. 2 summarising Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale
Training with Adam's Convergence Speed", arXiv:2102.02888; Sec. 4 and Algorithm 1
for 1-bit LAMB):

1. **Warm-up** (``warmup`` steps): gradients are averaged with an uncompressed
   fp32 allreduce (one fused buffer) and the ordinary optimizer runs -- AdamW
   for 1-bit Adam (bias-corrected, decoupled weight decay: bit-identical to
   ``torch.optim.AdamW`` on the averaged gradient), LAMB for 1-bit LAMB.
2. **Compression stage**: the variance is frozen and used as a fixed
   preconditioner. Each worker updates its momentum with its *local* gradient,
   ``m_local = b1 * m + (1 - b1) * g_local``; the momenta of all layers are
   fused into one flat buffer (Sec. 4.2) and averaged by the ``onebit``
   compressor's 3-phase compressed allreduce (gather chunks, average, scatter;
   Sec. 5) with worker and server error feedback kept inside the compressor.
   The result is the new global momentum, identical on every worker, so the
   parameters stay identical.

1-bit LAMB additionally (Algorithm 1, Sec. 4.1 and 4.3):
  * keeps a moving average ``c_avg`` (decay ``b3``) of each layer's LAMB
    scaling coefficient ``c = clip(||x|| / ||u||, c_min, c_max)`` during warm-up
    (clip applied to the whole ratio, footnote 4) and freezes it at the end;
  * keeps a *fresh* variance updated from the reconstructed global gradient
    ``g = (m_t - b1 m_{t-1}) / (1 - b1)`` (lines 15-16);
  * scales the learning rate of layer l by ``r = max((sqrt(v_frozen)+eps) /
    (sqrt(v_fresh)+eps))`` clipped to ``[r_min, r_max]`` and to within
    ``r_threshold`` of the previous ratio (lines 17-20; defaults 0.5, 4.0, 0.1
    from Fig. 3), so ``c_t = c_avg * r`` (measured, docs/ddp.md: with exact averaging the
    largest element is set by coordinates that went quiet, and raises the step where
    LAMB's would shrink; under the 1-bit compressor the reconstructed gradient is
    compression residue, and the ratio stays at 1 or its floor);
  * multiplies each layer's momentum by a fixed scale coefficient before the
    compressed allreduce and divides after (Sec. 4.3: ``united_scale /
    (||m_l|| / sqrt(numel_l))`` computed at the end of warm-up), so all layers
    reach the 1-bit compressor at similar magnitudes.

What is exchanged (``exchange=``): ``preconditioned`` (default): the momentum
divided by the frozen denominator ``sqrt(v_frozen) + eps``. That is the
per-coordinate form of Sec. 4.3's argument -- a scaling fixed during the
compression stage does not disturb error compensation, and averaging commutes
with it -- and puts the 1-bit scale and the error feedback in update units,
where one scale suits every coordinate. ``momentum`` (the papers' literal
choice: the raw momentum for 1-bit Adam, the Sec. 4.3 layer-scaled momentum
for 1-bit LAMB) shares one sign scale between coordinates whose frozen
denominators differ by orders of magnitude, which made 1-bit Adam diverge on
the digits model where the preconditioned exchange tracks Adam (docs/ddp.md).

Coordinates whose frozen variance is exactly zero (never a gradient during
warm-up: padding / unused embeddings, always-zero inputs) have their momentum masked to zero in both modes (DeepSpeed asks users
for an ``exp_avg_mask`` for the same reason); otherwise the sign compressor's
magnitude divided by ``eps`` is a step of ``scale / eps``.

The frozen variance does not bound the step of a coordinate whose gradient outgrows it
after warm-up: weights of rare, large inputs whose warm-up variance was ~1e-8 take steps
``m_hat / sqrt(v_frozen)`` in the hundreds to thousands where Adam's own never exceed
``(1 - b1) / sqrt(1 - b2)`` = 3.16 (Kingma & Ba, arXiv:1412.6980 Sec. 2.1), and the run
diverges *even with exact fp32 averaging* (``scripts/onebit_frozen_variance.py``; docs/ddp.md).
Two options, both off by default (the papers' algorithms): ``refresh=K`` (0/1 Adam's
variance refreshes, arXiv:2202.06009) and ``bound=adam`` (Adam's own step bound); spec
``onebit-adam:refresh=16:bound=adam``; :mod:`perfsim.runtime.onebit_variance` has them.

A diverging or NaN step stops with one ConfigError naming the step, the parameter group,
the parameter and the rank, the same on every rank (:mod:`perfsim.runtime.nonfinite`),
before any state or error buffer changes.

Choices where the paper leaves details open (documented, not tuned): the
warm-up uses Adam's bias corrections, and the frozen variance / momentum keep
using them (``v / (1 - b2^T_w)``, ``m / (1 - b1^t)``), so the stage switch is
smooth; ``c_avg`` is bias-corrected like Adam's moments, so short warm-ups do
not shrink it.

Integration: with these optimizers DDP must not average gradients; build them
with :func:`perfsim.ddp.onebit_optimizer`, which registers a no-op hook on a DDP
model (an optimizer whose parameters sit in a DDP model without it refuses to
step). Statistics and, for fp16/bf16 parameters, master weights are float32, also
after ``load_state_dict`` (torch's own would cast them to the parameter dtype).
The warm-up is a setting of the run (``warmup`` steps, default
:data:`DEFAULT_WARMUP`), not of the checkpoint: a resumed optimizer uses the
value it was built with (freezing at load if that warm-up is already over;
lengthening a finished warm-up is refused). ``state_dict()`` holds moments,
frozen variance, LAMB coefficients and the compressor's error buffers
(DeepSpeed's 1-bit optimizers drop those on reload; ours resume bit-identically).
"""

from __future__ import annotations

import copy
import math
import numbers
import time
from typing import Any

import torch

from perfsim.compression import make_compressor
from perfsim.compression.refresh import BOUNDS, DEFAULT_BOUND, check_refresh, is_refresh
from perfsim.runtime.grad_sync import owning_ddp
from perfsim.runtime.onebit_variance import VarianceOptions
from perfsim.compression.spec import DEFAULT_WARMUP, check_warmup
from perfsim.errors import ConfigError, NonFiniteError
from perfsim.runtime.nonfinite import culprits, describe, local_code

STATE_KEY = "onebit"
from perfsim.compression.spec import EXCHANGES  # noqa: E402  (one list, beside the spec parser)
#: compressors that may carry the momentum exchange (``fp32``: exact averaging, a control)
MOMENTUM_COMPRESSORS = ("onebit", "fp32")
#: what the compression stage exchanges by default (see the module docstring)
DEFAULT_EXCHANGE = "preconditioned"


def _world(group) -> int:
    import torch.distributed as dist  # lazy: torch is heavy, needed only here

    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _numbers(who: str, **values: Any) -> None:
    """Refuse, naming it, a hyper-parameter that is not a real number (``lr="1e-3"`` from a
    command line would otherwise fail inside a comparison with a TypeError naming nothing);
    a pair (``betas``, bounds) must be two numbers."""
    for name, v in values.items():
        pair = isinstance(v, (tuple, list))
        items = v if pair else (v,)
        if (pair and len(v) != 2) or any(isinstance(x, bool) or not isinstance(x, numbers.Real) for x in items):
            raise ConfigError(f"{who}: {name}={v!r} must be {'two numbers' if pair else 'a number'}")


def _mask_dead(momentum: torch.Tensor, frozen_var: torch.Tensor) -> torch.Tensor:
    """Zero the momentum of coordinates whose frozen variance is exactly 0.

    A sign + scale compressor gives *every* coordinate magnitude ``scale``,
    also those that never had a gradient (e.g. weights of always-zero inputs,
    padding embeddings); divided by ``sqrt(0) + eps`` that is a step of
    ``scale / eps``. DeepSpeed asks the user for an ``exp_avg_mask`` for this;
    here the mask is derived from the frozen variance, which is identical on
    every worker (it comes from the averaged warm-up gradients)."""
    return momentum.masked_fill_(frozen_var == 0, 0.0)


def _adam_moments(st: dict, grad: torch.Tensor, g: dict, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The warm-up stage's Adam moment update, shared by 1-bit Adam and 1-bit LAMB:
    ``m <- b1 m + (1-b1) grad``, ``v <- b2 v + (1-b2) grad^2`` in place (state ``st``,
    hyper-parameters of group ``g``, step ``t``); returns ``(m, sqrt(v / (1-b2^t)) + eps)``."""
    b1, b2 = g["betas"]
    m, v = st["exp_avg"], st["exp_avg_sq"]
    m.mul_(b1).add_(grad, alpha=1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    return m, (v / (1 - b2 ** t)).sqrt_().add_(g["eps"])


class _OneBitBase(VarianceOptions, torch.optim.Optimizer):
    """Shared machinery: warm-up gradient allreduce, fused momentum exchange,
    global state, checkpointing and byte/time counters."""

    algorithm = ""

    def __init__(self, params, *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, warmup: int, group=None, compressor: str = "onebit",
                 seed: int = 0, exchange: str = DEFAULT_EXCHANGE, refresh: int = 0,
                 bound: str = DEFAULT_BOUND):
        _numbers(self.algorithm, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        _check(lr > 0 and math.isfinite(lr), f"{self.algorithm}: lr={lr} must be > 0")
        _check(len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas),
               f"{self.algorithm}: betas={betas} must lie in [0, 1)")
        _check(eps > 0, f"{self.algorithm}: eps={eps} must be > 0")
        _check(weight_decay >= 0, f"{self.algorithm}: weight_decay={weight_decay} must be >= 0")
        check_warmup(warmup, self.algorithm)  # the one rule (perfsim.compression.spec)
        _check(exchange in EXCHANGES, f"{self.algorithm}: exchange={exchange!r} (choose from "
               f"{', '.join(EXCHANGES)})")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.exchange = exchange
        self.refresh = check_refresh(refresh, self.algorithm)  # the one rule (perfsim.compression.refresh)
        _check(bound in BOUNDS, f"{self.algorithm}: bound={bound!r} (choose from {', '.join(BOUNDS)})")
        self.bound = bound
        self.group = group
        self.warmup = warmup
        self.compressor = make_compressor(compressor, seed=seed)
        _check(self.compressor.name in MOMENTUM_COMPRESSORS,
               f"{self.algorithm}: compressor={compressor!r} cannot exchange the momentum (choose "
               f"{' or '.join(MOMENTUM_COMPRESSORS)}: 1-bit sign+scale with error feedback, or exact "
               "fp32 as a control); gradient compressors go through perfsim.ddp.attach")
        self.param_names: dict[int, str] = {}  # id(param) -> name, set by perfsim.ddp.onebit_optimizer
        self.global_state: dict[str, Any] = {"step": 0, "freeze_step": 0, "refreshes": 0}
        self.total_bytes = 0
        self.link = None      # the no-op DDP hook's state, set by perfsim.ddp.onebit_optimizer
        self._checked = False
        self.reset_stats()

    @property
    def wire_bytes(self) -> int:
        """Bytes this rank has fed to collectives (warm-up gradients and compressed
        momentum), from the exact ``dp_plan`` of what was sent."""
        return int(self.total_bytes)

    # ------------------------------------------------------------ helpers
    def _params(self) -> list[tuple[torch.Tensor, dict]]:
        return [(p, g) for g in self.param_groups for p in g["params"] if p.requires_grad]

    @staticmethod
    def _grad(p: torch.Tensor) -> torch.Tensor:
        return p.grad if p.grad is not None else torch.zeros_like(p)

    def _allreduce_grads(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Warm-up: uncompressed mean of the gradients, one fused fp32 allreduce."""
        world = _world(self.group)
        if world == 1:
            if grads:
                self._check_finite(torch.cat([g.reshape(-1) for g in grads]), "gradient", grads)
            return grads
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

        flat = torch.cat([g.reshape(-1).float() for g in grads])
        t0 = time.perf_counter()
        dist.all_reduce(flat, group=self.group)  # a NaN/Inf on any rank reaches every rank
        self.stats["time_s"] += time.perf_counter() - t0
        self._check_finite(flat, "gradient", grads)  # before any state changes
        self._count(flat.numel() * flat.element_size())
        flat /= world
        return [c.view_as(g) for c, g in zip(torch.split(flat, [g.numel() for g in grads]), grads)]

    def _exchange(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Compression stage: average ``tensors`` (fused) through the compressor."""
        world = _world(self.group)
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        if world > 1:
            # a NaN/Inf on one rank travels as a NaN scale (onebit) or through the sum
            # (fp32), so every rank stops here together, with no error buffer changed
            # (perfsim.runtime.nonfinite)
            t0 = time.perf_counter()
            try:
                flat = self.compressor.allreduce_mean(flat, self.group)
            except NonFiniteError as exc:  # raised on every rank alike: name the culprit, the same everywhere
                self._refuse("gradient or momentum", tensors, exc.local, flat.device)
            self.stats["time_s"] += time.perf_counter() - t0
            self._count(sum(s.nbytes for s in self.compressor.dp_plan((flat.numel(),), world)))
        self._check_finite(flat, "gradient or momentum", tensors)
        return [c.view_as(t) for c, t in zip(torch.split(flat, [t.numel() for t in tensors]), tensors)]

    def _count(self, nbytes: int) -> None:
        self.stats["bytes"] += int(nbytes)
        self.total_bytes += int(nbytes)

    def _check_communication(self, items) -> None:
        """Refuse to train when DDP would still allreduce these gradients: the
        parameters belong to a DistributedDataParallel model on which
        :func:`perfsim.ddp.onebit_optimizer` did not install its no-op hook."""
        self._checked = True
        if self.link is not None or _world(self.group) == 1 or not items:
            return
        ddp = owning_ddp([p for p, _ in items[:1]])
        if ddp is not None:
            raise ConfigError(f"{self.algorithm}: these parameters belong to a DistributedDataParallel "
                              "model that allreduces every gradient in fp32; build the optimizer with "
                              "perfsim.ddp.onebit_optimizer(ddp_model, ...) so it installs its no-op hook")

    def _check_finite(self, flat: torch.Tensor, what: str, parts: list[torch.Tensor]) -> None:
        """Stop when ``flat`` (the fused form of ``parts``, this rank's tensors in
        :meth:`_params` order; after an allreduce, the same on every rank) is not finite:
        :meth:`_refuse`. Called before any state is written."""
        if flat.numel() and not bool(torch.isfinite(flat).all()):
            self._refuse(what, parts, False, flat.device)

    def _refuse(self, what: str, parts: list[torch.Tensor], refused_here: bool, device) -> None:
        """Raise one ConfigError naming the step, the parameter group and parameter and the
        rank of the first NaN/Inf, identical on every rank: every rank calls this at the
        same point (the exchange told all of them), and one error-path all-gather of an
        int64 per rank (:func:`perfsim.runtime.nonfinite.culprits`) says whose it was."""
        codes = culprits(local_code(parts, refused_here), self.group, device)
        items = self._params()

        def name_of(i: int) -> str:
            p, g = items[i]
            gi = next(k for k, grp in enumerate(self.param_groups) if grp is g)
            name = self.param_names.get(id(p)) or f"#{[q for q in g['params']].index(p)}"
            return f"parameter group {gi}, parameter {name} {tuple(p.shape)}"
        self._diverged(what, describe(codes, name_of))

    def _diverged(self, what: str, where: str) -> None:
        t = self.global_state["step"]
        stage = "warm-up" if t <= self.warmup else "compression stage"
        raise ConfigError(
            f"{self.algorithm}: {what}: {where} at step {t} ({stage}, warmup={self.warmup}); "
            "nothing was updated -- NaN/Inf gradients, or training diverged (a longer warm-up or "
            "a smaller lr)")

    @property
    def compressing(self) -> bool:
        """True once the warm-up is over (the next step exchanges compressed momentum)."""
        return self.global_state["step"] >= self.warmup

    # ------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        if not self._checked:
            self._check_communication(params)
        self.global_state["step"] += 1
        try:
            self._step(params)
        except ConfigError:
            self.global_state["step"] -= 1  # nothing was written: the step did not happen
            raise
        return loss

    def _step(self, params) -> None:
        t = self.global_state["step"]
        grads = [self._grad(p).float() for p, _ in params]
        refresh = is_refresh(t, self.warmup, self.refresh)
        if t <= self.warmup or refresh:  # averaged (and checked) before any state is created or changed
            grads = self._allreduce_grads(grads)
        for p, _ in params:
            st = self.state[p]
            if not st:  # statistics in float32 whatever the parameter dtype (bf16 squares underflow)
                st["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
                st["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
                if p.dtype != torch.float32:  # float32 master weights for fp16/bf16 parameters
                    st["master"] = p.detach().float().clone()
                self._init_extra(st, p)
        # the update runs on the float32 master (the parameter itself when float32)
        items = [(self.state[p].get("master", p), g) for p, g in params]
        self._masters = {id(w): p for (w, _), (p, _) in zip(items, params)}
        if t <= self.warmup:
            self._warmup_step(t, items, grads)
            if t == self.warmup:
                self.global_state["freeze_step"] = t
                self._freeze(items)
        elif refresh:  # 0/1 Adam's variance update (arXiv:2202.06009): exact gradient, then the step
            self._refresh(items, grads)
            self._compressed_step(t, items, grads, exact=True)
        else:
            self._compressed_step(t, items, grads)
        for p, _ in params:
            if "master" in self.state[p]:
                p.copy_(self.state[p]["master"])

    def _st(self, w: torch.Tensor) -> dict:
        """Optimizer state of the parameter whose float32 master is ``w``."""
        return self.state[self._masters[id(w)]]

    def _init_extra(self, st: dict, p: torch.Tensor) -> None:
        pass

    # ------------------------------------------------------------ measurement
    def reset_stats(self) -> None:
        self.stats = {"bytes": 0, "time_s": 0.0}

    def pop_stats(self) -> dict[str, float]:
        """Bytes each rank fed to collectives and their wall time since the last call."""
        out = dict(self.stats)
        self.reset_stats()
        return out

    # ------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd[STATE_KEY] = {"algorithm": self.algorithm, "warmup": self.warmup, "exchange": self.exchange,
                         "step": int(self.global_state["step"]),
                         "freeze_step": int(self.global_state["freeze_step"]),
                         "refreshes": int(self.global_state["refreshes"]),
                         "wire_bytes": int(self.total_bytes),
                         "world_size": _world(self.group),
                         "compressor_spec": self.compressor.spec,
                         "compressor": self.compressor.state_dict()}
        return sd

    def _restore_float32(self, state_dict: dict[str, Any]) -> None:
        """Put back the saved float32 statistics and master weights: torch's
        ``Optimizer.load_state_dict`` casts every floating state tensor to its
        parameter's dtype, which for bf16/fp16 parameters rounds the moments, the
        frozen variance and the master weights (the resumed run then drifts from
        the uninterrupted one)."""
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(saved_ids, params):
            for key, value in state_dict["state"].get(pid, {}).items():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    self.state[p][key] = value.detach().to(device=p.device, dtype=torch.float32, copy=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        if ours is None:
            raise ConfigError(f"{self.algorithm}: checkpoint has no {STATE_KEY!r} state "
                              "(saved by another optimizer?)")
        if ours.get("algorithm") != self.algorithm:
            raise ConfigError(f"{self.algorithm}: checkpoint is for {ours.get('algorithm')!r}")
        if ours.get("exchange") != self.exchange:
            raise ConfigError(f"{self.algorithm}: checkpoint used exchange={ours.get('exchange')!r}, "
                              f"this run {self.exchange!r}")
        if ours.get("compressor_spec") != self.compressor.spec:
            raise ConfigError(f"{self.algorithm}: checkpoint used compressor "
                              f"{ours.get('compressor_spec')!r}, this run {self.compressor.spec!r}")
        step, frozen = int(ours["step"]), int(ours["freeze_step"])
        if frozen and self.warmup > frozen:
            raise ConfigError(f"{self.algorithm}: the checkpoint froze the variance at step {frozen}; "
                              f"warmup={self.warmup} cannot extend a finished warm-up (use <= {frozen})")
        saved_world, world = ours.get("world_size"), _world(self.group)
        per_rank = any(isinstance(v, dict) and v for v in ours["compressor"].values())  # error buffers
        if saved_world is not None and int(saved_world) != world and per_rank:
            raise ConfigError(f"{self.algorithm}: checkpoint saved at step {step} with {saved_world} "
                              f"data-parallel ranks, this run has {world}; the error-feedback buffers "
                              "are per rank and cannot be re-sharded -- resume with the same world size")
        compressor = copy.deepcopy(self.compressor)
        compressor.load_state_dict(ours["compressor"])  # validated before anything is replaced
        super().load_state_dict(state_dict)
        self._restore_float32(state_dict)
        # warm-up is this run's setting (not the checkpoint's): a shorter one than the
        # checkpoint's step freezes now, with the statistics of the steps done so far
        self.global_state = {"step": step, "freeze_step": frozen, "refreshes": int(ours.get("refreshes", 0))}
        self.total_bytes = int(ours.get("wire_bytes", 0))
        self.compressor = compressor
        if not frozen and step >= self.warmup:
            params = self._params()
            items = [(self.state[p].get("master", p), g) for p, g in params]
            self._masters = {id(w): p for (w, _), (p, _) in zip(items, params)}
            self.global_state["freeze_step"] = step
            self._freeze(items)


class OneBitAdam(_OneBitBase):
    """1-bit Adam (Tang et al. 2021, arXiv:2102.02888, as summarised in arXiv:2104.06069 Sec. 2).

    ``OneBitAdam(params, lr=1e-3, warmup=100, group=dp_group)``; ``group`` is the
    data-parallel process group (None: the default group). ``compressor`` names
    the momentum compressor (``onebit``; ``fp32`` gives the same algorithm
    with exact averaging, useful as a control).
    """

    algorithm = "onebit-adam"
    variance_key = "exp_avg_sq"  # frozen in place: it stops being updated (but by refreshes)

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, warmup: int = DEFAULT_WARMUP, group=None,
                 compressor: str = "onebit", seed: int = 0, exchange: str = DEFAULT_EXCHANGE,
                 refresh: int = 0, bound: str = DEFAULT_BOUND):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         warmup=warmup, group=group, compressor=compressor, seed=seed,
                         exchange=exchange, refresh=refresh, bound=bound)

    def _warmup_step(self, t, items, grads):
        for (p, g), grad in zip(items, grads):
            m, denom = _adam_moments(self._st(p), grad, g, t)
            p.mul_(1 - g["lr"] * g["weight_decay"])
            p.addcdiv_(m, denom, value=-g["lr"] / (1 - g["betas"][0] ** t))

    def _freeze(self, items):
        pass  # exp_avg_sq simply stops being updated; freeze_step gives its bias correction

    def _compressed_step(self, t, items, grads, exact=False):
        """One compression-stage step; ``exact``: ``grads`` are already averaged (a
        refresh step), so the momentum needs no exchange."""
        tf = self._variance_steps()
        pre = self.exchange == "preconditioned" and not exact
        locals_, denoms = [], []
        for (p, g), grad in zip(items, grads):
            b1, b2 = g["betas"]
            denom = (self._st(p)["exp_avg_sq"] / (1 - b2 ** tf)).sqrt_().add_(g["eps"])
            m_local = self._st(p)["exp_avg"] * b1 + grad * (1 - b1)
            m_local = _mask_dead(m_local, self._st(p)["exp_avg_sq"])
            locals_.append(m_local / denom if pre else m_local)
            denoms.append(denom)
        averaged = locals_ if exact else self._exchange(locals_)
        for (p, g), avg, denom in zip(items, averaged, denoms):
            b1 = g["betas"][0]
            st = self._st(p)
            st["exp_avg"].copy_(_mask_dead(avg * denom if pre else avg, st["exp_avg_sq"]))
            p.mul_(1 - g["lr"] * g["weight_decay"])
            if self.bound == "adam":
                denom = self._lift(st, denom, g, t)
            p.addcdiv_(st["exp_avg"], denom, value=-g["lr"] / (1 - b1 ** t))


class OneBitLamb(_OneBitBase):
    """1-bit LAMB (arXiv:2104.06069, Algorithm 1, Sec. 4.1-4.3).

    Each parameter tensor is a "layer" with its own scaling coefficient.
    ``coeff_bounds`` = (c_min, c_max) of LAMB's clip (Fig. 1 uses 0.01, 0.3);
    ``ratio_bounds`` = (r_min, r_max) and ``ratio_threshold`` clip the 1-bit
    LAMB scaling ratio (Fig. 3: 0.5, 4.0, 0.1); ``coeff_beta`` is b3.
    """

    algorithm = "onebit-lamb"
    variance_key = "exp_avg_sq_frozen"  # the preconditioner (exp_avg_sq stays the fresh one)

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, warmup: int = DEFAULT_WARMUP, group=None,
                 compressor: str = "onebit", seed: int = 0, exchange: str = DEFAULT_EXCHANGE,
                 coeff_beta: float = 0.9, coeff_bounds=(0.01, 0.3), ratio_bounds=(0.5, 4.0),
                 ratio_threshold: float = 0.1, refresh: int = 0, bound: str = DEFAULT_BOUND):
        _numbers("onebit-lamb", coeff_beta=coeff_beta, coeff_bounds=coeff_bounds, ratio_bounds=ratio_bounds,
                 ratio_threshold=ratio_threshold)
        _check(0.0 <= coeff_beta < 1.0, f"onebit-lamb: coeff_beta={coeff_beta} must lie in [0, 1)")
        _check(0 < coeff_bounds[0] <= coeff_bounds[1], f"onebit-lamb: coeff_bounds={coeff_bounds}")
        _check(0 < ratio_bounds[0] <= ratio_bounds[1], f"onebit-lamb: ratio_bounds={ratio_bounds}")
        _check(0 <= ratio_threshold < 1, f"onebit-lamb: ratio_threshold={ratio_threshold}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         warmup=warmup, group=group, compressor=compressor, seed=seed,
                         exchange=exchange, refresh=refresh, bound=bound)
        self.coeff_beta = coeff_beta
        self.coeff_bounds = tuple(coeff_bounds)
        self.ratio_bounds = tuple(ratio_bounds)
        self.ratio_threshold = ratio_threshold

    def _init_extra(self, st, p):
        st["coeff_avg"] = torch.zeros((), dtype=torch.float32)     # c_avg (Alg. 1 line 2)
        st["coeff_frozen"] = torch.zeros((), dtype=torch.float32)  # bias-corrected c_avg at T_w
        st["last_ratio"] = torch.ones((), dtype=torch.float32)     # r_{t-1} (line 19)
        st["momentum_scale"] = torch.ones((), dtype=torch.float32)  # Sec. 4.3 coefficient

    def _warmup_step(self, t, items, grads):
        c_min, c_max = self.coeff_bounds
        for (p, g), grad in zip(items, grads):
            st = self._st(p)
            m, denom = _adam_moments(st, grad, g, t)
            update = (m / (1 - g["betas"][0] ** t)).div_(denom)
            if g["weight_decay"]:
                update.add_(p, alpha=g["weight_decay"])
            w_norm, u_norm = float(p.norm()), float(update.norm())
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            coeff = min(max(ratio, c_min), c_max)
            st["coeff_avg"].mul_(self.coeff_beta).add_(coeff * (1 - self.coeff_beta))
            p.add_(update, alpha=-g["lr"] * coeff)

    def _freeze(self, items):
        t = self.global_state["freeze_step"]
        scales = []
        for p, _ in items:
            st = self._st(p)
            st["exp_avg_sq_frozen"] = st["exp_avg_sq"].clone()
            st["coeff_frozen"].copy_(st["coeff_avg"] / (1 - self.coeff_beta ** t))
            st["last_ratio"].fill_(1.0)
            scales.append(float(st["exp_avg"].norm()) / math.sqrt(max(p.numel(), 1)))
        positive = [s for s in scales if s > 0]
        united = sum(positive) / len(positive) if positive else 1.0
        for (p, _), s in zip(items, scales):
            self._st(p)["momentum_scale"].fill_(united / s if s > 0 else 1.0)

    def _compressed_step(self, t, items, grads, exact=False):
        """One compression-stage step (Alg. 1 lines 9-21); ``exact``: ``grads`` are
        already averaged (a refresh step), so the momentum needs no exchange."""
        r_min, r_max = self.ratio_bounds
        thr = self.ratio_threshold
        tf = self._variance_steps()
        pre = self.exchange == "preconditioned" and not exact
        locals_, denoms = [], []
        for (p, g), grad in zip(items, grads):
            b1, b2 = g["betas"]
            st = self._st(p)
            denom = (st["exp_avg_sq_frozen"] / (1 - b2 ** tf)).sqrt_().add_(g["eps"])
            m_local = st["exp_avg"] * b1 + grad * (1 - b1)
            m_local = _mask_dead(m_local, st["exp_avg_sq_frozen"])
            locals_.append(m_local if exact else m_local / denom if pre else m_local * st["momentum_scale"])
            denoms.append(denom)
        averaged = locals_ if exact else self._exchange(locals_)
        for (p, g), scaled, denom in zip(items, averaged, denoms):
            b1, b2 = g["betas"]
            st = self._st(p)
            m_new = scaled if exact else scaled * denom if pre else scaled / st["momentum_scale"]
            m_new = _mask_dead(m_new, st["exp_avg_sq_frozen"])
            g_rec = (m_new - st["exp_avg"] * b1) / (1 - b1)              # line 15
            st["exp_avg_sq"].mul_(b2).addcmul_(g_rec, g_rec, value=1 - b2)  # line 16 (fresh)
            st["exp_avg"].copy_(m_new)
            if self.bound == "adam":
                denom = self._lift(st, denom, g, t)
            fresh = (st["exp_avg_sq"] / (1 - b2 ** t)).sqrt_().add_(g["eps"])
            ratio = self._scaling_ratio(st["exp_avg"], denom, fresh)     # line 17
            ratio = min(max(ratio, r_min), r_max)                        # line 18
            last = float(st["last_ratio"])
            ratio = min(max(ratio, last * (1 - thr)), last * (1 + thr))   # line 19
            st["last_ratio"].fill_(ratio)
            coeff = float(st["coeff_frozen"]) * ratio                     # line 20
            update = (st["exp_avg"] / (1 - b1 ** t)).div_(denom)
            if g["weight_decay"]:
                update.add_(p, alpha=g["weight_decay"])
            p.add_(update, alpha=-g["lr"] * coeff)                        # line 21

    @staticmethod
    def _scaling_ratio(m: torch.Tensor, denom: torch.Tensor, fresh: torch.Tensor) -> float:
        """Alg. 1 line 17: the largest element of ``denom / fresh`` (frozen over fresh
        preconditioner, ``sqrt(v) + eps`` each); ``m`` (the new momentum) is unused here
        (``scripts/onebit_frozen_variance.py --ratio norm`` weighs the ratio by it)."""
        return float((denom / fresh).max()) if m.numel() else 1.0


def build(gspec, params, lr: float, group=None, *, warmup: int, betas=(0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 0.0, seed: int = 0, compressor: str = "onebit",
          **kwargs) -> "_OneBitBase":
    """The 1-bit optimizer of a parsed ``onebit-adam`` / ``onebit-lamb`` spec
    (public entry: :func:`perfsim.ddp.onebit_optimizer`)."""
    _numbers(gspec.optimizer, lr=lr)
    if not lr > 0:
        raise ConfigError(f"lr={lr}: must be > 0")
    cls = OneBitAdam if gspec.optimizer == "onebit-adam" else OneBitLamb
    refresh = kwargs.pop("refresh", gspec.refresh or 0)  # an explicit argument wins over the spec
    bound = kwargs.pop("bound", gspec.bound or DEFAULT_BOUND)
    known = () if cls is OneBitAdam else ("coeff_beta", "coeff_bounds", "ratio_bounds", "ratio_threshold")
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ConfigError(f"{gspec.optimizer}: unknown options {unknown}"
                          + (f" (it takes {', '.join(known)})" if known else ""))
    return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, warmup=warmup,
               group=group, compressor=compressor, seed=seed,
               exchange=gspec.exchange or DEFAULT_EXCHANGE, refresh=refresh, bound=bound, **kwargs)
