"""Simulator entry points behind :func:`perfsim.predict` and :func:`perfsim.sweep`
(the public simulator API: ``from perfsim.api import predict, build_configs``).

``predict(**params) -> Result`` takes the parameters of ``perfsim predict``, one
value each (strings such as ``"100Mbps"`` or numbers in SI units). The
parameters, their types, defaults and units are described once, in
:mod:`perfsim.params`; this module turns them into config dataclasses
(:func:`build_configs`) with profiles, models and topologies loaded once per
process. ``model`` also takes an inline transformer (``gpt:layers=96,hidden=12288,
heads=96,seq=2048,vocab=51200``, optional ``ffn=``, ``kv_heads=``; ``llama:`` /
``bert:`` / ``neox:`` conventions) or a Hugging Face ``config.json`` path. A ``gpu``
preset switches the defaults to Megatron-LM's (:data:`perfsim.job.MEGATRON`: 1F1B,
uniform partition, ranks ordered tp, dp, pp, contiguous gradient buffer, tied head
synced); with a ``gpu`` the compute comes from its operator model
(:mod:`perfsim.engine.compute`) and the memory is checked against its capacity
(:mod:`perfsim.memory`): a configuration that does not fit raises
:class:`ConfigError` naming the stage and the shortfall.

``predict_many(list_of_param_dicts)`` runs several (profiles and models are
loaded once).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from perfsim import params as params_mod
from perfsim.config import Strategy, System, Workload
from perfsim.engine import simulate
from perfsim.engine.context_parallel import check_context_parallel
from perfsim.engine.layer_times import resolve_layer_times, timed_recompute
from perfsim.documents import file_stamp
from perfsim.errors import ConfigError
from perfsim.fabrics import Nic, get_fabric, parse_nic
from perfsim.hardware import (BYTES_PER_VALUE, GPUS, NODE_FABRIC, default_attention, get_gpu, profile_device,
                               profile_gpu, same_silicon, value_precision)
from perfsim.memory import ALLOCATOR_PRESSURE
from perfsim.models.datasets import dataset_samples, wikitext2_samples
from perfsim.models.eager import eager_listed
from perfsim.job import check_chunks, chosen_chunks, preset
from perfsim.models.hf_config import DEFAULT_SEQ_LEN
from perfsim.models.moe import Routing, check_routing
from perfsim.models.ops import GradAccumulation
from perfsim.models.specs import block_index, is_block
from perfsim.models.tensor_parallel import shard_block_params
from perfsim.network import load_topology
from perfsim.partition import uniform_counts
from perfsim.profile import Profile, load_profile, profile_path
from perfsim.result import Result
from perfsim.schedules import stage_count
from perfsim.units import format_bandwidth, format_time
from perfsim.workload import Model, get_model, load_workload_file

#: the predict parameters' defaults (perfsim.params.DEFAULTS)
DEFAULTS: dict[str, Any] = params_mod.DEFAULTS


def _file_key(path) -> tuple[str, tuple]:
    """``(path, stamp)``: the file's path and :func:`perfsim.documents.file_stamp` (size,
    times, inode; the content of a file just written), the key of the caches below, so a
    file changed in any way is read again (qa7: the modification time alone missed a copy
    that restores it)."""
    p = Path(path)
    try:
        return str(p.resolve()), file_stamp(p)
    except OSError:
        return str(p), ()


@functools.lru_cache(maxsize=32)
def _profile(key: tuple[str, tuple] | None):
    return load_profile(None if key is None else key[0])


def _load_profile(spec):
    if spec is None or spec in ("", "default"):
        return _profile(None)
    if isinstance(spec, Profile):  # the caller's own value, maybe edited since: priced afresh
        spec.forget()
        return spec
    if not Path(spec).exists():
        from perfsim.packaged import NAMES, resolve  # lazy: perfsim predict does not load perfsim.packaged

        if str(spec) in NAMES["profile"]:  # a shipped name: cached like a file
            return _profile(_file_key(resolve("profile", spec)))
        return load_profile(spec)  # a bare name in traces/, or a clear error
    return _profile(_file_key(spec))


#: samples per macro-batch when neither macro_batch nor global_batch is given
DEFAULT_MACRO_BATCH = 32


@functools.lru_cache(maxsize=32)
def _model(model: str | None, workload_key: tuple[str, tuple] | None, seq_len: int | None = None,
           stamp: tuple | None = None):
    """A model by name, or a workload file (``workload_key``: :func:`_file_key`); ``stamp``: the
    config.json ``model``'s :func:`perfsim.documents.file_stamp` (so an edited file is read again)."""
    if workload_key:
        if seq_len:
            raise ConfigError("seq_len: not for a workload file (its layers fix the shapes)")
        return load_workload_file(workload_key[0])
    return get_model(model, seq_len)


