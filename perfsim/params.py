"""The parameters of a prediction, described once.

:data:`PARAMS` is the single description of everything ``perfsim predict`` takes:
name, type, default, unit, help text and where the value goes (a
:class:`~perfsim.config.Strategy` or :class:`~perfsim.config.System` field). It
drives

* the ``perfsim predict`` and ``perfsim sweep`` flags, and the job flags of ``perfsim run``
  and ``perfsim validate`` (:func:`add_arguments`; :data:`RUN_JOB_PARAMS`),
* the keyword arguments, annotations and docstring of :func:`perfsim.predict`
  and :func:`perfsim.sweep` (:func:`signature`, :func:`doc_table`),
* sweep grids and their configuration ids (:func:`normalize`), and
* the conversion into config dataclasses (:func:`perfsim.api.build_configs`).

Adding a predict parameter means adding one :class:`Param` here (and the field it
fills); nothing else lists the parameters.

Values are converted once, at this edge, into SI (bits/s, seconds, bytes):
``"100Mbps"`` and ``1e8`` are the same bandwidth.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping

from perfsim.boundaries import parse_boundary_compress
from perfsim.compression.spec import parse_spec
from perfsim.errors import ConfigError
from perfsim.job import JOB_FIELDS, PLACEMENT_DIMS, Job, chosen_chunks
from perfsim.tcp import parse_tcp_window
from perfsim.units import parse_bandwidth, parse_size, parse_time, split_list

#: value kinds: how a value is parsed (and the Python type the API accepts)
KINDS = {
    "model": "str", "str": "str", "path": "str | os.PathLike", "spec": "str", "choice": "str",
    "profile": "str | os.PathLike | Profile", "nic": "str | Nic", "int": "int", "float": "float", "bool": "bool", "bandwidth": "str | float", "time": "str | float",
    "size": "str | int", "partition": "str | Sequence[int]", "boundaries": "str | Mapping[int, str]",
    "order": "str | Sequence[int]", "placement": "str | Sequence[str]", "window": "str | int",
}
#: kinds whose comma list is ONE value (alternatives go in a Python list)
ONE_VALUE = ("partition", "boundaries", "order", "placement")


@dataclass(frozen=True)
class Param:
    """One predict parameter."""

    #: Python name (keyword argument, sweep key); the flag is ``--name-with-dashes``
    name: str
    #: one of :data:`KINDS`
    kind: str
    #: default value as a user would type it (None: the documented fallback)
    default: Any
    #: one help line, with the unit
    help: str
    #: flag group in ``--help``: workload, strategy or system
    group: str
    #: where the parsed value goes: ``"strategy.field"`` / ``"system.field"``,
    #: or None for values build_configs resolves itself (model, profile ...)
    target: str | None = None
    #: allowed values of a ``choice``, or ``"module:NAME"`` of the mapping/tuple
    #: that lists them where they are defined (e.g. the schedules)
    choices: tuple[str, ...] | str = ()
    #: smallest allowed ``int``
    minimum: int = 1
    #: role of a ``spec`` (perfsim.compression.spec): ``pipeline`` or ``grad``
    role: str = ""
    #: how ``perfsim plan`` searches it (:mod:`perfsim.search_space`): None (not a
    #: dimension: one value, the user's or the default); ``"split"`` (the planner's split
    #: of the GPUs and the batch: tp, pp, dp, micro_batch); a tuple of values; or
    #: ``"module:NAME"`` of such a tuple or of a function ``(context, param) -> values``
    #: (defaults that depend on the cluster, e.g. the GPU preset)
    search: Any = None
    #: where the dimension applies, a predicate of :data:`perfsim.search_space.APPLIES`
    #: (``"pp>1"`` ...); elsewhere the parameter keeps its default
    search_when: str = ""
    #: unit a bare number of a ``time`` is suggested in (``--host-overhead 25``: e.g.
    #: 25us); default ms (perfsim.units.parse_time)
    hint_unit: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} unknown")
        if self.group not in ("workload", "strategy", "system"):
            raise ValueError(f"{self.name}: group {self.group!r} unknown")

    @property
    def allowed(self) -> tuple[str, ...]:
        """The allowed values of a ``choice``."""
        if isinstance(self.choices, str):
            module, name = self.choices.split(":")
            return tuple(getattr(importlib.import_module(module), name))
        return self.choices

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def annotation(self) -> str:
        t = KINDS[self.kind]
        return f"{t} | None" if self.default is None else t


#: every predict parameter, in the order a grid varies them (the last fastest)
PARAMS: tuple[Param, ...] = (
    Param("model", "model", "gpt2-xl", "model: a preset (gpt2-xl, bert-large, llama2-70b, gpt3-175b ...), "
          "an inline transformer gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200"
          "[,ffn=..,kv_heads=..] (also llama:/bert:/neox:), or a Hugging Face config.json", "workload"),
    Param("seq_len", "int", None, "sequence length of a transformer model (default: the preset's)",
          "workload"),
    Param("workload", "path", None, "workload file (TOML/JSON, docs/formats.md) instead of a "
          "preset, or a packaged example name (example-workload)", "workload"),
    Param("profile", "profile", None, "calibration profile: a file, or a name: default-v100 (shipped), "
          "traces/NAME.json of a source checkout; default: the AQ-SGD paper's V100 profile", "workload"),
    Param("topology", "path", None, "heterogeneous topology file (JSON/TOML/CSV, docs/formats.md) "
          "or a packaged example name (example-geo); replaces bandwidth and latency (a node's NIC "
          "defaults to its fastest link)", "system"),
    Param("gpus_per_node", "int", 1, "devices per node", "system", "system.gpus_per_node"),
    Param("gpu", "str", None, "GPU preset (a100-sxm4-80gb, h100-sxm5-80gb, ...; perfsim.hardware): "
          "compute from its operator model, memory checked against its capacity; switches the "
          "defaults to Megatron-LM's (1f1b, uniform partition, placement tp,dp,pp)", "system"),
    Param("intra_node_bandwidth", "bandwidth", "300GB/s", "intra-node link rate (bits/s, or "
          "units such as 300GB/s)", "system"),
    Param("intra_node_fabric", "choice", None, "intra-node fabric preset with its achieved bus "
          "bandwidth (perfsim.fabrics; replaces intra_node_bandwidth)", "system",
          choices="perfsim.fabrics:FABRICS", search="perfsim.search_space:node_fabric"),
    Param("nic", "nic", None, "NICs of a node, [COUNTx]RATE[:KIND], e.g. 4x200Gbps:infiniband; their "
          "total replaces bandwidth, KIND (ethernet, socket, infiniband, ideal; default ethernet) gives the "
          "transport efficiency of an uncalibrated link", "system"),
    Param("collective_algo", "choice", "auto", "allreduce algorithm: auto (least modelled time, as "
          "NCCL's tuner), ring, tree (double binary tree) or hierarchical", "system",
          "system.collective_algo", choices="perfsim.collectives:ALGORITHMS"),
    Param("collective_model", "choice", "nominal", "nominal: a collective's steps cost the link latency, "
          "every size moves at the full rate; nccl: NCCL's protocols (LL, LL128, Simple) with their "
          "latencies and bandwidth shares, the cheapest per size (the nccl-tests busbw curve)", "system",
          "system.collective_model", choices="perfsim.collectives:COLLECTIVE_MODELS"),
    Param("link_model", "choice", "auto", "auto: the profile's measured link at this rate if any, else "
          "nominal x NIC efficiency; calibrated: require the measurement; nominal: ignore it",
          "system", "system.link_model", choices="perfsim.link:LINK_MODELS"),
    Param("host_overhead", "time", None, "host time per GPU operator (framework, autograd, launch), "
          "replacing the GPU curve's (Megatron-LM's on the A100 runs' hosts); e.g. 25us for eager "
          "PyTorch on an H200 host (docs/gpu.md); needs gpu", "system", "system.host_overhead_s", hint_unit="us"),
    Param("cpu_adam_rate", "float", None, "with offload optimizer: parameters per second a node's CPUs "
          "update with Adam, shared by its GPUs (default 4e9: ZeRO-Offload's CPU-Adam, 3.9e9-4.5e9 on a "
          "DGX-2 host)", "system", "system.cpu_adam_params_per_s"),
    Param("comm_slowdown", "float", None, "compute slowdown while communication overlaps it, e.g. 0.1 "
          "(default: the profile's measured interference, else 0)", "system", "system.comm_slowdown"),
    Param("nic_affinity", "choice", "gpu", "gpu: one GPU's flows (a pipeline message, a ring with one "
          "rank per node) use its nearest NICs, 1/min(NICs, GPUs per node) of the node's; node: all of "
          "them", "system", "system.nic_affinity", choices="perfsim.fabrics:NIC_AFFINITIES"),
    Param("straggler_cv", "float", 0.0, "spread (std / mean) of the GPUs' speeds, e.g. 0.01; every "
          "iteration waits for the slowest of the job's GPUs (perfsim.engine.sync_wait); 0 = off",
          "system", "system.straggler_cv"),
    Param("jitter_cv", "float", 0.0, "spread (std / mean) of one micro-batch's compute, independent "
          "between micro-batches (averages over accumulation); 0 = off", "system", "system.jitter_cv"),
    Param("nic_sharing", "bool", True, "share NICs fairly between concurrent flows; false gives "
          "every flow the full link (a lower bound)", "system", "system.nic_sharing"),
    Param("link_burst", "size", "0B", "token-bucket depth of each link in bytes: bytes that leave "
          "at once after idling (Linux tbf burst), e.g. 50KB; 0 = fixed-rate link", "system",
          "system.link_burst_bytes"),
    Param("p2p_protocol", "choice", "eager", "eager: a send starts at once (NCCL-like); "
          "rendezvous: once the receiver posted its receive (gloo over TCP)", "system",
          "system.p2p_protocol", choices="perfsim.link:P2P_PROTOCOLS"),
    Param("p2p_exchange", "choice", "async", "async: a pipeline send leaves without waiting, a receive "
          "waits before the compute that needs it (isend/irecv; perfsim run); blocking: Megatron-LM's "
          "exchanges, after each compute step one batch of its sends and the next step's receives, "
          "waited on to the end (combine with p2p_protocol=rendezvous for NCCL's large messages)",
          "system", "system.p2p_exchange", choices="perfsim.schedules:P2P_EXCHANGES"),
    Param("p2p_control_latency", "time", None, "one-way latency of the rendezvous ready notice "
          "(seconds, or 50us); default: the link latency", "system",
          "system.p2p_control_latency_s"),
    Param("tcp_window", "window", "auto", "window of each TCP connection of an ethernet or socket NIC: auto "
          "(the profile's host sysctls tcp_rmem/tcp_wmem/tcp_adv_win_scale, else Linux's defaults: 3 MiB), "
          "off, or bytes (e.g. 16MiB); a message's rate is at most connections x window / RTT, RTT = 2 x "
          "latency (perfsim.tcp)", "system", "system.tcp_window"),
    Param("tcp_connections", "int", None, "TCP connections carrying one message over a TCP NIC (default: "
          "the NIC kind's, 1: gloo's one pair per peer; NCCL's socket transport NCCL_SOCKET_NTHREADS x "
          "NCCL_NSOCKS_PERTHREAD, 1 x 1 unless set)", "system", "system.tcp_connections"),
    Param("tcp_slow_start_after_idle", "choice", "auto", "whether a TCP connection idle for longer than "
          "its RTO (RTT + 200 ms) restarts slow start from 10 segments (Linux net.ipv4.tcp_slow_start_after_idle, "
          "RFC 2861): auto (on where the profile recorded a host with the sysctl 1 and a congestion control "
          "other than bbr, else off), on (Linux's defaults), off (perfsim.tcp)", "system", "system.tcp_slow_start_after_idle",
          choices="perfsim.tcp:SLOW_START_MODES"),
    Param("dataset_samples", "int", None, "training samples per epoch; default: the model's own data set "
          "where perfsim run trains it (perfsim.models.datasets: the pydoc corpus's windows of seq_len bytes "
          "for a byte-level GPT preset such as gpt2-tiny, scikit-learn's 1797 digits for digits-mlp), else "
          "2359 (WikiText-2's training split in 1024-token samples)", "strategy", "strategy.dataset_samples"),
    Param("schedule", "choice", None, "pipeline schedule; default gpipe, 1f1b with a gpu preset",
          "strategy", choices="perfsim.schedules:SCHEDULES", search="perfsim.search_space:SCHEDULES",
          search_when="pp>1"),
    Param("virtual_stages", "int", None, "model chunks per device of interleaved-1f1b (default 2; the "
          "other schedules run their own: zb-v 2, the rest 1)", "strategy", "strategy.virtual_stages",
          search=(2, 4), search_when="interleaved"),
    Param("tp", "int", 1, "tensor-parallel degree (Megatron-LM)", "strategy", "strategy.tp", search="split"),
    Param("sequence_parallel", "bool", False, "Megatron sequence parallelism (reduce-scatter / "
          "all-gather instead of all-reduce; needs tp > 1)", "strategy", "strategy.sequence_parallel",
          search="perfsim.search_space:on_gpu", search_when="tp>1"),
    Param("placement", "placement", None, "rank order, innermost first: tp,pp,dp (replica-major, default) "
          "or Megatron's tp,dp,pp (default with a gpu preset)", "strategy"),
    Param("precision", "choice", "fp32", "training precision (mixed precision for bf16/fp16; fp8: "
          "Transformer Engine's recipe, fp8 block GEMMs and bf16 elsewhere, on H100/H200 only)",
          "strategy", "strategy.precision", choices="perfsim.hardware:PRECISIONS",
          search="perfsim.search_space:gpu_precision"),
    Param("recompute", "choice", "none", "activation recomputation", "strategy", "strategy.recompute",
          choices="perfsim.config:RECOMPUTE", search="perfsim.search_space:on_gpu"),
    Param("attention", "choice", "megatron", "attention kernels of the GPU compute model: megatron "
          "(scores, softmax, dropout and weighted sum as separate kernels; the s x s scores stored) or "
          "flash (FlashAttention-2, one fused kernel; nothing s x s stored)", "strategy", "strategy.attention",
          choices="perfsim.config:ATTENTION", search="perfsim.search_space:on_gpu"),
    Param("kernels", "choice", None, "how the GPU compute model runs a block's memory-bound operators: "
          "fused (Megatron-LM's fused kernels, one pass per norm), eager (plain PyTorch, e.g. a Hugging Face "
          "model under torch.autocast: one kernel per operator, fp32 norms and residual stream, autocast's casts) "
          "or eager-pure (plain PyTorch with the weights in the training precision, model.to(torch.bfloat16) or "
          "FSDP2's param_dtype: no casts, a half-precision residual stream); perfsim.models.eager; default "
          "fused with a gpu preset (Megatron-LM's), eager otherwise",
          "strategy", choices="perfsim.job:KERNELS"),
    Param("moe_capacity_factor", "float", None, "expert capacity factor of a mixture-of-experts model: "
          "each expert computes capacity x its balanced share of the routed tokens, padded, the rest "
          "dropped (GShard arXiv:2006.16668, Switch Transformer arXiv:2101.03961), e.g. 1.25; "
          "default: dropless experts (MegaBlocks, Megatron-Core's default)", "strategy",
          "strategy.moe_capacity_factor"),
    Param("ep", "int", 1, "expert-parallel degree of a mixture-of-experts model: its experts split over "
          "ep of the dp replicas (Megatron-Core: EP inside DP), tokens sent to them by all-to-all; "
          "must divide the experts and dp; with ep < dp the experts' gradients are all-reduced over "
          "their dp/ep replicas (Megatron-Core's expert data parallel group)", "strategy", "strategy.ep",
          search="perfsim.search_space:expert_parallel"),
    Param("moe_imbalance", "float", 1.0, "with ep > 1 and dropless experts: the busiest expert-parallel "
          "rank's routed tokens over the balanced share (an assumption; e.g. 1.2)", "strategy",
          "strategy.moe_imbalance"),
    Param("a2a_compress", "str", "none", "codec of the expert-parallel dispatch all-to-alls (the forward "
          "dispatch and, backward, the gradient into the expert outputs; the combine and its gradient stay "
          "at the training precision, as DeepSeek-V3 arXiv:2412.19437 Sec. 3.3): none, fp8 (1 byte a value "
          "+ an fp32 scale per 128, a GPU preset with fp8 (Hopper)) or directq:BITS (arXiv:2206.01299); "
          "unused with ep 1 (no all-to-all)", "strategy", "strategy.a2a_compress"),
    Param("zero", "int", 0, "ZeRO stage sharded over dp: 0 none, 1 optimizer state, 2 + gradients "
          "(reduce-scatter), 3 + parameters (gathered per layer in forward and backward; PyTorch "
          "FSDP2 fully_shard, DeepSpeed stage 3)", "strategy", "strategy.zero", minimum=0,
          choices="perfsim.job:ZERO_STAGES", search="perfsim.search_space:on_gpu", search_when="dp>1"),
    Param("reshard_after_forward", "bool", True, "ZeRO-3 / FSDP2: free each layer's gathered "
          "parameters after its forward and gather them again for the backward; false keeps them "
          "(no backward all-gather, the stage's full weights held)", "strategy",
          "strategy.reshard_after_forward"),
    Param("optimizer", "choice", "adamw", "optimizer: adamw (two fp32 moments; mixed precision adds an fp32 "
          "master copy: 12 bytes of state per parameter, 8 in fp32) or sgd (momentum 0.9: one buffer, 8 and 4 "
          "bytes); predict prices its state (sharded by zero) and its step's memory traffic, perfsim run "
          "trains it", "strategy", "strategy.optimizer", choices="perfsim.job:OPTIMIZERS"),
    Param("offload", "choice", "none", "CPU offload: none, or optimizer (ZeRO-Offload arXiv:2101.06840, with "
          "zero 2 or 3: each rank's gradient shard and optimizer state in host memory and its Adam step on "
          "the CPUs; the GPU keeps its 16-bit weights, the copies cross its PCIe link); needs gpu",
          "strategy", "strategy.offload", choices="perfsim.job:OFFLOAD"),
    Param("cross_entropy", "choice", "fused", "the loss's memory: fused (Megatron-LM's vocab-parallel "
          "cross entropy, fp32 softmax kept, gradient in place), pytorch (F.cross_entropy on the logits "
          "under autocast: + the logits and an fp32 gradient of them) or chunked (a fused linear "
          "cross entropy, Liger-Kernel: never the whole logits)", "strategy", "strategy.cross_entropy",
          choices="perfsim.config:CROSS_ENTROPY"),
    Param("grad_accumulation", "choice", "fused", "weight-gradient accumulation per micro-batch: fused (in the "
          "GEMM), main-grad (Megatron's main_grad.add_ hook) or autograd (param.grad +=): perfsim.models.ops",
          "strategy", "strategy.grad_accumulation", choices="perfsim.models.ops:GRAD_ACCUMULATION"),
    Param("pp", "int", 8, "pipeline-parallel degree (stages)", "strategy", "strategy.pp", search="split"),
    Param("dp", "int", 1, "data-parallel degree (pipeline replicas)", "strategy", "strategy.dp", search="split"),
    Param("partition", "partition", None, "layer counts per stage, e.g. 7,6,6,6,6,6,6,7, balanced "
          "(by compute) or uniform (Megatron: equal blocks, embedding first, head last); default "
          "balanced, uniform with a gpu preset", "strategy"),
    Param("bucket_size", "size", "25MiB", "gradient bucket size in bytes of fp32 gradients "
          "(e.g. 25MiB)", "strategy", "strategy.bucket_bytes"),
    Param("overlap", "bool", None, "start each bucket's gradient sync during the backward pass; "
          "default on, off with a gpu preset (Megatron-LM reduces gradients after the backward "
          "unless given --overlap-grad-reduce)", "strategy"),
    Param("grad_buffer", "choice", None, "where gradients live for the data-parallel sync: "
          "bucketed (PyTorch DDP: copied into and out of each bucket) or contiguous (Megatron-LM: "
          "one flat buffer reduced in place, no copies); default bucketed, contiguous with a gpu preset",
          "strategy", choices="perfsim.config:GRAD_BUFFERS"),
    Param("tied_embedding", "choice", None, "a tied LM head on another pipeline stage than the "
          "embedding: untied (the last stage trains its own head, perfsim run's default) or sync "
          "(Megatron-LM: all-reduce the copy's gradient with the first stage after the "
          "data-parallel sync); default untied, sync with a gpu preset",
          "strategy", choices="perfsim.job:TIED_EMBEDDINGS"),
    Param("tp_send", "choice", None, "how the TP ranks of a stage send a pipeline boundary: full (each "
          "sends the whole activation; perfsim run, Megatron-Core) or scatter-gather (each 1/tp, "
          "all-gathered on arrival; Megatron-LM 2021); default full, scatter-gather with a gpu preset; "
          "sequence parallelism sends 1/tp either way", "strategy", choices="perfsim.job:TP_SENDS"),
    Param("micro_batch", "int", 1, "samples per micro-batch", "strategy", "strategy.micro_batch",
          search="split"),
    Param("macro_batch", "int", None, "samples per macro-batch (one optimizer step of one replica); "
          "default 32, or global_batch / dp", "strategy"),
    Param("global_batch", "int", None, "samples per optimizer step over all replicas "
          "(= dp x micro_batch x accumulation steps; sets macro_batch)", "strategy"),
    Param("epochs", "int", 1, "epochs for the end-to-end time: ceil(dataset_samples / global_batch) optimizer "
          "steps each (the last batch completed from the epoch's first samples), the steps perfsim run "
          "--epochs trains (perfsim.job.training_steps)", "strategy", "strategy.epochs"),
    Param("latency", "time", "0s", "one-way inter-node latency (seconds, or 5ms)", "system",
          "system.latency_s"),
    Param("grad_compress", "spec", "none", "data-parallel gradient compression "
          "(`perfsim compressors`), e.g. none, qsgd-maxnorm:4", "strategy", "strategy.grad_compress",
          role="grad", search="perfsim.search_space:GRADIENT_COMPRESSION", search_when="dp>1"),
    Param("compress", "spec", "fp32", "pipeline compression (`perfsim compressors`), e.g. fp32, "
          "directq:fw4bw8, aqsgd:fw3bw6", "strategy", "strategy.compress", role="pipeline",
          search="perfsim.search_space:PIPELINE_COMPRESSION", search_when="pp>1"),
    Param("boundary_compress", "boundaries", None, "pipeline compression of single boundaries, "
          "BOUNDARY=SPEC,... (boundary k follows stage k; the others use compress), e.g. "
          "1=aqsgd:fw2bw4 for fewer bits on a slow hop (perfsim.boundaries)", "strategy",
          "strategy.boundary_compress"),
    Param("device_order", "order", None, "GPU that runs each logical GPU index along the placement "
          "order, a permutation such as 0,2,1,3: which node runs which stage on a topology "
          "(default: the identity)", "strategy", "strategy.device_order"),
    Param("allow_oom", "bool", False, "predict a configuration that does not fit in memory", "system"),
    Param("bandwidth", "bandwidth", "10Gbps", "inter-node link rate: each node's NIC has this rate, shared by its "
          "GPUs (bits/s, or with a unit: 10Gbps, 100Mbps, 12.5MB/s; b = bit, B = byte)", "system"),
)
BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
#: defaults by name (as a user would type them)
DEFAULTS: dict[str, Any] = {p.name: p.default for p in PARAMS}


def _param(name: str) -> Param:
    key = str(name).replace("-", "_")
    try:
        return BY_NAME[key]
    except KeyError:
        raise ConfigError(f"parameter {name!r}: unknown (known: {', '.join(NAMES)})") from None


def parse_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}={value!r}: expected true or false")


def _parse_int(value: Any, p: Param, who: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{who}={value!r}: must be an integer")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{who}={value!r}: must be an integer") from None
    if not number.is_integer():
        raise ConfigError(f"{who}={value!r}: must be an integer")
    if number < p.minimum:
        raise ConfigError(f"{who}={value!r}: must be an integer >= {p.minimum}")
    return int(number)


def _parse_partition(value: Any, p: Param) -> tuple[int, ...] | str | None:
    from perfsim.partition import parse_counts  # lazy: import perfsim does not load perfsim.partition

    if isinstance(value, str) and value.strip().lower() == "uniform":
        return "uniform"
    counts = parse_counts(value)
    if counts is not None and not counts:
        raise ConfigError(f"partition={value!r}: empty")
    return counts


def parse_device_order(value: Any, who: str) -> tuple[int, ...] | None:
    try:
        items = str(value).split(",") if isinstance(value, str) else list(value)
        order = tuple(int(str(x).strip()) for x in items if str(x).strip())
    except (TypeError, ValueError):
        raise ConfigError(f"{who}={value!r}: expected comma-separated GPU indices") from None
    if sorted(order) != list(range(len(order))):
        raise ConfigError(f"{who}={value!r}: must be a permutation of 0..{len(order) - 1}")
    return order or None


def normalize(name: str, value: Any, cli: bool = False) -> Any:
    """One value of parameter ``name`` in canonical form: SI floats for rates
    and times, int bytes for sizes, ints, bools, stripped strings (lower-case
    for choices), a tuple for a partition; None stays None (the default).
    ``"1Gbps"`` and ``1e9`` normalise to the same value. Raises ConfigError
    naming the parameter (its flag with ``cli``)."""
    p = _param(name)
    if value is None:
        return None
    kind, who = p.kind, p.flag if cli else p.name
    if kind == "bandwidth":
        return parse_bandwidth(value, who)
    if kind == "time":
        return parse_time(value, who, hint_unit=p.hint_unit)
    if kind == "size":
        return parse_size(value, who)
    if kind == "window":  # auto, off or bytes (perfsim.tcp)
        return parse_tcp_window(value, who)
    if kind == "int":
        return _parse_int(value, p, who)
    if kind == "float":  # a finite number >= 0
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{who}={value!r}: must be a number") from None
        if isinstance(value, bool) or not math.isfinite(number) or number < 0:
            raise ConfigError(f"{who}={value!r}: must be a finite number >= 0")
        return number
    if kind == "bool":
        return parse_bool(value, who)
    if kind == "partition":
        return _parse_partition(value, p)
    if kind == "boundaries":  # a BoundarySpecs value; prints (and is stored) as canonical text
        return parse_boundary_compress(value)
    if kind == "order":
        return parse_device_order(value, who)
    if kind == "placement":  # one rank order, its comma list one value: canonical text ``tp,dp,pp``
        dims = [str(x).strip().lower() for x in (value.split(",") if isinstance(value, str) else value)] \
            if isinstance(value, (str, list, tuple)) else None
        if dims is None or sorted(dims) != sorted(PLACEMENT_DIMS):
            raise ConfigError(f"{who}={value!r}: an order of tp, dp, pp (innermost first)")
        return ",".join(dims)
    if kind == "spec" and not isinstance(value, str):  # parsed already: kept, never parsed again
        return parse_spec(value, p.role) if hasattr(value, "role") else _bad_string(value, who)
    if hasattr(value, "__fspath__"):
        value = str(value)
    if kind == "profile" and not isinstance(value, str):
        from perfsim.profile import Profile  # lazy: import perfsim does not load perfsim.profile

        if not isinstance(value, Profile):
            raise ConfigError(f"{who}={value!r}: a profile file, a profile name or a loaded Profile")
    if kind in ("profile", "nic") and not isinstance(value, str):
        return value  # a loaded perfsim.profile.Profile, a perfsim.fabrics.Nic
    if not isinstance(value, str) or not value.strip():
        _bad_string(value, who)
    text = value.strip()
    if kind == "spec":  # parsed once into THE value (perfsim.compression.spec.Spec); prints as canonical text
        return parse_spec(text, p.role)
    if kind == "choice":
        text = text.lower()
        if text not in p.allowed:
            raise ConfigError(f"{who}={value!r}: choose from {', '.join(p.allowed)}")
    return text


def _bad_string(value: Any, who: str):
    raise ConfigError(f"{who}={value!r}: must be a non-empty string")


def plain(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with each spec value (a :class:`~perfsim.compression.spec.Spec`, a
    :class:`~perfsim.boundaries.BoundarySpecs`) as its canonical text: what tables and
    files store."""
    return {k: v.text if hasattr(v, "text") and not isinstance(v, str) else v for k, v in params.items()}


