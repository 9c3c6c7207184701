"""perfsim's gradient compressors in your own DistributedDataParallel script.

The one public way in (``perfsim run`` uses the same objects)::

    from perfsim import ddp as pddp

    model = DistributedDataParallel(net)
    state = pddp.CompressionState("qsgd-maxnorm:4")     # process_group=... optional
    model.register_comm_hook(state, pddp.hook)          # the torch convention
    # or, equivalently:  state = pddp.attach(model, "ecq:4")

    # 1-bit Adam / 1-bit LAMB exchange compressed *momentum*: one call sets up
    # both the optimizer and DDP's (no-op) gradient hook
    opt = pddp.onebit_optimizer(model, "onebit-adam", lr=1e-3, warmup=100)

    ckpt = {"model": model.state_dict(), "optim": opt.state_dict(), "comm": state.state_dict()}
    state.load_state_dict(ckpt["comm"])                 # exact resume, nothing else to call
    state.wire_bytes                                    # gradient bytes this rank has sent
    opt.wire_bytes                                      # the same for the 1-bit optimizers

Gradient specs (``CompressionState`` / ``attach``): ``fp32``, ``fp16``, ``bf16``,
``qsgd-maxnorm:BITS[:chunk=D]``, ``qsgd-maxnorm-multiscale:BITS[:SCALES]``,
``randk-maxnorm:FRACTION:BITS``, ``ecq:BITS``, ``qsgd:BITS``, ``powersgd:RANK``
(torch's own PowerSGD hook). Optimizer specs (``onebit_optimizer``):
``onebit-adam``, ``onebit-lamb``.

Guarantees (each tested with real gloo processes, ``tests/ddp/test_ddp.py``):

* **Exact resume.** State is keyed by parameter *names* (the hook finds the DDP
  model that owns a bucket on its first call), and every bucket is compressed in
  one canonical parameter layout, so N steps + save + fresh processes + load +
  N steps is bit-identical to 2N steps, PowerSGD included (its memories go
  through torch's ``PowerSGDState.__getstate__`` / ``__setstate__``, keyed by
  bucket name instead of torch's bucket index). The user also restores model,
  optimizer and torch's RNG, as for any DDP checkpoint.
* **Honest bytes.** ``wire_bytes`` sums each method's ``dp_plan`` -- the
  collectives it really performs, the numbers the simulator charges and
  ``perfsim compressors --world-size W`` lists.
* **Wrong use is an error**: an unknown spec, an optimizer spec given as a
  gradient compressor (or the reverse), a 1-bit optimizer whose parameters
  live in a DDP model that still allreduces gradients, a checkpoint saved with
  another world size (error-feedback buffers are per rank: refused) or for other
  buckets (renamed parameters, another ``bucket_cap_mb``: its error feedback would be
  dropped), one state registered on two DDP models.
* **NaN/Inf is one error.** A NaN/Inf gradient on any rank makes every rank raise the
  same one-line ConfigError (out of ``backward()``) naming the step, the bucket and its
  parameter names, the parameter and the rank, with the bucket's state unchanged and no
  extra byte in a normal step (:mod:`perfsim.runtime.nonfinite`; ``tests/ddp/
  test_ddp_nonfinite.py``). Casts (``fp32``/``fp16``/``bf16``) pass NaN/Inf through as
  DDP's allreduce does, so ``torch.amp.GradScaler`` can skip the step (docs/ddp.md).
* Works with ``find_unused_parameters=True``, bf16/fp16 parameters, ``no_sync``
  gradient accumulation and several DDP models per process (one state each).
"""

from __future__ import annotations

from typing import Any

import torch

from perfsim.compression.spec import Spec, parse_spec
from perfsim.errors import ConfigError
from perfsim.runtime import grad_sync as _gs
from perfsim.runtime import onebit_optim as _ob

__all__ = ["CompressionState", "hook", "attach", "onebit_optimizer", "warmup_steps", "OPTIMIZER_SPECS",
           "DEFAULT_WARMUP"]

OPTIMIZER_SPECS = _gs.ONEBIT_OPTIMIZERS
DEFAULT_WARMUP = _gs.DEFAULT_WARMUP


def warmup_steps(spec: "str | Spec", total_steps: int | None = None) -> int | None:
    """The warm-up a 1-bit optimizer spec gets without a ``warmup=`` argument
    (:meth:`perfsim.compression.spec.Spec.warmup_steps`); None for a gradient compressor."""
    return parse_spec(spec, "grad").warmup_steps(total_steps)


