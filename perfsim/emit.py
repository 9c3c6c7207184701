"""The plan's winner as a command to launch: ``perfsim run`` (perfsim's own execute
mode), Megatron-LM's ``pretrain_gpt.py`` flags, or a ``torchrun`` command line around
them (``perfsim plan --emit megatron|torchrun|perfsim``).

Megatron-LM's flags are those of ``megatron/training/arguments.py`` (NVIDIA
Megatron-LM, "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", arXiv:1909.08053; interleaved stages and sequence parallelism: Narayanan
et al. arXiv:2104.04473, Korthikanti et al. arXiv:2205.05198). What a flag cannot say
(a schedule Megatron-LM does not run, perfsim's compression) is a ``#`` comment line.
"""

from __future__ import annotations

import shlex
from typing import Any, Iterable

from perfsim.errors import ConfigError
from perfsim.job import PLACEMENT_DIMS, Job
from perfsim.models.delta_net import GatedDeltaNet
from perfsim.models.registry import runtime_names
from perfsim.partition import uniform_counts
from perfsim.schedules import VIRTUAL_STAGE_SCHEDULES

#: what ``--emit`` writes
EMIT_KINDS = ("perfsim", "megatron", "torchrun")


def run_command(params: dict[str, Any], model_runtime: Iterable[str] | None = None) -> str | None:
    """The ``perfsim run`` command that trains this configuration for real, or None
    when the runtime has no implementation of the model."""
    runtime = set(model_runtime) if model_runtime is not None else set(runtime_names())
    if params["model"] not in runtime:
        return None
    flags = [f"--model {params['model']}", f"--pp {params['pp']}", f"--dp {params['dp']}",
             f"--schedule {params.get('schedule') or _schedule(params)}", f"--compress {params['compress']}",
             f"--grad-compress {params['grad_compress']}", f"--micro-batch {params['micro_batch']}",
             f"--macro-batch {params['macro_batch']}"]
    if params.get("tp", 1) != 1:
        flags.insert(1, f"--tp {params['tp']}")
    if (params.get("cp") or 1) != 1:  # stated, so that run's own checks refuse what it cannot train
        flags.insert(1, f"--cp {params['cp']}")
    if params.get("boundary_compress"):
        flags.insert(flags.index(f"--compress {params['compress']}") + 1,
                     f"--boundary-compress {params['boundary_compress']}")
    from perfsim.api import build_configs  # lazy: import perfsim does not load perfsim.api

    strategy = build_configs(**params)[1]
    flags += job_flags(strategy)
    placement = tuple(strategy.placement)  # the job's rank order, as predicted
    if placement != PLACEMENT_DIMS:
        flags.append(f"--placement {','.join(placement)}")
    if strategy.optimizer != Job.optimizer:
        flags.append(f"--optimizer {strategy.optimizer}")
    order = runtime_device_order(params)
    note = ""
    if order is not None and params.get("tp", 1) == 1:
        flags.append(f"--device-order {','.join(map(str, order))}")
    elif order is not None:  # the TP device mesh numbers its ranks itself
        note = f"  # simulated GPU order {','.join(map(str, order))} not expressible with --tp > 1"
    bw = params.get("bandwidth")
    if bw and not params.get("topology"):
        flags.append(f"--emulate-bandwidth {bw}")
        per_node = params.get("gpus_per_node") or 1
        if per_node > 1:  # perfsim run shapes each rank's own link, one rate for all (runtime/config.py)
            note += (f"  # every rank's link shaped at {bw}, the plan's {per_node} GPUs per node included "
                     "(their intra-node path was priced apart)")
    return "perfsim run " + " ".join(flags) + note


#: the job fields :func:`run_command` states when they differ from :class:`perfsim.job.Job`'s
#: default (beside the ones it always states); ``kernels`` is not one: perfsim run trains
#: eager modules whatever kernels the prediction priced
_JOB_FLAGS = ("sequence_parallel", "tied_embedding", "zero", "offload", "tp_send", "partition")


