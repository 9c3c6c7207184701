"""``perfsim plan``: the best way to train a model on a cluster, compression included.

The planner enumerates configurations over every dimension ``perfsim predict`` models
-- parallelism (TP x PP x DP over the cluster's GPUs), micro-batch, schedule and
interleaved stages, ZeRO, recomputation, attention kernel, sequence parallelism,
precision, the node's fabric, pipeline and gradient compression: the search space
comes from predict's parameter table (:mod:`perfsim.search_space`) --, simulates them
with the same engine as ``perfsim predict`` and ranks them by **time to a target
loss**, not raw throughput: compression changes how many steps a run needs.
``time_to_loss = iteration_s x steps_ratio x reference_steps`` (the run's warm-up iterations among
those steps at the warm-up's pace, :meth:`Candidate.run_time`) where ``steps_ratio``
is how many more (or fewer) optimizer steps a compressor needs than uncompressed
training to reach the same loss, read from measured ``perfsim run`` curves
(:mod:`perfsim.convergence`). Without a curve for a method the plan ranks by the mean
iteration time of the run (``--epochs``, warm-up iterations at their pace) and says so.
Scores within the model's error band (:data:`TIE_BAND`) of the best go to the lossless choice.

The search is an exact branch and bound (:mod:`perfsim.plan_search`). Configurations
that do not fit in memory are rejected: the GPU preset's, else the GPU the profile was
measured on where it names one (the default's V100 16 GB; :func:`perfsim.plan_search.check_fits`).

On a heterogeneous topology the search also covers placement (which GPU runs which
stage) and per-boundary compression (:mod:`perfsim.placement`,
:func:`placement_variants`); the bound then charges each boundary at the slowest link
it crosses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from perfsim import params as params_mod
from perfsim.errors import ConfigError
from perfsim.models.delta_net import GatedDeltaNet
from perfsim.params import BY_NAME, DEFAULTS, normalize
from perfsim.plan_search import (Group, family_bound, family_key, forget_jobs, group_bound,  # noqa: F401
                                 group_key, plan_bound, search)
from perfsim.search_space import (GRADIENT_COMPRESSION, PIPELINE_COMPRESSION, SCHEDULES,  # noqa: F401
                                  Context, SearchSpace, dimensions, enumerate_candidates, is_dimension,
                                  without_ep_only)
from perfsim.emit import emit, run_command, runtime_device_order  # noqa: F401

#: relative error band of a prediction: whole training steps are predicted within
#: 1.5-5.7 % on the H200 (docs/gpu.md); two scores closer than
#: this are a tie, and a tie goes to the lossless choice
TIE_BAND = 0.05


@dataclass
class Candidate:
    """One configuration: its predict parameters, bound and (once simulated) figures."""

    params: dict[str, Any]
    bound_s: float
    steps_ratio: float | None
    summary: dict[str, Any] | None = None
    links: list[dict[str, Any]] = field(default_factory=list)
    rejected: str | None = None
    #: optimizer steps uncompressed training needs to reach the target loss (None: unknown)
    reference_steps: int | None = None
    #: 95 % interval of the steps ratio over the curves' seeds (None: one seed, or a mix)
    ratio_interval: tuple[float, float] | None = None

    @property
    def key(self) -> float:
        """Ordering key of the search: a lower bound of time per unit of progress."""
        return self.bound_s * (self.steps_ratio or 1.0)

    @property
    def time_to_loss_s(self) -> float | None:
        """Wall time to the target loss: the steps it needs (steps ratio x the steps uncompressed
        training needs, its measured curve), the run's warm-up iterations among them at the
        warm-up's pace (:meth:`run_time`)."""
        if self.summary is None or self.steps_ratio is None or not self.reference_steps:
            return None
        return self.run_time(self.steps_ratio * self.reference_steps)

    def run_time(self, steps: float) -> float:
        """Wall time of a run's first ``steps`` optimizer steps: its warm-up iterations first
        (AQ-SGD's uncompressed first epoch, a 1-bit optimizer's uncompressed steps: the summary's
        ``warmup_iterations`` at ``warmup_iteration_s``; a 1-bit optimizer's later refreshes
        counted as if they came first), the rest at the steady ``iteration_s`` (qa7: the steady
        state alone ranked AQ-SGD first for a loss it reaches inside its uncompressed epoch)."""
        s = self.summary
        warm = min(steps, s.get("warmup_iterations") or 0)
        return warm * s.get("warmup_iteration_s", s["iteration_s"]) + (steps - warm) * s["iteration_s"]

    def score(self) -> float:
        """What the plan minimises: the time to the target loss per step uncompressed training
        needs (:meth:`run_time`: warm-up iterations at their pace), or, without convergence
        data, the mean iteration time of the run asked for (its ``optimizer_steps``, warm-up
        iterations included: ``total_s / optimizer_steps``): a short run that is all
        uncompressed warm-up (AQ-SGD's first epoch) scores at that pace, not its steady one."""
        if self.steps_ratio is not None and self.reference_steps:
            return self.run_time(self.steps_ratio * self.reference_steps) / self.reference_steps
        steps = self.summary.get("optimizer_steps") or 0
        warm = steps and self.summary.get("warmup_iterations")  # none: exactly the steady pace
        mean = self.run_time(steps) / steps if warm else self.summary["iteration_s"]
        return mean * (self.steps_ratio or 1.0)


