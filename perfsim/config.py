"""Configuration of one simulation: workload, strategy, system (ASTRA-sim split).

Each is a frozen dataclass; ``__post_init__`` validates and raises
:class:`ConfigError` naming the field. :func:`from_dict` builds one from a
mapping and rejects unknown keys. Units are SI (bits/s, seconds, bytes);
strings such as ``"100Mbps"`` are converted by :mod:`perfsim.units` at the edge
(see :mod:`perfsim.api`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from perfsim.collectives import ALGORITHMS as COLLECTIVE_ALGORITHMS
from perfsim.collectives import COLLECTIVE_MODELS
from perfsim.errors import ConfigError
from perfsim.fabrics import NIC_AFFINITIES, NIC_KINDS
from perfsim.hardware import PRECISIONS, get_gpu, value_precision
from perfsim.job import MEGATRON_PLACEMENT, PLACEMENT_DIMS, TIED_EMBEDDINGS, ZERO_STAGES, Job  # noqa: F401  (re-exported)
from perfsim.job import OPTIMIZER_STEPS, check_choice
from perfsim.job import check_int as _pos_int
from perfsim.link import LINK_MODELS, P2P_PROTOCOLS
from perfsim.models.ops import FP8_CASTS, GRAD_ACCUMULATION
from perfsim.models.specs import LayerSpec
from perfsim.param_table import BY_NAME as PARAMS_BY_NAME, check_bound
from perfsim.schedules import P2P_EXCHANGES
from perfsim.tcp import parse_slow_start, parse_tcp_window


def _pos_float(obj, name: str, allow_zero: bool = False, allow_none: bool = False) -> None:
    """ConfigError naming the field ``name`` unless it is a finite number > 0 (>= 0 with
    ``allow_zero``; None with ``allow_none``). A field a predict parameter fills with a bound
    of its own is checked by :func:`_param_bound`."""
    v = getattr(obj, name)
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v < 0 or (v == 0 and not allow_zero):
        raise ConfigError(f"{name}={v!r}: must be a finite number {'>=' if allow_zero else '>'} 0")


def _param_bound(obj, name: str, param: str | None = None) -> None:
    """Field ``name`` of ``obj`` (None: not set) within the bound of the predict parameter that
    fills it (``param``, default the same name; :attr:`perfsim.param_table.Param.bound`): the one
    statement of that bound, which the parsed value kept already (ConfigError naming the parameter)."""
    if getattr(obj, name) is not None:
        check_bound(PARAMS_BY_NAME[param or name], getattr(obj, name))


@dataclass(frozen=True)
class Workload:
    """What is trained, with its costs resolved for one micro-batch size."""

    #: model name (preset or workload-file name)
    model: str
    #: the layers, in order (parameters, boundary activation shape per sample)
    layers: tuple[LayerSpec, ...]
    #: forward seconds of each layer for ONE micro-batch
    fwd_s: tuple[float, ...]
    #: backward seconds of each layer for ONE micro-batch
    bwd_s: tuple[float, ...]
    #: tokens in one sample (sequence length; 1 for images)
    tokens_per_sample: int = 1
    #: the transformer's shape (perfsim.models.transformer.TransformerSpec) when known:
    #: tensor-parallel collectives and the activation-memory model need it
    arch: Any = None
    #: parameters one tensor-parallel rank holds of each layer (None = ``layers[i].params``)
    rank_params: tuple[int, ...] | None = None
    #: where the compute times come from (printed in the result: an assumption when modelled)
    compute_source: str = ""
    #: without ``arch``: values of the last layer's copy of a tied embedding (a workload file's)
    tied_values: int = 0

    def __post_init__(self):
        if not self.layers:
            raise ConfigError("layers: empty model")
        if len(self.fwd_s) != len(self.layers) or len(self.bwd_s) != len(self.layers):
            raise ConfigError("fwd_s/bwd_s: need one time per layer")
        for name in ("fwd_s", "bwd_s"):
            for t in getattr(self, name):
                if not math.isfinite(t) or t < 0:
                    raise ConfigError(f"{name}: time {t!r} must be finite and >= 0")
        _pos_int(self, "tokens_per_sample")
        if self.rank_params is not None and len(self.rank_params) != len(self.layers):
            raise ConfigError("rank_params: need one count per layer")

    def params_of(self, i: int) -> int:
        """Parameters of layer ``i`` on one tensor-parallel rank."""
        return self.rank_params[i] if self.rank_params is not None else self.layers[i].params

    def context_rank(self, cp: int) -> "Workload":
        """One context-parallel rank's view (``Strategy.cp``; :mod:`perfsim.engine.context_parallel`): its
        layers, shape and tokens a sample the sequence shard's
        (:meth:`perfsim.models.transformer.TransformerSpec.context_shard`), its compute times already the
        rank's (priced from that shard); itself for ``cp == 1`` or a model that is not a transformer."""
        if cp == 1 or self.arch is None:
            return self
        shard = self.arch.context_shard(cp)
        return replace(self, layers=tuple(shard.layers()), tokens_per_sample=shard.seq_len, arch=shard)