def job_flags(strategy: Job) -> list[str]:
    """``perfsim run`` flags of ``strategy``'s chunks per device (interleaved-1f1b: always
    stated) and of each :data:`_JOB_FLAGS` field off its default, so the emitted command trains
    the job that was predicted (a value execute mode cannot train, ZeRO-1 or an offload, is
    then refused by perfsim run in one line rather than dropped)."""
    flags = []
    if strategy.schedule in VIRTUAL_STAGE_SCHEDULES:
        flags.append(f"--virtual-stages {strategy.virtual_stages}")
    for name in _JOB_FLAGS:
        value = getattr(strategy, name)
        if value == getattr(Job, name) or value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif isinstance(value, (list, tuple)):
            flags.append(f"{flag} {','.join(map(str, value))}")
        else:
            flags.append(f"{flag} {value}")
    return flags


def runtime_device_order(params: dict[str, Any]) -> tuple[int, ...] | None:
    """``perfsim run --device-order`` of a configuration: the simulator's own (both engines
    number the ranks along the job's ``placement`` and then through ``device_order``:
    :meth:`perfsim.job.Job.device`), so that under torchrun every stage runs on the host
    the plan chose. None when that is the identity."""
    from perfsim.api import build_configs  # lazy: import perfsim does not load perfsim.api

    order = build_configs(**params)[1].device_order
    return None if order is None or tuple(order) == tuple(range(len(order))) else tuple(order)


