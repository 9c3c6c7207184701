"""One description of a training job: how it is parallelised, batched, scheduled and compressed.

:class:`Job` holds the fields that the simulator's :class:`perfsim.config.Strategy` and
execute mode's :class:`perfsim.runtime.config.RunConfig` share, with ONE default, ONE value
type and ONE validation each, so that ``perfsim predict`` and ``perfsim run`` given the same
flags describe the same job (issue 38: "one class for the job"; house style: torchtitan's one
job config that builds the CLI).

Both classes *inherit* from :class:`Job` rather than holding one: the engine and the runtime
read ``strategy.pp`` / ``cfg.micro_batch`` in hundreds of places, a frozen dataclass subclass
keeps that flat access and the ``dataclasses.replace`` / ``fields`` behaviour every caller
relies on, and :class:`perfsim.schedules.PipelineShape` (what a schedule table follows from)
is already a mixin of the same fields. Each subclass adds only its own fields (the simulator's
precision, buckets...; the runtime's model, steps, seed, emulated link...) and the
checks of what it can do (execute mode trains ZeRO 0 or 3 only, TP on GPT models only);
``__post_init__`` runs :meth:`Job.check` first.

The defaults are ``perfsim predict``'s (its predictions are the reference: pp 8, micro-batches
of 1, macro-batches of 32, GPipe); :data:`MEGATRON` names the defaults a ``--gpu`` preset
switches to (Megatron-LM's, :func:`defaults`).

Values are parsed once, at the edge (:mod:`perfsim.params`): ``device_order`` and
``partition`` are tuples of ints here (a JSON list is turned back into one), never text.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from perfsim.boundaries import BoundarySpecs, check_boundaries, parse_boundary_compress
from perfsim.compression.spec import Spec, parse_spec
from perfsim.errors import ConfigError
from perfsim.hardware import MIXED_PRECISIONS
from perfsim.models.tensor_parallel import TP_SENDS
from perfsim.models.transformer import MEGATRON_VOCAB_MULTIPLE
from perfsim.schedules import PipelineShape, SCHEDULES, VIRTUAL_STAGE_SCHEDULES, stage_count

#: a tied LM head whose embedding lives on another pipeline stage: ``untied`` -- the
#: last stage trains a head of its own (perfsim's runtime keeps stages independent);
#: ``sync`` -- Megatron-LM keeps a copy of the embedding on the last stage and, after
#: the data-parallel sync, all-reduces its gradient with the first stage's
#: (``_allreduce_embedding_grads`` in ``finalize_model_grads``; DeepSpeed's pipeline
#: engine reduces ``TiedLayerSpec`` gradients the same way)
TIED_EMBEDDINGS = ("untied", "sync")
#: ZeRO stages (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
#: Parameter Models", arXiv:1910.02054, Sec. 5): 0 none, 1 optimizer states, 2 + gradients,
#: 3 + parameters sharded over data parallelism. PyTorch FSDP2's ``fully_shard`` is stage 3
#: (Zhao et al., "PyTorch FSDP", arXiv:2304.11277), ``reshard_after_forward`` its option
ZERO_STAGES = (0, 1, 2, 3)
#: CPU offload (Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training",
#: arXiv:2101.06840): ``none``, or ``optimizer`` -- the optimizer state, the gradients and the
#: step on the host, the GPU keeping its 16-bit weights (ZeRO-2/3; perfsim.engine.offload)
OFFLOAD = ("none", "optimizer")
#: how the block's memory-bound operators run (perfsim.models.eager): ``fused`` -- Megatron-LM's
#: fused kernels (LayerNorm, bias-dropout-add, scale-mask-softmax, bias-GELU; one pass per norm);
#: ``eager`` -- plain PyTorch under ``torch.autocast``, one kernel per aten operator, fp32 weights
#: and residual stream, autocast's casts (a Hugging Face model, nanoGPT; what ``perfsim run``
#: trains); ``eager-pure`` -- plain PyTorch with the weights themselves in the training precision
#: (``model.to(torch.bfloat16)``, FSDP2's ``param_dtype``): no autocast casts, a half-precision
#: residual stream (``scripts/gpu_step_bench.py``'s steps); the same as ``eager`` in fp32
KERNELS = ("fused", "eager", "eager-pure")
@dataclass(frozen=True)
class Optimizer:
    """What an optimizer keeps and moves per parameter (its state for :mod:`perfsim.memory`,
    its step's memory traffic for the engine's step time); :data:`OPTIMIZERS` by name."""

    #: name (``--optimizer``)
    name: str
    #: fp32 state buffers per parameter: Adam(W)'s momentum and variance (2), SGD's momentum (1)
    states: int

    def state_bytes(self, precision: str) -> int:
        """``K`` of ZeRO (Rajbhandari et al., arXiv:1910.02054, Sec. 3.1): optimizer-state bytes
        per parameter -- its fp32 buffers, plus the fp32 master weights under mixed precision
        (:data:`perfsim.hardware.MIXED_PRECISIONS`; Adam: ``K = 12`` mixed, 8 in fp32; SGD with
        momentum: 8 and 4)."""
        return 4 * self.states + (4 if precision in MIXED_PRECISIONS else 0)

    def step_bytes(self, precision: str, step: str = "fused") -> int:
        """Bytes one step moves per parameter, memory-bound: read the fp32 gradient, read and
        write the weight and every state buffer (Adam 4 (1 + 2 x 3) = 28; SGD with momentum
        4 (1 + 2 x 2) = 20), then by ``step`` (:data:`OPTIMIZER_STEPS`):

        * ``fused`` -- one fused mixed-precision pass: mixed precision adds the half-precision
          gradient read, the weight copy written and the unscale / gradient-norm work, 8
          (Micikevicius et al., "Mixed Precision Training", arXiv:1710.03740);
        * ``megatron`` -- the passes Megatron-LM's optimizers make (``megatron/optimizer/optimizer.py``):
          every precision reads the fp32 gradients once more for the clipping norm (4); fp16
          (``Float16OptimizerWithFloat16Params`` with its loss scaler) first copies the fp16
          gradients to fp32 (read 2, write 4) and unscales them with the inf check
          (``torch._amp_foreach_non_finite_check_and_unscale_``: read and write 4 each), and
          every mixed precision copies the fp32 weights back to the half-precision model
          (read 4, write 2): Adam 52 bytes in fp16, 38 in bf16 / fp8 (fp32 main gradients, no
          loss scaler), 32 in fp32 (``FP32Optimizer``)."""
        core = 4 * (1 + 2 * (1 + self.states))
        mixed = precision in MIXED_PRECISIONS
        if step == "megatron":
            return core + 4 + ((6 + 8) if precision == "fp16" else 0) + (6 if mixed else 0)
        return core + (8 if mixed else 0)


#: how an optimizer step's passes are counted (:meth:`Optimizer.step_bytes`): one fused pass, or
#: Megatron-LM's optimizer's separate passes
OPTIMIZER_STEPS = ("fused", "megatron")
#: the optimizers ``perfsim run`` trains and ``perfsim predict`` prices: AdamW (weight decay
#: 0; the same traffic and state as Adam, Loshchilov & Hutter, arXiv:1711.05101) and SGD with
#: momentum 0.9 (``torch.optim.SGD``). A 1-bit optimizer (``--grad-compress onebit-adam`` /
#: ``onebit-lamb``) replaces AdamW and keeps its two moments (Tang et al., arXiv:2102.02888;
#: Li et al., arXiv:2104.06069): it needs ``optimizer=adamw`` (:meth:`Job.check`)
OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (Optimizer("adamw", 2), Optimizer("sgd", 1))}
#: what a profile's ``optimizer`` record names -> the optimizer whose traffic it timed
#: (``perfsim calibrate`` times adamw, adam or sgd; Adam moves what AdamW does)
TIMED_OPTIMIZER = {"adamw": "adamw", "adam": "adamw", "sgd": "sgd"}


#: the dimensions of a rank order (:attr:`Job.placement`), innermost first, in perfsim's
#: default order: tensor, pipeline, data (replica-major: device = replica * pp + stage, the
#: numbering topology files use)
PLACEMENT_DIMS = ("tp", "pp", "dp")
#: Megatron-LM's rank order: tensor, data, pipeline (a TP group is the fastest-connected set
#: of consecutive ranks; Narayanan et al. 2021, arXiv:2104.04473 Sec. 3)
MEGATRON_PLACEMENT = ("tp", "dp", "pp")


def place(placement: tuple[str, ...], sizes: dict[str, int], coords: dict[str, int]) -> int:
    """Position of ``coords`` (``{"tp": t, "dp": r, "pp": s}``) in the rank order
    ``placement`` (innermost first) of a job of ``sizes``: the one definition of rank
    placement, read by the simulator (:meth:`Job.device`) and the runtime
    (:class:`perfsim.runtime.layout.RankLayout`)."""
    pos, stride = 0, 1
    for dim in placement:
        pos += coords[dim] * stride
        stride *= sizes[dim]
    return pos


def unplace(placement: tuple[str, ...], sizes: dict[str, int], pos: int) -> dict[str, int]:
    """The coordinates (``{"tp", "dp", "pp"}``) at position ``pos`` of ``placement``
    (the inverse of :func:`place`)."""
    out = {}
    for dim in placement:
        pos, out[dim] = divmod(pos, sizes[dim])
    return out


@dataclass(frozen=True)
class Preset:
    """Defaults of a named way of training, applied where the user gave no value."""

    #: preset name (``--gpu`` selects ``megatron``)
    name: str
    #: pipeline schedule (perfsim.schedules)
    schedule: str
    #: ``bucketed`` or ``contiguous`` gradient buffer (perfsim.config.GRAD_BUFFERS)
    grad_buffer: str
    #: ``untied`` or ``sync`` (TIED_EMBEDDINGS)
    tied_embedding: str
    #: start each bucket's gradient sync during the backward pass
    overlap: bool
    #: rank order of the placement, innermost first
    placement: str
    #: ``None`` (balanced by compute) or ``uniform`` (equal blocks, embedding first, head last)
    partition: str | None
    #: vocabulary padded to a multiple of this (times tp)
    vocab_multiple: int
    #: ``fused`` or ``eager`` kernels (KERNELS)
    kernels: str
    #: how TP ranks send a pipeline boundary (perfsim.models.tensor_parallel.TP_SENDS)
    tp_send: str = "full"


#: perfsim's own defaults (those of ``perfsim predict`` without a GPU preset)
PERFSIM = Preset("perfsim", schedule="gpipe", grad_buffer="bucketed", tied_embedding="untied", overlap=True,
                 placement="tp,pp,dp", partition=None, vocab_multiple=1, kernels="eager", tp_send="full")
#: Megatron-LM's defaults (Shoeybi et al., arXiv:1909.08053; Narayanan et al., arXiv:2104.04473):
#: 1F1B, one contiguous fp32 gradient buffer reduced after the backward (unless
#: ``--overlap-grad-reduce``), the tied embedding's gradient all-reduced between the first and
#: last stages, ranks ordered tp, dp, pp, a uniform split of the blocks, and the vocabulary
#: padded to a multiple of 128 x tp (``--make-vocab-size-divisible-by``,
#: perfsim.models.transformer.MEGATRON_VOCAB_MULTIPLE), pipeline messages scattered over the TP
#: ranks and gathered on arrival (``--scatter-gather-tensors-in-pipeline``, arXiv:2104.04473 Sec. 4.1),
#: and its fused kernels
MEGATRON = Preset("megatron", schedule="1f1b", grad_buffer="contiguous", tied_embedding="sync", overlap=False,
                  placement="tp,dp,pp", partition="uniform", vocab_multiple=MEGATRON_VOCAB_MULTIPLE,
                  kernels="fused", tp_send="scatter-gather")
PRESETS = {p.name: p for p in (PERFSIM, MEGATRON)}


def preset(gpu: Any) -> Preset:
    """The defaults a prediction takes: :data:`MEGATRON` with a GPU preset, else :data:`PERFSIM`."""
    return MEGATRON if gpu else PERFSIM


def steps_per_epoch(samples: int, global_batch: int) -> int:
    """Optimizer steps of one epoch over ``samples`` at ``global_batch`` samples a step:
    ``ceil(samples / global_batch)``, the last batch completed from the epoch's first samples
    (``torch.utils.data.DistributedSampler``'s padding). The one definition ``perfsim predict``
    (its ``iterations_per_epoch``) and ``perfsim run`` (:class:`perfsim.runtime.data.Order`) count."""
    return -(-samples // global_batch)


def training_steps(epochs: int, samples: int, global_batch: int) -> int:
    """Optimizer steps of ``epochs`` epochs (:func:`steps_per_epoch` each): what ``--epochs``
    means to ``perfsim predict`` (its end-to-end time) and to ``perfsim run`` (how long it trains).
    The data set's ``samples`` are the model's own where perfsim knows its data set
    (:func:`perfsim.models.datasets.dataset_samples`), else predict's ``--dataset-samples``."""
    return epochs * steps_per_epoch(samples, global_batch)


def chosen_chunks(schedule: str, virtual_stages: int | None) -> int | None:
    """What ``--virtual-stages`` means for ``schedule``, in ``perfsim predict`` and ``perfsim run``
    alike: the model chunks per device of a schedule that lets the user choose them
    (interleaved-1f1b, :data:`perfsim.schedules.VIRTUAL_STAGE_SCHEDULES`); the others run their
    own (zb-v 2, the rest 1) and take None, so one ``--virtual-stages`` applies to the
    interleaved rows of a grid of schedules. (A Job built directly with a count its schedule
    cannot run is refused by the schedule table.)"""
    return virtual_stages if schedule in VIRTUAL_STAGE_SCHEDULES else None


def check_chunks(pp: int, schedule: str, virtual_stages: int | None, layers: int) -> None:
    """Each of the pp x chunks-per-device pipeline stages needs one of the model's ``layers``:
    the error names the values the user gave (``virtual_stages=100``), not their product."""
    per_device = stage_count(schedule, virtual_stages)
    if pp * per_device <= layers:
        return
    if per_device == 1:
        what = f"pp={pp}"
    elif virtual_stages is not None and schedule in VIRTUAL_STAGE_SCHEDULES:
        what = f"virtual_stages={virtual_stages} with pp={pp} ({pp} x {per_device} model chunks)"
    else:
        what = f"pp={pp} with {schedule} ({per_device} model chunks per device: {pp * per_device})"
    raise ConfigError(f"{what}: the model has only {layers} layers, one per pipeline stage at least")


def check_int(obj, name: str, minimum: int = 1) -> None:
    """ConfigError naming field ``name`` of ``obj`` unless it is an integer >= ``minimum``."""
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{name}={v!r}: must be an integer >= {minimum}")


def check_choice(obj, name: str, choices) -> None:
    """ConfigError naming field ``name`` of ``obj`` unless its value is one of ``choices``."""
    v = getattr(obj, name)
    if v not in choices:
        raise ConfigError(f"{name}={v!r}: choose from {', '.join(choices)}")


@dataclass(frozen=True)
class Job(PipelineShape):
    """The job both engines run: parallelism, batch, schedule, compression (module docstring)."""

    #: pipeline-parallel degree (stages)
    pp: int = 8
    #: data-parallel degree (pipeline replicas)
    dp: int = 1
    #: tensor-parallel degree (Megatron-LM column/row-parallel layers)
    tp: int = 1
    #: Megatron sequence parallelism (reduce-scatter/all-gather instead of all-reduce; tp > 1)
    sequence_parallel: bool = False
    #: samples per micro-batch
    micro_batch: int = 1
    #: samples per macro-batch (one optimizer step of one replica)
    macro_batch: int = 32
    #: pipeline schedule name (``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``zb-h1``,
    #: ``zb-v``; perfsim.schedules)
    schedule: str = "gpipe"
    #: model chunks per device (interleaved-1f1b: default 2; zb-v: 2; others 1);
    #: None: the schedule's own
    virtual_stages: int | None = None
    #: pipeline compression spec (``fp32``, ``directq:fw4bw8``, ``aqsgd:fw3bw6``): a
    #: :class:`perfsim.compression.spec.Spec` (text is parsed on construction)
    compress: Spec = "fp32"
    #: data-parallel gradient compression spec (``none`` = fp32 allreduce), a Spec
    grad_compress: Spec = "none"
    #: per-boundary pipeline compression overriding ``compress`` (``"1=aqsgd:fw2bw4"``,
    #: perfsim.boundaries; boundary k follows stage k): a BoundarySpecs (text parsed)
    boundary_compress: BoundarySpecs = BoundarySpecs()
    #: GPU (rank) that runs each position of the placement order (a permutation; None:
    #: the identity): places stages on the nodes of a heterogeneous topology
    device_order: tuple[int, ...] | None = None
    #: rank order, innermost first (PLACEMENT_DIMS: ``tp,pp,dp``, a replica's stages
    #: adjacent; Megatron-LM's ``tp,dp,pp``): the simulator's devices and the runtime's
    #: ranks are both numbered along it (:meth:`device`); TP innermost keeps a TP group in a node
    placement: tuple[str, ...] = PLACEMENT_DIMS
    #: layer counts per stage (pp x virtual stages of them), or None for the balanced partition
    partition: tuple[int, ...] | None = None
    #: ``untied`` or ``sync`` (TIED_EMBEDDINGS)
    tied_embedding: str = "untied"
    #: ZeRO stage (ZERO_STAGES): 0 none, 1 optimizer state, 2 + gradients, 3 + parameters
    #: sharded over data parallelism (3 = FSDP2 ``fully_shard``)
    zero: int = 0
    #: CPU offload (OFFLOAD): ``optimizer`` keeps the optimizer state and the gradients (the
    #: shard ZeRO-2/3 gives this rank) in host memory and steps them there (ZeRO-Offload)
    offload: str = "none"
    #: how the TP ranks of a stage send a pipeline boundary: ``full`` or ``scatter-gather``
    #: (perfsim.models.tensor_parallel.TP_SENDS)
    tp_send: str = "full"
    #: ``eager`` (plain PyTorch under autocast: one kernel per operator), ``eager-pure`` (the same,
    #: weights in the training precision) or ``fused`` (Megatron-LM's kernels): KERNELS; a GPU
    #: preset's prediction defaults to Megatron's (:data:`MEGATRON`)
    kernels: str = "eager"
    #: optimizer (OPTIMIZERS): ``adamw`` or ``sgd`` (momentum 0.9); ``perfsim run`` trains it,
    #: ``perfsim predict`` prices its step and its state (memory, ZeRO's sharded ``K``)
    optimizer: str = "adamw"

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """The job's one validation (ConfigError naming the field)."""
        for name in ("device_order", "partition", "placement"):  # a JSON list (a rank's config) -> the tuple
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.placement, str):  # the flag's text, ``tp,dp,pp``
            object.__setattr__(self, "placement", tuple(x.strip().lower() for x in self.placement.split(",")))
        if not isinstance(self.placement, tuple) or sorted(self.placement) != sorted(PLACEMENT_DIMS):
            raise ConfigError(f"placement={','.join(map(str, self.placement))!r}: an order of tp, dp, pp")
        for name in ("pp", "dp", "tp", "micro_batch", "macro_batch"):
            check_int(self, name)
        if self.virtual_stages is not None:
            check_int(self, "virtual_stages")
        if self.macro_batch % self.micro_batch:
            raise ConfigError(f"macro_batch={self.macro_batch}: not divisible by micro_batch={self.micro_batch}")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("sequence_parallel: needs tp > 1")
        check_choice(self, "tied_embedding", TIED_EMBEDDINGS)
        check_choice(self, "tp_send", TP_SENDS)
        if self.zero not in ZERO_STAGES:
            raise ConfigError(f"zero={self.zero!r}: choose from {', '.join(map(str, ZERO_STAGES))} "
                              f"(1 optimizer state, 2 + gradients, 3 + parameters sharded)")
        check_choice(self, "kernels", KERNELS)
        check_choice(self, "optimizer", OPTIMIZERS)
        check_choice(self, "offload", OFFLOAD)
        if self.offload != "none" and self.zero < 2:
            raise ConfigError(f"offload={self.offload!r}: needs zero 2 or 3 (ZeRO-Offload streams each rank's "
                              f"reduced gradient shard to the host, arXiv:2101.06840 Sec. 4); zero={self.zero}")
        if self.offload != "none" and self.optimizer != "adamw":
            raise ConfigError(f"offload={self.offload!r} with optimizer={self.optimizer!r}: ZeRO-Offload's host "
                              f"step is CPU-Adam's (arXiv:2101.06840 Sec. 4); use optimizer=adamw")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r}: unknown (choose from {', '.join(SCHEDULES)})")
        if self.zero >= 2 and self.schedule in ("zb-h1", "zb-v"):
            raise ConfigError(f"zero={self.zero}: not modelled with the zero-bubble schedule "
                              f"{self.schedule!r} (its split weight gradient); use gpipe, 1f1b or interleaved-1f1b")
        for name in ("compress", "grad_compress"):
            v = getattr(self, name)
            if not isinstance(v, (str, Spec)) or not str(v).strip():
                raise ConfigError(f"{name}={v!r}: must be a non-empty string")
        # the specs as values, parsed once (text from callers and saved run configs is accepted)
        object.__setattr__(self, "compress", parse_spec(self.compress, "pipeline"))
        object.__setattr__(self, "grad_compress", parse_spec(self.grad_compress, "grad"))
        object.__setattr__(self, "boundary_compress", parse_boundary_compress(self.boundary_compress))
        if self.grad_compress.family == "optimizer" and self.optimizer != "adamw":
            raise ConfigError(f"optimizer={self.optimizer!r} with grad_compress={self.grad_compress.text!r}: "
                              f"a 1-bit optimizer is an Adam (or LAMB) itself; use optimizer=adamw")
        self.table()  # the schedule must fit pp and the micro-batches
        check_boundaries(self.boundary_compress, self.num_stages)
        if self.device_order is not None and sorted(self.device_order) != list(range(self.devices)):
            raise ConfigError(f"device_order={','.join(map(str, self.device_order))!r}: must be a permutation "
                              f"of the {self.devices} GPUs 0..{self.devices - 1} (tp x dp x pp)")
        if self.partition is not None:
            n = self.num_stages
            if len(self.partition) != n or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                               for c in self.partition):
                raise ConfigError(f"partition={self.partition!r}: needs {n} layer counts >= 1 "
                                  f"(pp={self.pp} x {n // self.pp} virtual stages)")

    @property
    def devices(self) -> int:
        """GPUs (ranks) of the job: tp x replicas x pp."""
        return self.tp * self.replicas * self.pp

    @property
    def replicas(self) -> int:
        """Ranks of a (tensor rank, stage) position that hold the same weights and reduce their
        gradients together: the data-parallel replicas (``dp``; x ``cp`` with the simulator's
        context parallelism, :class:`perfsim.config.Strategy`). The devices' ``dp`` coordinate runs
        over them."""
        return self.dp

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all replicas."""
        return self.macro_batch * self.dp

    def _sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "dp": self.replicas, "pp": self.pp}

    def device(self, t: int, r: int, s: int) -> int:
        """GPU (rank) of tensor rank ``t`` of replica ``r``, stage ``s``: numbered along
        ``placement``, innermost first (:func:`place`), then through ``device_order``."""
        pos = place(self.placement, self._sizes(), {"tp": t, "dp": r, "pp": s})
        return pos if self.device_order is None else self.device_order[pos]

    def coords(self, device: int) -> tuple[int, int, int]:
        """``(t, r, s)`` of GPU (rank) ``device``: the inverse of :meth:`device`."""
        pos = device if self.device_order is None else self.device_order.index(device)
        c = unplace(self.placement, self._sizes(), pos)
        return c["tp"], c["dp"], c["pp"]

    def job(self) -> "Job":
        """The :class:`Job` part alone (what ``perfsim run`` and ``perfsim predict`` must agree on)."""
        return Job(**{f.name: getattr(self, f.name) for f in fields(Job)})


#: the names of the job's fields, in order
JOB_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Job))
