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

from perfsim.errors import ConfigError
from perfsim.job import Job

OPTIMIZERS = ("adamw", "sgd")
#: seeds feed torch and numpy generators; numpy's take 32 bits
MAX_SEED = 2**32 - 1
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class RunConfig(Job):
    """One real training job.

    model: preset of :mod:`perfsim.models.specs` (``gpt2-tiny``, ``digits-mlp``...).
    pp, dp, tp: pipeline stages, data-parallel replicas and tensor-parallel ranks
      per stage (world size ``pp*dp*tp``; Megatron's rank order, TP innermost, then
      DP, then PP: :class:`perfsim.runtime.tensor_parallel.RankLayout`).
    sequence_parallel: with ``tp > 1``, Megatron's sequence parallelism
      (:mod:`perfsim.runtime.tensor_parallel`).
    tied_embedding: ``untied`` (the LM head trains its own weight) or ``sync`` (GPT,
      ``tp = 1``: the head is a copy of the token embedding, kept equal by an
      all-reduce of the two gradients after the data-parallel sync,
      :mod:`perfsim.runtime.tied`); the simulator's ``--tied-embedding``.
    schedule: ``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``zb-h1`` or ``zb-v``
      (tables of :mod:`perfsim.schedules`).
    virtual_stages: model chunks per rank (interleaved-1f1b; None: the schedule's own).
    compress: pipeline spec (``fp32``, ``directq:fw4bw8``, ``aqsgd:fw3bw6``).
    boundary_compress: per-boundary overrides of ``compress`` (``"1=aqsgd:fw2bw4"``,
      :mod:`perfsim.boundaries`): one compressor pair per boundary.
    device_order: the rank that runs each position of the rank layout (``"0,2,1,3"``;
      None: the identity). Under torchrun a rank's number fixes its host, so this
      places stages on nodes; on one machine over loopback every rank shares one
      emulated link rate, so the order changes which process runs a stage, not the
      speed of its links.
    grad_compress: data-parallel spec (``none``, ``qsgd-maxnorm:4``, ``onebit-lamb``...).
    micro_batch, macro_batch: samples per micro-batch / per replica per step.
    steps: optimizer steps in total (a resumed run continues up to it);
      ``epochs`` sets it instead (give one of the two).
    seed, lr, optimizer: training.
    dataset_limit: keep the first N samples (shorter epochs; AQ-SGD's
      uncompressed first epoch ends sooner).
    out: output folder. resume: checkpoint folder to continue from.
    checkpoint_every: steps between checkpoints (0: only at the end).
    bandwidth_bps, latency_s: emulated per-NIC bandwidth and one-way latency
      (None: the plain loopback / real network).
    timeout_s: collective / p2p timeout; a rank blocked longer fails.
    device: ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per rank).
    partition: layer counts per stage, pp x virtual stages of them (``"2,1,1,2"``,
      the syntax of ``perfsim predict --partition``); None:
      :func:`perfsim.partition.partition_model`.
    fail_rank, fail_step, fail_signal: fault injection for tests -- that rank
      sends itself ``fail_signal`` (SIGKILL; SIGSTOP: a hung rank) at that step.
    hang_timeout_s: a rank whose heartbeat stops this long is named as hung
      and the job stopped (local launch).
    zero: 0 (plain data parallelism) or 3: every layer under torch's ``fully_shard``
      (FSDP2, :mod:`perfsim.runtime.fsdp`; ``pp = tp = 1``, no gradient compression,
      untied head, no checkpoints), the simulator's ``--zero 3``.
    """

    #: the default model: the smallest preset of :mod:`perfsim.models.specs` that the job's
    #: default pipeline (pp 8, a stage per layer at least) can train on a CPU
    model: str = "gpt2-small-byte"
    steps: int | None = None
    epochs: float | None = None
    seed: int = 0
    lr: float = 1e-3
    optimizer: str = "adamw"
    dataset_limit: int | None = None
    out: str = "perfsim-run"
    resume: str | None = None
    checkpoint_every: int = 0
    bandwidth_bps: float | None = None
    latency_s: float = 0.0
    timeout_s: float = 60.0
    device: str = "cpu"
    partition: str | None = None
    fail_rank: int | None = None
    fail_step: int | None = None
    virtual_stages: int | None = None
    fail_signal: str = "SIGKILL"
    hang_timeout_s: float = 30.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.check()  # the job's fields (perfsim.job.Job), validated once for predict and run
        from perfsim.models.specs import get_model_spec

        get_model_spec(self.model)
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ConfigError(f"steps={self.steps!r}: must be an integer >= 1")
        if self.epochs is not None and not (0 < self.epochs < math.inf):
            raise ConfigError(f"epochs={self.epochs!r}: must be a finite number > 0")
        if self.steps is not None and self.epochs is not None:
            raise ConfigError(f"steps={self.steps} and epochs={self.epochs:g}: give one (--steps counts "
                              "optimizer steps, --epochs sets them from the data set's size)")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed={self.seed!r}: must be an integer in 0..{MAX_SEED}")
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr!r}: must be > 0")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer={self.optimizer!r}: choose from {', '.join(OPTIMIZERS)}")
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r}: choose from {', '.join(DEVICES)}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every={self.checkpoint_every}: must be >= 0")
        if not 0 < self.hang_timeout_s < math.inf:
            raise ConfigError(f"hang_timeout={self.hang_timeout_s}: must be a finite time > 0")
        if self.fail_signal not in ("SIGKILL", "SIGSTOP", "SIGTERM"):
            raise ConfigError(f"fail_signal={self.fail_signal!r}: SIGKILL, SIGSTOP or SIGTERM")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout={self.timeout_s}: must be > 0")
        if self.bandwidth_bps is not None:
            from perfsim.netem import check_rate

            check_rate(self.bandwidth_bps)  # the range tc can shape, before anything is built
        if self.latency_s < 0:
            raise ConfigError(f"emulate_latency={self.latency_s}: must be >= 0")
        if self.dataset_limit is not None and self.dataset_limit < 1:
            raise ConfigError(f"dataset_limit={self.dataset_limit}: must be >= 1")
        self.check_zero()
        from perfsim.models.tensor_parallel import check_tp
        from perfsim.models.transformer import resolve_transformer

        check_tp(resolve_transformer(self.model), self.tp, self.sequence_parallel, self.model)
        self.check_tied()
        self.stage_ranges()  # the partition must fit
        # the compressor specs must parse (ConfigError names them)
        from perfsim.compression import make_pipeline_pair

        make_pipeline_pair(self.compress)
        from perfsim.boundaries import check_boundaries

        for spec in check_boundaries(self.boundary_compress, self.num_stages).values():
            make_pipeline_pair(spec)
        self.layout  # the device order must fit the rank layout (no order with tp > 1)
        from perfsim.compression.grad_spec import parse_grad_spec

        parse_grad_spec(self.grad_compress)

    # ----------------------------------------------------------------- derived
    @property
    def world_size(self) -> int:
        return self.devices

    @property
    def layout(self):
        from perfsim.runtime.tensor_parallel import RankLayout

        return RankLayout(self.tp, self.dp, self.pp, self.device_order)

    def spec(self):
        from perfsim.models.specs import get_model_spec

        return get_model_spec(self.model)

    def stage_ranges(self) -> list[tuple[int, int]]:
        """``[start, end)`` layer range of every stage (model chunk)."""
        from perfsim.partition import partition_model

        spec = self.spec()
        nst = self.num_stages
        if nst > len(spec.layers()) and nst > self.pp:
            raise ConfigError(f"schedule {self.schedule!r}: {nst} stages ({nst // self.pp} per rank) but "
                              f"{self.model} has only {len(spec.layers())} layers")
        return partition_model(spec, nst, explicit=self.partition)

    def check_tied(self) -> None:
        from perfsim.models.specs import GPTSpec

        if self.tied_embedding == "sync" and not isinstance(self.spec(), GPTSpec):
            raise ConfigError(f"tied_embedding=sync: model {self.model!r} has no embedding to tie (GPT models only)")
        if self.tied_embedding == "sync" and self.tp > 1:
            raise ConfigError("tied_embedding=sync with tp > 1: execute mode replicates the embedding on every "
                              "tensor-parallel rank (Megatron splits it by vocabulary); use tp=1 or untied")

    def check_zero(self) -> None:
        """Execute mode runs ZeRO-3 as FSDP2 on one pipeline stage without TP (refused otherwise)."""
        if self.zero not in (0, 3):
            raise ConfigError(f"zero={self.zero!r}: perfsim run trains 0 (DDP-style) or 3 (FSDP2 fully_shard); "
                              f"ZeRO-1/2 are modelled by perfsim predict only")
        if self.zero == 3:
            for what, bad in (("pp", self.pp != 1), ("tp", self.tp != 1),
                              ("grad_compress", self.grad_compress.lower() not in ("none", "fp32")),
                              ("tied_embedding", self.tied_embedding != "untied"),
                              ("resume", self.resume is not None),
                              ("checkpoint_every", self.checkpoint_every != 0)):
                if bad:
                    raise ConfigError(f"zero=3 with {what}={getattr(self, what)!r}: execute mode's FSDP2 "
                                      f"runs pp 1, tp 1, no gradient compression, an untied head, no checkpoints")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"run config: unknown keys {unknown}")
        return cls(**d)

    def replace(self, **kw) -> "RunConfig":
        return dataclasses.replace(self, **kw)

    #: fields that must match between a checkpoint and the run resuming it
    RESUME_KEYS = ("model", "pp", "dp", "tp", "sequence_parallel", "tied_embedding", "schedule",
                   "virtual_stages", "compress", "boundary_compress", "device_order", "grad_compress", "micro_batch",
                   "macro_batch", "seed", "lr", "optimizer", "dataset_limit", "partition")
    #: what a checkpoint written before a resume key existed had
    RESUME_DEFAULTS = {"tied_embedding": "untied"}