def megatron_args(params: dict[str, Any], global_batch: int) -> tuple[list[str], list[str]]:
    """Megatron-LM's flags for a configuration, and comment lines for what they cannot
    express."""
    from perfsim.api import build_configs  # lazy: import perfsim does not load perfsim.api

    workload, strategy, _, _ = build_configs(**params)
    args = ["--tensor-model-parallel-size", str(strategy.tp), "--pipeline-model-parallel-size", str(strategy.pp)]
    if strategy.cp > 1:  # Megatron-Core's ring of key/value exchanges (perfsim.engine.context_parallel)
        args += ["--context-parallel-size", str(strategy.cp), "--cp-comm-type", strategy.cp_comm]
    notes = []
    arch = workload.arch
    if arch is not None:
        args += ["--num-layers", str(arch.n_layer), "--hidden-size", str(arch.hidden),
                 "--num-attention-heads", str(arch.heads), "--ffn-hidden-size", str(arch.ffn or 4 * arch.hidden),
                 "--seq-length", str(arch.seq_len), "--max-position-embeddings", str(max(arch.seq_len, arch.max_positions)),
                 "--padded-vocab-size", str(arch.vocab)]
        if arch.kv_heads and arch.kv_heads != arch.heads:
            args += ["--group-query-attention", "--num-query-groups", str(arch.kv_heads)]
        block_args, block_notes = architecture_args(arch)
        args += block_args
        notes += block_notes
        if arch.experts:
            moe_args, moe_notes = moe_args_of(arch, strategy)
            args += moe_args
            notes += moe_notes
        # perfsim's untied head on another stage (its default without a GPU preset) is Megatron-LM's
        # untied output layer: the tied one all-reduces the copy's gradient (tied_embedding=sync)
        if not arch.tied or (strategy.pp > 1 and strategy.tied_embedding == "untied"):
            args += ["--untie-embeddings-and-output-weights"]
    if strategy.schedule in VIRTUAL_STAGE_SCHEDULES:
        if arch is None or arch.n_layer % (strategy.pp * strategy.virtual_stages):
            raise ConfigError(f"virtual_stages={strategy.virtual_stages}: Megatron-LM needs the layers to "
                              f"divide into pp x virtual stages")
        args += ["--num-layers-per-virtual-pipeline-stage",
                 str(arch.n_layer // (strategy.pp * strategy.virtual_stages))]
    elif strategy.schedule not in ("1f1b",) and strategy.pp > 1:
        notes.append(f"schedule {strategy.schedule}: Megatron-LM runs 1F1B (or interleaved); this plan's "
                     f"figures assume {strategy.schedule}")
    if strategy.pp > 1:  # Megatron-LM splits the blocks evenly (perfsim.partition.uniform_counts)
        names = [layer.name for layer in workload.layers]
        uniform = uniform_counts(names, strategy.num_stages) if arch is not None else None
        if strategy.partition is None or tuple(strategy.partition) != uniform:
            what = ",".join(map(str, strategy.partition)) if strategy.partition else "balanced by compute"
            notes.append(f"partition {what}: Megatron-LM splits the blocks uniformly; this plan's figures assume "
                         f"its own split (plan with --partition uniform for Megatron-LM's)")
    args += ["--micro-batch-size", str(strategy.micro_batch), "--global-batch-size", str(global_batch)]
    if strategy.sequence_parallel:
        args.append("--sequence-parallel")
    if strategy.recompute != "none":
        args += ["--recompute-granularity", strategy.recompute]
        if strategy.recompute == "full":
            args += ["--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if strategy.zero in (1, 2):  # optimizer state sharded, gradients reduce-scattered
        args.append("--use-distributed-optimizer")
        if strategy.zero == 2 and strategy.replicas > 1:
            notes.append("zero 2: Megatron-LM's distributed optimizer reduce-scatters the gradients once a step "
                         "(ZeRO-1's sync); this plan's figures assume ZeRO-2's reduce-scatter of every unit's "
                         "gradient each micro-batch (DeepSpeed stage 2)")
    elif strategy.zero == 3:  # parameters sharded too: Megatron-LM through PyTorch FSDP2
        args.append("--use-torch-fsdp2")
    if strategy.overlap_grad_sync and strategy.replicas > 1:  # Megatron-LM arguments.py: "overlap DDP grad reduce"
        args.append("--overlap-grad-reduce")
    if strategy.offload == "optimizer":
        notes.append("offload optimizer: this plan's figures assume ZeRO-Offload's CPU Adam (DeepSpeed's "
                     "offload_optimizer, arXiv:2101.06840); no Megatron-LM flag is emitted for it")
    if strategy.precision in ("bf16", "fp16"):
        args.append("--" + strategy.precision)
    elif strategy.precision == "fp8":  # Transformer Engine's delayed scaling, bf16 outside the GEMMs (hardware.py)
        args += ["--bf16", "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024",
                 "--fp8-amax-compute-algo", "max"]
    if strategy.optimizer == "sgd":  # Megatron-LM's default is Adam (its --optimizer adam)
        args += ["--optimizer", "sgd", "--sgd-momentum", "0.9"]
    if strategy.attention == "flash":
        args.append("--use-flash-attn")
    for what, spec in (("pipeline", strategy.compress), ("gradient", strategy.grad_compress)):
        if not spec.plain:
            notes.append(f"{what} compression {spec}: no Megatron-LM flag (perfsim run implements it)")
    return args, notes


def architecture_args(arch) -> tuple[list[str], list[str]]:
    """Megatron-LM's flags for the block a :class:`~perfsim.models.transformer.TransformerSpec`
    describes, where it differs from Megatron-LM's defaults (a GPT-2 block: LayerNorm, GELU MLP,
    biases everywhere, learned absolute positions), and comments for what no flag says. Without
    them a Llama-style model would train as a GPT-2 block of the same widths: another model
    (two MLP matrices instead of SwiGLU's three), not the one predicted."""
    args, notes = [], []
    if arch.encoder:
        notes.append(f"{arch.name} is an encoder (BERT-style): Megatron-LM trains it with pretrain_bert.py, "
                     "whose flags differ from these")
    if arch.gated:
        args.append("--swiglu")
    if arch.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if not arch.learned_positions:
        args += ["--position-embedding-type", "rope"]
    if not (arch.bias or arch.out_bias or arch.mlp_bias):
        args.append("--disable-bias-linear")
        if arch.qkv_bias:
            args.append("--add-qkv-bias")
    elif not (arch.qkv_bias and arch.out_bias and arch.mlp_bias):
        notes.append(f"biases: qkv {arch.qkv_bias}, output {arch.out_bias}, MLP {arch.mlp_bias}: Megatron-LM "
                     "adds all or (with --disable-bias-linear) none of the output and MLP biases")
    if arch.mla:  # Megatron-Core's MLASelfAttention (megatron/training/arguments.py, its MLA flags)
        args += ["--multi-latent-attention", "--kv-lora-rank", str(arch.kv_lora_rank),
                 "--qk-head-dim", str(arch.head_dim - arch.rope_head_dim),
                 "--qk-pos-emb-head-dim", str(arch.rope_head_dim), "--v-head-dim", str(arch.v_head_dim),
                 "--qk-layernorm"]
        if arch.q_lora_rank:
            args += ["--q-lora-rank", str(arch.q_lora_rank)]
    elif arch.head_dim * arch.heads != arch.hidden:
        args += ["--kv-channels", str(arch.head_dim)]
    if arch.qk_norm and not arch.mla:  # Megatron-Core's q/k norms, of --normalization's kind
        args.append("--qk-layernorm")
    if arch.qk_l2_norm:  # Megatron-Core's L2Norm over the queries and keys (its Llama 4 examples)
        args.append("--qk-l2-norm")
    if arch.attention_output_gate:  # Megatron-Core's sigmoid gate on the attention output (Qwen3-Next)
        args.append("--attention-output-gate")
    mamba = arch.linear_attention_layers and not isinstance(arch.linear_mixer, GatedDeltaNet)
    if mamba or arch.mixer_free_layers or arch.mlp_free_layers:
        notes.append("Mamba-2 blocks or blocks of one sub-block: Megatron-LM trains hybrid models through "
                     "pretrain_mamba.py (--hybrid-override-pattern), not this GPT command; no flags are emitted for them")
    elif arch.linear_attention_layers:  # Megatron-Core's experimental Gated DeltaNet: 1 a GDN block, 0 attention
        net = arch.linear_mixer
        pattern = ",".join("1" if i in arch.linear_attention_layers else "0" for i in range(arch.n_layer))
        args += ["--enable-experimental", "--experimental-attention-variant", "gated_delta_net",
                 "--linear-attention-freq", f"[{pattern}]", "--linear-conv-kernel-dim", str(net.conv_kernel),
                 "--linear-key-head-dim", str(net.key_dim), "--linear-value-head-dim", str(net.value_dim),
                 "--linear-num-key-heads", str(net.key_heads), "--linear-num-value-heads", str(net.value_heads)]
    if arch.nope_layers:  # 1: a block without rotary embedding (Megatron-LM arguments.py, --no-rope-freq)
        pattern = ",".join("1" if i in arch.nope_layers else "0" for i in range(arch.n_layer))
        args += ["--no-rope-freq", f"[{pattern}]"]
    if arch.parallel_block or arch.norms_per_block == 1:
        notes.append("parallel attention and MLP block: Megatron-LM's GPT block is sequential (no flag); "
                     "this plan's figures assume the parallel block")
    if arch.attention_sinks:  # Megatron-Core's learnable softmax offset, one a head
        args += ["--softmax-type", "learnable"]
    if arch.router_bias:
        notes.append("a bias on the MoE router's linear layer (gpt-oss): no Megatron-LM flag; this plan's "
                     "figures count its parameters")
    if arch.norms_per_block == 4 or arch.final_logit_softcap or arch.attn_logit_softcap:
        notes.append("Gemma's norms after attention and the MLP and its logit soft-capping: Megatron-LM's GPT "
                     "block has neither (no flag); this plan's figures assume them")
    if arch.mtp_layers:  # Megatron-Core's MultiTokenPredictionBlock, on the last pipeline stage
        args += ["--mtp-num-layers", str(arch.mtp_layers)]
    if arch.attention_chunk:
        notes.append(f"chunked attention ({arch.attention_chunk}-token chunks, Llama 4): no Megatron-LM flag is "
                     "emitted for it; this plan's figures assume it")
    if arch.sliding_window:  # Megatron-Core's window attention (Transformer Engine): (left, right) keys
        args += ["--window-size", f"{arch.sliding_window - 1},0"]
        if arch.full_attention_layers:  # 1: a windowed block, 0: full attention
            pattern = ",".join("0" if i in arch.full_attention_layers else "1" for i in range(arch.n_layer))
            args += ["--window-attn-skip-freq", f"[{pattern}]"]
    return args, notes


def moe_args_of(arch, strategy) -> tuple[list[str], list[str]]:
    """Megatron-Core's MoE flags (megatron/training/arguments.py: ``--num-experts``,
    ``--moe-router-topk``, ``--expert-model-parallel-size`` ...) of a MoE model and job. Megatron-LM
    refuses MoE with tensor parallelism but without sequence parallelism ("When using MoE and
    tensor parallelism, sequence parallelism must be used"): said in a comment, since the plan's
    figures priced that job."""
    args = ["--num-experts", str(arch.experts), "--moe-router-topk", str(arch.top_k),
            "--moe-ffn-hidden-size", str(arch.expert_ffn or arch.ffn), "--moe-grouped-gemm"]
    notes = []
    if arch.shared_ffn:
        args += ["--moe-shared-expert-intermediate-size", str(arch.shared_ffn)]
        if arch.shared_gate:
            args.append("--moe-shared-expert-gate")
    if arch.dense_layers:
        freq = ",".join("0" if i in arch.dense_layers else "1" for i in range(arch.n_layer))
        args += ["--moe-layer-freq", f"[{freq}]"]
    if strategy.ep > 1:
        args += ["--expert-model-parallel-size", str(strategy.ep), "--moe-token-dispatcher-type", "alltoall"]
    if getattr(strategy, "ep_overlap", False):  # the combined 1F1B schedule (perfsim.engine.ep_overlap)
        args.append("--overlap-moe-expert-parallel-comm")
    if strategy.moe_capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", str(strategy.moe_capacity_factor),
                 "--moe-pad-expert-input-to-capacity"]
    if strategy.tp > 1 and not strategy.sequence_parallel:
        notes.append(f"MoE with tensor parallelism {strategy.tp} and no sequence parallelism: Megatron-LM "
                     "refuses it (add --sequence-parallel, and plan with --sequence-parallel on for its figures)")
    return args, notes


def _schedule(params: dict[str, Any]) -> str:
    from perfsim.api import build_configs  # lazy: import perfsim does not load perfsim.api

    return build_configs(**params)[1].schedule


def run_refusal(command: str) -> str | None:
    """The one line in which ``perfsim run`` refuses ``command`` (a :func:`run_command` line),
    None when run trains it: :func:`perfsim.runtime.make_config`'s own checks (e.g. ``--zero 1``,
    ``--offload``, ``--tp-send scatter-gather`` with tp and pp > 1 without sequence parallelism),
    so the emitter never keeps a second list of what execute mode cannot train."""
    from perfsim.runtime import make_config  # lazy: the run config's checks load torch

    words = shlex.split(command, comments=True)[2:]  # after "perfsim run"
    flags: dict[str, Any] = {"out": "perfsim-run"}  # checked, never created
    while words:  # run_command writes "--flag VALUE" or a bare switch "--flag" / "--no-flag"
        name = words.pop(0)[2:].replace("-", "_")
        if words and not words[0].startswith("--"):
            flags[name] = words.pop(0)
        else:
            flags[name[3:] if name.startswith("no_") else name] = not name.startswith("no_")
    try:
        make_config(**flags)
    except ConfigError as exc:
        return str(exc)
    return None


def check_emit(model: str) -> None:
    """Refuse ``--emit perfsim`` before a search when the runtime cannot train ``model``."""
    if str(model).lower() not in runtime_names():
        raise ConfigError(f"--emit perfsim: {model} has no perfsim run implementation "
                          f"(runtime models: {', '.join(sorted(runtime_names()))})")


def emit(params: dict[str, Any], kind: str, *, nodes: int, global_batch: int,
         script: str = "pretrain_gpt.py") -> str:
    """The configuration as a command of ``kind`` (:data:`EMIT_KINDS`)."""
    if kind not in EMIT_KINDS:
        raise ConfigError(f"--emit {kind!r}: choose from {', '.join(EMIT_KINDS)}")
    if kind == "perfsim":
        check_emit(params["model"])
        command = run_command(params)
        refused = run_refusal(command)
        if refused:  # said up front: the command is the prediction's, not one run trains
            return (f"# perfsim run cannot train {refused.split(':', 1)[0]}; this command states the "
                    f"prediction's settings (perfsim run: {refused})\n{command}")
        return command
    args, notes = megatron_args(params, global_batch)
    lines = [f"# {n}" for n in notes]
    if kind == "megatron":
        return "\n".join(lines + [shlex.join(args)])
    launcher = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(params.get("gpus_per_node", 1)),
                "--node-rank", "$NODE_RANK", "--master-addr", "$MASTER_ADDR", "--master-port", "29500"]
    return "\n".join(lines + [" ".join(launcher) + " " + shlex.join([script, *args])])