@functools.lru_cache(maxsize=32)
def _with_mtp(model, mtp_layers: int | None):
    """``model`` trained with ``mtp_layers`` multi-token prediction modules (None: its own)."""
    if mtp_layers is None:
        return model
    if model.arch is None or model.arch.encoder:
        raise ConfigError(f"mtp_layers={mtp_layers}: model {model.name!r} is not a decoder transformer "
                          "(multi-token prediction needs an LM head)")
    if model.arch.mtp_layers == mtp_layers:
        return model
    return Model.of(replace(model.arch, mtp_layers=mtp_layers))


@functools.lru_cache(maxsize=32)
def _topology(key: tuple[str, tuple]):
    return load_topology(key[0])


def _load_file(kind: str, value) -> tuple[str, tuple]:
    from perfsim.packaged import resolve  # lazy: perfsim predict does not load perfsim.packaged

    return _file_key(resolve(kind, value))


def input_files(**params) -> dict[str, Any]:
    """The input files a prediction of ``params`` reads, by role -- ``profile`` (the
    default one when none is given), ``model`` (a config.json), ``workload``,
    ``topology`` -- resolved as :func:`build_configs` resolves them: paths, or a
    Profile given as an object. A name that resolves to no file keeps its text
    (predict names that error). What :mod:`perfsim.provenance` hashes into the key
    of a stored prediction."""
    from perfsim.packaged import resolve  # lazy: perfsim predict does not load perfsim.packaged

    get = {str(k).replace("-", "_"): v for k, v in params.items() if v is not None}.get
    files: dict[str, Any] = {}
    profile = get("profile")
    try:
        files["profile"] = profile if not isinstance(profile, (str, os.PathLike, type(None))) \
            else profile_path(profile)
    except ConfigError:  # no default profile found: predict says so
        files["profile"] = None
    for role in ("workload", "topology"):
        if get(role):
            try:
                files[role] = resolve(role, get(role))
            except ConfigError:
                files[role] = str(get(role))
    model = get("model")
    if not get("workload") and isinstance(model, str):
        config = _config_json(model)
        if config is not None:
            files["model"] = config
    return files


def _config_json(name: str) -> str | None:
    """The config.json that model ``name`` reads -- a path ending in ``.json``, or the
    ``config.json`` of a Hub-style folder -- else None (a preset or an inline spec):
    the one rule :func:`build_configs` reads by and :func:`input_files` keys by."""
    if os.path.isdir(name):
        return os.path.join(name, "config.json")
    return name if name.lower().endswith(".json") else None