class CompressionState(_gs.GradSync):
    """The state of :func:`hook`: one compressor (with its error feedback and random
    counters) per gradient bucket, keyed by the names of the bucket's parameters.

    ``spec``: a gradient compression spec (see the module docstring).
    ``process_group``: the data-parallel group (default: the DDP model's own).
    ``seed``: seeds stochastic rounding (identical on every rank; the rank is
    mixed in by the compressors themselves).
    """

    def __init__(self, spec: "str | Spec", process_group=None, *, seed: int = 0):
        gspec = parse_spec(spec, "grad")  # the public edge: text parsed once, a Spec kept
        if gspec.family == "optimizer":
            raise ConfigError(f"CompressionState({gspec.text!r}): {gspec.optimizer} exchanges momentum, not "
                              f"gradients; use perfsim.ddp.onebit_optimizer(model, {gspec.text!r}, lr=...)")
        super().__init__(gspec, process_group, seed=seed)

    @property
    def wire_bytes(self) -> int:
        """Bytes this rank has fed to collectives for gradients so far (restored by
        :meth:`load_state_dict`), from each method's exact ``dp_plan``."""
        return int(self.total_bytes)

    def sync(self, named_parameters, group=None) -> dict[str, float]:
        """Average the gradients of modules that are not DDP (pipeline stages) with
        the same buckets and compressors as the hook; returns this call's bytes/time."""
        return _gs.sync_gradients(named_parameters, self, group)


def hook(state: CompressionState, bucket):  # no return annotation: DDP checks it literally
    """DDP communication hook: ``model.register_comm_hook(state, perfsim.ddp.hook)``.

    DDP's buckets change between the first iteration and its rebuild, and start
    over after a restart; compressing them as given would tie error feedback,
    random draws and norms to that history. Instead the hook compresses the
    state's *canonical* buckets (:meth:`CompressionState.groups`: parameter order,
    the model's bucket cap -- what the simulator charges): gradients of each DDP
    bucket are held until every parameter of a canonical bucket has arrived, that
    bucket is averaged, and a DDP bucket's future completes once all of its
    parameters are done. DDP waits for the futures only after the last bucket,
    so nothing blocks; every rank sees DDP's buckets in the same order.
    """
    if not isinstance(state, _gs.GradSync) or state.spec.family == "optimizer":
        raise ConfigError(f"perfsim.ddp.hook: state must be a perfsim.ddp.CompressionState, "
                          f"got {type(state).__name__}")
    buf = bucket.buffer()
    params = list(bucket.parameters())
    if not state._names and params:
        state.bind_from_bucket(params)
    stranger = next((p for p in params if id(p) not in state._names), None)
    if stranger is not None:  # its bucket would wait forever for canonical buckets it is not in: a hang
        state.__dict__.pop("_pending", None)
        bound = ", ".join(n for _, n in zip(range(3), state._names.values()))
        raise ConfigError(f"perfsim.ddp.hook: this CompressionState is bound to another model (parameters "
                          f"{bound}, ...) than this bucket's (a {tuple(stranger.shape)} parameter); "
                          "create one CompressionState per DDP model")
    if getattr(state, "_loaded", None):  # the first step after load_state_dict: the same buckets?
        state.expect_buckets(state.key_for(i, g, sum(p.numel() for p in g)) for i, g in enumerate(state.groups()))
    fut: torch.futures.Future = torch.futures.Future()
    if _gs._world(state.process_group) == 1:
        fut.set_result(buf)
        return fut
    pend = state.__dict__.setdefault("_pending", {"views": {}, "buckets": [], "done": set()})
    offset = 0
    for p in params:
        pend["views"][id(p)] = buf[offset:offset + p.numel()]
        offset += p.numel()
    pend["buckets"].append((fut, buf, [id(p) for p in params]))
    groups = state.groups()
    for gi, group in enumerate(groups):
        if gi in pend["done"] or not all(id(p) in pend["views"] for p in group):
            continue
        views = [pend["views"].pop(id(p)) for p in group]
        flat = torch.cat([v.to(torch.float32) for v in views])
        pend["done"].add(gi)
        try:
            out = _gs.reduce_bucket(state, gi, len(groups), group, flat, len(pend["done"]) == len(groups))
        except ConfigError:  # a refused bucket (NaN/Inf, on every rank alike): the step is over
            state.__dict__.pop("_pending", None)
            raise
        at = 0
        for v in views:
            v.copy_(out[at:at + v.numel()])
            at += v.numel()
    waiting = []
    for item in pend["buckets"]:
        if any(i in pend["views"] for i in item[2]):
            waiting.append(item)
        else:
            item[0].set_result(item[1])
    pend["buckets"] = waiting
    if len(pend["done"]) == len(groups):
        if pend["views"] or waiting:
            raise ConfigError("perfsim.ddp.hook: DDP handed gradients of parameters outside the model's "
                              "canonical buckets")
        pend["done"] = set()
        state.steps += 1
    return fut


