"""Does a job fit in GPU memory, and what would make it fit (``perfsim memory``).

The question ``accelerate estimate-memory`` and DeepSpeed's ``estimate_zero*_model_states_mem_needs``
answer, with the memory model every prediction uses (:mod:`perfsim.memory`: weights,
gradients, optimizer state by ZeRO stage -- Rajbhandari et al., "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", arXiv:1910.02054 --, activations by schedule and
recomputation, the loss's logits, buffers): the peak per GPU of each pipeline stage, and the
same peak under each single change that can lower it (a ZeRO stage, recomputation, more
tensor, pipeline, context or expert parallelism on the same GPUs, a smaller micro-batch, a chunked loss,
fp8; CPU offload where it makes the job fit), so the user sees which knob buys what. Nothing is
simulated: only the plan that prices the stages is built (so expert parallelism smaller than data
parallelism, which the simulator refuses, is answered here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfsim.api import build_configs
from perfsim.engine import plan_with_memory
from perfsim.errors import ConfigError
from perfsim.hardware import get_gpu, profile_gpu
from perfsim.param_table import PARAMS
from perfsim.params import resolved

GIB = 2 ** 30


@dataclass
class MemoryReport:
    """Peak memory per GPU of one job, and of the single changes that lower it."""

    #: the job's parameters, as given
    params: dict[str, Any]
    #: peak bytes per GPU over the stages, and the stage that holds it
    peak_bytes: float
    worst_stage: int
    #: that stage's parts (weights, gradients, optimizer state, activations, buffers), bytes
    breakdown: dict[str, float]
    #: the GPU's memory in bytes, None without a GPU preset
    capacity_bytes: float | None
    #: every stage's peak, bytes
    stage_bytes: list[float] = field(default_factory=list)
    #: (change as flags, peak bytes, fits) for each applicable single change, lowest peak first
    options: list[tuple[str, float, bool | None]] = field(default_factory=list)
    #: where no single change fits: changes taken one after another, each the one that
    #: lowers the peak most, as (flags so far, peak bytes) -- the last fits, or nothing more helps
    combination: list[tuple[str, float]] = field(default_factory=list)
    #: host memory per GPU of an offloaded optimizer on that stage (``--offload optimizer``), bytes
    host_bytes: float = 0.0
    #: whose memory ``capacity_bytes`` is: the ``--gpu`` preset, else the GPU the profile was
    #: measured on (``v100-sxm2-16gb, the profile's GPU``), as predict's memory warning compares
    capacity_of: str = ""
    #: one line each: what the caller gave that does not change this job's memory
    #: (:func:`memory_free_settings`), printed as predict's notes are
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.peak_bytes <= self.capacity_bytes

    def options_by_flags(self) -> dict[str, float]:
        """{change as flags: peak bytes}."""
        return {flags: peak for flags, peak, _ in self.options}

    def to_dict(self) -> dict[str, Any]:
        return {"peak_gib": self.peak_bytes / GIB, "worst_stage": self.worst_stage,
                "breakdown_gib": {k: v / GIB for k, v in self.breakdown.items()},
                "capacity_gib": None if self.capacity_bytes is None else self.capacity_bytes / GIB,
                "fits": self.fits, "stage_gib": [b / GIB for b in self.stage_bytes],
                "options": [{"change": c, "peak_gib": b / GIB, "fits": f} for c, b, f in self.options],
                "combination": [{"flags": c, "peak_gib": b / GIB} for c, b in self.combination],
                "host_gib": self.host_bytes / GIB, "capacity_of": self.capacity_of, "notes": self.notes}


def _peaks(params: dict[str, Any]):
    """(stage memories, capacity bytes) of one job: the plan and memory model predict uses."""
    _, _, memory = plan_with_memory(*build_configs(**params), allow_oom=True)
    return memory


def _changes(p: dict[str, Any], offload: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """Single changes that can lower the peak, as (flags, new parameters); those that do not
    apply to this job (already set, no data parallelism to shard over) are left out.
    ``offload``: also CPU offload of the optimizer (ZeRO-Offload, arXiv:2101.06840; it slows
    the step, :mod:`perfsim.engine.offload`, so it is offered only to a job that does not fit),
    on ZeRO-2 as the paper builds it."""
    given, p = p, resolved(p)
    out = []
    if offload and given.get("gpu") and p.get("offload", "none") == "none":
        zero = p.get("zero") or 0
        out.append(("--offload optimizer", {"offload": "optimizer"}) if zero >= 2 else
                   ("--zero 2 --offload optimizer", {"zero": 2, "offload": "optimizer"}))
    dp, tp, pp = p["dp"], p["tp"], p["pp"]
    zero = p.get("zero") or 0
    if dp > 1:
        out += [(f"--zero {z}", {"zero": z}) for z in (1, 2, 3) if z > zero]
    recompute = p.get("recompute") or "none"
    out += [(f"--recompute {r}", {"recompute": r}) for r in ("selective", "full")
            if (r, recompute) not in (("selective", "selective"), ("selective", "full"), ("full", "full"))]
    if dp % 2 == 0:  # the same GPUs: more model parallelism, fewer replicas
        out.append((f"--tp {2 * tp} --dp {dp // 2}", {"tp": 2 * tp, "dp": dp // 2}))
        out.append((f"--pp {2 * pp} --dp {dp // 2}", {"pp": 2 * pp, "dp": dp // 2}))
        cp = p.get("cp") or 1  # each replica's sequences split over twice the ranks (refused where not modelled)
        out.append((f"--cp {2 * cp} --dp {dp // 2}", {"cp": 2 * cp, "dp": dp // 2}))
    ep = p.get("ep") or 1
    if dp % (2 * ep) == 0:  # a mixture of experts: its experts over more replicas (a dense model refuses it)
        out.append((f"--ep {2 * ep}", {"ep": 2 * ep}))
    mb = p.get("micro_batch") or 1
    if mb > 1:
        out.append((f"--micro-batch {mb // 2}", {"micro_batch": mb // 2}))
    if (p.get("cross_entropy") or "fused") != "chunked":
        out.append(("--cross-entropy chunked", {"cross_entropy": "chunked"}))
    if given.get("gpu") and p.get("precision") != "fp8":
        if "fp8" in get_gpu(p["gpu"]).peak_flops:
            out.append(("--precision fp8", {"precision": "fp8"}))
    return out


def memory_report(**params: Any) -> MemoryReport:
    """The peak memory per GPU of the job ``params`` (``perfsim predict``'s keywords) and of
    each single change that lowers it (:func:`_changes`); a change the job refuses
    (e.g. more stages than layers) is left out. Raises ConfigError on bad input, like predict."""
    params = {k: v for k, v in params.items() if v is not None}
    mem, cap = _peaks(params)
    capacity_of = str(params.get("gpu") or "")
    if cap is None:  # no --gpu: the GPU the profile was measured on (perfsim.api._warn_memory's)
        measured_on = profile_gpu(build_configs(**params)[3])
        if measured_on is not None:
            cap, capacity_of = measured_on.memory_bytes, f"{measured_on.name}, the profile's GPU"
    worst = max(mem, key=lambda m: m.total)
    parts = {"weights": worst.weights, "gradients": worst.grads, "optimizer state": worst.optimizer,
             "activations": worst.activations, "buffers": worst.buffers + worst.sharding}
    short = cap is not None and worst.total > cap
    options = [(flags, peak, None if cap is None else peak <= cap)
               for flags, _, peak in _lower(params, worst.total, offload=short)
               if "--offload" not in flags or peak <= cap]  # offload: only where it makes the job fit
    combination = []
    if cap is not None and worst.total > cap and not any(f for _, _, f in options):
        job, peak, taken = params, worst.total, []
        for _ in range(MAX_COMBINED):
            better = _lower(job, peak, offload=True)
            if not better:
                break
            flags, change, peak = better[0]
            job, taken = {**job, **change}, taken + [flags]
            combination.append((" ".join(taken), peak))
            if peak <= cap:
                break
    return MemoryReport(params=params, peak_bytes=worst.total, worst_stage=worst.stage, breakdown=parts,
                        capacity_bytes=cap, stage_bytes=[m.total for m in mem], options=options,
                        combination=combination, host_bytes=worst.host, capacity_of=capacity_of,
                        notes=memory_free_settings(params, [m.total for m in mem]))


#: the system parameters memory is always priced with (the GPU's capacity; --allow-oom is predict's)
_MEMORY_SYSTEM = ("gpu", "allow_oom")
_SYSTEM = frozenset(p.name for p in PARAMS if p.group == "system") - set(_MEMORY_SYSTEM)


def memory_free_settings(params: dict[str, Any], stage_bytes: list[float]) -> list[str]:
    """A note naming the system settings given (network, links, collectives, timing: the
    ``system`` group of :data:`perfsim.param_table.PARAMS`) that do not change this job's
    memory: each is dropped in turn and the stages' peaks priced again; those whose peaks stay
    ``stage_bytes`` are named, so a user does not read them as taken into account."""
    free = []
    for name in sorted(k for k in params if k in _SYSTEM):
        try:
            alone, _ = _peaks({k: v for k, v in params.items() if k != name})
        except ConfigError:  # the job needs it (e.g. a topology holding its nodes): it is used
            continue
        if [m.total for m in alone] == stage_bytes:
            free.append("--" + name.replace("_", "-"))
    if not free:
        return []
    return [f"{', '.join(free)}: given, but {'it does' if len(free) == 1 else 'they do'} not change this "
            f"job's memory (perfsim predict prices time)"]


#: how many changes a combination takes at most
MAX_COMBINED = 6


def _lower(params: dict[str, Any], peak: float, offload: bool = False
           ) -> list[tuple[str, dict[str, Any], float]]:
    """The single changes of ``params`` whose peak is below ``peak``, lowest first; a change
    the job refuses (e.g. more stages than layers) is left out. ``offload``: :func:`_changes`'."""
    out = []
    for flags, change in _changes(params, offload):
        try:
            m, _ = _peaks({**params, **change})
        except ConfigError:
            continue
        new = max(s.total for s in m)
        if new < peak:
            out.append((flags, change, new))
    return sorted(out, key=lambda o: o[2])


def render(report: MemoryReport) -> str:
    """The report as lines of text (``perfsim memory``)."""
    cap = report.capacity_bytes
    head = f"peak {report.peak_bytes / GIB:.1f} GiB per GPU on stage {report.worst_stage} (" + ", ".join(
        f"{k} {v / GIB:.1f}" for k, v in report.breakdown.items()) + ")"
    if cap is None:
        verdict = "no --gpu given: no capacity to compare with"
    else:
        gpu = report.capacity_of or report.params.get("gpu")
        verdict = (f"fits in {cap / GIB:.0f} GiB ({gpu}), {(cap - report.peak_bytes) / GIB:.1f} GiB to spare"
                   if report.fits else f"does NOT fit in {cap / GIB:.0f} GiB ({gpu}): short by "
                   f"{(report.peak_bytes - cap) / GIB:.1f} GiB")
    lines = [head, verdict]
    if report.host_bytes:
        lines.append(f"gradients and optimizer state in host memory: {report.host_bytes / GIB:.1f} GiB per GPU "
                     "(--offload optimizer)")
    if report.options:
        lines.append("single changes that lower the peak:")
        width = max(len(c) for c, _, _ in report.options)
        for change, peak, fits in report.options:
            mark = "" if fits is None else ("  fits" if fits else "  still too large")
            lines.append(f"  {change:<{width}}  {peak / GIB:7.1f} GiB{mark}")
    else:
        lines.append("no single change lowers the peak")
    if report.combination:
        flags, peak = report.combination[-1]
        fits = cap is not None and peak <= cap
        lines.append(("together, these fit: " if fits else "together (still too large): ")
                     + f"{flags}  ->  {peak / GIB:.1f} GiB")
    return "\n".join(lines)
