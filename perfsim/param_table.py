"""The table of predict's parameters: what one parameter is (:class:`Param`) and all of them
(:data:`PARAMS`), in the order a grid varies them.

This is the one place a predict parameter is described: its name (the keyword and sweep
key; the flag is the name with dashes), its kind (how a value is parsed,
:mod:`perfsim.param_values`), its default, help line and unit, its flag group and where
the parsed value goes (a :class:`~perfsim.config.Strategy` or :class:`~perfsim.config.System`
field), and how ``perfsim plan`` searches it. :mod:`perfsim.params` generates the flags,
keywords and docstrings from it; adding a predict parameter means adding one :class:`Param`
to :data:`PARAMS` (and the field it fills).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

from perfsim.errors import ConfigError

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
    #: lower bound of a number (``int``, ``float``, ``size``, ``time``, ``bandwidth``): its
    #: smallest value, or with ``above`` the value it must exceed; None: an int's 1, else 0
    minimum: float | None = None
    #: a number must exceed ``minimum`` (``> 0``), not only reach it
    above: bool = False
    #: a number's upper bound, which it must stay below (None: none)
    below: float | None = None
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
    #: help line of the flag where ``perfsim run`` (and ``perfsim validate``'s measured runs) train
    #: the job on this machine's devices and :attr:`help` (predict's) does not hold there (a GPU
    #: preset's defaults, what execute mode refuses); "": the same text
    run_help: str = ""
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
    def lower(self) -> float:
        """A number's lower bound (:attr:`minimum`, else the kind's: an int's 1, else 0)."""
        return self.minimum if self.minimum is not None else (1 if self.kind == "int" else 0)

    @property
    def bound(self) -> str:
        """The bound a number keeps as every refusal of it states it (``>= 1``, ``> 0``, ``>= 0
        and < 1``): one fact, checked by :func:`check_bound` where the value is parsed
        (:func:`perfsim.param_values.normalize`) and where its config field is validated."""
        text = f"{'>' if self.above else '>='} {self.lower:g}"
        return text + (f" and < {self.below:g}" if self.below is not None else "")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def annotation(self) -> str:
        t = KINDS[self.kind]
        return f"{t} | None" if self.default is None else t


#: the kinds whose values are numbers with a :attr:`Param.bound`
NUMBER_KINDS = ("int", "float", "size", "time", "bandwidth")