def build_configs(**params) -> tuple[Workload, Strategy, System, Any]:
    """Parse ``params`` (perfsim.params names and values) into validated configs + profile.

    Parameters with a ``target`` fill that config field as they are; the others
    are resolved here: the model (preset, inline spec, config.json or workload
    file), the profile, the topology, and the defaults of the named preset
    (:func:`perfsim.job.preset`: ``megatron`` with a ``gpu`` -- schedule 1f1b, uniform
    partition, placement tp,dp,pp, contiguous gradient buffer, gradients reduced after the
    backward, tied head synced, vocabulary padded -- else ``perfsim``'s)."""
    p = params_mod.resolved(params)
    profile = _load_profile(p["profile"])
    seq_len = p["seq_len"]
    if p["workload"]:
        model = _model(None, _load_file("workload", p["workload"]), seq_len)
    else:
        name = _config_json(p["model"]) or p["model"]
        if os.path.isdir(p["model"]) and not os.path.isfile(name):  # a Hub-style folder holding config.json
            raise ConfigError(f"model {p['model']!r}: a folder without config.json")
        if name.lower().endswith(".json"):
            if not os.path.exists(name):
                raise ConfigError(f"model {name!r}: no such config.json")
            path, stamp = _file_key(name)
            model = _model(path, None, seq_len, stamp)
        else:
            model = _model(name if ":" in name else name.lower(), None, seq_len)
    model = _with_mtp(model, p["mtp_layers"])
    fields: dict[str, dict[str, Any]] = {"strategy": {}, "system": {}}
    for param in params_mod.PARAMS:
        if param.target is not None and p[param.name] is not None:
            where, field_name = param.target.split(".")
            fields[where][field_name] = p[param.name]
    gpu = get_gpu(p["gpu"]) if p["gpu"] else None
    if p["precision"] == "fp8" and gpu is None:
        raise ConfigError("precision=fp8: needs a GPU preset with fp8 (--gpu h100, h100-pcie or h200): "
                          "its fp8 GEMMs are modelled from the datasheet rate")
    st = fields["strategy"]
    st["macro_batch"] = _batch(p)
    if p["dataset_samples"] is None:  # the model's own data set where perfsim run has one
        samples = dataset_samples(model.spec)
        if samples is None and model.tokens_per_sample > 1:  # a language model: WikiText-2, one pass
            samples = wikitext2_samples(model.tokens_per_sample)
        if samples is not None:
            st["dataset_samples"] = samples  # (else Strategy's default)
    defaults = preset(gpu)  # a GPU preset switches to Megatron-LM's (perfsim.job.MEGATRON)
    st["schedule"] = p["schedule"] or defaults.schedule
    st["grad_buffer"] = p["grad_buffer"] or defaults.grad_buffer
    st["tied_embedding"] = p["tied_embedding"] or defaults.tied_embedding
    st["kernels"] = p["kernels"] or _default_kernels(defaults, model, p["precision"])
    if model.arch is not None:  # a transformer's attention kernels: FlashAttention where it runs
        st["attention"] = p["attention"] or default_attention(gpu, p["precision"], model.arch.head_dim)
    st["recompute"] = p["recompute"] or _default_recompute(profile, model, gpu)
    st["tp_send"] = p["tp_send"] or defaults.tp_send
    st["overlap_grad_sync"] = p["overlap"] if p["overlap"] is not None else defaults.overlap
    st["virtual_stages"] = chosen_chunks(st["schedule"], st.get("virtual_stages"))
    # the partition covers every model chunk: pp x stages per device
    check_chunks(p["pp"], st["schedule"], st.get("virtual_stages"), len(model.layers))
    st["partition"] = _partition(p["partition"] or (defaults.partition if model.arch is not None else None), model,
                                 p["pp"] * stage_count(st["schedule"], st.get("virtual_stages")))
    st["placement"] = tuple(x.strip().lower() for x in (p["placement"] or defaults.placement).split(","))
    strategy = Strategy(**st)
    check_routing(model.arch, model.name, strategy)
    check_transformer_only(model, strategy)
    check_context_parallel(model.arch, strategy, gpu, model.name)
    # a context-parallel rank computes its share of each sequence (perfsim.engine.context_parallel)
    fwd, bwd, source = resolve_layer_times(model.context_rank(strategy.cp), profile, strategy.micro_batch, gpu=gpu,
                                           precision=strategy.precision, tp=strategy.tp,
                                           sequence_parallel=strategy.sequence_parallel,
                                           recompute=strategy.recompute,
                                           vocab_multiple=defaults.vocab_multiple,
                                           attention=strategy.attention, kernels=strategy.kernels,
                                           host_overhead_s=fields["system"].get("host_overhead_s"),
                                           routing=Routing.of(strategy), grad_acc=_grad_accumulation(strategy),
                                           fp8_casts=strategy.fp8_casts)
    workload = Workload(model.name, model.layers, tuple(fwd), tuple(bwd), model.tokens_per_sample,
                        arch=model.arch, rank_params=_rank_params(model, strategy.tp, strategy.ep), compute_source=source,
                        tied_values=model.tied_values)
    given = [k for k in ("bandwidth", "latency") if params.get(k) is not None]
    if p["topology"] and given:
        raise ConfigError(f"topology {str(p['topology'])!r}: its links replace {' and '.join(given)}; "
                          f"give one or the other")
    topology = _topology(_load_file("topology", p["topology"])) if p["topology"] else None
    sy = fields["system"]
    nic = parse_nic(p["nic"]) if p["nic"] else Nic(1, p["bandwidth"])  # bandwidth: one NIC, bit/s
    sy.update(bandwidth_bps=nic.total_bps, nic_kind=nic.kind, nics_per_node=nic.count,
              intra_node_bandwidth_bps=p["intra_node_bandwidth"])
    fabric_name = p["intra_node_fabric"]
    if fabric_name is None and gpu is not None and params.get("intra_node_bandwidth") is None \
            and gpu.name in NODE_FABRIC:
        # the fabric a node of this GPU ships with, as plan prices it (perfsim.search_space.node_fabric):
        # NVLink generation, PCIe, or host memory without peer-to-peer (perfsim.fabrics.HostPath)
        fabric_name = NODE_FABRIC[gpu.name]
    if fabric_name:
        fabric = get_fabric(fabric_name)
        sy.update(intra_node_bandwidth_bps=fabric.bandwidth_bps, intra_node_latency_s=fabric.latency_s,
                  intra_node_pcie=fabric.name.startswith("pcie"))
    system = System(topology=topology, gpu=gpu.name if gpu else None, **fields["system"])
    return workload, strategy, system, profile


def _grad_accumulation(strategy: Strategy) -> GradAccumulation:
    """How the strategy's micro-batches accumulate their weight gradients
    (:class:`perfsim.models.ops.GradAccumulation`): its method, the replica's micro-batches, the
    ``main_grad`` buffer's value size (the strategy's gradient precision) and ``param.grad``'s
    (fp32 weights under autocast, ``kernels="eager"``; else the training precision's)."""
    return GradAccumulation(strategy.grad_accumulation, strategy.num_microbatches,
                            grad_bytes=BYTES_PER_VALUE[strategy.grad_dtype],
                            weight_bytes=4 if strategy.kernels == "eager" else None)


def check_transformer_only(model, strategy: Strategy) -> None:
    """Refuse a setting that only a transformer's blocks use on a model without them, rather
    than predict as if it were not given: recomputation re-runs the forward of the ``block``
    layers (:mod:`perfsim.engine.layer_times`, :mod:`perfsim.memory`; a workload file's
    ``block*`` layers too), the attention kernel prices a transformer's attention
    (:mod:`perfsim.engine.compute`); an MLP or a CNN has neither (as ``seq_len`` and ``tp``
    are refused there)."""
    if strategy.recompute != "none" and not has_blocks(model):
        raise ConfigError(f"recompute={strategy.recompute!r}: model {model.name!r} has no transformer "
                          f"blocks to recompute (its time and memory would not change)")
    if strategy.attention != "megatron" and model.arch is None:
        raise ConfigError(f"attention={strategy.attention!r}: model {model.name!r} is not a transformer "
                          f"(no attention to run)")


