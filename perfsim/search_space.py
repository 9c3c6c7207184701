"""The planner's search space, generated from :data:`perfsim.params.PARAMS`.

Every predict parameter declares whether ``perfsim plan`` searches it
(:attr:`perfsim.params.Param.search`) and where the dimension applies
(:attr:`~perfsim.params.Param.search_when`); this module lists no parameter by
hand. A new predict parameter becomes a search dimension with one line in PARAMS.

* ``"split"`` (tp, cp, pp, dp, micro_batch): the planner splits the cluster's GPUs into
  TP x CP x PP x DP (CP over the values given -- ``perfsim.plan`` gives ``CP_SEARCHED`` for a long
  sequence --, else 1) and each replica's batch into micro-batches (:func:`splits`).
* a tuple, or ``"module:NAME"`` of a tuple or of a function ``(context, param) ->
  values``: the default values searched; the user pins or widens them with the same
  flags (or keywords) ``predict`` takes.

Defaults that trade memory for time (ZeRO, recomputation, attention kernel, sequence
parallelism) are searched where a GPU preset gives a memory capacity to trade against
(:func:`on_gpu`); precision and the node's fabric default to the GPU's own
(:func:`gpu_precision`, :func:`node_fabric`). Every value is validated here, before
any search: one line naming the flag and the value.
"""

from __future__ import annotations

import importlib
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from perfsim import params as params_mod
from perfsim.errors import ConfigError
from perfsim.schedules import VIRTUAL_STAGE_SCHEDULES

#: default pipeline compressions searched (forward / backward bits of the seeds' grids)
PIPELINE_COMPRESSION = ("fp32", "fp16", "directq:fw4bw8", "aqsgd:fw4bw8", "aqsgd:fw3bw6", "aqsgd:fw2bw4")
#: default gradient compressions searched
GRADIENT_COMPRESSION = ("none", "fp16", "qsgd-maxnorm:8", "qsgd-maxnorm:4", "powersgd:2")
#: default schedules searched (zb-v needs two chunks per device; give it with --schedule)
SCHEDULES = ("gpipe", "1f1b", "zb-h1", "interleaved-1f1b")
#: default micro-batch sizes (those dividing a replica's batch)
MICRO_BATCHES = (1, 2, 4, 8)
#: old keyword names of :class:`SearchSpace`
ALIASES = {"schedules": "schedule"}


@dataclass(frozen=True)
class Context:
    """What the default values of a dimension depend on."""

    #: the GPU preset (perfsim.hardware.GPU) or None (a profile's measured compute)
    gpu: Any = None
    gpus_per_node: int = 1
    #: parameters the user gave (a default gives way to them)
    pinned: frozenset = frozenset()
    #: routed experts of a mixture-of-experts model (0: dense)
    experts: int = 0
    #: the model has transformer blocks (recomputation and the attention kernel apply to
    #: them alone: perfsim.api.check_transformer_only)
    transformer: bool = True


#: dimensions of a transformer's blocks alone (predict refuses them on other models:
#: perfsim.api.check_transformer_only)
TRANSFORMER_ONLY = ("recompute", "attention")


def on_gpu(ctx: Context, p) -> tuple:
    """Every allowed value where a GPU preset models kernels and checks memory (these
    dimensions trade memory for time); the parameter's default elsewhere, and on a model
    that is not a transformer for :data:`TRANSFORMER_ONLY`."""
    if ctx.gpu is None or (p.name in TRANSFORMER_ONLY and not ctx.transformer):
        return (p.default,)
    return (False, True) if p.kind == "bool" else tuple(p.allowed)


def gpu_precision(ctx: Context, p) -> tuple:
    """bf16 on a GPU that has it, else fp16 where it has tensor cores for it (mixed
    precision, as practitioners train); the default without a GPU preset."""
    if ctx.gpu is not None:
        for prec in ("bf16", "fp16"):
            if prec in ctx.gpu.peak_flops:
                return (prec,)
    return (p.default,)


def node_fabric(ctx: Context, p) -> tuple:
    """The fabric a node of the GPU ships with (:data:`perfsim.hardware.NODE_FABRIC`),
    unless the user gave the intra-node rate."""
    from perfsim.hardware import NODE_FABRIC  # lazy: import perfsim does not load perfsim.hardware

    if ctx.gpu is None or ctx.gpus_per_node == 1 or "intra_node_bandwidth" in ctx.pinned:
        return (None,)
    return (NODE_FABRIC.get(ctx.gpu.name),)