#: activation recomputation modes (Korthikanti et al. 2022, arXiv:2205.05198)
RECOMPUTE = ("none", "selective", "full")
#: attention kernels: Megatron-LM's (scores, softmax, dropout, weighted sum as separate
#: kernels, the s x s scores stored) or FlashAttention-2's one fused kernel
#: (Dao 2023, arXiv:2307.08691)
ATTENTION = ("megatron", "flash")
#: where data-parallel gradients live: ``bucketed`` -- PyTorch DDP's default, each
#: bucket flattened into a buffer and the averaged result copied back (Li et al.,
#: "PyTorch Distributed", arXiv:2006.15704, Sec. 3.2.3); ``contiguous`` -- one flat
#: buffer the collective reduces in place (Megatron-LM's DistributedDataParallel with
#: contiguous gradient buffers; DDP's ``gradient_as_bucket_view=True``): no copies
GRAD_BUFFERS = ("bucketed", "contiguous")
#: the tied head's and ZeRO's choices belong to the job (perfsim.job), re-exported here
#: the loss's memory (perfsim.memory): ``fused`` -- Megatron-LM's vocab-parallel cross
#: entropy (fp32 softmax kept, its gradient computed in place; Korthikanti et al.'s
#: ``4 s b v``); ``pytorch`` -- ``F.cross_entropy`` on the logits under autocast (the
#: logits, the fp32 log-softmax and, in the backward, an fp32 gradient of the full
#: ``s b v`` size: 12 bytes per bf16 logit, measured on an H100); ``chunked`` -- a fused linear cross entropy that never holds the
#: whole logits (Liger-Kernel, Hsu et al. 2024, arXiv:2410.10989, Sec. 3.2)
CROSS_ENTROPY = ("fused", "pytorch", "chunked")
#: how a context-parallel group exchanges what its attention needs (Megatron-Core's ``--cp-comm-type``;
#: :func:`perfsim.engine.context_parallel.cp_collectives`): ``p2p`` the ring beside the attention (the
#: default), ``allgather`` every rank's keys and values gathered before it (Llama 3's), ``a2a`` the
#: sequence traded for heads and back (DeepSpeed-Ulysses)
CP_COMMS = ("p2p", "allgather", "a2a")