def has_blocks(model) -> bool:
    """The model has layers that recomputation re-runs (a transformer's blocks,
    :func:`perfsim.models.specs.is_block`)."""
    return any(is_block(layer.name) for layer in model.layers)


def _default_recompute(profile, model, gpu) -> str:
    """The recomputation the profile's block backward records were timed with
    (:func:`perfsim.engine.layer_times.timed_recompute`) when they price this model -- the
    profile times it and no other GPU than the profile's is named -- else ``none``: a
    prediction without ``--recompute`` describes the job as it was measured (the embedded
    default: the AQ-SGD paper's fine-tuning, every block checkpointed, as its code runs it)."""
    if profile is None or not has_blocks(model) or (gpu is not None and not same_silicon(profile_gpu(profile), gpu)):
        return "none"
    kinds = {timed_recompute(profile, model, layer.name) for layer in model.layers
             if is_block(layer.name) and profile.select("layer_bwd", model=model.name, name=layer.name)}
    return kinds.pop() if len(kinds) == 1 else "none"


def _default_kernels(defaults, model, precision: str) -> str:
    """The preset's kernels (Megatron-LM's fused with a GPU preset; perfsim's eager: plain PyTorch,
    what a Hugging Face config.json is trained with and what ``perfsim run`` and ``perfsim calibrate``
    run), fused for a model whose eager kernels are not listed (:func:`perfsim.models.eager.eager_listed`:
    encoders, mixtures of experts, parallel blocks; fp8)."""
    if defaults.kernels == "eager" and (model.arch is None or not eager_listed(model.arch, precision)):
        return "fused"
    return defaults.kernels