def expert_parallel(ctx: Context, p) -> Callable[[Mapping[str, Any]], tuple]:
    """A mixture-of-experts model: no expert parallelism, and every ``ep > 1`` dividing both
    the candidate's ``dp`` and the experts (Megatron-Core's expert-parallel group inside the
    data-parallel one; with ``ep < dp`` the experts' gradients sync over their
    expert-data-parallel group, :func:`perfsim.engine.buckets.expert_buckets`) (a dense model:
    not searched); per candidate, since it depends on its ``dp``."""
    def values(q: Mapping[str, Any]) -> tuple:
        dp = q["dp"]
        if not ctx.experts:
            return (None,)  # a dense model: left to predict's default
        return (1, *(e for e in range(2, dp + 1) if dp % e == 0 and ctx.experts % e == 0))

    return values


def cpu_offload(ctx: Context, p) -> Callable[[Mapping[str, Any]], tuple]:
    """ZeRO-Offload (``offload``, arXiv:2101.06840) where a GPU preset gives a memory to trade
    against: both values on a candidate with ZeRO-2/3, or with one replica unless the user pinned
    the ZeRO stage (where ZeRO shards nothing and the stage is how the offload is configured:
    :func:`offload_stage`); else none
    (predict refuses it below ZeRO-2). A model too large for the GPUs' memory otherwise is
    then found, as predict finds it (qa8: plan said "no configuration fits" for llama2-7b on
    one H100, which predict --zero 2 --offload optimizer fits in 17.5 GiB)."""
    def values(q: Mapping[str, Any]) -> tuple:
        if ctx.gpu is None:
            return (p.default,)
        if (q.get("zero") or 0) >= 2 or (q["dp"] == 1 and "zero" not in ctx.pinned):
            return tuple(p.allowed)
        return (p.default,)

    return values


def offload_stage(q: Mapping[str, Any], zeros: Any = (2,)) -> dict[str, Any]:
    """A candidate offloading its optimizer with one replica runs ZeRO-2 (DeepSpeed's
    ``offload_optimizer`` needs stage 2 or 3; sharding over one replica changes nothing else),
    unless the ZeRO stages searched (``zeros``: the user's pin) hold none from 2 up."""
    if q.get("offload") == "optimizer" and (q.get("zero") or 0) < 2 and q["dp"] == 1 \
            and any((z or 0) >= 2 for z in zeros):
        return {**q, "zero": 2}
    return dict(q)


#: stated assumptions of a mixture of experts that apply only where the experts are split
#: (``ep > 1``: how unevenly the router loads the expert-parallel ranks); left out of a
#: candidate with ``ep 1``, where they change nothing (predict notes them unused)
EXPERT_PARALLEL_ONLY = ("moe_imbalance",)


def without_ep_only(q: Mapping[str, Any]) -> dict[str, Any]:
    """``q`` without :data:`EXPERT_PARALLEL_ONLY` when it splits no experts (``ep`` 1 or absent)."""
    if (q.get("ep") or 1) > 1:
        return dict(q)
    return {k: v for k, v in q.items() if k not in EXPERT_PARALLEL_ONLY}


def _interleaved(q: Mapping[str, Any]) -> bool:
    return q.get("schedule") in VIRTUAL_STAGE_SCHEDULES


#: where a dimension applies (Param.search_when), given the candidate's other values
APPLIES: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "pp>1": lambda q: q["pp"] > 1,
    "dp>1": lambda q: q["dp"] > 1,
    # bucketed gradient sync (overlap): ZeRO-2/3 reduce-scatter each unit's gradient as the backward
    # produces it (perfsim.engine.sharding), so overlap changes nothing there
    "dp>1,zero<2": lambda q: q["dp"] > 1 and (q.get("zero") or 0) < 2,
    "tp>1": lambda q: q.get("tp", 1) > 1,
    "interleaved": _interleaved,
}


def dimensions() -> tuple:
    """The searched parameters (PARAMS with a ``search``), in PARAMS order."""
    return tuple(p for p in params_mod.PARAMS if p.search is not None)


def is_dimension(name: str) -> bool:
    return params_mod.BY_NAME[name].search is not None if name in params_mod.BY_NAME else False


