"""The configuration of one ``perfsim run`` job (what every rank receives).

Flag names and values are those of ``perfsim run`` / ``perfsim predict``: one
value each, strings such as ``"100Mbps"`` parsed once (by
:func:`perfsim.runtime.make_config`) into SI units.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from perfsim.boundaries import check_boundaries
from perfsim.errors import ConfigError
from perfsim.job import MEGATRON_PLACEMENT, Job, check_choice, check_chunks, check_int
from perfsim.models.registry import get_model_spec
from perfsim.models.tensor_parallel import check_tp
from perfsim.models.transformer import TransformerSpec
from perfsim.runtime.layout import RankLayout

#: seeds feed torch and numpy generators; numpy's take 32 bits
MAX_SEED = 2**32 - 1
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class RunOption:
    """One option of ``perfsim run`` beside the job's (how long, where to, over which
    link: not what is trained, which :data:`perfsim.params.RUN_JOB_PARAMS` describe)."""

    #: keyword of :func:`perfsim.run` / flag ``--name-with-dashes``
    name: str
    #: the RunConfig field it fills (its default is the option's), or None (``overwrite``)
    field: str | None
    #: ``int`` (>= 0), ``count`` (>= 1), ``float``, ``text`` (a path, a name, a time or a
    #: rate with its unit) or ``switch``
    kind: str
    #: the keyword's annotation in :func:`perfsim.run`'s signature
    annotation: str
    #: one help line
    help: str


#: ``perfsim run``'s own options, in the order of its ``--help``: the flags of the command and
#: the keywords of :func:`perfsim.run` are generated from this table and
#: :data:`perfsim.params.PARAMS` (the job's flags), nowhere else
RUN_OPTIONS: tuple[RunOption, ...] = (
    RunOption("steps", "steps", "count", "int | None",
              "optimizer steps in total (default 20; give --steps or --epochs, not both)"),
    RunOption("epochs", "epochs", "count", "int | None",
              "train this many epochs instead of --steps (not with --steps): ceil(samples / global batch) "
              "optimizer steps each over the model's data set (--dataset-limit shortens it), the steps "
              "perfsim predict --epochs counts (perfsim.job.training_steps)"),
    RunOption("seed", "seed", "int", "int", "random seed, 0..4294967295 (default 0)"),
    RunOption("lr", "lr", "float", "float", "learning rate (default 0.001)"),
    RunOption("dataset_limit", "dataset_limit", "count", "int | None",
              "use only the first N samples (shorter epochs)"),
    RunOption("out", "out", "text", "str | None",
              "output folder (default perfsim-run; with --resume the run folder that owns the checkpoint). "
              "A folder holding an earlier run is refused: --resume it or --overwrite it"),
    RunOption("resume", "resume", "text", "str | None",
              "continue the run whose checkpoint is in this folder (a run folder, its ckpt/ or a ckpt/stepN): "
              "the model and every job flag come from the checkpoint (flags given again must agree; "
              "--steps/--epochs, --checkpoint-every, --emulate-*, --timeout, --device may change), outputs go "
              "to that run's folder"),
    RunOption("overwrite", None, "switch", "bool",
              "replace the earlier run in --out (its results and its ckpt/ are removed first)"),
    RunOption("checkpoint_every", "checkpoint_every", "int", "int",
              "steps between checkpoints (default: only at the end)"),
    RunOption("emulate_bandwidth", "bandwidth_bps", "text", "str | float | None",
              "shape every rank's link with tc in its own network namespace, e.g. 100Mbps (root)"),
    RunOption("emulate_latency", "latency_s", "text", "str | float | None",
              "one-way latency added to each link, e.g. 20ms"),
    RunOption("timeout", "timeout_s", "text", "str | float", "p2p / collective timeout (default 60s)"),
    RunOption("hang_timeout", "hang_timeout_s", "text", "str | float",
              "a rank whose heartbeat stops this long is named and the run stopped (default 30s)"),
    RunOption("device", "device", "text", "str", "cpu (gloo) or cuda (NCCL, one GPU per rank; default cpu)"),
)


@dataclass(frozen=True)
class RunConfig(Job):
    """One real training job.

    The job -- pp, dp, tp, sequence_parallel, micro_batch, macro_batch, schedule,
    virtual_stages, compress, grad_compress, boundary_compress, device_order, partition,
    tied_embedding, zero, optimizer -- is :class:`perfsim.job.Job`'s, with its defaults and its one
    validation (those of ``perfsim predict``); this class adds the model, how long and
    where to train, and what execute mode can do: TP and a synced tied head need a GPT
    model (:func:`perfsim.models.tensor_parallel.check_tp`; the tied head ``tp = 1``: the
    embedding is replicated, :mod:`perfsim.runtime.tied`), ZeRO is 0 or 3 (:meth:`check_zero`),
    a ``device_order`` places ranks with ``tp = 1`` only (under torchrun a rank's number
    fixes its host; over loopback every rank shares one emulated link rate).

    model: preset of :mod:`perfsim.models.registry` (``gpt2-tiny``, ``digits-mlp``...);
      default ``gpt2-small-byte``, the smallest preset with a layer for each of the default
      job's 8 pipeline stages (a model with fewer layers needs a smaller ``pp``).
    steps: optimizer steps in total (a resumed run continues up to it);
      ``epochs`` sets it instead (give one of the two): :func:`perfsim.job.training_steps`
      over the model's data set, the count ``perfsim predict --epochs`` prices.
    seed, lr: training.
    dataset_limit: keep the first N samples (shorter epochs; AQ-SGD's
      uncompressed first epoch ends sooner).
    out: output folder. resume: checkpoint folder to continue from.
    checkpoint_every: steps between checkpoints (0: only at the end).
    bandwidth_bps, latency_s: emulated per-NIC bandwidth and one-way latency
      (None: the plain loopback / real network).
    timeout_s: collective / p2p timeout; a rank blocked longer fails.
    device: ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per rank).
    fail_rank, fail_step, fail_signal: fault injection for tests -- that rank
      sends itself ``fail_signal`` (SIGKILL; SIGSTOP: a hung rank) at that step.
    hang_timeout_s: a rank whose heartbeat stops this long is named as hung
      and the job stopped (local launch).
    """

    #: the default model: the smallest preset of :mod:`perfsim.models.registry` that the job's
    #: default pipeline (pp 8, a stage per layer at least) can train on a CPU
    model: str = "gpt2-small-byte"
    steps: int | None = None
    epochs: int | None = None
    seed: int = 0
    lr: float = 1e-3
    dataset_limit: int | None = None
    out: str = "perfsim-run"
    resume: str | None = None
    checkpoint_every: int = 0
    bandwidth_bps: float | None = None
    latency_s: float = 0.0
    timeout_s: float = 60.0
    device: str = "cpu"
    fail_rank: int | None = None
    fail_step: int | None = None
    fail_signal: str = "SIGKILL"
    hang_timeout_s: float = 30.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.check()  # the job's fields (perfsim.job.Job), validated once for predict and run
        get_model_spec(self.model)
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ConfigError(f"steps={self.steps!r}: must be an integer >= 1")
        if self.epochs is not None:
            check_int(self, "epochs")  # as predict's (perfsim.config.Strategy)
        if self.steps is not None and self.epochs is not None:
            raise ConfigError(f"steps={self.steps} and epochs={self.epochs}: give one (--steps counts "
                              "optimizer steps, --epochs sets them from the data set's size)")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed={self.seed!r}: must be an integer in 0..{MAX_SEED}")
        if not 0 < self.lr < math.inf:
            raise ConfigError(f"lr={self.lr!r}: must be a finite number > 0")
        check_choice(self, "device", DEVICES)
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every={self.checkpoint_every}: must be >= 0")
        if not 0 < self.hang_timeout_s < math.inf:
            raise ConfigError(f"hang_timeout={self.hang_timeout_s}: must be a finite time > 0")
        if self.fail_signal not in ("SIGKILL", "SIGSTOP", "SIGTERM"):
            raise ConfigError(f"fail_signal={self.fail_signal!r}: SIGKILL, SIGSTOP or SIGTERM")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout={self.timeout_s}: must be > 0")
        if self.bandwidth_bps is not None:
            from perfsim.shaping import check_rate  # lazy: import perfsim does not load perfsim.shaping

            check_rate(self.bandwidth_bps)  # the range tc can shape, before anything is built
        if self.latency_s < 0:
            raise ConfigError(f"emulate_latency={self.latency_s}: must be >= 0")
        if self.dataset_limit is not None and self.dataset_limit < 1:
            raise ConfigError(f"dataset_limit={self.dataset_limit}: must be >= 1")
        self.check_zero()
        self.check_tp_send()
        if self.offload != "none":
            raise ConfigError(f"offload={self.offload!r}: perfsim run trains on CPU ranks, which have no device "
                              "memory to offload from; CPU offload is modelled by perfsim predict only")
        if self.kernels != "eager":
            raise ConfigError(f"kernels={self.kernels!r}: perfsim run trains plain PyTorch modules (eager); "
                              "Megatron-LM's fused kernels are modelled by perfsim predict only")
        spec = self.spec()
        check_tp(spec if isinstance(spec, TransformerSpec) else None, self.tp, self.sequence_parallel, self.model)
        self.check_tied()
        self.stage_ranges()  # the partition must fit
        # the compressors' own arguments must check (ConfigError names the spec)
        # lazy: import perfsim does not load perfsim.compression.aqsgd
        from perfsim.compression import check_spec

        for spec in (self.compress, *check_boundaries(self.boundary_compress, self.num_stages).values()):
            check_spec(spec)
        self.layout  # the device order must fit the rank layout (no order with tp > 1)
        check_spec(self.grad_compress)

    # ----------------------------------------------------------------- derived
    @property
    def world_size(self) -> int:
        return self.devices

    @property
    def layout(self):
        return RankLayout(self.tp, self.dp, self.pp, self.device_order, self.placement)

    def spec(self):
        return get_model_spec(self.model)

    def stage_ranges(self) -> list[tuple[int, int]]:
        """``[start, end)`` layer range of every stage (model chunk)."""
        from perfsim.partition import partition_model  # lazy: import perfsim does not load perfsim.partition

        spec = self.spec()
        check_chunks(self.pp, self.schedule, self.virtual_stages, len(spec.layers()))  # predict's check
        return partition_model(spec, self.num_stages, explicit=self.partition)

    def check_tied(self) -> None:
        if self.tied_embedding == "sync" and not isinstance(self.spec(), TransformerSpec):
            raise ConfigError(f"tied_embedding=sync: model {self.model!r} has no embedding to tie (GPT models only)")
        if self.tied_embedding == "sync" and self.tp > 1:
            raise ConfigError("tied_embedding=sync with tp > 1: execute mode replicates the embedding on every "
                              "tensor-parallel rank (Megatron splits it by vocabulary); use tp=1 or untied")

    def check_tp_send(self) -> None:
        """Execute mode sends the whole activation from every TP rank (no scatter/gather)."""
        if self.tp_send != "full" and self.tp > 1 and self.pp > 1 and not self.sequence_parallel:
            raise ConfigError(f"tp_send={self.tp_send!r}: execute mode sends the full activation from every "
                              f"tensor-parallel rank (tp_send=full), or 1/tp with sequence_parallel")

    def check_zero(self) -> None:
        """Execute mode runs ZeRO-3 as FSDP2 on one pipeline stage without TP (refused otherwise)."""
        if self.zero not in (0, 3):
            raise ConfigError(f"zero={self.zero!r}: perfsim run trains 0 (DDP-style) or 3 (FSDP2 fully_shard); "
                              f"ZeRO-1/2 are modelled by perfsim predict only")
        if self.zero == 3:
            for what, bad in (("pp", self.pp != 1), ("tp", self.tp != 1),
                              ("grad_compress", not self.grad_compress.plain),
                              ("tied_embedding", self.tied_embedding != "untied"),
                              ("resume", self.resume is not None),
                              ("checkpoint_every", self.checkpoint_every != 0)):
                if bad:
                    value = getattr(self, what)
                    raise ConfigError(f"zero=3 with {what}={getattr(value, 'text', value)!r}: execute mode's FSDP2 "
                                      f"runs pp 1, tp 1, no gradient compression, an untied head, no checkpoints")

    def to_json(self) -> str:
        """The job as JSON, each spec as its canonical text (no overrides: null)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(compress=self.compress.text, grad_compress=self.grad_compress.text,
                 boundary_compress=self.boundary_compress.text or None)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{unknown[0]}: not a perfsim run setting (run config: unknown keys {unknown})")
        return cls(**d)

    def replace(self, **kw) -> "RunConfig":
        return dataclasses.replace(self, **kw)

    #: fields that must match between a checkpoint and the run resuming it
    RESUME_KEYS = ("model", "pp", "dp", "tp", "sequence_parallel", "tied_embedding", "schedule",
                   "virtual_stages", "compress", "boundary_compress", "device_order", "grad_compress", "micro_batch",
                   "macro_batch", "seed", "lr", "optimizer", "dataset_limit", "partition", "placement")
    #: what a checkpoint written before a resume key existed had
    RESUME_DEFAULTS = {"tied_embedding": "untied", "placement": list(MEGATRON_PLACEMENT)}  # runs ordered tp, dp, pp