def check_bound(p: Param, value: Any, who: str | None = None, given: Any = None) -> None:
    """ConfigError naming ``who`` (default: the parameter's name) and the value as ``given``
    (default ``value``) unless ``value`` is a finite number that keeps ``p``'s
    :attr:`~Param.bound`, which the message states."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and (value > p.lower if p.above else value >= p.lower) and (p.below is None or value < p.below)
    if not ok:
        what = {"int": "an integer ", "float": "a finite number "}.get(p.kind, "")
        raise ConfigError(f"{who or p.name}={value if given is None else given!r}: must be {what}{p.bound}")


#: every predict parameter, in the order a grid varies them (the last fastest)
PARAMS: tuple[Param, ...] = (
    # what is trained (the workload)
    Param("model", "model", "gpt2-xl", "model: a preset (gpt2-xl, bert-large, llama2-70b, gpt3-175b ...), "
          "an inline transformer gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200"
          "[,ffn=..,kv_heads=..] (also llama:/bert:/neox:), or a Hugging Face config.json", "workload",
          run_help=("model preset that execute mode trains: digits-mlp, gpt2-tiny, gpt2-small-byte, gpt2 ... "
                    "(perfsim.models.registry)")),
    Param("seq_len", "int", None, "sequence length of a transformer model (default: the preset's)",
          "workload"),
    Param("mtp_layers", "int", None, "multi-token prediction modules trained with a transformer (DeepSeek-V3 "
          "trains 1; Megatron-Core --mtp-num-layers): each a projection, one more block and one more LM-head "
          "pass on the last pipeline stage (default: the model's own, a config.json's "
          "num_nextn_predict_layers, else 0)", "workload", minimum=0),
    Param("workload", "path", None, "workload file (TOML/JSON, docs/formats.md) instead of a "
          "preset, or a packaged example name (example-workload)", "workload"),
    Param("profile", "profile", None, "calibration profile: a file, or a name: default-v100 (shipped), "
          "traces/NAME.json of a source checkout; default: the AQ-SGD paper's V100 profile", "workload"),
    # the cluster: its nodes, GPUs and links, and how the network and compute models treat them
    Param("topology", "path", None, "heterogeneous topology file (JSON/TOML/CSV, docs/formats.md) "
          "or a packaged example name (example-geo); replaces bandwidth and latency (a node's NIC "
          "defaults to its fastest link)", "system"),
    Param("gpus_per_node", "int", 1, "devices per node", "system", "system.gpus_per_node"),
    Param("gpu", "str", None, "GPU preset (a100-sxm4-80gb, h100-sxm5-80gb, ...; perfsim.hardware): "
          "compute from its operator model, memory checked against its capacity; switches the "
          "defaults to Megatron-LM's (1f1b, uniform partition, placement tp,dp,pp)", "system"),
    Param("intra_node_bandwidth", "bandwidth", "300GB/s", "intra-node link rate (bits/s, or "
          "units such as 300GB/s; default with a GPU preset: the fabric its node ships with, "
          "perfsim.hardware.NODE_FABRIC)", "system", above=True),
    Param("intra_node_fabric", "choice", None, "intra-node fabric preset with its achieved bus "
          "bandwidth (perfsim.fabrics; replaces intra_node_bandwidth)", "system",
          choices="perfsim.fabrics:FABRICS", search="perfsim.search_space:node_fabric"),
    Param("nic", "nic", None, "NICs of a node, [COUNTx]RATE[:KIND], e.g. 4x200Gbps:infiniband; their "
          "total replaces bandwidth, KIND (ethernet, socket, infiniband, ideal; default ethernet) gives the "
          "transport efficiency of an uncalibrated link", "system"),
    Param("collective_algo", "choice", "auto", "allreduce algorithm: auto (least modelled time, as "
          "NCCL's tuner), ring, tree (double binary tree) or hierarchical", "system",
          "system.collective_algo", choices="perfsim.collectives:ALGORITHMS"),
    Param("collective_model", "choice", "auto", "nominal: a collective's steps cost the link latency, "
          "every size moves at the full rate; nccl: NCCL's protocols (LL, LL128, Simple) with their "
          "latencies and bandwidth shares, the cheapest per size (the nccl-tests busbw curve); pipelined: "
          "those protocols with each step's latency overlapped by the data before it; auto: pipelined "
          "for a GPU preset's NCCL collectives, else nominal", "system",
          "system.collective_model", choices="perfsim.collectives:COLLECTIVE_MODELS"),
    Param("link_model", "choice", "auto", "auto: the profile's measured link at this rate if any, else "
          "nominal x NIC efficiency; calibrated: require the measurement; nominal: ignore it",
          "system", "system.link_model", choices="perfsim.link:LINK_MODELS"),
    Param("host_overhead", "time", None, "host time per GPU operator (framework, autograd, launch), "
          "replacing the GPU curve's (Megatron-LM's on the A100 runs' hosts); e.g. 25us for eager "
          "PyTorch on an H200 host (docs/gpu.md); needs gpu", "system", "system.host_overhead_s", hint_unit="us"),
    Param("cpu_adam_rate", "float", None, "with offload optimizer: parameters per second a node's CPUs "
          "update with Adam, shared by its GPUs (default 4e9: ZeRO-Offload's CPU-Adam, 3.9e9-4.5e9 on a "
          "DGX-2 host)", "system", "system.cpu_adam_params_per_s", above=True),
    Param("comm_slowdown", "float", None, "compute slowdown while communication overlaps it, e.g. 0.1 "
          "(default: the profile's measured interference, else 0)", "system", "system.comm_slowdown"),
    Param("nic_affinity", "choice", "gpu", "gpu: one GPU's flows (a pipeline message, a ring with one "
          "rank per node) use its nearest NICs, 1/min(NICs, GPUs per node) of the node's; node: all of "
          "them", "system", "system.nic_affinity", choices="perfsim.fabrics:NIC_AFFINITIES"),
    Param("straggler_cv", "float", 0.0, "spread (std / mean) of the GPUs' speeds, e.g. 0.01; every "
          "iteration waits for the slowest of the job's GPUs (perfsim.engine.sync_wait); 0 = off",
          "system", "system.straggler_cv", below=1),
    Param("jitter_cv", "float", 0.0, "spread (std / mean) of one micro-batch's compute, independent "
          "between micro-batches (averages over accumulation); 0 = off", "system", "system.jitter_cv", below=1),
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
          "waited on to the end; deepspeed: DeepSpeed's pipeline engine (1f1b only), each message its own "
          "blocking call, sent one step after the compute that made it (combine either with "
          "p2p_protocol=rendezvous for NCCL's large messages)",
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
    # the job: data, schedule, parallelism, precision, memory, optimizer, batch
    Param("dataset_samples", "int", None, "training samples per epoch; default: the model's own data set "
          "where perfsim run trains it (perfsim.models.datasets: the pydoc corpus's windows of seq_len bytes "
          "for a byte-level GPT preset such as gpt2-tiny, scikit-learn's 1797 digits for digits-mlp), else "
          "WikiText-2's training split in samples of the model's sequence length (2359 of 1024 tokens, "
          "590 of 4096), 2359 for a model without tokens", "strategy", "strategy.dataset_samples"),
    Param("schedule", "choice", None, "pipeline schedule; default gpipe, 1f1b with a gpu preset",
          "strategy", choices="perfsim.schedules:SCHEDULES", search="perfsim.search_space:SCHEDULES",
          search_when="pp>1",
          run_help="pipeline schedule"),
    Param("virtual_stages", "int", None, "model chunks per device of interleaved-1f1b (default 2; the "
          "other schedules run their own: zb-v 2, the rest 1)", "strategy", "strategy.virtual_stages",
          search=(2, 4), search_when="interleaved"),
    Param("tp", "int", 1, "tensor-parallel degree (Megatron-LM)", "strategy", "strategy.tp", search="split"),
    Param("sequence_parallel", "bool", False, "Megatron sequence parallelism (reduce-scatter / "
          "all-gather instead of all-reduce; needs tp > 1)", "strategy", "strategy.sequence_parallel",
          search="perfsim.search_space:on_gpu", search_when="tp>1"),
    Param("placement", "placement", None, "rank order, innermost first: tp,pp,dp (replica-major, default) "
          "or Megatron's tp,dp,pp (default with a gpu preset)", "strategy",
          run_help=("rank order, innermost first: tp,pp,dp (replica-major, default) or Megatron's tp,dp,pp; "
                    "a rank's place in it picks its stage, replica and tensor shard")),
    Param("precision", "choice", "fp32", "training precision (mixed precision for bf16/fp16; fp8: "
          "Transformer Engine's recipe, fp8 block GEMMs and bf16 elsewhere, on H100/H200 only)",
          "strategy", "strategy.precision", choices="perfsim.hardware:PRECISIONS",
          search="perfsim.search_space:gpu_precision"),
    Param("recompute", "choice", None, "activation recomputation (default: as the profile's measured "
          "backward ran, for a model it times on its own device -- the embedded default's is full, "
          "as the AQ-SGD paper's code checkpoints every block -- else none)", "strategy", "strategy.recompute",
          choices="perfsim.config:RECOMPUTE", search="perfsim.search_space:on_gpu"),
    Param("attention", "choice", None, "attention kernels of the GPU compute model: megatron "
          "(scores, softmax, dropout and weighted sum as separate kernels; the s x s scores stored) or "
          "flash (FlashAttention-2, one fused kernel; nothing s x s stored); default: flash on a GPU it "
          "runs on (Ampere, Ada, Hopper, MI300X) in 16-bit or fp8 precision, else megatron",
          "strategy", "strategy.attention",
          choices="perfsim.config:ATTENTION", search="perfsim.search_space:on_gpu"),
    Param("kernels", "choice", None, "how the GPU compute model runs a block's memory-bound operators: "
          "fused (Megatron-LM's fused kernels, one pass per norm), eager (plain PyTorch, e.g. a Hugging Face "
          "model under torch.autocast: one kernel per operator, fp32 norms and residual stream, autocast's casts) "
          "or eager-pure (plain PyTorch with the weights in the training precision, model.to(torch.bfloat16) or "
          "FSDP2's param_dtype: no casts, a half-precision residual stream); perfsim.models.eager; default "
          "fused with a gpu preset (Megatron-LM's), eager otherwise",
          "strategy", choices="perfsim.job:KERNELS",
          run_help=("eager only: perfsim run trains plain PyTorch modules; fused and eager-pure "
                    "are priced by perfsim predict only")),
    Param("moe_capacity_factor", "float", None, "expert capacity factor of a mixture-of-experts model: "
          "each expert computes capacity x its balanced share of the routed tokens, padded, the rest "
          "dropped (GShard arXiv:2006.16668, Switch Transformer arXiv:2101.03961), e.g. 1.25; "
          "default: dropless experts (MegaBlocks, Megatron-Core's default)", "strategy",
          "strategy.moe_capacity_factor", above=True),
    Param("ep", "int", 1, "expert-parallel degree of a mixture-of-experts model: its experts split over "
          "ep of the dp replicas (Megatron-Core: EP inside DP), tokens sent to them by all-to-all; "
          "must divide the experts and dp; with ep < dp the experts' gradients are all-reduced over "
          "their dp/ep replicas (Megatron-Core's expert data parallel group), and with zero 1 their "
          "optimizer state shards over them", "strategy", "strategy.ep",
          search="perfsim.search_space:expert_parallel"),
    Param("cp", "int", 1, "context-parallel degree (Megatron-Core's --context-parallel-size): each sequence split "
          "over cp ranks in 2 x cp load-balanced chunks, every token-wise operator on a rank's seq_len / cp tokens, "
          "its attention over the whole sequence through a ring of key/value exchanges beside the attention, "
          "gradients reduced over dp x cp ranks; GPUs = tp x cp x pp x dp; needs --gpu and flash attention",
          "strategy", "strategy.cp", search="split"),
    Param("cp_comm", "choice", "p2p", "with cp > 1, how the context-parallel group exchanges keys and values "
          "(Megatron-Core's --cp-comm-type): p2p (a ring beside the attention's steps, hidden but for what they "
          "outlast), allgather (gathered before the attention, exposed: Llama 3's) or a2a (DeepSpeed-Ulysses: "
          "sequence shards traded for head shards and back, exposed; the heads must split cp ways)",
          "strategy", "strategy.cp_comm", choices="perfsim.config:CP_COMMS"),
    Param("moe_imbalance", "float", 1.0, "with ep > 1 and dropless experts: the busiest expert-parallel "
          "rank's routed tokens over the balanced share (an assumption; e.g. 1.2)", "strategy",
          "strategy.moe_imbalance", minimum=1),
    Param("a2a_compress", "str", "none", "codec of the expert-parallel dispatch all-to-alls (the forward "
          "dispatch and, backward, the gradient into the expert outputs; the combine and its gradient stay "
          "at the training precision, as DeepSeek-V3 arXiv:2412.19437 Sec. 3.3): none, fp8 (1 byte a value "
          "+ an fp32 scale per 128, a GPU preset with fp8 (Hopper)) or directq:BITS (arXiv:2206.01299); "
          "unused with ep 1 (no all-to-all)", "strategy", "strategy.a2a_compress"),
    Param("ep_overlap", "bool", False, "with ep > 1: Megatron-Core's --overlap-moe-expert-parallel-comm "
          "(combined 1F1B): a forward and another micro-batch's backward run layer by layer as one unit, each "
          "one's token all-to-alls beside the other's compute, which loses 20 of 132 SMs to them while they "
          "run (DeepSeek-V3 arXiv:2412.19437 Sec. 3.2.2); with pp > 1 the interleaved schedule; default off: "
          "the all-to-alls serial with compute", "strategy", "strategy.ep_overlap"),
    Param("zero", "int", 0, "ZeRO stage sharded over dp: 0 none, 1 optimizer state, 2 + gradients "
          "(reduce-scatter), 3 + parameters (gathered per layer in forward and backward; PyTorch "
          "FSDP2 fully_shard, DeepSpeed stage 3)", "strategy", "strategy.zero", minimum=0,
          choices="perfsim.job:ZERO_STAGES", search="perfsim.search_space:on_gpu", search_when="dp>1",
          run_help=("ZeRO stage: 0 none (DDP-style) or 3 (PyTorch FSDP2 fully_shard, with pp 1, tp 1, no "
                    "gradient compression, an untied head, no checkpoints); 1 and 2 are priced by perfsim "
                    "predict only")),
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
          "strategy", "strategy.offload", choices="perfsim.job:OFFLOAD",
          search="perfsim.search_space:cpu_offload",
          run_help=("none only: perfsim run does not offload (ZeRO-Offload's optimizer on the CPUs is priced "
                    "by perfsim predict only)")),
    Param("cross_entropy", "choice", "fused", "the loss's memory: fused (Megatron-LM's vocab-parallel "
          "cross entropy, fp32 softmax kept, gradient in place), pytorch (F.cross_entropy on the logits "
          "under autocast: + the logits and an fp32 gradient of them) or chunked (a fused linear "
          "cross entropy, Liger-Kernel: never the whole logits)", "strategy", "strategy.cross_entropy",
          choices="perfsim.config:CROSS_ENTROPY"),
    Param("fp8_casts", "choice", "te", "under --precision fp8: te prices Transformer Engine's quantisation "
          "kernels around the fp8 GEMMs (inputs cast, output gradients cast and transposed, fp8 inputs "
          "transposed for the weight gradients: perfsim.models.ops.fp8_cast_ops); none leaves them out",
          "strategy", "strategy.fp8_casts", choices="perfsim.models.ops:FP8_CASTS"),
    Param("grad_accumulation", "choice", "fused", "weight-gradient accumulation per micro-batch: fused (in the "
          "GEMM), main-grad (Megatron's main_grad.add_ hook) or autograd (param.grad +=): perfsim.models.ops",
          "strategy", "strategy.grad_accumulation", choices="perfsim.models.ops:GRAD_ACCUMULATION"),
    Param("optimizer_step", "choice", "fused", "how a GPU preset prices the optimizer step's memory "
          "traffic: fused (one mixed-precision pass: Adam 36 bytes per parameter) or megatron (Megatron-LM's "
          "separate passes: gradient copy, unscale, norm, weight copy back; Adam 52 in fp16, 38 in bf16): "
          "perfsim.job.Optimizer.step_bytes", "strategy", "strategy.optimizer_step",
          choices="perfsim.job:OPTIMIZER_STEPS"),
    Param("pp", "int", 8, "pipeline-parallel degree (stages)", "strategy", "strategy.pp", search="split"),
    Param("dp", "int", 1, "data-parallel degree (pipeline replicas)", "strategy", "strategy.dp", search="split"),
    Param("partition", "partition", None, "layer counts per stage, e.g. 7,6,6,6,6,6,6,7, balanced "
          "(by compute) or uniform (Megatron: equal blocks, embedding first, head last); default "
          "balanced, uniform with a gpu preset", "strategy",
          run_help=("layer counts per stage, e.g. 2,2,2,2, or uniform (Megatron: equal blocks, embedding "
                    "first, head last); default balanced by parameters")),
    Param("bucket_size", "size", "25MiB", "gradient bucket size in bytes of fp32 gradients "
          "(e.g. 25MiB)", "strategy", "strategy.bucket_bytes", minimum=1),
    Param("overlap", "bool", None, "start each bucket's gradient sync during the backward pass; "
          "default on, off with a gpu preset (Megatron-LM reduces gradients after the backward "
          "unless given --overlap-grad-reduce; ZeRO-2/3 sync each unit's gradient as the backward "
          "produces it, whatever this says)", "strategy",
          search="perfsim.search_space:on_gpu", search_when="dp>1,zero<2"),
    Param("grad_buffer", "choice", None, "where gradients live for the data-parallel sync: "
          "bucketed (PyTorch DDP: copied into and out of each bucket) or contiguous (Megatron-LM: "
          "one flat buffer reduced in place, no copies); default bucketed, contiguous with a gpu preset",
          "strategy", choices="perfsim.config:GRAD_BUFFERS"),
    Param("tied_embedding", "choice", None, "a tied LM head on another pipeline stage than the "
          "embedding: untied (the last stage trains its own head, perfsim run's default) or sync "
          "(Megatron-LM: all-reduce the copy's gradient with the first stage after the "
          "data-parallel sync); default untied, sync with a gpu preset",
          "strategy", choices="perfsim.job:TIED_EMBEDDINGS",
          run_help=("a tied LM head on another pipeline stage than the embedding: untied (the last "
                    "stage trains its own head) or sync (Megatron-LM: all-reduce the copy's "
                    "gradient with the first stage after the data-parallel sync; GPT models, tp 1)")),
    Param("tp_send", "choice", None, "how the TP ranks of a stage send a pipeline boundary: full (each "
          "sends the whole activation; perfsim run, Megatron-Core) or scatter-gather (each 1/tp, "
          "all-gathered on arrival; Megatron-LM 2021); default full, scatter-gather with a gpu preset; "
          "sequence parallelism sends 1/tp either way", "strategy", choices="perfsim.job:TP_SENDS",
          run_help=("how the TP ranks of a stage send a pipeline boundary: full only (each sends the whole "
                    "activation; sequence parallelism sends 1/tp); scatter-gather is priced "
                    "by perfsim predict only")),
    Param("micro_batch", "int", 1, "samples per micro-batch", "strategy", "strategy.micro_batch",
          search="split"),
    Param("macro_batch", "int", None, "samples per macro-batch (one optimizer step of one replica); "
          "default 32, or global_batch / dp", "strategy",
          run_help="samples per macro-batch (one optimizer step of one replica)"),
    Param("global_batch", "int", None, "samples per optimizer step over all replicas "
          "(= dp x micro_batch x accumulation steps; sets macro_batch)", "strategy"),
    Param("epochs", "int", 1, "epochs for the end-to-end time: ceil(dataset_samples / global_batch) optimizer "
          "steps each (the last batch completed from the epoch's first samples), the steps perfsim run "
          "--epochs trains (perfsim.job.training_steps)", "strategy", "strategy.epochs"),
    # last, the dimensions a grid varies fastest: latency, compression, device order, allow_oom, bandwidth
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
          "(default: the identity)", "strategy", "strategy.device_order",
          run_help=("rank that runs each position of the placement order, a permutation such as "
                    "0,2,1,3 (tp 1 only; default: the identity)")),
    Param("host_memory", "size", None, "host memory (RAM) of one node, e.g. 2TB (DGX H100) or 1TB (DGX A100 40GB): "
          "an offloaded optimizer's state (--offload optimizer) of the node's GPUs must fit in it; "
          "unset: not checked", "system", "system.host_memory_bytes", minimum=1),
    Param("allow_oom", "bool", False, "predict a configuration that does not fit in memory", "system"),
    Param("bandwidth", "bandwidth", "10Gbps", "inter-node link rate: each node's NIC has this rate, shared by its "
          "GPUs (bits/s, or with a unit: 10Gbps, 100Mbps, 12.5MB/s; b = bit, B = byte)", "system", above=True),
)
BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
#: defaults by name (as a user would type them)
DEFAULTS: dict[str, Any] = {p.name: p.default for p in PARAMS}