def _defaults(p, ctx: Context) -> tuple:
    spec = p.search
    if isinstance(spec, str) and ":" in spec:
        module, name = spec.split(":")
        spec = getattr(importlib.import_module(module), name)
        if callable(spec):
            out = spec(ctx, p)
            return out if callable(out) else tuple(out)  # a callable: values per candidate
    if p.kind == "spec":  # the searched specs as values, parsed once here
        return tuple(params_mod.normalize(p.name, v) for v in spec)
    return tuple(spec)


def check_value(name: str, value: Any, who: str, ctx: Context | None = None) -> None:
    """Refuse a dimension value that predict would refuse, whatever it is combined
    with: a compressor that cannot be built, a ZeRO stage or precision not modelled."""
    p = params_mod.BY_NAME[name]
    if p.kind == "spec" and value is not None:
        # lazy: import perfsim does not load perfsim.compression.registry
        from perfsim.compression.registry import check_spec

        try:
            check_spec(params_mod.normalize(name, value))  # a Spec, built once to check its arguments
        except ConfigError as exc:
            raise ConfigError(f"{who}={str(value)!r}: {exc}") from None
    elif p.choices and p.kind != "choice" and value not in p.allowed:
        raise ConfigError(f"{who}={value!r}: choose from {', '.join(map(str, p.allowed))}")
    if name == "ep" and ctx is not None and value > 1 and not ctx.experts:
        raise ConfigError(f"{who}={value!r}: the model has no experts to split")
    if name in TRANSFORMER_ONLY and ctx is not None and not ctx.transformer and value != p.default:
        raise ConfigError(f"{who}={value!r}: the model is not a transformer (predict refuses it there)")
    if name == "precision" and ctx is not None and ctx.gpu is not None:
        from perfsim.hardware import check_precision  # lazy: import perfsim does not load perfsim.hardware

        check_precision(ctx.gpu, value)