@dataclass
class PlanResult:
    """Ranked configurations (best first) and how the search went."""

    ranked: list[Candidate]
    evaluated: int
    pruned: int
    rejected: int
    total: int
    notes: list[str]
    explanation: str = ""
    all_evaluated: list[Candidate] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per ranked configuration: the predict summary + rank, steps
        ratio and time to loss."""
        out = []
        for i, c in enumerate(self.ranked, 1):
            lo, hi = c.ratio_interval or (None, None)
            row = {"rank": i, **c.summary, "steps_ratio": c.steps_ratio, "steps_ratio_lo": lo,
                   "steps_ratio_hi": hi,
                   "time_to_loss_s": c.time_to_loss_s, "score_s": c.score()}
            for d in dimensions():  # every searched dimension, as the candidate set it
                row.setdefault(d.name, c.params.get(d.name, d.default))
            out.append(row)
        return out

    def to_frame(self):
        import pandas as pd  # lazy: pandas is heavy, needed only here

        return pd.DataFrame(self.rows())

    def __repr__(self) -> str:
        best = self.ranked[0].params if self.ranked else {}
        return (f"PlanResult({len(self.ranked)} ranked of {self.total} candidates, "
                f"{self.evaluated} simulated, {self.pruned} pruned, {self.rejected} rejected; "
                f"best={ {k: best[k] for k in ('pp', 'dp', 'compress', 'grad_compress') if k in best} })")


def placement_variants(params: Sequence[dict[str, Any]], compress: Sequence[str], topology, nodes: int,
                       gpus_per_node: int) -> list[dict[str, Any]]:
    """On a heterogeneous ``topology``: every candidate in each placement of
    :func:`perfsim.placement.placements` (which GPU runs which stage), a pipeline's
    compression also per link (:func:`perfsim.placement.per_link_compression`: fewer
    bits on the slower boundaries)."""
    # lazy: import perfsim does not load perfsim.placement
    from perfsim.placement import boundary_rates, per_link_compression, placements

    fixed = any("placement" in p or "device_order" in p for p in params[:1])
    choices = [(None, None)] if fixed else placements(topology, nodes, gpus_per_node)
    first = compress[0]
    out = []
    seen: set = set()
    for p in params:
        # placements that put every (replica, stage) on the same GPUs are one candidate
        sig = (group_key(p), p["compress"], p["grad_compress"])
        kept = []
        for pl, order in choices:
            where = device_map(p, pl, order)
            if (sig, where) not in seen:
                seen.add((sig, where))
                kept.append((pl, order))
        if p["pp"] == 1:  # a placement still orders the data-parallel ring
            out += [_placed(p, pl, order, p["compress"], "") for pl, order in kept]
            continue
        if p["compress"] != first:  # the assignments below cover every searched spec
            continue
        for pl, order in kept:
            q = _placed(p, pl, order, p["compress"], "")
            rates = boundary_rates(topology, gpus_per_node, pp=p["pp"], dp=p["dp"] * p.get("cp", 1), tp=p.get("tp", 1),
                                   schedule=p["schedule"], microbatches=p["macro_batch"] // p["micro_batch"],
                                   placement=q.get("placement") or "tp,pp,dp", order=q.get("device_order"))
            for comp, per in per_link_compression(rates, compress):
                out.append(_placed(p, pl, order, comp, per))
    return out


def device_map(p: dict[str, Any], placement: str | None, order) -> tuple[int, ...]:
    """The GPU of every (tensor rank, replica, pipeline device) of a candidate (a context-parallel
    group's ranks are consecutive replicas, :attr:`perfsim.config.Strategy.replicas`)."""
    from perfsim.placement import strategy_of  # lazy: import perfsim does not load perfsim.placement

    st = strategy_of(p["pp"], p["dp"] * p.get("cp", 1), p.get("tp", 1), "gpipe", 1, placement or "tp,pp,dp", order)
    return tuple(st.device(t, r, d) for t in range(st.tp) for r in range(st.replicas) for d in range(st.pp))


def _placed(p: dict[str, Any], placement: str | None, order, compress, per) -> dict[str, Any]:
    q = {**p, "compress": compress}
    if placement is not None:
        q["placement"] = placement
    if order is not None:
        q["device_order"] = order
    if per:
        q["boundary_compress"] = per
    return q


def mixed_steps_ratio(curves, p: dict[str, Any], target: float | None) -> float | None:
    """Steps ratio of a candidate: with per-boundary compression that of its most
    step-costly spec (the curves measure one spec on every boundary; a mix is
    assumed to converge no worse than its most lossy part)."""
    specs = {normalize("compress", p["compress"]),
             *(normalize("boundary_compress", p.get("boundary_compress")) or {}).values()}
    ratios = [curves.steps_ratio(c, p["grad_compress"], target) for c in sorted(specs, key=str)]
    if any(r is None for r in ratios):
        return None
    return max(ratios)


def _interval_text(summary: dict) -> str:
    """``; 80 % interval 2.9-3.6 s`` from the prediction's error band
    (:mod:`perfsim.engine.uncertainty`), or nothing where none is stated."""
    lo, hi = summary.get("iteration_s_low"), summary.get("iteration_s_high")
    if lo is None or hi is None:
        return ""
    extra = "; extrapolated beyond the validation data" if "extrapolated" in str(summary.get("interval_note")) else ""
    return f"; 80 % interval {lo * 1e3:.1f}-{hi * 1e3:.1f} ms{extra}"


def _shape(c: Candidate) -> str:
    p = c.params
    cp = f" x CP {p['cp']}" if p.get("cp", 1) > 1 else ""
    return (f"TP {p.get('tp', 1)}{cp} x PP {p['pp']} x DP {p['dp']}, {c.summary.get('schedule') or p.get('schedule')}, "
            f"micro-batch {p['micro_batch']}, {p['compress']} + {p['grad_compress']}")


def _best_of_other_kind(winner: Candidate, simulated: Sequence[Candidate]) -> Candidate | None:
    """The best-scoring simulated candidate that is lossless where ``winner`` compresses, or the reverse."""
    others = [c for c in simulated if c.summary is not None and _lossless(c) != _lossless(winner)]
    return min(others, key=Candidate.score, default=None)


def percent(x: float) -> str:
    """A relative difference for a sentence: one decimal, or its own digits below 0.05 % (never
    "0.0%" for two configurations that differ), "0%" when equal."""
    if x == 0:
        return "0%"
    return f"{x:.1%}" if abs(x) >= 5e-4 else f"{100 * x:.2g}%"


def compression_verdict(winner: Candidate, simulated: Sequence[Candidate], measure: str,
                        band: float = TIE_BAND) -> str:
    """Whether compression pays for this job, against the best configuration of the other kind
    (lossless vs compressed, :func:`_lossless`) that the search simulated. The search simulates a
    lossless candidate while its lower bound is within ``band`` of the best score (ties go to the
    lossless choice), so a lossless candidate it did not simulate is more than ``band`` slower."""
    other = _best_of_other_kind(winner, simulated)
    if not _lossless(winner):
        if other is None:
            return (f"Compression pays: every lossless configuration is more than {band:.0%} slower {measure} "
                    "(each one's lower bound already is, so none was simulated).")
        gain = other.score() / winner.score() - 1
        return f"Compression pays: the best lossless configuration simulated ({_shape(other)}) is {percent(gain)} slower {measure}."
    if other is None:
        return ("Compression does not pay here: every compressed configuration's lower bound is above the "
                "ranked configurations' times, so none was simulated.")
    gain = other.score() / winner.score() - 1
    if gain < 0:
        return (f"Compression would gain only {percent(-gain)} {measure} ({_shape(other)}), within the model's "
                f"error band: it does not pay here.")
    return f"Compression does not pay here: the fastest compressed configuration ({_shape(other)}) is {percent(gain)} slower {measure}."


def explain(ranked: Sequence[Candidate], simulated: Sequence[Candidate] = ()) -> str:
    """One paragraph: where the winner's time goes, which link binds, how it differs from
    the runner-up and, from every candidate ``simulated``, whether compression pays
    (:func:`compression_verdict`; said unless the runner-up already is that comparison)."""
    if not ranked:
        return "No configuration could be simulated."
    w = ranked[0]
    s = w.summary
    it = s["iteration_s"]
    parts = {k: s.get(k, 0.0) or 0.0 for k in ("compute_s", "comm_s", "encode_s", "idle_s", "dp_sync_s",
                                                "optimizer_s", "tp_comm_s")}
    busiest = max(w.links, key=lambda l: l.get("busy_s", 0.0), default=None)
    p = w.params
    ep = f" (expert parallel {p['ep']})" if p.get("ep", 1) > 1 else ""
    cp = f" x CP {p['cp']}" if p.get("cp", 1) > 1 else ""
    text = (f"The best configuration runs TP {p.get('tp', 1)}{cp} x PP {p['pp']} x DP {p['dp']}{ep} with "
            f"{s.get('schedule') or p.get('schedule')}, micro-batch {p['micro_batch']}, pipeline compression {p['compress']} and "
            f"gradient compression {p['grad_compress']}: {it * 1e3:.1f} ms per iteration "
            f"({s.get('throughput_samples_per_s', 0):.3g} samples/s{_interval_text(s)}). Per stage and iteration, compute takes "
            f"{parts['compute_s'] * 1e3:.1f} ms, pipeline communication {parts['comm_s'] * 1e3:.1f} ms, "
            f"encoding {parts['encode_s'] * 1e3:.1f} ms, "
            + (f"tensor- and expert-parallel communication {parts['tp_comm_s'] * 1e3:.1f} ms, "
               if parts["tp_comm_s"] else "")
            + f"gradient sync {parts['dp_sync_s'] * 1e3:.1f} ms, "
            f"optimizer step {parts['optimizer_s'] * 1e3:.1f} ms and "
            f"idle time (bubble and waiting) {parts['idle_s'] * 1e3:.1f} ms.")
    chosen = [f"{d.name}={p[d.name]}" for d in dimensions()
              if d.search != "split" and d.name in p and d.name not in ("schedule", "compress", "grad_compress")
              and p[d.name] != BY_NAME[d.name].default]
    if chosen:
        text += f" It also sets {', '.join(chosen)}."
    if p.get("boundary_compress") or p.get("device_order") is not None:
        overrides = normalize("boundary_compress", p.get("boundary_compress")) or {}
        per = [str(overrides.get(k, p["compress"])) for k in range(p["pp"] - 1)]
        text += (f" Placement: rank order {p.get('placement') or 'tp,pp,dp'}"
                 + (f", GPUs in the order {','.join(map(str, p['device_order']))}" if p.get("device_order") else "")
                 + f"; pipeline boundaries compressed {' | '.join(per)}.")
    if busiest and busiest.get("busy_s", 0) > 0:
        text += (f" The busiest link, {busiest['src']} -> {busiest['dst']}, is busy "
                 f"{busiest['busy_s'] / it:.0%} of the iteration.")
    if w.steps_ratio is not None and w.steps_ratio != 1.0:
        text += f" Its compression needs {w.steps_ratio:.2f}x the steps of uncompressed training."
    # what the score measures: time to the target loss, or (no curves) the run's mean iteration
    measure = "to the target" if w.time_to_loss_s is not None else "per iteration over the run"
    if len(ranked) > 1:
        r = ranked[1]
        diff = [k for k in dict.fromkeys([*p, *r.params]) if p.get(k) != r.params.get(k)]
        gain = r.score() / w.score() - 1
        if gain < 0:
            how = f"is {percent(-gain)} faster {measure}, a tie within the model's error band that goes to the lossless choice"
        elif gain < TIE_BAND:
            how = (f"is {percent(gain)} slower {measure}: within the model's error band ({TIE_BAND:.0%}), "
                   "so the data do not separate the two")
        else:
            how = f"is {percent(gain)} slower {measure}"
        text += (f" The runner-up differs in {', '.join(diff) or 'nothing searched'} "
                 f"({', '.join(f'{k}={r.params.get(k)}' for k in diff)}) and {how}.")
    if simulated and not (len(ranked) > 1 and _best_of_other_kind(w, simulated) is ranked[1]):
        text += " " + compression_verdict(w, simulated, measure)
    return text


#: parameters perfsim plan decides or takes itself (not given through ``system``)
_OWN = ("global_batch", "macro_batch")


def _lossless(c: Candidate) -> bool:
    """No compression beyond the training precision (predict's defaults: the plain specs)."""
    p = c.params
    return all(normalize(k, p.get(k, DEFAULTS[k])).plain for k in ("compress", "grad_compress")) \
        and not p.get("boundary_compress")


def _setup(model, gpus_per_node, space, system, cli):
    """The base parameters (one value each, validated) and the search space with the
    dimensions given in ``system`` merged in."""
    unknown = sorted(k for k in system if k.replace("-", "_") not in params_mod.BY_NAME)
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown} (known: {', '.join(params_mod.NAMES)})")
    own = sorted(k for k in system if k in _OWN)
    if own:
        raise ConfigError(f"{own[0]}: the plan derives it (give global_batch)")
    space = space or SearchSpace()
    dims = {k: v for k, v in system.items() if is_dimension(k) and v is not None}
    both = sorted(set(dims) & set(space.values))
    if both:
        raise ConfigError(f"{both[0]}: given both as a keyword and in space")
    if dims:
        space = SearchSpace(cli=cli, **space.values, **dims)
    base: dict[str, Any] = {"model": model, "gpus_per_node": gpus_per_node}
    for k, v in system.items():
        if v is None or k in dims:
            continue
        values = params_mod.values_of(k, v, cli)
        if len(values) != 1:
            who = params_mod.BY_NAME[k].flag if cli else k
            raise ConfigError(f"{who}={v!r}: perfsim plan takes one value (not a search dimension)")
        base[k] = v
    params_mod.values_of("model", model, cli)
    return base, space


