"""``perfsim plan``: the best way to train a model on a cluster, compression included.

The planner enumerates configurations -- parallelism (TP x PP x DP over the cluster's
GPUs), schedule, micro-batch, recomputation, pipeline and gradient compression --,
simulates them with the same engine as ``perfsim predict`` and ranks them by
**time to a target loss**, not raw throughput: compression changes how many steps a
run needs. ``time_to_loss = iteration_s x steps_ratio x reference_steps`` where
``steps_ratio`` is how many more (or fewer) optimizer steps a compressor needs than
uncompressed training to reach the same loss, read from measured ``perfsim run``
curves (:mod:`perfsim.convergence`). Without a curve for a method the plan ranks by
throughput and says so.

Search is branch and bound (Land & Doig, "An automatic method of solving discrete
programming problems", Econometrica 1960): every candidate gets a closed-form lower
bound of its iteration time from the engine's plan (:func:`iteration_bound`: busiest
stage, one pass through the pipeline, bytes over the busiest boundary) -- candidates are
simulated in increasing order of ``bound x steps_ratio``, and the search stops as
soon as the next bound cannot beat the ``top``-th best time found. Configurations
that do not fit in memory (when the simulator reports ``fits``) are rejected.

On a heterogeneous topology the search also covers placement (which GPU runs which
stage) and per-boundary compression (:mod:`perfsim.placement`,
:func:`placement_variants`); the bound then charges each boundary at the slowest link
it crosses.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from perfsim.errors import ConfigError

#: default pipeline compressions searched (forward / backward bits of the seeds' grids)
PIPELINE_COMPRESSION = ("fp32", "fp16", "directq:fw4bw8", "aqsgd:fw4bw8", "aqsgd:fw3bw6", "aqsgd:fw2bw4")
#: default gradient compressions searched
GRADIENT_COMPRESSION = ("none", "fp16", "qsgd-maxnorm:8", "qsgd-maxnorm:4", "powersgd:2")
SCHEDULES = ("gpipe", "1f1b", "zb-h1", "interleaved-1f1b")


@dataclass(frozen=True)
class SearchSpace:
    """The axes the planner searches (``None`` = derived from the cluster/model)."""

    #: tensor-parallel degrees (None: the divisors of gpus_per_node, when the
    #: simulator supports TP; else 1)
    tp: tuple[int, ...] | None = None
    #: pipeline degrees (None: every divisor of the GPU count that the layer count allows)
    pp: tuple[int, ...] | None = None
    #: micro-batch sizes (None: powers of two dividing the per-replica batch, up to 8)
    micro_batch: tuple[int, ...] | None = None
    schedules: tuple[str, ...] = SCHEDULES
    compress: tuple[str, ...] = PIPELINE_COMPRESSION
    grad_compress: tuple[str, ...] = GRADIENT_COMPRESSION
    #: activation recomputation modes (searched only where the simulator has them)
    recompute: tuple[str, ...] = ("none", "full")

    def __post_init__(self):
        for name in ("tp", "pp", "micro_batch"):
            v = getattr(self, name)
            if v is not None and (not v or any(not isinstance(x, int) or x < 1 for x in v)):
                raise ConfigError(f"{name}={v!r}: need integers >= 1")
        for name in ("schedules", "compress", "grad_compress", "recompute"):
            if not getattr(self, name):
                raise ConfigError(f"{name}: empty")


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

    @property
    def key(self) -> float:
        """Ordering key of the search: a lower bound of time per unit of progress."""
        return self.bound_s * (self.steps_ratio or 1.0)

    @property
    def time_to_loss_s(self) -> float | None:
        """Wall time to the target loss: iteration x steps ratio x the steps uncompressed
        training needs (its measured curve)."""
        if self.summary is None or self.steps_ratio is None or not self.reference_steps:
            return None
        return self.summary["iteration_s"] * self.steps_ratio * self.reference_steps

    def score(self) -> float:
        """What the plan minimises: iteration time x steps ratio (time per unit of
        progress), or the iteration time alone when no convergence data exists."""
        return self.summary["iteration_s"] * (self.steps_ratio or 1.0)


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
            row = {"rank": i, **c.summary, "steps_ratio": c.steps_ratio,
                   "time_to_loss_s": c.time_to_loss_s, "score_s": c.score()}
            row.setdefault("tp", c.params.get("tp", 1))
            row.setdefault("recompute", c.params.get("recompute", "none"))
            out.append(row)
        return out

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows())

    def __repr__(self) -> str:
        best = self.ranked[0].params if self.ranked else {}
        return (f"PlanResult({len(self.ranked)} ranked of {self.total} candidates, "
                f"{self.evaluated} simulated, {self.pruned} pruned, {self.rejected} rejected; "
                f"best={ {k: best[k] for k in ('pp', 'dp', 'compress', 'grad_compress') if k in best} })")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _known_params() -> set[str]:
    from perfsim.api import DEFAULTS

    return set(DEFAULTS)


def enumerate_candidates(*, n_layers: int, gpus: int, gpus_per_node: int, global_batch: int,
                         space: SearchSpace, base: dict[str, Any],
                         known: set[str] | None = None, experts: int = 0) -> list[dict[str, Any]]:
    """Every parameter dict of the search (before bounds): TP x PP x DP = ``gpus``,
    per-replica batch = ``global_batch / dp``, micro-batch dividing it; a model of
    ``experts`` routed experts also with expert parallelism over the ``dp`` replicas
    (``ep = dp``, where it divides the experts; :func:`perfsim.models.moe.check_routing`)."""
    known = _known_params() if known is None else known
    has_tp = "tp" in known
    tps = space.tp or (tuple(d for d in _divisors(gpus_per_node)) if has_tp else (1,))
    if not has_tp and any(t != 1 for t in tps):
        raise ConfigError("tp: this simulator has no tensor parallelism")
    recompute = space.recompute if "recompute" in known else ("none",)
    out = []
    for tp in tps:
        if gpus % tp:
            continue
        pps = space.pp or tuple(d for d in _divisors(gpus // tp) if d <= n_layers)
        for pp in pps:
            if (gpus // tp) % pp or pp > n_layers:
                continue
            dp = gpus // tp // pp
            if global_batch % dp:
                continue
            per_replica = global_batch // dp
            mbs = space.micro_batch or tuple(b for b in (1, 2, 4, 8) if per_replica % b == 0)
            for mb in mbs:
                if per_replica % mb:
                    continue
                schedules = space.schedules if pp > 1 else space.schedules[:1]
                compress = space.compress if pp > 1 else ("fp32",)
                grads = space.grad_compress if dp > 1 else ("none",)
                eps = (1, dp) if "ep" in known and experts and dp > 1 and experts % dp == 0 else (1,)
                for sched, comp, grad, rc, ep in itertools.product(schedules, compress, grads, recompute, eps):
                    p = {**base, "pp": pp, "dp": dp, "micro_batch": mb, "macro_batch": per_replica,
                         "schedule": sched, "compress": comp, "grad_compress": grad}
                    if has_tp:
                        p["tp"] = tp
                    if "recompute" in known:
                        p["recompute"] = rc
                    if ep > 1:
                        p["ep"] = ep
                    out.append(p)
    return out


def placement_variants(params: Sequence[dict[str, Any]], space: SearchSpace, topology, nodes: int,
                       gpus_per_node: int) -> list[dict[str, Any]]:
    """On a heterogeneous ``topology``: every candidate in each placement of
    :func:`perfsim.placement.placements` (which GPU runs which stage), a pipeline's
    compression also per link (:func:`perfsim.placement.per_link_compression`: fewer
    bits on the slower boundaries)."""
    from perfsim.placement import boundary_rates, per_link_compression, placements

    fixed = any("placement" in p or "device_order" in p for p in params[:1])
    choices = [(None, None)] if fixed else placements(topology, nodes, gpus_per_node)
    first = space.compress[0]
    out = []
    seen: set = set()
    for p in params:
        # placements that put every (replica, stage) on the same GPUs are one candidate
        sig = (p["pp"], p["dp"], p.get("tp", 1), p.get("ep", 1), p["schedule"], p["micro_batch"], p["compress"],
               p["grad_compress"], p.get("recompute"))
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
            rates = boundary_rates(topology, gpus_per_node, pp=p["pp"], dp=p["dp"], tp=p.get("tp", 1),
                                   schedule=p["schedule"], microbatches=p["macro_batch"] // p["micro_batch"],
                                   placement=q.get("placement") or "tp,pp,dp", order=q.get("device_order"))
            for comp, per in per_link_compression(rates, space.compress):
                out.append(_placed(p, pl, order, comp, per))
    return out


def device_map(p: dict[str, Any], placement: str | None, order) -> tuple[int, ...]:
    """The GPU of every (tensor rank, replica, pipeline device) of a candidate."""
    from perfsim.placement import strategy_of

    st = strategy_of(p["pp"], p["dp"], p.get("tp", 1), "gpipe", 1, placement or "tp,pp,dp", order)
    return tuple(st.device(t, r, d) for t in range(st.tp) for r in range(st.dp) for d in range(st.pp))


def _placed(p: dict[str, Any], placement: str | None, order, compress: str, per: str) -> dict[str, Any]:
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
    from perfsim.boundaries import parse_boundary_compress

    specs = {p["compress"], *parse_boundary_compress(p.get("boundary_compress")).values()}
    ratios = [curves.steps_ratio(c, p["grad_compress"], target) for c in sorted(specs)]
    if any(r is None for r in ratios):
        return None
    return max(ratios)


def iteration_bound(stage_work_s: Sequence[float], boundary_bytes: Sequence[float], m: int,
                    link_bps: float | None, sync_bytes: Sequence[float] = (),
                    boundary_bps: Sequence[float] | None = None,
                    boundary_latency_s: Sequence[float] = ()) -> float:
    """Lower bound of one iteration, whatever the schedule or network contention:

    * the busiest stage computes all ``m`` micro-batches: ``m x max_s W_s``;
    * one micro-batch's forward and backward pass through every stage in turn: ``sum_s W_s``;
    * every micro-batch crosses each pipeline boundary (forward activations one way,
      gradients the other, full duplex): ``m x max_k bytes_k x 8 / B`` at the link's
      nominal rate ``B`` (``None``: no link term);
    * each stage's gradient synchronisation puts ``sync_bytes[s]`` on its busiest link
      once per iteration (however well it overlaps the backward): ``max_s sync_s x 8 / B``;
    * on a heterogeneous topology, ``boundary_bps[k]`` is the rate of the slowest link
      boundary ``k`` crosses: ``m x max_k bytes_k x 8 / B_k``; and one micro-batch's
      pass crosses every boundary forward and back: ``sum_s W_s + 2 sum_k lat_k`` with
      ``boundary_latency_s[k]`` the least one-way latency of boundary ``k``.
    """
    bound = max(m * max(stage_work_s), sum(stage_work_s) + 2 * sum(boundary_latency_s))
    if link_bps and boundary_bytes:
        bound = max(bound, m * max(boundary_bytes) * 8 / link_bps)
    if boundary_bps and boundary_bytes:
        bound = max(bound, m * max(b * 8 / r for b, r in zip(boundary_bytes, boundary_bps)))
    if link_bps and sync_bytes:
        bound = max(bound, max(sync_bytes) * 8 / link_bps)
    return bound


def plan_bound(params: dict[str, Any]) -> float:
    """:func:`iteration_bound` of a configuration, from the engine's own plan (stage
    compute, exact boundary wire bytes) -- no simulation."""
    from perfsim.api import build_configs
    from perfsim.engine.plan import build_plan

    workload, strategy, system, profile = build_configs(**params)
    pl = build_plan(workload, strategy, profile)
    work = [st.fwd_s + st.bwd_s for st in pl.stages]
    boundary = [max(st.fw_bytes, st.bw_bytes) for st in pl.stages[:-1]]
    # pipeline neighbours share a node only when a node holds several GPUs; then the
    # faster intra-node fabric is the optimistic (valid) rate
    link = None
    if system.topology is None:
        link = system.bandwidth_bps if system.gpus_per_node == 1 else \
            max(system.bandwidth_bps, system.intra_node_bandwidth_bps)
    from perfsim.network import collective_cost

    sync = [sum(collective_cost(step.kind, step.nbytes, pl.dp)[0] for b in st.buckets for step in b.steps)
            for st in pl.stages] if pl.dp > 1 else []
    rates = None
    if system.topology is not None:  # each boundary over the slowest link it crosses
        from perfsim.network import Network

        net = Network(system, strategy.devices, profile)
        where = pl.table.stage_device
        paths = [[net.path(strategy.device(0, r, where[k]), strategy.device(0, r, where[k + 1]))
                  for r in range(pl.dp)] if where[k] != where[k + 1] else []
                 for k in range(len(pl.stages) - 1)]
        rates = [min((p.bandwidth_bps for p in ps), default=math.inf) for ps in paths]
        lats = [min((p.latency_s for p in ps), default=0.0) for ps in paths]
        return iteration_bound(work, boundary, pl.num_microbatches, link, sync, rates, lats)
    return iteration_bound(work, boundary, pl.num_microbatches, link, sync, rates)


def _simulate(params: dict[str, Any]) -> tuple[dict | None, list, str | None]:
    from perfsim.api import predict

    try:
        res = predict(**params)
    except ConfigError as exc:  # e.g. does not fit in memory, invalid combination
        return None, [], str(exc)
    return res.summary, res.links, None


def _simulate_batch(batch: list[dict[str, Any]]) -> list[tuple[dict | None, list, str | None]]:
    return [_simulate(p) for p in batch]


#: parallel backends of the search (``process``: a local process pool, as ``perfsim sweep``)
BACKENDS = ("process", "dask")


class _Workers:
    """Maps a function over lists of parameter batches: in this process (``jobs == 1``),
    a local process pool, or Dask (``dask_scheduler``: a ``dask.distributed`` scheduler
    address, e.g. ``tcp://host:8786``, so a large search spreads over its workers;
    without it Dask's local multiprocessing scheduler with ``jobs`` workers)."""

    def __init__(self, backend: str, jobs: int, dask_scheduler: str | None = None):
        if backend not in BACKENDS:
            raise ConfigError(f"backend={backend!r}: choose from {', '.join(BACKENDS)}")
        self.backend, self.jobs, self.pool, self.client = backend, jobs, None, None
        if backend == "dask":
            import importlib.util

            if importlib.util.find_spec("dask") is None:
                raise ConfigError("backend=dask: dask is not installed (pip install 'perfsim[dask]')")
            if dask_scheduler:
                try:
                    from distributed import Client
                except ImportError:
                    raise ConfigError("dask_scheduler: needs dask.distributed (pip install 'perfsim[dask]')") from None
                try:
                    self.client = Client(dask_scheduler, timeout="10s")
                except (OSError, TimeoutError) as exc:
                    raise ConfigError(f"dask_scheduler={dask_scheduler!r}: cannot connect ({exc})") from None
                self.jobs = max(jobs, sum(self.client.nthreads().values()))
        elif dask_scheduler:
            raise ConfigError("dask_scheduler: only with backend=dask")
        elif jobs > 1:
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(max_workers=jobs)

    @property
    def parallel(self) -> bool:
        return self.pool is not None or self.client is not None or (self.backend == "dask" and self.jobs > 1)

    def map(self, batches: list[list[dict[str, Any]]]) -> list[list[tuple]]:
        if self.client is not None:
            return self.client.gather(self.client.map(_simulate_batch, batches, pure=False))
        if self.backend == "dask" and self.jobs > 1:
            import dask

            tasks = [dask.delayed(_simulate_batch)(b) for b in batches]
            return list(dask.compute(*tasks, scheduler="processes", num_workers=self.jobs))
        if self.pool is not None:
            return list(self.pool.map(_simulate_batch, batches))
        return [_simulate_batch(b) for b in batches]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.client is not None:
            self.client.close()


def search(candidates: Sequence[Candidate], *, top: int = 5, jobs: int = 1, wave: int = 16,
           progress: Callable[[int], None] | None = None, backend: str = "process",
           dask_scheduler: str | None = None) -> tuple[list[Candidate], int, int]:
    """Branch and bound over ``candidates``: simulate in order of their bound key, stop
    when the next bound cannot enter the top ``top``. Returns (evaluated candidates,
    number pruned, number rejected). Waves of ``wave`` candidates per worker run in
    parallel on ``backend`` (:class:`_Workers`)."""
    order = sorted(candidates, key=lambda c: c.key)
    done: list[Candidate] = []
    best: list[float] = []  # scores of the feasible candidates, ascending
    rejected = 0
    workers = _Workers(backend, jobs, dask_scheduler)
    try:
        i = 0
        while i < len(order):
            if len(best) >= top and order[i].key >= best[top - 1]:
                break  # every remaining bound is at least the current top-th score
            n = workers.jobs
            batch = order[i:i + (max(wave, 2 * n) if workers.parallel else 1)]
            chunks = [batch[k::n] for k in range(n)] if workers.parallel else [batch]
            chunks = [ch for ch in chunks if ch]
            outs = workers.map([[c.params for c in ch] for ch in chunks])
            results = {}
            for ch, out in zip(chunks, outs):
                for c, r in zip(ch, out):
                    results[id(c)] = r
            results = [results[id(c)] for c in batch]
            for c, (summary, links, err) in zip(batch, results):
                if err is None and summary.get("fits") is False:
                    err = "does not fit in memory"
                if err is not None:
                    c.rejected = err
                    rejected += 1
                else:
                    c.summary, c.links = summary, links
                    best.append(c.score())
                    best.sort()
                done.append(c)
            i += len(batch)
            if progress:
                progress(len(batch))
    finally:
        workers.close()
    return done, len(order) - len(done), rejected


def explain(ranked: Sequence[Candidate]) -> str:
    """One paragraph: where the winner's time goes, which link binds, and how it
    differs from the runner-up."""
    if not ranked:
        return "No configuration could be simulated."
    w = ranked[0]
    s = w.summary
    it = s["iteration_s"]
    parts = {k: s.get(k, 0.0) or 0.0 for k in ("compute_s", "comm_s", "encode_s", "idle_s", "dp_sync_s")}
    busiest = max(w.links, key=lambda l: l.get("busy_s", 0.0), default=None)
    p = w.params
    ep = f" (expert parallel {p['ep']})" if p.get("ep", 1) > 1 else ""
    text = (f"The best configuration runs TP {p.get('tp', 1)} x PP {p['pp']} x DP {p['dp']}{ep} with "
            f"{p['schedule']}, micro-batch {p['micro_batch']}, pipeline compression {p['compress']} and "
            f"gradient compression {p['grad_compress']}: {it * 1e3:.1f} ms per iteration "
            f"({s.get('throughput_samples_per_s', 0):.3g} samples/s). Per stage and iteration, compute takes "
            f"{parts['compute_s'] * 1e3:.1f} ms, pipeline communication {parts['comm_s'] * 1e3:.1f} ms, "
            f"encoding {parts['encode_s'] * 1e3:.1f} ms, gradient sync {parts['dp_sync_s'] * 1e3:.1f} ms and "
            f"idle time (bubble and waiting) {parts['idle_s'] * 1e3:.1f} ms.")
    if p.get("boundary_compress") or p.get("device_order") is not None:
        from perfsim.boundaries import spec_of

        per = [spec_of(p["compress"], p.get("boundary_compress"), k) for k in range(p["pp"] - 1)]
        text += (f" Placement: rank order {p.get('placement') or 'tp,pp,dp'}"
                 + (f", GPUs in the order {','.join(map(str, p['device_order']))}" if p.get("device_order") else "")
                 + f"; pipeline boundaries compressed {' | '.join(per)}.")
    if busiest and busiest.get("busy_s", 0) > 0:
        text += (f" The busiest link, {busiest['src']} -> {busiest['dst']}, is busy "
                 f"{busiest['busy_s'] / it:.0%} of the iteration.")
    if w.steps_ratio is not None and w.steps_ratio != 1.0:
        text += f" Its compression needs {w.steps_ratio:.2f}x the steps of uncompressed training."
    if len(ranked) > 1:
        r = ranked[1]
        diff = [k for k in ("tp", "pp", "dp", "schedule", "micro_batch", "compress", "boundary_compress",
                            "grad_compress", "recompute", "placement", "device_order")
                if p.get(k) != r.params.get(k)]
        gain = r.score() / w.score() - 1
        text += (f" The runner-up differs in {', '.join(diff) or 'nothing searched'} "
                 f"({', '.join(f'{k}={r.params.get(k)}' for k in diff)}) and is {gain:.1%} slower to the target.")
    return text


def plan(*, model: str = "gpt2-xl", nodes: int = 1, gpus_per_node: int = 1, global_batch: int = 32,
         target_loss: float | None = None, convergence: str | None = None, space: SearchSpace | None = None,
         top: int = 5, jobs: int = 1, progress: Callable[[int], None] | None = None,
         backend: str = "process", dask_scheduler: str | None = None, **system: Any) -> PlanResult:
    """Search the configurations of ``model`` on ``nodes x gpus_per_node`` GPUs.

    ``system`` takes the system parameters of :func:`perfsim.api.predict` (``bandwidth``,
    ``latency``, ``topology``, ``profile``, ``gpu``, ``intra_node_fabric``, ...).
    ``convergence`` names measured curves (a bundled model or a JSON file,
    :mod:`perfsim.convergence`); by default those of ``model`` if shipped.
    ``jobs`` worker processes simulate in parallel: a local process pool
    (``backend="process"``) or Dask (``backend="dask"``, the optional extra
    ``perfsim[dask]``; ``dask_scheduler`` the address of a ``dask.distributed``
    cluster to spread a large search over machines).
    """
    from perfsim.api import build_configs
    from perfsim.convergence import load_convergence

    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("global_batch", global_batch),
                    ("top", top), ("jobs", jobs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}={v!r}: must be an integer >= 1")
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r}: choose from {', '.join(BACKENDS)}")
    space = space or SearchSpace()
    known = _known_params()
    unknown = set(system) - known
    if unknown:
        raise ConfigError(f"unknown system parameter(s) {sorted(unknown)}")
    gpus = nodes * gpus_per_node
    base = {"model": model, "gpus_per_node": gpus_per_node, **system}
    notes: list[str] = []
    curves = load_convergence(convergence, model)
    if curves is None:
        notes.append(f"no measured convergence curves for {model}: ranked by iteration time "
                     "(time to loss unknown)")
    else:
        notes.append(f"steps to loss from {curves.describe()}")
    w, _, w_system, _ = build_configs(**{**base, "pp": 1, "dp": 1})
    params = enumerate_candidates(n_layers=len(w.layers), gpus=gpus, gpus_per_node=gpus_per_node,
                                  global_batch=global_batch, space=space, base=base, known=known,
                                  experts=getattr(w.arch, "experts", 0))
    if not params:
        raise ConfigError(f"global_batch={global_batch}: no TP x PP x DP split of {gpus} GPUs divides it")
    topo = w_system.topology
    if topo is not None and not topo.is_uniform():
        if topo.nodes < nodes:
            raise ConfigError(f"topology {system['topology']!r}: has {topo.nodes} nodes, the plan needs {nodes}")
        params = placement_variants(params, space, topo, nodes, gpus_per_node)
        notes.append("heterogeneous topology: searched stage placements (identity and a fast-link chain "
                     "of the nodes, replica-major and Megatron rank orders) and fewer bits on slower "
                     "pipeline boundaries; a per-boundary mix is given the steps ratio of its most "
                     "step-costly spec")
    ref_steps = curves.reference_steps(target_loss) if curves is not None else None
    cands, invalid = [], []
    missing, never = set(), set()
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
        try:
            bound = plan_bound(p)
        except ConfigError as exc:  # an invalid combination: rejected without simulating
            c = Candidate(p, 0.0, ratio, rejected=str(exc))
            invalid.append(c)
            continue
        cands.append(Candidate(p, bound, ratio, reference_steps=ref_steps))
    if missing:
        notes.append(f"left out {len(missing)} compression combination(s) without a measured curve: "
                     + ", ".join(sorted(f"{c}+{g}" for c, g in missing)[:6]))
    if never:
        notes.append("left out (never reached the target loss in their measured budget): "
                     + ", ".join(sorted(f"{c}+{g}" for c, g in never)))
    done, pruned, rejected = search(cands, top=top, jobs=jobs, progress=progress, backend=backend,
                                    dask_scheduler=dask_scheduler)
    feasible = sorted((c for c in done if c.summary is not None), key=Candidate.score)
    result = PlanResult(ranked=feasible[:top], evaluated=len(done), pruned=pruned,
                        rejected=rejected + len(invalid), total=len(cands) + len(invalid), notes=notes,
                        all_evaluated=done + invalid)
    result.explanation = explain(result.ranked)
    return result