class SearchSpace:
    """The values of every search dimension the caller pins or widens (``name=values``:
    a value, a list or a comma list, as predict takes them; ``schedules=`` is the old
    spelling of ``schedule=``); the other dimensions take their defaults from the
    cluster (:meth:`resolve`). Values are validated at construction."""

    def __init__(self, cli: bool = False, **dims: Any):
        self.values: dict[str, tuple] = {}
        for key, raw in dims.items():
            if raw is None:
                continue
            name = ALIASES.get(key, key).replace("-", "_")
            p = params_mod.BY_NAME.get(name)
            who = p.flag if (p and cli) else name
            if p is None or p.search is None:
                raise ConfigError(f"{key}: not a search dimension of perfsim plan (dimensions: "
                                  f"{', '.join(d.name for d in dimensions())})")
            if isinstance(raw, (list, tuple)) and not raw:
                raise ConfigError(f"{who}: empty list of values")
            values = tuple(params_mod.values_of(name, raw, cli))
            for v in values:
                check_value(name, v, who)
            self.values[name] = values

    def __getattr__(self, name: str):
        values = self.__dict__.get("values", {})
        name = ALIASES.get(name, name)
        if name in values:
            return values[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"SearchSpace({', '.join(f'{k}={v!r}' for k, v in self.values.items())})"

    def resolve(self, ctx: Context) -> dict[str, tuple]:
        """Values of every non-split dimension: the caller's, else the defaults."""
        out = {}
        for p in dimensions():
            if p.search == "split":
                continue
            out[p.name] = self.values.get(p.name) or _defaults(p, ctx)
            if p.name in self.values:
                for v in out[p.name]:
                    check_value(p.name, v, p.name, ctx)
        return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def splits(*, n_layers: int, gpus: int, gpus_per_node: int, global_batch: int,
           space: SearchSpace) -> list[dict[str, int]]:
    """Every TP x PP x DP = ``gpus`` with DP dividing ``global_batch``, and micro-batch
    sizes dividing a replica's batch: tp among the divisors of a node's GPUs (TP stays
    inside a node), pp at most the layer count. A given value that no split can use is
    refused, naming it."""
    tps = space.values.get("tp") or tuple(_divisors(gpus_per_node))
    given = space.values
    cps = given.get("cp") or (1,)  # context parallelism: over the values given (perfsim.plan's for long sequences)
    for name, vals in (("tp", given.get("tp")), ("pp", given.get("pp")), ("dp", given.get("dp")), ("cp", given.get("cp"))):
        for v in vals or ():
            if gpus % v:
                raise ConfigError(f"{name}={v}: does not divide the cluster's {gpus} GPUs")
    pinned = {name: given[name] for name in ("tp", "cp", "pp", "dp") if given.get(name)}
    whole = {"tp", "pp", "dp"} <= set(pinned)  # every factor pinned (cp's too, where given): they make the GPUs
    if len(pinned) > 1 and not any(gpus % math.prod(c) == 0 and (not whole or math.prod(c) == gpus)
                                   for c in itertools.product(*pinned.values())):
        what = " x ".join(f"{name}={','.join(map(str, vals))}" for name, vals in pinned.items())
        raise ConfigError(f"{what}: tp x {'cp x ' if 'cp' in pinned else ''}pp x dp must be the cluster's {gpus} GPUs "
                          "(nodes x gpus_per_node)")
    for v in given.get("pp") or ():
        if v > n_layers:
            raise ConfigError(f"pp={v}: more stages than the model's {n_layers} layers")
    for v in given.get("dp") or ():
        if global_batch % v:
            raise ConfigError(f"dp={v}: does not divide global_batch={global_batch}")
    for v in given.get("micro_batch") or ():
        if global_batch % v:
            raise ConfigError(f"micro_batch={v}: does not divide global_batch={global_batch}")
    out = []
    for tp, cp in itertools.product(tps, cps):
        if gpus % (tp * cp):
            continue
        rest = gpus // tp // cp
        for pp in given.get("pp") or [d for d in _divisors(rest) if d <= n_layers]:
            if rest % pp or pp > n_layers:
                continue
            dp = rest // pp
            if global_batch % dp or (given.get("dp") and dp not in given["dp"]):
                continue
            per_replica = global_batch // dp
            for mb in given.get("micro_batch") or MICRO_BATCHES:
                if per_replica % mb == 0:
                    out.append({"tp": tp, **({"cp": cp} if given.get("cp") else {}), "pp": pp, "dp": dp,
                                "micro_batch": mb, "macro_batch": per_replica})
    return out


def expand(split: dict[str, Any], dims: Mapping[str, tuple], base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every candidate of one split: the product of the dimensions in PARAMS order, a
    dimension that does not apply (its ``search_when``) kept at its default (None: left
    out, predict's default applies, e.g. the schedule of a one-stage pipeline)."""
    order = [p for p in dimensions() if p.search != "split"]
    out: list[dict[str, Any]] = []

    def walk(q: dict[str, Any], i: int) -> None:
        if i == len(order):
            zeros = dims["zero"] if not callable(dims["zero"]) else (2,)
            out.append(offload_stage(without_ep_only(q), zeros))
            return
        p = order[i]
        vals = dims[p.name]
        if callable(vals):
            vals = vals(q)
        if p.search_when and not APPLIES[p.search_when](q):
            vals = (params_mod.normalize(p.name, p.default),)  # None: left to predict's default
        for v in vals:
            walk({**q, p.name: v} if v is not None else q, i + 1)

    walk({**base, **split}, 0)
    return out


def enumerate_candidates(*, n_layers: int, gpus: int, gpus_per_node: int, global_batch: int,
                         space: SearchSpace, base: dict[str, Any], known: set[str] | None = None,
                         ctx: Context | None = None, experts: int = 0) -> list[dict[str, Any]]:
    """Every parameter dict of the search (before bounds): :func:`splits` x the other
    dimensions (:func:`expand`). ``known``: the parameters the simulator takes (None:
    all of PARAMS); without ``tp`` no tensor parallelism is searched. ``experts``: the routed
    experts of a mixture-of-experts model when no ``ctx`` is given."""
    if known is not None and "tp" not in known:
        if any(t != 1 for t in space.values.get("tp", ())):
            raise ConfigError("tp: this simulator has no tensor parallelism")
        space = SearchSpace(**{**space.values, "tp": (1,)})
    ctx = ctx or Context(None, gpus_per_node, experts=experts)
    dims = space.resolve(ctx)
    out = []
    for split in splits(n_layers=n_layers, gpus=gpus, gpus_per_node=gpus_per_node,
                        global_batch=global_batch, space=space):
        out += expand(split, dims, base)
    return out