def attach(model, spec: str, process_group=None, *, seed: int = 0) -> CompressionState:
    """Create a :class:`CompressionState` for ``spec``, bind it to ``model`` (a
    ``DistributedDataParallel``) and register :func:`hook`; returns the state."""
    from torch.nn.parallel import DistributedDataParallel  # lazy: torch is heavy, needed only here

    if not isinstance(model, DistributedDataParallel):
        raise ConfigError(f"attach: expected a DistributedDataParallel model, got {type(model).__name__}")
    state = CompressionState(spec, process_group or getattr(model, "process_group", None), seed=seed)
    state.bind(model)  # its parameters and its bucket cap, as the hook binds itself
    _register(model, state, hook)
    return state


def _register(model, state, fn) -> None:
    try:
        model.register_comm_hook(state, fn)
    except RuntimeError as exc:  # torch allows one hook per DDP model
        raise ConfigError(f"DDP model already has a communication hook ({str(exc).splitlines()[0]}); "
                          "register one perfsim.ddp hook per model") from None


class _OneBitLink:
    """State of the no-op DDP hook that :func:`onebit_optimizer` installs."""

    def __init__(self):
        self.hook_calls = 0


def onebit_optimizer(model, spec: str, lr: float, *, warmup: int | None = None,
                     total_steps: int | None = None, process_group=None,
                     betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, seed: int = 0,
                     **kwargs: Any) -> torch.optim.Optimizer:
    """1-bit Adam or 1-bit LAMB for ``model``, with its communication set up.

    ``model``: a ``DistributedDataParallel`` (a no-op gradient hook is registered
    on it, so DDP does not allreduce gradients the optimizer exchanges as
    compressed momentum) or a plain module (every rank holds a replica; the
    optimizer refuses to step if the parameters belong to a DDP model without
    that hook). ``spec``: ``onebit-adam`` / ``onebit-lamb`` (``:warmup=N`` and
    ``:exchange=`` as in ``--grad-compress``). ``warmup``: uncompressed steps
    before the variance freezes; an explicit argument wins, then the spec's
    ``warmup=``, then 20 % of ``total_steps`` (the length of your run: the papers
    warm up for 15-20 % of training), then :data:`DEFAULT_WARMUP` steps.
    ``process_group`` defaults to the DDP model's group. Other keywords go to
    :class:`perfsim.runtime.onebit_optim.OneBitLamb` (clipping bounds).
    The optimizer's ``wire_bytes`` counts the bytes it has sent.
    """
    from torch.nn.parallel import DistributedDataParallel  # lazy: torch is heavy, needed only here

    gspec = parse_spec(spec, "grad")  # the public edge: text parsed once, a Spec kept
    if gspec.family != "optimizer":
        raise ConfigError(f"onebit_optimizer: {gspec.text!r} is not a 1-bit optimizer (choose "
                          f"{' or '.join(OPTIMIZER_SPECS)}); gradient compressors go through "
                          "perfsim.ddp.attach / CompressionState")
    is_ddp = isinstance(model, DistributedDataParallel)
    if process_group is None and is_ddp:
        process_group = getattr(model, "process_group", None)
    module = model.module if is_ddp else model
    names = {}
    if hasattr(module, "parameters"):
        params = list(module.parameters())
        names = {id(p): n for n, p in module.named_parameters()} if hasattr(module, "named_parameters") else {}
    elif isinstance(model, (list, tuple)) and all(isinstance(p, torch.Tensor) for p in model):
        params = list(model)  # explicit tensors (e.g. tensor-parallel local shards)
    else:
        raise ConfigError(f"onebit_optimizer: expected a module or a list of parameters, "
                          f"got {type(model).__name__}")
    steps = warmup if warmup is not None else gspec.warmup_steps(total_steps)
    opt = _ob.build(gspec, params, lr=lr, group=process_group, warmup=steps, betas=betas,
                    eps=eps, weight_decay=weight_decay, seed=seed, **kwargs)
    opt.param_names = names  # named in error messages (a NaN gradient's parameter)
    if is_ddp:
        link = _OneBitLink()
        _register(model, link, _gs.noop_hook)
        opt.link = link
    return opt