@dataclass(frozen=True)
class Strategy(Job):
    """How the training is parallelised and compressed: the job (:class:`perfsim.job.Job`:
    pp, dp, tp, batch, schedule, compression, partition, device order, tied head, ZeRO) and
    what only the simulator models (precision, buckets, MoE routing...)."""

    #: gradient bucket size in bytes of fp32 gradients (PyTorch DDP default 25 MiB)
    bucket_bytes: int = 25 * 2**20
    #: start a bucket's gradient sync as soon as the last backward produced it
    overlap_grad_sync: bool = True
    #: ``bucketed`` (copy into and out of each bucket) or ``contiguous`` (GRAD_BUFFERS)
    grad_buffer: str = "bucketed"
    #: number of epochs for the end-to-end time (perfsim.job.training_steps: the steps
    #: ``perfsim run --epochs`` trains)
    epochs: int = 1
    #: training samples in one epoch (predict takes the model's own data set where perfsim
    #: knows it, perfsim.models.datasets; this default ~ WikiText-2 train at 1024 tokens:
    #: 2.4M GPT-2 tokens / 1024)
    dataset_samples: int = 2359
    #: activation recomputation: ``none``, ``selective`` (attention core) or ``full``
    recompute: str = "none"
    #: attention kernels of the compute model (ATTENTION)
    attention: str = "megatron"
    #: training precision: ``fp32``, ``tf32``, ``bf16`` or ``fp16`` (mixed precision)
    precision: str = "fp32"
    #: ZeRO-3 / FSDP2: free the gathered parameters after each unit's forward and gather
    #: them again in the backward (FSDP2's default); False keeps them from the forward to
    #: the backward (no backward all-gather, more memory)
    reshard_after_forward: bool = True
    #: the loss's activation memory (CROSS_ENTROPY)
    cross_entropy: str = "fused"
    #: a MoE model's expert capacity factor (perfsim.models.moe: GShard / Switch Transformer
    #: padded capacity); None: dropless experts
    moe_capacity_factor: float | None = None
    #: expert-parallel degree: a MoE model's experts split over ``ep`` consecutive
    #: data-parallel replicas (Megatron-Core lays the expert-parallel group inside the
    #: data-parallel one); 1: every replica holds every expert
    ep: int = 1
    #: context-parallel degree: every sequence split over ``cp`` ranks that hold the same weights
    #: (Megatron-Core's ``--context-parallel-size``; perfsim.engine.context_parallel): each rank
    #: computes its tokens' share, its queries' attention over the whole sequence through a ring of
    #: key/value exchanges, and reduces its gradients with the data-parallel replicas' (``dp x cp``
    #: ranks, :attr:`replicas`); placed next to the tensor ranks (Megatron-Core's tp-cp-dp-pp order)
    cp: int = 1
    #: how a context-parallel group exchanges keys and values (CP_COMMS): ``p2p`` (the ring),
    #: ``allgather`` or ``a2a`` (DeepSpeed-Ulysses)
    cp_comm: str = "p2p"
    #: the busiest expert-parallel rank's routed tokens over the balanced share (>= 1; a
    #: stated assumption, perfsim.models.moe.Routing)
    moe_imbalance: float = 1.0
    #: codec of the expert-parallel dispatch all-to-alls (perfsim.models.moe.parse_a2a_compress):
    #: ``none``, ``fp8`` (DeepSeek-V3, arXiv:2412.19437 Sec. 3.3) or ``directq:BITS``
    a2a_compress: str = "none"
    #: Megatron-Core's ``--overlap-moe-expert-parallel-comm``: a forward and another micro-batch's
    #: backward run as one unit, each one's all-to-alls beside the other's compute
    #: (perfsim.engine.ep_overlap)
    ep_overlap: bool = False
    #: how the micro-batches accumulate their weight gradients in the GPU compute model
    #: (perfsim.models.ops.GRAD_ACCUMULATION): ``fused`` (gradient accumulation fusion),
    #: ``main-grad`` (Megatron's local DDP hook, every parameter every micro-batch) or
    #: ``autograd`` (``param.grad +=``, every micro-batch after the first)
    grad_accumulation: str = "fused"
    #: how a GPU preset counts the optimizer step's bytes (perfsim.job.OPTIMIZER_STEPS): ``fused``
    #: (one pass) or ``megatron`` (Megatron-LM's optimizer's passes)
    optimizer_step: str = "fused"
    #: Transformer Engine's quantisation kernels under ``precision="fp8"``
    #: (perfsim.models.ops.FP8_CASTS): ``te`` priced, ``none`` left out
    fp8_casts: str = "te"

    @property
    def replicas(self) -> int:
        """Ranks of a (tensor rank, stage) position holding the same weights: ``dp x cp`` (a
        context-parallel group's ranks are ``cp`` consecutive replicas; :meth:`perfsim.job.Job.replicas`)."""
        return self.dp * self.cp

    def __post_init__(self):
        _pos_int(self, "cp")  # before the job's checks, which count the devices
        self.check()  # the job's fields (perfsim.job.Job)
        for name in ("epochs", "dataset_samples"):
            _pos_int(self, name)
        if isinstance(self.bucket_bytes, bool) or not isinstance(self.bucket_bytes, int):
            raise ConfigError(f"bucket_size={self.bucket_bytes!r}: whole bytes")  # the parameter's name
        _param_bound(self, "bucket_bytes", "bucket_size")
        check_choice(self, "recompute", RECOMPUTE)
        check_choice(self, "attention", ATTENTION)
        check_choice(self, "precision", PRECISIONS)
        check_choice(self, "grad_buffer", GRAD_BUFFERS)
        check_choice(self, "cross_entropy", CROSS_ENTROPY)
        check_choice(self, "grad_accumulation", GRAD_ACCUMULATION)
        check_choice(self, "optimizer_step", OPTIMIZER_STEPS)
        check_choice(self, "fp8_casts", FP8_CASTS)
        _param_bound(self, "moe_capacity_factor")
        _pos_int(self, "ep")
        if self.replicas % self.ep:
            raise ConfigError(f"ep={self.ep}: must divide dp={self.dp}" + (f" x cp={self.cp}" if self.cp > 1 else "")
                              + " (the expert-parallel group is carved out of the data-parallel replicas"
                              + (", context-parallel ranks included: Megatron-Core)" if self.cp > 1 else ")"))
        if self.zero >= 2 and self.ep > 1:
            raise ConfigError(f"zero={self.zero} with ep={self.ep}: not modelled (the experts are not "
                              f"replicated over the data-parallel group that ZeRO-2/3 shards over)")
        _param_bound(self, "moe_imbalance")  # >= 1 (1 = balanced)
        check_choice(self, "cp_comm", CP_COMMS)
        from perfsim.models.moe import parse_a2a_compress  # lazy: config imports no model code eagerly

        # with ep 1 there is no all-to-all to compress: unused (the model note says so), not refused, so
        # that perfsim plan can search ep with a given codec
        object.__setattr__(self, "a2a_compress", parse_a2a_compress(self.a2a_compress))
        if self.ep_overlap:
            self._check_ep_overlap()

    def _check_ep_overlap(self) -> None:
        """What Megatron-Core's combined 1F1B runs with, and what its model here covers (ConfigError)."""
        if self.ep == 1:
            raise ConfigError("ep_overlap: needs ep > 1 (there is no all-to-all to hide)")
        if self.pp > 1 and self.schedule != "interleaved-1f1b":
            raise ConfigError(f"ep_overlap with pp={self.pp}: Megatron-Core's combined 1F1B runs inside the "
                              f"interleaved schedule (--schedule interleaved-1f1b), not {self.schedule!r}")
        if self.recompute == "full":
            raise ConfigError("ep_overlap with recompute=full: the recomputed forward's all-to-alls are not "
                              "placed in the combined unit's phases (not modelled); use none or selective")

    @property
    def grad_dtype(self) -> str:
        """Precision the gradients are kept and all-reduced in: the training precision,
        except that Megatron-LM's contiguous buffer is fp32 under bf16 ("bfloat16
        requires gradient accumulation and all-reduce to be done in fp32": Megatron-LM
        ``megatron/arguments.py`` forces ``accumulate_allreduce_grads_in_fp32``; its
        distributed-optimizer table counts bf16 params with fp32 grads, 18 bytes per
        parameter). fp16 keeps fp16 gradients (the A100 data's all-reduce is fp16)."""
        if self.precision in ("bf16", "fp8") and self.grad_buffer == "contiguous":
            return "fp32"
        return value_precision(self.precision)  # fp8: bf16 gradients (Transformer Engine)