def _rank_params(model, tp: int, ep: int = 1) -> tuple[int, ...] | None:
    """Parameters one tensor-parallel rank holds of each layer (Megatron-LM sharding); with
    expert parallelism ``ep`` a MoE block's experts split ``ep`` ways too."""
    if model.arch is None or (tp == 1 and ep == 1):
        return None
    arch = model.arch
    per = {"embed": arch.embed_params() - arch.vocab * arch.hidden + -(-arch.vocab * arch.hidden // tp),
           "head": arch.head_params() if arch.tied or arch.encoder
           else arch.norm_params() + -(-arch.vocab * arch.hidden // tp)}
    kinds: dict[tuple, int] = {}  # a block's share by its kind (experts, mixer ...) and whether it is an MTP module's

    def block(i: int) -> int:
        kind = (arch.block_kind(i), arch.is_mtp_block(i))
        if kind not in kinds:
            kinds[kind] = shard_block_params(arch, tp, i, ep)
        return kinds[kind]

    return tuple(block(block_index(layer.name)) if is_block(layer.name) else per[layer.name]
                 for layer in model.layers)


def _partition(raw, model, pp: int):
    """Layer counts per stage (``pp``: the pipeline's stages, every model chunk): given, None
    (balanced by compute), or ``uniform`` -- Megatron-LM's split of a transformer
    (:func:`perfsim.partition.uniform_counts`), the default of the :data:`perfsim.job.MEGATRON`
    preset for a transformer."""
    if raw != "uniform":
        return raw
    return uniform_counts([layer.name for layer in model.layers], pp)


def _batch(p: dict[str, Any]) -> int:
    """macro_batch per replica from ``macro_batch`` and/or ``global_batch``, checked:
    global = dp x micro_batch x accumulation steps."""
    gb, macro, dp, micro = p["global_batch"], p["macro_batch"], p["dp"], p["micro_batch"]
    if gb is None:
        return macro if macro is not None else DEFAULT_MACRO_BATCH
    if gb % (dp * micro):
        raise ConfigError(f"global_batch={gb}: must be a multiple of dp x micro_batch = {dp} x {micro}"
                          f" = {dp * micro} (global = dp x micro-batch x accumulation steps)")
    if macro is not None and macro * dp != gb:
        raise ConfigError(f"global_batch={gb}: disagrees with macro_batch={macro} x dp={dp} = {macro * dp}")
    return gb // dp


def predict(**params) -> Result:
    """Simulate one configuration (see the module docstring for parameters).

    ``note_unused``: also say in ``model_note`` which settings the caller gave that this
    configuration does not use (:func:`unused_settings`; ``perfsim.predict`` and ``perfsim
    predict`` set it; the planner's and a sweep's configurations, which pass one setting
    to every candidate, do not). The summary's ``notes`` list what a reader is told, one line
    each (:func:`prediction_notes`)."""
    trace = bool(params.pop("trace", False))
    note_unused = bool(params.pop("note_unused", False))
    allow_oom = params_mod.normalize("allow_oom", params.get("allow_oom") or False)
    workload, strategy, system, profile = build_configs(**params)
    result = simulate(workload, strategy, system, profile, trace=trace, allow_oom=allow_oom)
    if params.get("topology"):
        result.summary["topology"] = str(params["topology"])
    result.summary["profile_device"] = profile_device(profile)  # what measured the profile's times
    unused = unused_settings(params, strategy, result.summary, note_unused,
                             operator_model=bool(system.gpu) and workload.arch is not None,
                             gpu=bool(system.gpu))
    result.summary.update(model_facts(workload.arch, strategy, params.get("seq_len") is None, unused))
    result.summary["notes"] = prediction_notes(params, strategy, system, result.summary)
    _warn_memory(result.summary, profile)
    _check_finite(result)
    return result


def _warn_memory(summary: dict[str, Any], profile=None) -> None:
    """With a GPU preset: the peak's share of its capacity (``memory_pressure``) and, above
    :data:`perfsim.memory.ALLOCATOR_PRESSURE` of it, a ``memory_warning`` (allocator pressure:
    cudaFree/cudaMalloc and fragmentation, a slowdown the model does not price).
    Without a GPU preset nothing refuses a peak memory over a capacity, so a peak above
    the memory of the GPU the profile was measured on (its ``device`` names a preset, as
    the default's V100 16 GB does), else above every preset's memory, is said in the
    summary's ``memory_warning`` (one line naming the way to check it). ``perfsim predict``
    prints it on stderr; the API does not log it, as the planner and sweeps call
    :func:`predict` for hundreds of configurations."""
    peak = summary.get("peak_memory_gib")
    cap = summary.get("memory_capacity_gib")
    if summary.get("gpu") and peak and cap:  # a GPU preset: the allocator near its capacity
        share = peak / cap
        summary["memory_pressure"] = share
        if share > ALLOCATOR_PRESSURE:
            summary["memory_warning"] = (
                f"peak memory {peak:.1f} GiB per GPU is {100 * share:.0f} % of the {summary['gpu']}'s "
                f"{cap:.0f} GiB ({'beyond its capacity' if share > 1 else f'over {100 * ALLOCATOR_PRESSURE:.0f} %'}): "
                "PyTorch's caching allocator may free "
                "and re-allocate (cudaFree/cudaMalloc after a device synchronisation) and fragment, which is "
                "not priced (perfsim.memory.ALLOCATOR_PRESSURE); measure it, or lower the peak (--recompute, "
                "--zero, --tp, --pp, a smaller --micro-batch)")
        return
    if summary.get("gpu") or not peak:
        return
    gpu = max(GPUS.values(), key=lambda g: g.memory_bytes)
    what = f"every GPU preset's memory (the largest, {gpu.name}, has {gpu.memory_bytes / 2**30:.0f} GiB)"
    measured_on = profile_gpu(profile) if profile is not None else None
    if measured_on is not None and peak * 2**30 <= gpu.memory_bytes:  # the stronger statement first
        gpu, what = measured_on, f"the profile's GPU ({measured_on.name}, {measured_on.memory_bytes / 2**30:.0f} GiB)"
    if peak * 2**30 > gpu.memory_bytes:
        text = (f"peak memory {peak:.1f} GiB per GPU exceeds {what}; give --gpu to check a GPU's "
                "capacity, or shard the model further (--tp, --pp, --recompute)")
        summary["memory_warning"] = text


#: what marks a note of ``model_note`` as a setting given but not used (:func:`unused_notes`)
UNUSED = " unused: "


def unused_settings(params: dict[str, Any], strategy: Strategy, summary: dict[str, Any],
                    explicit: bool = True, operator_model: bool = True, gpu: bool = True) -> list[str]:
    """Settings given in ``params`` (not None) that this configuration does not use, each
    ``NAME VALUE unused: why`` (as ``a2a_compress`` with ep 1, :func:`model_facts`): a
    ``bandwidth`` beside a ``nic`` (the NICs give each node's links), an
    ``intra_node_bandwidth`` beside an ``intra_node_fabric`` (the preset's rate); with
    ``explicit`` (the caller set them itself, not a planner's candidate) also
    ``virtual_stages`` with a schedule that is not interleaved, ``reshard_after_forward``
    without ZeRO-3, data-parallel gradient settings and ZeRO with dp 1, pipeline compression with pp 1
    or with a ``boundary_compress`` spec for every boundary,
    ``attention`` and ``kernels`` where the profile's layer times price the compute (no operator
    model runs kernels: ``compute_model`` "profile..."),
    ``tied_embedding sync`` where no tied LM head is synced (the engine's ``tied_bytes`` 0), and
    ``grad_accumulation`` where no GPU operator model prices the compute (``operator_model`` False:
    no GPU preset or not a transformer; its layer times come from a profile or FLOPs), and
    ``optimizer_step`` without a GPU preset (``gpu`` False: the profile's optimizer record prices it)."""
    given = {str(k).replace("-", "_"): v for k, v in params.items() if v is not None}

    def value(name: str) -> Any:  # as given, normalised (only for a note: predict's hot path)
        return params_mod.normalize(name, given[name])

    notes = []
    if "nic" in given and "bandwidth" in given:
        nic = parse_nic(value("nic"))
        notes.append(f"bandwidth {format_bandwidth(value('bandwidth'))}{UNUSED}nic {nic.count}x"
                     f"{format_bandwidth(nic.rate_bps)} gives each node's links")
    if "intra_node_fabric" in given and "intra_node_bandwidth" in given:
        notes.append(f"intra_node_bandwidth {format_bandwidth(value('intra_node_bandwidth'))}{UNUSED}"
                     f"intra_node_fabric {value('intra_node_fabric')} gives the intra-node links")
    if not explicit:
        return notes
    if "virtual_stages" in given and strategy.virtual_stages is None:
        notes.append(f"virtual_stages {value('virtual_stages')}{UNUSED}schedule {strategy.schedule} is not "
                     "interleaved (its model chunks per device are fixed)")
    if "cp_comm" in given and strategy.cp == 1:
        notes.append(f"cp_comm {value('cp_comm')}{UNUSED}cp 1 has no context-parallel group")
    if "reshard_after_forward" in given and strategy.zero != 3:
        notes.append(f"reshard_after_forward {value('reshard_after_forward')}{UNUSED}zero {strategy.zero} "
                     "gathers no parameters (ZeRO-3 does)")
    if "overlap" in given and strategy.replicas > 1 and strategy.zero >= 2:
        notes.append(f"overlap {value('overlap')}{UNUSED}zero {strategy.zero} syncs each unit's gradient as the "
                     "backward produces it")
    if strategy.replicas == 1:
        for name in ("grad_compress", "bucket_size", "overlap"):
            if name in given and (name != "grad_compress" or strategy.grad_compress.text != "none"):
                shown = strategy.grad_compress.text if name == "grad_compress" else value(name)
                notes.append(f"{name} {shown}{UNUSED}dp 1 has no data-parallel gradient sync")
        if "zero" in given and strategy.zero and strategy.offload == "none":  # ZeRO-Offload needs its stage
            notes.append(f"zero {strategy.zero}{UNUSED}dp 1 has no replicas to shard over")
    if str(summary.get("compute_model", "")).startswith("profile"):  # no operator model ran any kernel
        for name in ("attention", "kernels"):
            if name in given:
                notes.append(f"{name} {value(name)}{UNUSED}the profile's measured layer times price the compute"
                             + (" (the activation memory follows it)" if name == "attention" else "")
                             + "; --gpu prices it with a GPU's operator model")
    if "compress" in given and strategy.pp == 1 and strategy.compress.text != "fp32":
        notes.append(f"compress {strategy.compress.text}{UNUSED}pp 1 has no pipeline boundary")
    boundaries = strategy.pp * stage_count(strategy.schedule, strategy.virtual_stages) - 1
    if "compress" in given and strategy.pp > 1 and len(strategy.boundary_compress) >= boundaries:
        notes.append(f"compress {strategy.compress.text}{UNUSED}boundary_compress {strategy.boundary_compress} "
                     "gives every pipeline boundary its own spec")
    if "tied_embedding" in given and value("tied_embedding") == "sync" and not summary.get("tied_bytes"):
        notes.append(f"tied_embedding sync{UNUSED}no tied LM head on another device than its embedding "
                     "(tied_bytes 0)")
    if "grad_accumulation" in given and not operator_model:
        notes.append(f"grad_accumulation {value('grad_accumulation')}{UNUSED}no GPU operator model prices "
                     "this compute (a transformer with --gpu does)")
    if "optimizer_step" in given and not gpu:
        notes.append(f"optimizer_step {value('optimizer_step')}{UNUSED}the profile's measured optimizer step "
                     "prices it (a GPU preset counts its bytes)")
    return notes


def unused_notes(summary: dict[str, Any]) -> list[str]:
    """The notes of ``summary["model_note"]`` that name a setting given but not used
    (:func:`unused_settings`, ``a2a_compress`` with ep 1): what the commands say on stderr."""
    return [n for n in str(summary.get("model_note") or "").split("; ") if UNUSED in n]


def prediction_notes(params: dict[str, Any], strategy: Strategy, system: System,
                     summary: dict[str, Any]) -> list[str]:
    """The summary's ``notes``: what a reader of this prediction is told, one line each and
    decided here once (``perfsim predict``, ``sweep`` and ``plan`` print them on stderr; the
    API result and every output carry them): a tensor-parallel group wider than a node
    (:func:`_tp_across_nodes`), the network settings of ``params`` that a job inside one node
    does not use (:func:`_network_unused`), a topology's extremes standing in ``bandwidth_bps``
    and ``latency_s`` (:func:`_topology_extremes`), and the settings given but not used
    (:func:`unused_notes`, also in ``model_note``). No note holds :data:`perfsim.outputs.LIST_SEP`,
    which joins them in a CSV cell."""
    given = {str(k).replace("-", "_"): v for k, v in params.items() if v is not None}
    notes = [_tp_across_nodes(strategy.tp, system.gpus_per_node)]
    notes += _network_unused(given, strategy.devices, system)
    notes += [_topology_extremes(summary) if system.topology is not None else None]
    notes += unused_notes(summary)
    return [n for n in dict.fromkeys(notes) if n]


def _tp_across_nodes(tp: int, per_node: int) -> str | None:
    """A tensor-parallel group wider than a node (``--gpu h100 --tp 8`` with the default
    ``--gpus-per-node 1``): its collectives cross the inter-node network, as predicted -- said,
    since Megatron-LM keeps TP inside a node (arXiv:2104.04473 Sec. 3.3)."""
    if tp <= per_node:
        return None
    return (f"tp {tp} spans {-(-tp // per_node)} nodes of {per_node} GPU{'s' * (per_node > 1)} (--gpus-per-node "
            f"{per_node}): every tensor-parallel collective crosses the inter-node network, as predicted "
            f"(GPUs of one node: --gpus-per-node {tp})")


def _network_unused(given: dict[str, Any], gpus: int, system: System) -> list[str]:
    """``bandwidth`` / ``latency`` / ``nic`` given for a job whose GPUs all sit in one node
    (``--gpus-per-node 8`` with 8 GPUs, or one GPU) and no topology: nothing crosses the
    network, so they leave the prediction as it is -- said (:data:`UNUSED`'s wording)."""
    per_node = system.gpus_per_node
    if gpus > per_node or system.topology is not None:
        return []
    nic = given.get("nic")
    shown = {"bandwidth": lambda: format_bandwidth(params_mod.normalize("bandwidth", given["bandwidth"])),
             "latency": lambda: format_time(params_mod.normalize("latency", given["latency"])),
             "nic": lambda: nic if isinstance(nic, str) else f"{nic.count}x{format_bandwidth(nic.rate_bps)}"}
    where = (f"all {gpus} GPUs sit in one node (--gpus-per-node {per_node})" if gpus > 1 else "one GPU, one node")
    return [f"{name} {shown[name]()}{UNUSED}{where}, nothing crosses the network (--intra-node-bandwidth "
            "or --intra-node-fabric prices the links inside a node)" for name in shown if name in given]


def _topology_extremes(summary: dict[str, Any]) -> str:
    """With a topology the summary's ``bandwidth_bps`` and ``latency_s`` are its slowest
    inter-node rate and its largest latency (:func:`perfsim.engine.report._topology_links`),
    which a job need not cross (``--topology example-geo --pp 3``: 40 ms, a job inside one
    region never waits it) -- said, as the table's latency row says "up to"."""
    return (f"topology {summary.get('topology')}: bandwidth_bps {format_bandwidth(summary['bandwidth_bps'])} and "
            f"latency_s {format_time(summary['latency_s'])} are its slowest link and its largest latency, "
            "not necessarily this job's (the links rows hold the links it used)")


def model_facts(arch, strategy: Strategy, seq_default: bool, unused: list[str] = ()) -> dict[str, Any]:
    """Summary entries that state what the model is: active parameters of a mixture of
    experts (with the routing assumption), and where the sequence length of a config.json
    model comes from (``model_note``, printed by ``perfsim predict``), with the settings
    given that this configuration does not use (``unused``, :func:`unused_settings`)."""
    if arch is None:
        return {"model_note": "; ".join(unused)} if unused else {}
    notes = []
    facts: dict[str, Any] = {"active_params": arch.active_params}
    if arch.moe:
        cf = strategy.moe_capacity_factor
        notes.append(f"{arch.params / 1e9:.2f} B parameters, {arch.active_params / 1e9:.2f} B active per "
                     f"token (top-{arch.top_k} of {arch.experts} experts"
                     + (f", {arch.shared_ffn}-wide shared expert" if arch.shared_ffn else "")
                     + (f", {len(arch.dense_layers)} dense block(s)" if arch.dense_layers else "")
                     + (f"; expert capacity factor {cf:g}, padded" if cf else
                        "; dropless experts, " + (f"busiest expert-parallel rank at {strategy.moe_imbalance:g} x "
                                                  "the balanced load" if strategy.ep > 1 and
                                                  strategy.moe_imbalance != 1 else "balanced routing assumed"))
                     + (f"; expert parallel {strategy.ep}: {arch.experts // strategy.ep} expert(s) per GPU, "
                        "all-to-all dispatch and combine" if strategy.ep > 1 else "")
                     + (f", dispatch pair sent as {strategy.a2a_compress} (the combine pair at "
                        f"{value_precision(strategy.precision)})" if strategy.a2a_compress != "none" and
                        strategy.ep > 1 else "") + ")")
    if arch.mla:
        notes.append(f"multi-head latent attention (key/value latent {arch.kv_lora_rank}"
                     + (f", query latent {arch.q_lora_rank}" if arch.q_lora_rank else "")
                     + f", heads {arch.head_dim}/{arch.v_head_dim} wide): priced from its projections' shapes; "
                     "no MLA step was timed, so its interval is that of standard-attention rows")
    if arch.final_logit_softcap or arch.attn_logit_softcap:
        notes.append("logit soft-capping (Gemma 2): "
                     + ", ".join(([f"the LM head's logits at {arch.final_logit_softcap:g}, three passes over them"]
                                  if arch.final_logit_softcap else [])
                                 + ([f"the scores at {arch.attn_logit_softcap:g}, "
                                     + ("inside the flash kernel, not priced" if strategy.attention == "flash"
                                        else "three passes over them")] if arch.attn_logit_softcap else [])))
    if arch.left_out:
        notes.append(arch.left_out)
    if arch.attention_sinks:
        notes.append("attention sinks (gpt-oss): one learned logit a head in every softmax, not priced")
    windowed = sum(1 for i in range(arch.n_layer) if arch.is_window_block(i))
    if windowed:
        notes.append(f"sliding-window attention ({arch.sliding_window} tokens) in {windowed} of {arch.n_layer} "
                     + ("blocks: flash attention skips the keys outside it" if strategy.attention == "flash" else
                        "blocks: attention=megatron computes every score and masks, priced as full attention"))
    chunked = sum(1 for i in range(arch.n_layer) if arch.is_chunked_block(i))
    if chunked:
        notes.append(f"chunked attention ({arch.attention_chunk}-token chunks) in {chunked} of {arch.n_layer} "
                     + ("blocks: flash attention skips the keys outside each query's chunk"
                        if strategy.attention == "flash" else
                        "blocks: attention=megatron computes every score and masks, priced as full attention"))
    if arch.linear_attention_layers:
        kind, _, how = arch.linear_mixer.describe().partition(" (")
        notes.append(f"{kind} in {len(arch.linear_attention_layers)} of {arch.n_layer} blocks ({how}")
    if arch.mixer_free_layers or arch.mlp_free_layers:
        notes.append(f"blocks of one sub-block (Nemotron-H's layers): {len(arch.mlp_free_layers)} a token mixer alone, "
                     f"{len(arch.mixer_free_layers)} an MLP alone, each with one norm, one residual add and its "
                     "own tensor-parallel collectives")
    if arch.attention_output_gate:
        notes.append("gated attention: the query projection also computes a sigmoid gate on the attention output")
    if strategy.cp > 1:
        how = {"p2p": "passing keys and values around a ring beside the attention (what it does not hide is in the "
                      "layer collectives)",
               "allgather": "gathering every rank's keys and values before the attention (exposed, in the layer "
                            "collectives)",
               "a2a": "trading sequence shards for head shards by all-to-all around the attention (DeepSpeed-Ulysses; "
                      "exposed, in the layer collectives)"}[strategy.cp_comm]
        notes.append(f"context parallel {strategy.cp}: each rank computes {arch.seq_len // strategy.cp} of every "
                     f"{arch.seq_len} tokens and their attention over the whole sequence, {how}; "
                     f"gradients reduced over dp x cp = {strategy.replicas} ranks; no context-parallel step was timed")
    if arch.mtp_layers:
        notes.append(f"{arch.mtp_layers} multi-token prediction module(s) (DeepSeek-V3 Sec. 2.2), each a block, a "
                     "projection and one more LM-head pass, on the last pipeline stage with an embedding copy "
                     "there when pp > 1: priced from their shapes; no MTP step was timed")
    if strategy.a2a_compress != "none" and strategy.ep == 1:
        notes.append(f"a2a_compress {strategy.a2a_compress}{UNUSED}no expert-parallel all-to-all with ep 1")
    if strategy.moe_imbalance != 1.0 and (strategy.ep == 1 or strategy.moe_capacity_factor is not None):
        notes.append(f"moe_imbalance {strategy.moe_imbalance:g}{UNUSED}"
                     + ("one rank holds every expert (ep 1): its grouped GEMMs do the same work however the "
                        "tokens are spread" if strategy.ep == 1 else
                        "experts padded to capacity compute their full buffers whatever the routing"))
    notes += unused
    if seq_default and arch.from_config:
        notes.append(f"sequence {arch.seq_len} tokens: perfsim's training default (min of "
                     f"max_position_embeddings {arch.max_positions} and {DEFAULT_SEQ_LEN}); --seq-len sets it")
    facts["model_note"] = "; ".join(notes)
    return facts


def _check_finite(result: Result) -> None:
    """An overflowing prediction (inf/NaN time or rate) is an error, never a
    printed NaN: it comes from input magnitudes the model cannot represent."""
    bad = [k for k, v in result.summary.items()
           if isinstance(v, float) and not math.isfinite(v) and k not in ("bandwidth_bps",)]
    if bad:
        s = result.summary
        raise ConfigError(f"the prediction overflowed ({bad[0]} = {s[bad[0]]}); check the magnitudes of "
                          f"the inputs (bandwidth {s.get('bandwidth_bps'):g} bit/s, epochs {float(s.get('epochs') or 0):g}, "
                          f"dataset_samples, macro_batch)")


def predict_many(param_dicts: Iterable[dict[str, Any]]) -> list[Result]:
    """``predict`` for each dict, in order."""
    return [predict(**dict(d)) for d in param_dicts]