def run_command(params: dict[str, Any], model_runtime: Iterable[str] | None = None) -> str | None:
    """The ``perfsim run`` command that trains this configuration for real, or None
    when the runtime has no implementation of the model."""
    from perfsim.models.specs import MODEL_SPECS

    runtime = set(model_runtime) if model_runtime is not None else set(MODEL_SPECS)
    if params["model"] not in runtime:
        return None
    flags = [f"--model {params['model']}", f"--pp {params['pp']}", f"--dp {params['dp']}",
             f"--schedule {params['schedule']}", f"--compress {params['compress']}",
             f"--grad-compress {params['grad_compress']}", f"--micro-batch {params['micro_batch']}",
             f"--macro-batch {params['macro_batch']}"]
    if params.get("tp", 1) != 1:
        flags.insert(1, f"--tp {params['tp']}")
    if params.get("boundary_compress"):
        flags.insert(flags.index(f"--compress {params['compress']}") + 1,
                     f"--boundary-compress {params['boundary_compress']}")
    order = runtime_device_order(params)
    note = ""
    if order is not None and params.get("tp", 1) == 1:
        flags.append(f"--device-order {','.join(map(str, order))}")
    elif order is not None:  # the TP device mesh numbers its ranks itself
        note = f"  # simulated GPU order {','.join(map(str, order))} not expressible with --tp > 1"
    bw = params.get("bandwidth")
    if bw and not params.get("topology"):
        flags.append(f"--emulate-bandwidth {bw}")
    return "perfsim run " + " ".join(flags) + note


def runtime_device_order(params: dict[str, Any]) -> tuple[int, ...] | None:
    """``perfsim run --device-order`` of a configuration: the GPU (rank) the simulator
    places each position of the runtime's rank order on (TP innermost, then DP, then
    PP: :class:`perfsim.runtime.tensor_parallel.RankLayout`), so that under torchrun
    every stage runs on the host the plan chose. None when that is the identity."""
    from perfsim.api import build_configs

    st = build_configs(**params)[1]
    order = tuple(st.device(t, r, s) for s in range(st.pp) for r in range(st.dp) for t in range(st.tp))
    return None if order == tuple(range(len(order))) else order


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated in (lower x, higher y)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best_y = [], -math.inf
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return front