#: tokens a sequence from which ``perfsim plan`` searches context parallelism when no ``--cp`` is given
#: (:data:`CP_SEARCHED`; a GPU preset's job): Llama 3 turned it on for its long-context stage, beyond
#: its 8,192-token pre-training (arXiv:2407.21783, Sec. 3.3.2); shorter sequences keep cp 1 unless asked
LONG_SEQUENCE = 16384
#: the context-parallel degrees searched then (those that divide the GPUs and split the sequence)
CP_SEARCHED = (1, 2, 4, 8)


def candidates(*, model: str = "gpt2-xl", nodes: int = 1, gpus_per_node: int = 1, global_batch: int = 32,
               target_loss: float | None = None, convergence: str | None = None,
               space: SearchSpace | None = None, cli: bool = False,
               **system: Any) -> tuple[list[Candidate], list[str]]:
    """Every configuration :func:`plan` searches (validated; bounds not yet computed),
    and the notes on what was left out -- the space an exhaustive check runs through."""
    from perfsim.api import build_configs, has_blocks  # lazy: import perfsim does not load perfsim.api
    from perfsim.convergence import load_convergence  # lazy: import perfsim does not load perfsim.convergence
    from perfsim.hardware import get_gpu  # lazy: import perfsim does not load perfsim.hardware

    base, space = _setup(model, gpus_per_node, space, system, cli)
    gpus = nodes * gpus_per_node
    notes: list[str] = []
    curves = load_convergence(convergence, model)
    if curves is None:
        notes.append(f"no measured convergence curves for {model}: ranked by iteration time "
                     "over the whole run, warm-up iterations at their pace (time to loss unknown)")
    else:
        notes.append(f"steps to loss from {curves.describe()}")
    w, _, w_system, _ = build_configs(**without_ep_only({**base, "pp": 1, "dp": 1}))
    ctx = Context(get_gpu(base["gpu"]) if base.get("gpu") else None, gpus_per_node,
                  frozenset(system) | frozenset(space.values),
                  experts=getattr(w.arch, "experts", 0) or 0, transformer=has_blocks(w))
    dims = space.resolve(ctx)
    searched = space  # with the context-parallel degrees of a long sequence, where none is given
    long = "cp" not in space.values and ctx.gpu is not None and w.arch is not None and w.arch.seq_len >= LONG_SEQUENCE
    if long and isinstance(w.arch.linear_mixer, GatedDeltaNet):
        # a Gated DeltaNet's context parallelism: refused by the spec, so not searched, and said
        notes.append(f"sequences of {w.arch.seq_len} tokens: context parallelism not searched (not modelled with "
                     f"{type(w.arch.linear_mixer).__name__} blocks)")
    elif long:
        cps = tuple(c for c in CP_SEARCHED if gpus % c == 0 and w.arch.seq_len % (2 * c) == 0)
        searched = SearchSpace(cli=cli, **space.values, cp=list(cps))
        notes.append(f"sequences of {w.arch.seq_len} tokens: context parallelism searched over cp "
                     f"{', '.join(map(str, cps))} (--cp chooses; docs/model.md, \"Context parallelism\")")
    topo = w_system.topology
    if topo is not None and topo.nodes < nodes:
        raise ConfigError(f"topology {system['topology']!r}: has {topo.nodes} nodes, the plan needs {nodes}")
    params = enumerate_candidates(n_layers=len(w.layers), gpus=gpus, gpus_per_node=gpus_per_node,
                                  global_batch=global_batch, space=searched, base=base, ctx=ctx)
    if not params:
        raise ConfigError(f"global_batch={global_batch}: no TP x PP x DP split of {gpus} GPUs "
                          "(with the given tp/pp/dp/micro_batch) divides it")
    for name, values in space.values.items():  # a given value no configuration can use
        d = BY_NAME[name]
        default = normalize(name, d.default)  # a Spec for the compression dimensions
        unused = set(values) - {q.get(name, default) for q in params}
        if unused:
            v = sorted(unused, key=str)[0]
            v = getattr(v, "text", v)  # a spec is named by its text
            raise ConfigError(f"{d.flag if cli else name}={v!r}: no configuration of {nodes} x {gpus_per_node} "
                              f"GPUs uses it" + (f" (it needs {d.search_when})" if d.search_when else ""))
    if topo is not None and not topo.is_uniform():
        params = placement_variants(params, dims["compress"], topo, nodes, gpus_per_node)
        notes.append("heterogeneous topology: searched stage placements (identity and a fast-link chain "
                     "of the nodes, replica-major and Megatron rank orders) and fewer bits on slower "
                     "pipeline boundaries; a per-boundary mix is given the steps ratio of its most "
                     "step-costly spec")
    ref_steps = curves.reference_steps(target_loss) if curves is not None else None
    out: list[Candidate] = []
    missing, never, noise = set(), set(), set()
    for p in params:
        ratio = None
        if curves is not None:
            ratio = mixed_steps_ratio(curves, p, target_loss)
            if ratio is None:
                missing.add((p["compress"], p["grad_compress"]))
                continue
            if math.isinf(ratio):
                never.add((p["compress"], p["grad_compress"]))
                continue
        interval = None
        if curves is not None and not p.get("boundary_compress"):
            rp, rg = curves.ratios(p["compress"], p["grad_compress"], target_loss)
            if min(rp.n, rg.n) >= 2:
                interval = (rp.lo * rg.lo, rp.hi * rg.hi)
            for spec, r in ((p["compress"], rp), (p["grad_compress"], rg)):
                if r.includes_one and r.mean != 1.0:
                    noise.add(f"{spec} {r.mean:.3f} [{r.lo:.3f}, {r.hi:.3f}]")
        out.append(Candidate(p, 0.0, ratio, reference_steps=ref_steps, ratio_interval=interval))
    if noise:
        notes.append("steps ratios whose 95 % interval over seeds includes 1, treated as 1 (seed noise): "
                     + ", ".join(sorted(noise)))
    if missing:
        notes.append(f"left out {len(missing)} compression combination(s) without a measured curve: "
                     + ", ".join(sorted(f"{c}+{g}" for c, g in missing)[:6]))
    if never:
        notes.append("left out (never reached the target loss in their measured budget): "
                     + ", ".join(sorted(f"{c}+{g}" for c, g in never)))
    return out, notes


