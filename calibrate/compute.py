"""Per-layer forward and backward compute time of a model.

For each layer of a model preset (:mod:`perfsim.models.specs`), at each chosen
micro-batch size and dtype, we time

* ``layer_fwd``: the forward call with autograd recording (as in training);
* ``layer_bwd``: ``torch.autograd.backward`` from that layer's output (with a
  random output gradient) to its input and parameters -- exactly what a
  pipeline stage does for a micro-batch. The last layer's forward includes the
  loss and its backward starts from the loss;
* ``optimizer``: one optimizer step over that layer's parameters (AdamW by
  default, the runtime's choice), so the simulator can charge the step per stage.

Each record is one (op, layer, micro-batch, dtype) with the median and IQR of
``repeats`` timings after ``warmup`` calls (:mod:`perfsim.calibrate.timing`):
CUDA events on a GPU, wall clock on the CPU.

CPU threads: ranks of a CPU run share the machine's cores, so a rank's compute
depends on how many threads it gets. ``threads`` (recorded in every row) sets
``torch.set_num_threads`` during the measurement; by default the profile is
measured with the threads one rank of a ``ranks``-rank run gets
(``cores // ranks``, at least 1). ``concurrent=True`` runs the measurement in
``ranks`` processes at once, so the times include the memory-bandwidth and
cache contention that co-located ranks really see.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from perfsim.calibrate.layers import activation_bytes, build_layers, layer_input, loss_of
from perfsim.calibrate.timing import time_op
from perfsim.errors import ConfigError
from perfsim.models.registry import get_model_spec

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ConfigError(f"dtype {name!r}: unknown (choose from {', '.join(_DTYPES)})") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class ComputeConfig:
    """What to time.

    model: preset name (``digits-mlp``, ``gpt2-tiny``...).
    micro_batches: micro-batch sizes (samples) to time at.
    dtypes: compute dtypes (``float32``; ``bfloat16``/``float16`` on GPU).
    device: ``cpu`` or ``cuda``.
    warmup, repeats: untimed calls, then timed calls per record.
    threads: torch intra-op threads during timing (None: cores // ranks).
    ranks: ranks sharing this machine in the runs the profile is for.
    optimizer: ``adamw``, ``adam`` or ``sgd`` (None: skip optimizer timing).
    max_seconds: per-record cap on timed wall time (keeps >= 3 samples).
    stages: pipeline degrees whose whole stages are also timed (``stage_fwd`` /
      ``stage_bwd`` records, ``name`` = ``stage<k>``, ``world_size`` = degree),
      partitioned by :func:`perfsim.partition.partition_model` as both the
      simulator and the runtime partition; a stage's time includes the
      per-layer call overheads that summing layer records misses, and is timed
      as a pipeline rank runs it (see :func:`_measure_stages`).
    stage_microbatches: micro-batches per step when timing whole stages (the
      runs' macro-batch / micro-batch; 4 in the validation runs).
    stage_schedule: schedule whose stage rows drive that timing (``1f1b``, ``gpipe``).
    """

    model: str
    micro_batches: tuple[int, ...] = (1,)
    dtypes: tuple[str, ...] = ("float32",)
    device: str = "cpu"
    warmup: int = 3
    repeats: int = 15
    threads: int | None = None
    ranks: int = 1
    optimizer: str | None = "adamw"
    max_seconds: float | None = 5.0
    stages: tuple[int, ...] = ()
    stage_microbatches: int = 4
    stage_schedule: str = "1f1b"
    spec: object = field(default=None, compare=False)

    def __post_init__(self):
        spec = get_model_spec(self.model) if self.spec is None else self.spec
        object.__setattr__(self, "spec", spec)
        if not self.micro_batches or any(int(b) < 1 for b in self.micro_batches):
            raise ConfigError(f"micro_batches={self.micro_batches}: need sizes >= 1")
        for d in self.dtypes:
            parse_dtype(d)
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r}: use cpu or cuda")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device='cuda': no CUDA device available")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads={self.threads}: must be >= 1")
        if self.ranks < 1:
            raise ConfigError(f"ranks={self.ranks}: must be >= 1")
        n = len(spec.layers())
        if any(int(p) < 1 or int(p) > n for p in self.stages):
            raise ConfigError(f"stages={self.stages}: pipeline degrees must be in 1..{n} for {spec.name}")
        if isinstance(self.stage_microbatches, bool) or not isinstance(self.stage_microbatches, int) \
                or self.stage_microbatches < 1:
            raise ConfigError(f"stage_microbatches={self.stage_microbatches!r}: must be an integer >= 1")
        from perfsim.schedules import PLAIN_SCHEDULES, get_schedule

        get_schedule(self.stage_schedule)  # ConfigError naming an unknown schedule
        if self.stage_schedule.lower() not in PLAIN_SCHEDULES:  # one stage per rank, whole backwards
            raise ConfigError(f"stage_schedule={self.stage_schedule!r}: the harness times gpipe or 1f1b "
                              f"(--stage-timing run times any schedule)")
        if self.optimizer not in (None, "adamw", "adam", "sgd"):
            raise ConfigError(f"optimizer={self.optimizer!r}: use adamw, adam or sgd")

    @property
    def effective_threads(self) -> int:
        if self.threads is not None:
            return self.threads
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, (cores or 1) // self.ranks)


def _make_optimizer(name: str, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)  # as perfsim run builds it
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    return torch.optim.SGD(params, lr=1e-4, momentum=0.9)


def count_records(cfg: ComputeConfig) -> int:
    """How many measurements :func:`measure_compute` makes (for a progress bar)."""
    per = 2 + (1 if cfg.optimizer else 0)
    n = len(cfg.spec.layers()) * per + 3 * sum(int(p) for p in cfg.stages)  # stage fwd, bwd, opt
    return n * len(cfg.micro_batches) * len(cfg.dtypes)


def measure_compute(cfg: ComputeConfig, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Time every layer's forward, backward and optimizer step; profile records."""
    spec = cfg.spec
    threads = cfg.effective_threads
    old_threads = torch.get_num_threads()
    if cfg.device == "cpu":
        torch.set_num_threads(threads)
    records: list[dict] = []
    try:
        for dname in cfg.dtypes:
            dtype = parse_dtype(dname)
            mods, source = build_layers(spec, dtype=dtype, device=cfg.device)
            layers = spec.layers()
            last = len(layers) - 1
            for mb in cfg.micro_batches:
                mb = int(mb)
                gen = torch.Generator(device=cfg.device).manual_seed(mb)
                for i, (lay, mod) in enumerate(zip(layers, mods)):
                    x = layer_input(spec, i, mb, dtype=dtype, device=cfg.device, generator=gen)
                    out_bytes = activation_bytes(lay.out_shape, mb, dtype)

                    def fwd(mod=mod, x=x, i=i):
                        out = mod(x)
                        return loss_of(spec, out, mb) if i == last else out

                    def setup_bwd(fwd=fwd, i=i):
                        out = fwd()
                        grad = None if i == last else torch.randn_like(out)
                        return out, grad

                    def bwd(arg):
                        out, grad = arg
                        torch.autograd.backward(out, grad)

                    base = {"model": spec.name, "name": lay.name, "micro_batch": mb,
                            "size_bytes": out_bytes, "world_size": 1, "dtype": dtype_name(dtype),
                            "device": cfg.device, "threads": threads, "params": lay.params,
                            "layer_index": i, "source": source}
                    if progress:
                        progress(f"compute {spec.name} {lay.name} mb={mb} fwd")
                    t = time_op(fwd, warmup=cfg.warmup, repeats=cfg.repeats, device=cfg.device,
                                max_seconds=cfg.max_seconds)
                    records.append({"op": "layer_fwd", **base, **t.record()})
                    if progress:
                        progress(f"compute {spec.name} {lay.name} mb={mb} bwd")
                    t = time_op(bwd, setup=setup_bwd, warmup=cfg.warmup, repeats=cfg.repeats,
                                device=cfg.device, max_seconds=cfg.max_seconds)
                    records.append({"op": "layer_bwd", **base, **t.record()})
                    if cfg.optimizer and mb == int(cfg.micro_batches[0]):
                        if progress:
                            progress(f"compute {spec.name} {lay.name} optimizer")
                        params = [p for p in mod.parameters() if p.requires_grad]
                        for p in params:
                            p.grad = torch.randn_like(p)
                        opt = _make_optimizer(cfg.optimizer, params)
                        t = time_op(opt.step, warmup=cfg.warmup, repeats=cfg.repeats,
                                    device=cfg.device, max_seconds=cfg.max_seconds)
                        rec = {**base, "op": "optimizer", "optimizer": cfg.optimizer,
                               "size_bytes": lay.params * torch.empty((), dtype=dtype).element_size()}
                        records.append({**rec, **t.record()})
                        for p in params:
                            p.grad = None
                    for p in mod.parameters():
                        p.grad = None
                for pp in cfg.stages:
                    records += _measure_stages(cfg, mods, int(pp), mb, dtype, threads, source, progress)
    finally:
        torch.set_num_threads(old_threads)
    return records


def _measure_stages(cfg: ComputeConfig, mods, pp: int, mb: int, dtype, threads: int, source: str,
                    progress) -> list[dict]:
    """Whole-stage forward/backward times of a ``pp``-stage partition, timed as a
    pipeline rank runs them.

    Each stage is execute mode's own module (:func:`perfsim.runtime.models.build_stage`,
    the last one with its loss on real targets) driven by its row of the
    schedule table (:func:`perfsim.schedules.get_schedule`, ``cfg.stage_schedule``)
    over ``cfg.stage_microbatches`` micro-batches: a fresh input per micro-batch,
    the forwards' activations kept alive until their backward, and the optimizer
    step after every step, as :mod:`perfsim.runtime.pipeline` does. Every forward
    and backward of the timed steps is one sample; every timed step's optimizer
    step (and ``zero_grad``) is one ``stage_optimizer`` sample. Timing one call repeatedly on
    one input (hot caches, one live graph) instead reads faster than the pipeline's
    steps do (docs/validation.md, "Measurement notes")."""
    from perfsim.calibrate.timing import summarize
    from perfsim.partition import partition_model
    from perfsim.runtime import build_stage
    from perfsim.schedules import get_schedule

    spec = cfg.spec
    layers = spec.layers()
    m = cfg.stage_microbatches
    table = get_schedule(cfg.stage_schedule)(pp, m)
    steps = cfg.warmup + max(3, -(-cfg.repeats // m))  # >= 3 optimizer-step samples
    sync = torch.cuda.synchronize if cfg.device == "cuda" else (lambda: None)
    out = []
    gen = torch.Generator(device=cfg.device).manual_seed(1000 + mb)
    for k, (a, b) in enumerate(partition_model(spec, pp)):
        torch.manual_seed(k)
        stage = build_stage(spec, pp, k, 0).to(device=cfg.device, dtype=dtype).train()
        opt = _make_optimizer(cfg.optimizer or "sgd", [p for p in stage.parameters() if p.requires_grad])
        if progress:
            progress(f"compute {spec.name} pp={pp} stage{k} mb={mb} ({cfg.stage_schedule}, {m} micro-batches)")
        fwd_t: list[float] = []
        bwd_t: list[float] = []
        opt_t: list[float] = []
        for step in range(steps):
            timed = step >= cfg.warmup
            live = {}
            for act in table[k]:
                if act.kind == "F":
                    x = layer_input(spec, a, mb, dtype=dtype, device=cfg.device, generator=gen)
                    target = (torch.randint(0, layers[-1].out_shape[-1], (mb, *layers[-1].out_shape[:-1]),
                                            device=cfg.device, generator=gen) if stage.is_last else None)
                    sync()
                    t0 = time.perf_counter()
                    y = stage(x)
                    loss = stage.loss(y, target) if stage.is_last else None
                    sync()
                    t1 = time.perf_counter()
                    live[act.microbatch] = (y, loss)
                    if timed:
                        fwd_t.append(t1 - t0)
                else:
                    y, loss = live.pop(act.microbatch)
                    grad = None if loss is not None else torch.randn_like(y)
                    sync()
                    t0 = time.perf_counter()
                    if loss is not None:
                        (loss / m).backward()
                    else:
                        y.backward(grad)
                    sync()
                    t1 = time.perf_counter()
                    if timed:
                        bwd_t.append(t1 - t0)
            t0 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if timed:
                opt_t.append(time.perf_counter() - t0)
        base = {"model": spec.name, "name": f"stage{k}", "micro_batch": mb, "world_size": pp,
                "size_bytes": activation_bytes(layers[b - 1].out_shape, mb, dtype),
                "dtype": dtype_name(dtype), "device": cfg.device, "threads": threads,
                "params": sum(lay.params for lay in layers[a:b]), "layers": f"{a}-{b - 1}",
                "schedule": cfg.stage_schedule, "microbatches": m, "source": source}
        out.append({"op": "stage_fwd", **base, **summarize(fwd_t).record()})
        out.append({"op": "stage_bwd", **base, **summarize(bwd_t).record()})
        # the optimizer step as the rank runs it: after a step's backwards, on the
        # gradients they left (colder caches than a back-to-back per-layer timing)
        out.append({"op": "stage_optimizer", **base, "optimizer": cfg.optimizer or "sgd",
                    "size_bytes": base["params"] * torch.empty((), dtype=dtype).element_size(),
                    **summarize(opt_t).record()})
    return out


def measure_compute_concurrent(cfg: ComputeConfig, progress: Callable[[str], None] | None = None
                               ) -> list[dict]:
    """Run :func:`measure_compute` in ``cfg.ranks`` processes at once and keep rank
    0's records (``concurrent_ranks`` column = ``cfg.ranks``): per-rank compute
    under the contention that co-located ranks see."""
    if cfg.ranks == 1:
        recs = measure_compute(cfg, progress)
        return [{**r, "concurrent_ranks": 1} for r in recs]
    from perfsim.calibrate.timing import measure_concurrently

    if progress:
        progress(f"compute {cfg.spec.name} in {cfg.ranks} concurrent processes")
    return measure_concurrently(measure_compute, cfg, cfg.ranks)