@dataclass(frozen=True)
class System:
    """The devices and the network between them."""

    #: inter-node NIC / link rate in bits per second (ignored where a topology gives one)
    bandwidth_bps: float = 10e9
    #: one-way latency of an inter-node link in seconds
    latency_s: float = 0.0
    #: devices (GPUs) per node; devices of one node talk over the intra-node fabric
    gpus_per_node: int = 1
    #: host memory (RAM) of one node in bytes, which holds its GPUs' offloaded optimizer state
    #: (ZeRO-Offload); None: not checked
    host_memory_bytes: float | None = None
    #: intra-node link rate in bits/s (NVLink-class default, 300 GB/s)
    intra_node_bandwidth_bps: float = 2.4e12
    #: intra-node latency in seconds
    intra_node_latency_s: float = 5e-6
    #: per-pair heterogeneous topology (perfsim.network.Topology) or None
    topology: Any = None
    #: share NICs fairly between concurrent flows (max-min); False = each flow
    #: gets the full link (a lower bound on communication time)
    nic_sharing: bool = True
    #: token-bucket depth of each node's inter-node egress in bytes (Linux ``tc tbf``
    #: ``burst``; measured by ``perfsim calibrate --emulate-bandwidth``): after the link
    #: idled, up to this many bytes leave at once and the bucket refills at the link
    #: rate. 0 = a plain fixed-rate link
    link_burst_bytes: float = 0.0
    #: ``eager``: a point-to-point message starts when it is sent; ``rendezvous``: it
    #: starts only once the receiver has posted its receive and the receiver's "ready"
    #: notice has crossed back (queued behind bytes already waiting on the receiver's
    #: egress) -- gloo's TCP transport is receiver-driven
    p2p_protocol: str = "eager"
    #: one-way latency of the rendezvous "ready" notice (s); None = the link latency
    p2p_control_latency_s: float | None = None
    #: how a device waits on its pipeline messages (perfsim.schedules.P2P_EXCHANGES): ``async``
    #: -- a send leaves without waiting, a receive waits before the compute that needs it;
    #: ``blocking`` -- Megatron-LM's exchanges: after each compute step one batch of that step's
    #: sends and the next step's receives, waited on to the end (perfsim.schedules.exchange_rows);
    #: ``deepspeed`` -- DeepSpeed's pipeline engine, each message a blocking call of its own
    #: (perfsim.schedules.deepspeed_rows)
    p2p_exchange: str = "async"
    #: GPU preset (perfsim.hardware.GPUS) or None: compute from the profile alone
    gpu: str | None = None
    #: parameters per second a node's CPUs update with Adam for CPU offload (``Strategy.offload``;
    #: shared by the node's GPUs); None: :data:`perfsim.engine.offload.CPU_ADAM_PARAMS_PER_S`
    cpu_adam_params_per_s: float | None = None
    #: transport of the inter-node NICs (perfsim.fabrics.NIC_KINDS): the payload share
    #: of ``bandwidth_bps`` a long transfer achieves when the link is not calibrated
    nic_kind: str = "ideal"
    #: NICs per node (``bandwidth_bps`` is their total; reported, shared by the node's GPUs)
    nics_per_node: int = 1
    #: ``gpu``: one GPU's flows use only its nearest NICs, ``1 / min(nics, gpus_per_node)`` of
    #: the node's (perfsim.fabrics.gpu_nic_share); ``node``: every flow may use all of them
    nic_affinity: str = "gpu"
    #: ``auto``: the profile's measured link at this rate when it has one, else nominal;
    #: ``calibrated``: require it; ``nominal``: ``bandwidth_bps`` x the NIC kind's efficiency
    link_model: str = "auto"
    #: collective algorithm (perfsim.collectives): ``auto`` (least modelled time, as
    #: NCCL's tuner), ``ring``, ``tree`` or ``hierarchical``
    collective_algo: str = "auto"
    #: ``nominal``: each collective step costs the link's latency, every size the full rate;
    #: ``nccl``: NCCL's protocols LL / LL128 / Simple, the cheapest per size (perfsim.collectives);
    #: ``pipelined``: those protocols with each step's latency overlapped by the data before it;
    #: ``auto``: ``pipelined`` for a GPU preset's NCCL collectives, else ``nominal``
    collective_model: str = "auto"
    #: the intra-node fabric is PCIe (NCCL's PCI step latencies, no LL128); set from
    #: ``--intra-node-fabric pcie*``
    intra_node_pcie: bool = False
    #: compute slowdown while communication overlaps it on the same device (0.1 = 10 %
    #: slower); None = measured by ``perfsim calibrate`` (op ``interference``), else 0
    comm_slowdown: float | None = None
    #: host time per GPU operator (framework, autograd, launch) replacing the GPU
    #: curve's ``kernel_s``; None = the curve's (perfsim.hardware.curve_for)
    host_overhead_s: float | None = None
    #: relative spread (standard deviation / mean) of the GPUs' speeds, persistent per GPU;
    #: the iteration waits for the slowest (perfsim.engine.sync_wait); 0 = off
    straggler_cv: float = 0.0
    #: relative spread of one micro-batch's compute on one GPU, independent between
    #: micro-batches (averages over gradient accumulation; perfsim.engine.sync_wait); 0 = off
    jitter_cv: float = 0.0
    #: window of each TCP connection of the inter-node links (perfsim.tcp): ``auto`` (the
    #: profile's host sysctls, else Linux's defaults), ``off`` (no window ceiling), or bytes;
    #: bounds a TCP transport's rate (NIC kinds ethernet, socket) at connections x W / RTT
    tcp_window: str | int = "auto"
    #: TCP connections that carry one message; None = the NIC kind's (gloo and NCCL's
    #: socket transport by default: 1)
    tcp_connections: int | None = None
    #: whether a TCP connection idle for longer than its RTO restarts slow start (Linux
    #: ``net.ipv4.tcp_slow_start_after_idle``; perfsim.tcp): ``auto`` (on where the profile
    #: recorded a host with the sysctl 1 and a congestion control other than bbr, else off),
    #: ``on`` (Linux's defaults) or ``off``
    tcp_slow_start_after_idle: str = "auto"

    def __post_init__(self):
        _pos_float(self, "bandwidth_bps")
        _pos_float(self, "link_burst_bytes", allow_zero=True)
        _pos_float(self, "p2p_control_latency_s", allow_zero=True, allow_none=True)
        check_choice(self, "p2p_protocol", P2P_PROTOCOLS)
        check_choice(self, "p2p_exchange", P2P_EXCHANGES)
        _pos_float(self, "latency_s", allow_zero=True)
        _pos_int(self, "gpus_per_node")
        _pos_float(self, "intra_node_bandwidth_bps")
        _pos_float(self, "intra_node_latency_s", allow_zero=True)
        if self.gpu is not None:
            get_gpu(self.gpu)
        check_choice(self, "nic_kind", NIC_KINDS)
        _pos_int(self, "nics_per_node")
        check_choice(self, "nic_affinity", NIC_AFFINITIES)
        check_choice(self, "link_model", LINK_MODELS)
        check_choice(self, "collective_algo", COLLECTIVE_ALGORITHMS)
        check_choice(self, "collective_model", COLLECTIVE_MODELS)
        _param_bound(self, "comm_slowdown")
        _param_bound(self, "host_memory_bytes", "host_memory")
        _pos_float(self, "host_overhead_s", allow_zero=True, allow_none=True)
        _param_bound(self, "cpu_adam_params_per_s", "cpu_adam_rate")  # the parameter's name
        for name in ("straggler_cv", "jitter_cv"):  # a relative spread: >= 0 and < 1 (0.02 = 2 %)
            _param_bound(self, name)
        object.__setattr__(self, "tcp_window", parse_tcp_window(self.tcp_window))
        if self.tcp_connections is not None:
            _pos_int(self, "tcp_connections")
        object.__setattr__(self, "tcp_slow_start_after_idle", parse_slow_start(self.tcp_slow_start_after_idle))
        if self.host_overhead_s is not None and self.gpu is None:
            raise ConfigError("host_overhead: only with a GPU preset (--gpu); a profile's measured "
                              "times carry their own host")


def from_dict(cls, data: Mapping[str, Any], where: str = ""):
    """Build ``cls`` (Workload/Strategy/System) from a mapping, rejecting unknown keys."""
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {sorted(unknown)} "
                          f"(known: {', '.join(sorted(names))})")
    return cls(**data)