def plan(*, model: str = "gpt2-xl", nodes: int = 1, gpus_per_node: int = 1, global_batch: int = 32,
         target_loss: float | None = None, convergence: str | None = None, space: SearchSpace | None = None,
         top: int = 5, jobs: int = 1, progress: Callable[[int], None] | None = None,
         backend: str = "process", dask_scheduler: str | None = None, tie_band: float = TIE_BAND,
         cli: bool = False, total: Callable[[int], None] | None = None, **system: Any) -> PlanResult:
    """Search the configurations of ``model`` on ``nodes x gpus_per_node`` GPUs.

    ``system`` takes every parameter of :func:`perfsim.api.predict` (``bandwidth``,
    ``latency``, ``topology``, ``profile``, ``gpu``, ``seq_len``, ...): one value each,
    except the search dimensions (``tp``, ``zero``, ``attention``, ``recompute``, ...,
    :mod:`perfsim.search_space`), which take a value (pinned) or a list (searched) in
    place of their defaults -- as does ``space``. Bad input (a value predict would
    refuse, an infeasible cluster, an empty search) raises :class:`ConfigError` before
    any search. ``convergence`` names measured curves (a bundled model or a JSON file,
    :mod:`perfsim.convergence`); by default those of ``model`` if shipped. ``jobs``
    worker processes simulate in parallel: a local process pool (``backend="process"``)
    or Dask (``backend="dask"``, the optional extra ``perfsim[dask]``;
    ``dask_scheduler`` the address of a ``dask.distributed`` cluster). ``progress(n)``
    is called as ``n`` more candidates are decided, after ``total(N)`` (if given).
    """
    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("global_batch", global_batch),
                    ("top", top), ("jobs", jobs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}={v!r}: must be an integer >= 1")
    from perfsim.batch import BACKENDS  # lazy: `import perfsim` loads this module, the pool's on use

    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r}: choose from {', '.join(BACKENDS)}")
    if target_loss is not None and (isinstance(target_loss, bool) or not isinstance(target_loss, (int, float))
                                    or not math.isfinite(target_loss)):
        raise ConfigError(f"target_loss={target_loss!r}: must be a finite number (a loss the runs reach)")
    if not (isinstance(tie_band, (int, float)) and 0 <= tie_band < 1):
        raise ConfigError(f"tie_band={tie_band!r}: a fraction in [0, 1)")
    forget_jobs()
    cands, notes = candidates(model=model, nodes=nodes, gpus_per_node=gpus_per_node, global_batch=global_batch,
                              target_loss=target_loss, convergence=convergence, space=space, cli=cli, **system)
    grouped: dict[tuple, list[Candidate]] = {}
    for c in cands:
        grouped.setdefault(group_key(c.params), []).append(c)
    n_cands = sum(len(m) for m in grouped.values())
    if total:
        total(n_cands)
    families: dict[tuple, list[Group]] = {}
    for members in grouped.values():
        g = Group(0.0, members, ratio=min(c.steps_ratio or 1.0 for c in members))
        families.setdefault(family_key(members[0].params), []).append(g)
    fams = []
    for groups in families.values():
        ratio = min(g.ratio for g in groups)
        fams.append(Group(family_bound(groups[0].first().params) * ratio, groups, ratio=ratio))
    done, pruned, rejected, invalid = search(fams, top=top, jobs=jobs, progress=progress, backend=backend,
                                             dask_scheduler=dask_scheduler, band=tie_band, lossless=_lossless)
    # equal scores: the lossless configuration first (it trains the same model for the same time)
    feasible = sorted((c for c in done if c.summary is not None), key=lambda c: (c.score(), not _lossless(c)))
    if not feasible:
        why = [c.rejected for c in done + invalid if c.rejected]
        raise ConfigError(f"no configuration of {model} on {nodes} x {gpus_per_node} GPUs fits"
                          + (f" ({rejected} rejected), e.g. {why[0]}" if why else
                             " (every candidate was left out: see the convergence curves)"))
    lossless = next((c for c in feasible if _lossless(c)), None)
    if lossless is not None and lossless is not feasible[0] \
            and lossless.score() <= feasible[0].score() * (1 + tie_band):
        gain = lossless.score() / feasible[0].score() - 1
        notes.append(f"the fastest ({feasible[0].params['compress']} + {feasible[0].params['grad_compress']}) "
                     f"is {percent(gain)} faster than the best lossless "
                     f"configuration, within the model's {tie_band:.0%} error band: the lossless one ranks first")
        feasible.remove(lossless)
        feasible.insert(0, lossless)
    result = PlanResult(ranked=feasible[:top], evaluated=len(done), pruned=pruned,
                        rejected=rejected, total=n_cands, notes=notes,
                        all_evaluated=done + invalid)
    result.explanation = explain(result.ranked, done)
    return result


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated in (lower x, higher y)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best_y = [], -math.inf
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return front