#: a table column's unit suffix by parameter kind (CSV columns carry units in their names)
_UNIT_SUFFIX = {"bandwidth": "_bps", "time": "_s", "size": "_bytes"}


def column(name: str) -> str:
    """The table column of parameter ``name``: its name with its unit (``bandwidth_bps``,
    ``latency_s``, ``bucket_size_bytes``, ``seq_len``), as the predict summary names it."""
    p = _param(name)
    return p.name + _UNIT_SUFFIX.get(p.kind, "")


def shown_columns(values: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``values`` (one configuration) that the summary ``row`` of its result
    does not show, each as ``{column: value}`` (:func:`column`; specs as their text, a sequence
    as its comma list): without them the rows of a grid that differ only in ``seq_len`` or
    ``bucket_size`` cannot be told apart."""
    out = {}
    for name, value in plain(values).items():
        if name not in BY_NAME or value is None or name in row or column(name) in row:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        elif not isinstance(value, (str, int, float, bool)):  # a loaded Profile: its file, else its kind
            value = str(getattr(value, "path", None) or f"<{type(value).__name__}>")
        out[column(name)] = value
    return out


def split_models(raw: str, what: str = "model") -> list[str]:
    """Comma list of models where an inline spec's own ``key=value`` items stay with it:
    ``gpt2-xl,gpt:layers=2,hidden=64`` -> two models (an empty element is refused,
    :func:`perfsim.units.split_list`)."""
    out: list[str] = []
    for item in split_list(raw, what):
        if out and "=" in item and ":" not in item:
            out[-1] += "," + item
        else:
            out.append(item)
    return out


def values_of(name: str, raw: Any, cli: bool = False) -> list:
    """A scalar, a comma-list string or a list -> de-duplicated normalised values
    (a partition string is one value; alternatives go in a list)."""
    p = _param(name)
    if p.kind in ONE_VALUE:  # one value, or a list of alternatives
        alternatives = isinstance(raw, list) and raw and not isinstance(raw[0], int)
        items = list(raw) if alternatives else [raw]
    else:
        items = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    flat: list = []
    who = p.flag if cli else p.name
    for i, item in enumerate(items):
        splittable = isinstance(item, str) and p.kind not in ONE_VALUE
        if splittable and not item.strip() and len(items) > 1:  # ["10Gbps", ""]: never dropped
            raise ConfigError(f"{who} {raw!r}: element {i + 1} of {len(items)} is empty")
        flat.extend((split_models(item, who) if p.kind == "model" else split_list(item, who))
                    if splittable else [item])
    if not flat:
        raise ConfigError(f"{p.flag if cli else p.name}: empty list of values")
    out: list = []
    for item in flat:
        v = normalize(p.name, item, cli)
        if v not in out:
            out.append(v)
    return out


def grid(values: Mapping[str, Any], cli: bool = False) -> dict[str, list]:
    """``{name: value | list | comma list}`` -> ``{name: [normalised values]}`` in
    :data:`PARAMS` order, leaving out names whose value is None (``cli``: errors
    name the flag)."""
    given = {}
    for key, raw in values.items():
        if raw is not None:
            given[_param(key).name] = values_of(key, raw, cli)
    return {p.name: given[p.name] for p in PARAMS if p.name in given}


def expand(values: Mapping[str, list]) -> list[dict[str, Any]]:
    """The cartesian product of a :func:`grid` (the last parameter varies fastest)."""
    keys = list(values)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(values[k] for k in keys))]


def resolved(params: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter, normalised: ``params`` over :data:`DEFAULTS` (None = default)."""
    unknown = [k for k in params if str(k).replace("-", "_") not in BY_NAME]
    if unknown:
        raise ConfigError(f"unknown parameter(s) {sorted(unknown)} (known: {', '.join(NAMES)})")
    given = {str(k).replace("-", "_"): v for k, v in params.items() if v is not None}
    return {p.name: normalize(p.name, given.get(p.name, p.default)) for p in PARAMS}


# ---------------------------------------------------------------- command line

def _flag_help(p: Param, lists: bool, default: Any = None) -> str:
    text = p.help
    if p.choices:
        text += f" ({', '.join(map(str, p.allowed))})"
    default = p.default if default is None else default
    if default is not None:
        text += f" (default {str(default).lower() if p.kind == 'bool' else default})"
    if lists and p.kind not in ONE_VALUE:
        text += "; a comma list runs every value"
    return text


def add_arguments(parser: argparse.ArgumentParser, lists: bool | tuple[str, ...] = True,
                  skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None,
                  shown: Mapping[str, Any] | None = None, helps: Mapping[str, str] | None = None) -> None:
    """One flag per parameter (but those in ``skip``; only those in ``only`` when given),
    grouped as workload / strategy / system. Flags default to None (= the parameter's
    default); with ``lists`` (True, or the names that do) a flag takes a comma list.
    Booleans are ``--x/--no-x``. ``shown``: the default a command states in the help
    where it is not the parameter's (``perfsim run``'s model); ``helps``: a command's own
    help text of a parameter."""
    groups = {g: parser.add_argument_group(g) for g in ("workload", "strategy", "system")}
    shown, helps = shown or {}, helps or {}
    for p in PARAMS:
        if p.name in skip or (only is not None and p.name not in only):
            continue
        many = lists if isinstance(lists, bool) else p.name in lists
        g = groups[p.group]
        help_p = Param(p.name, p.kind, p.default, helps[p.name], p.group, choices=p.choices) \
            if p.name in helps else p
        if p.kind == "bool":
            g.add_argument(p.flag, dest=p.name, action=argparse.BooleanOptionalAction, default=None,
                           help=_flag_help(help_p, False, shown.get(p.name)))
        else:
            metavar = "LIST" if many and p.kind not in ONE_VALUE else p.kind.upper()
            g.add_argument(p.flag, dest=p.name, default=None, metavar=metavar,
                           help=_flag_help(help_p, many, shown.get(p.name)))


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The parameters given on the command line (None for those not given)."""
    return {p.name: getattr(args, p.name, None) for p in PARAMS}


#: the parameters that describe the job ``perfsim run`` trains: the model and the fields of
#: :class:`perfsim.job.Job` (run's flags and :func:`perfsim.run`'s keywords are these)
RUN_JOB_PARAMS: tuple[str, ...] = ("model", *JOB_FIELDS)
#: the job parameters that ``perfsim run`` keeps as given (the model preset is looked up by
#: RunConfig; the compressor specs are checked by the compressors themselves)
_KEPT = ("model", "compress", "grad_compress", "boundary_compress")


def run_job(values: Mapping[str, Any], cli: bool = False) -> dict[str, Any]:
    """The job parameters of ``values`` (None: not given) normalised as predict normalises
    them (:func:`normalize`; ``cli``: errors name the flag): what ``perfsim run`` and
    :func:`perfsim.run` hand to RunConfig."""
    job = {name: values[name] if name in _KEPT else normalize(name, values[name], cli)
           for name in RUN_JOB_PARAMS if values.get(name) is not None}
    if "virtual_stages" in job:  # as predict takes it: the interleaved schedule's chunk count
        job["virtual_stages"] = chosen_chunks(job.get("schedule", Job.schedule), job["virtual_stages"])
    return job


# ---------------------------------------------------------------- Python API

def signature(extra: tuple[inspect.Parameter, ...] = (), ret: str = "Result") -> inspect.Signature:
    """Keyword-only signature of the parameters (annotations as strings)."""
    ps = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default,
                            annotation=p.annotation) for p in PARAMS]
    return inspect.Signature([*ps, *extra], return_annotation=ret)


def _choices_ref(p: Param) -> str:
    """The choices as text without importing where they are defined (doc_table
    runs at ``import perfsim``)."""
    if isinstance(p.choices, str):
        module, name = p.choices.split(":")
        return f"one of {module}.{name}"
    return ", ".join(p.choices)


def doc_table() -> str:
    """The parameters as a docstring section (name, type, default, help)."""
    lines = []
    for p in PARAMS:
        default = "" if p.default is None else f", default {p.default!r}"
        lines.append(f"    {p.name} ({p.annotation}{default}):\n        {p.help}"
                     + (f" ({_choices_ref(p)})" if p.choices else ""))
    return "\n".join(lines)
