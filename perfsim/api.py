"""Public Python API of the simulator.

``predict(**params) -> Result`` takes the same names and values as the flags of
``perfsim predict``, one value each (strings such as ``"100Mbps"`` or plain
numbers in SI units)::

    from perfsim.api import predict
    r = predict(bandwidth="100Mbps", compress="aqsgd:fw3bw6")
    r.summary["throughput_samples_per_s"]

Parameters (defaults = the embedded default: GPT2-1.5B on 8 V100 stages, the
AQ-SGD paper's setting):

===================== ================================================ ==========
model                 preset name (``gpt2-xl``, ``bert-large`` ...)     gpt2-xl
workload              workload file (TOML/JSON), replaces ``model``     None
profile               profile file or name                              default
bandwidth             inter-node link rate                              10Gbps
latency               one-way inter-node latency                        0
topology              heterogeneous topology file (JSON/TOML/CSV)       None
compress              pipeline compression (``aqsgd:fw3bw6``)           fp32
grad_compress         data-parallel gradient compression                none
schedule              ``gpipe``, ``1f1b``, ``interleaved-1f1b``,        gpipe
                      ``zb-h1`` or ``zb-v`` (default: 1f1b, Megatron's,
                      when a ``gpu`` preset is named)
virtual_stages        model chunks per device of interleaved-1f1b       2
                      (the other schedules run their own)
pp, dp                pipeline / data-parallel degree                   8, 1
micro_batch           samples per micro-batch                           1
macro_batch           samples per macro-batch (per replica)             32
epochs                epochs for ``total_s``                            1
partition             layer counts per stage (``"7,6,..."``), ``balanced``  balanced;
                      (by compute) or ``uniform`` (Megatron: equal       uniform with
                      blocks, embedding first, head last)               a ``gpu``
gpus_per_node         devices per node                                  1
intra_node_bandwidth  intra-node rate                                   300GB/s
bucket_size           gradient bucket size (``25MiB``)                  25MiB
overlap               overlap gradient sync with backward               True
nic_sharing           fair-share NICs among concurrent flows            True
dataset_samples       samples per epoch                                 2359
trace                 record a Chrome trace in ``Result.trace_events``  False
link_burst            token-bucket depth of each egress (``50KB``)      0
p2p_protocol          ``eager`` or ``rendezvous`` (receiver-driven)     eager
p2p_control_latency   latency of the rendezvous ready notice            latency
tp                    tensor-parallel degree (Megatron-LM)              1
sequence_parallel     Megatron sequence parallelism (needs tp > 1)      False
gpu                   GPU preset (``a100-sxm4-80gb``, perfsim.hardware) profile's
precision             ``fp32``, ``tf32``, ``bf16``, ``fp16``            fp32
recompute             activation recomputation: none/selective/full     none
global_batch          samples per step over all replicas (sets          None
                      macro_batch = global_batch / dp)
zero                  ZeRO stage (0 or 1: optimizer state sharded)      0
seq_len               sequence length of a transformer model            preset's
placement             rank order, innermost first (``tp,dp,pp`` is      tp,pp,dp;
                      Megatron's; ``tp,pp,dp`` replica-major)           tp,dp,pp with
                                                                        a ``gpu``
allow_oom             predict a configuration that does not fit         False
intra_node_fabric     ``pcie3`` .. ``nvlink4`` (perfsim.fabrics)        None
nic                   node NICs ``[COUNTx]RATE[:KIND]`` (``4x200Gbps``)  None
collective_algo       ``auto``, ``ring``, ``tree``, ``hierarchical``    auto
link_model            ``auto``, ``calibrated``, ``nominal``             auto
comm_slowdown         compute slowdown under communication (0.1)        profile
===================== ================================================ ==========

``model`` also takes an inline transformer (``gpt:layers=96,hidden=12288,heads=96,
seq=2048,vocab=51200``, optional ``ffn=``, ``kv_heads=``; ``llama:`` / ``bert:`` /
``neox:`` conventions) or a Hugging Face ``config.json`` path. A ``gpu`` preset
switches the defaults to Megatron-LM's (1F1B, uniform partition, ranks ordered
tp, dp, pp). With a ``gpu`` the
compute comes from its operator model (:mod:`perfsim.engine.compute`) and the
memory is checked against its capacity (:mod:`perfsim.memory`): a configuration
that does not fit raises :class:`ConfigError` naming the stage and the shortfall.

``predict_many(list_of_param_dicts)`` runs several (profiles and models are
loaded once).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Iterable

from perfsim.config import Strategy, System, Workload
from perfsim.errors import ConfigError
from perfsim.result import Result
from perfsim.schedules import VIRTUAL_STAGE_SCHEDULES
from perfsim.units import parse_bandwidth, parse_size, parse_time

DEFAULTS: dict[str, Any] = {
    "model": "gpt2-xl", "workload": None, "profile": None, "bandwidth": "10Gbps", "latency": "0s",
    "topology": None, "compress": "fp32", "grad_compress": "none", "schedule": None,
    "virtual_stages": None, "pp": 8, "dp": 1, "micro_batch": 1, "macro_batch": None, "epochs": 1, "partition": None,
    "gpus_per_node": 1, "intra_node_bandwidth": "300GB/s", "bucket_size": "25MiB", "overlap": True,
    "nic_sharing": True, "dataset_samples": 2359, "trace": False,
    "link_burst": 0, "p2p_protocol": "eager", "p2p_control_latency": None,
    "tp": 1, "sequence_parallel": False, "gpu": None, "precision": "fp32", "recompute": "none",
    "global_batch": None, "zero": 0, "seq_len": None, "placement": None, "allow_oom": False,
    "intra_node_fabric": None, "nic": None, "collective_algo": "auto", "link_model": "auto",
    "comm_slowdown": None,
}
#: samples per macro-batch when neither macro_batch nor global_batch is given
DEFAULT_MACRO_BATCH = 32


def _file_key(path) -> tuple[str, float]:
    p = Path(path)
    try:
        return str(p.resolve()), p.stat().st_mtime
    except OSError:
        return str(p), 0.0


@functools.lru_cache(maxsize=32)
def _profile(key: tuple[str, float] | None):
    from perfsim.profile import load_profile

    return load_profile(None if key is None else key[0])


def _load_profile(spec):
    from perfsim.profile import Profile, load_profile

    if spec is None or spec in ("", "default"):
        return _profile(None)
    if isinstance(spec, Profile):
        return spec
    if not Path(spec).exists():
        return load_profile(spec)  # a bare name, or a clear error
    return _profile(_file_key(spec))


@functools.lru_cache(maxsize=32)
def _model(model: str | None, workload_key: tuple[str, float] | None, seq_len: int | None = None):
    from perfsim.workload import get_model, load_workload_file

    if workload_key:
        if seq_len:
            raise ConfigError("seq_len: not for a workload file (its layers fix the shapes)")
        return load_workload_file(workload_key[0])
    return get_model(model, seq_len)


@functools.lru_cache(maxsize=32)
def _topology(key: tuple[str, float]):
    from perfsim.network import load_topology

    return load_topology(key[0])


def _int(params, name) -> int:
    v = params[name]
    if isinstance(v, bool):
        raise ConfigError(f"{name}={v!r}: must be an integer")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={v!r}: must be an integer") from None
    if not f.is_integer():
        raise ConfigError(f"{name}={v!r}: must be an integer")
    return int(f)


def _bool(params, name) -> bool:
    v = params[name]
    if isinstance(v, str):
        if v.lower() in ("1", "true", "yes", "on"):
            return True
        if v.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={v!r}: expected true/false")
    return bool(v)


def build_configs(**params) -> tuple[Workload, Strategy, System, Any]:
    """Parse ``params`` (flag names and values) into validated configs + profile."""
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"unknown parameter(s) {sorted(unknown)} (known: {', '.join(DEFAULTS)})")
    p = {**DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    from perfsim.workload import parse_partition, resolve_layer_times

    profile = _load_profile(p["profile"])
    seq_len = None if p["seq_len"] in (None, "") else _int(p, "seq_len")
    if seq_len is not None and seq_len < 1:
        raise ConfigError(f"seq_len={seq_len}: must be >= 1")
    if p["workload"]:
        wkey = _file_key(p["workload"])
        if not os.path.exists(wkey[0]):
            raise ConfigError(f"workload {str(p['workload'])!r}: no such file")
        model = _model(None, wkey, seq_len)
    else:
        name = str(p["model"])
        if name.lower().endswith(".json"):
            if not os.path.exists(name):
                raise ConfigError(f"model {name!r}: no such config.json")
            model = _model(str(_file_key(name)[0]), None, seq_len)
        else:
            model = _model(name if ":" in name else name.lower(), None, seq_len)
    micro_batch = _int(p, "micro_batch")
    if micro_batch < 1:
        raise ConfigError(f"micro_batch={micro_batch}: must be >= 1")
    dp, tp = _int(p, "dp"), _int(p, "tp")
    macro_batch = _batch(p, dp, micro_batch)
    from perfsim.hardware import get_gpu

    gpu = get_gpu(p["gpu"]) if p["gpu"] else None
    precision = str(p["precision"]).lower()
    recompute = str(p["recompute"]).lower()
    sp = _bool(p, "sequence_parallel")
    schedule = str(p["schedule"] or ("1f1b" if p["gpu"] else "gpipe")).lower()
    vstages = (_int(p, "virtual_stages") if p["virtual_stages"] is not None
               and schedule in VIRTUAL_STAGE_SCHEDULES else None)
    from perfsim.schedules import stage_count

    strategy = Strategy(
        pp=_int(p, "pp"), dp=dp, micro_batch=micro_batch, macro_batch=macro_batch,
        schedule=schedule, compress=str(p["compress"]),
        virtual_stages=vstages, grad_compress=str(p["grad_compress"]),
        partition=_partition(p, model, _int(p, "pp") * stage_count(schedule, vstages)),
        bucket_bytes=parse_size(p["bucket_size"], "bucket_size"), overlap_grad_sync=_bool(p, "overlap"),
        epochs=_int(p, "epochs"), dataset_samples=_int(p, "dataset_samples"), tp=tp, sequence_parallel=sp,
        recompute=recompute, precision=precision, zero=_int(p, "zero"),
        placement=tuple(x.strip().lower() for x in str(p["placement"] or
                                                       ("tp,dp,pp" if p["gpu"] else "tp,pp,dp")).split(",")))
    fwd, bwd, source = resolve_layer_times(model, profile, micro_batch, gpu=gpu, precision=precision, tp=tp,
                                           sequence_parallel=sp, recompute=recompute)
    rank_params = None
    if model.arch is not None and tp > 1:
        from perfsim.models.tensor_parallel import shard_block_params

        arch = model.arch
        per = {"block": shard_block_params(arch, tp),
               "embed": arch.embed_params() - arch.vocab * arch.hidden + -(-arch.vocab * arch.hidden // tp),
               "head": arch.head_params() if arch.tied or arch.encoder
               else arch.norm_params() + -(-arch.vocab * arch.hidden // tp)}
        rank_params = tuple(per["block" if layer.name.startswith("block") else layer.name]
                            for layer in model.layers)
    workload = Workload(model.name, model.layers, tuple(fwd), tuple(bwd), model.tokens_per_sample,
                        arch=model.arch, rank_params=rank_params, compute_source=source)
    topology = _topology(_file_key(p["topology"])) if p["topology"] else None
    if p["topology"] and not os.path.exists(str(p["topology"])):
        raise ConfigError(f"topology {str(p['topology'])!r}: no such file")
    given = [k for k in ("bandwidth", "latency") if params.get(k) is not None]
    if p["topology"] and given:
        raise ConfigError(f"topology {str(p['topology'])!r}: its links replace {' and '.join(given)}; "
                          f"give one or the other")
    from perfsim.fabrics import get_fabric, parse_nic

    nic = parse_nic(p["nic"]) if p["nic"] else parse_nic(p["bandwidth"], "bandwidth")
    intra_bps = parse_bandwidth(p["intra_node_bandwidth"], "intra_node_bandwidth")
    intra_lat = System.intra_node_latency_s
    if p["intra_node_fabric"]:
        fabric = get_fabric(p["intra_node_fabric"])
        intra_bps, intra_lat = fabric.bandwidth_bps, fabric.latency_s
    slowdown = p["comm_slowdown"]
    if slowdown is not None:
        try:
            slowdown = float(slowdown)
        except (TypeError, ValueError):
            raise ConfigError(f"comm_slowdown={p['comm_slowdown']!r}: must be a number >= 0") from None
    system = System(bandwidth_bps=nic.total_bps, latency_s=parse_time(p["latency"], "latency"),
                    gpus_per_node=_int(p, "gpus_per_node"),
                    intra_node_bandwidth_bps=intra_bps, intra_node_latency_s=intra_lat,
                    nic_kind=nic.kind, nics_per_node=nic.count,
                    collective_algo=str(p["collective_algo"]).lower(), link_model=str(p["link_model"]).lower(),
                    comm_slowdown=slowdown,
                    topology=topology, nic_sharing=_bool(p, "nic_sharing"),
                    link_burst_bytes=float(parse_size(p["link_burst"], "link_burst")),
                    p2p_protocol=str(p["p2p_protocol"]).lower(),
                    p2p_control_latency_s=None if p["p2p_control_latency"] is None else
                    parse_time(p["p2p_control_latency"], "p2p_control_latency"),
                    gpu=gpu.name if gpu else None)
    return workload, strategy, system, profile


def _partition(p, model, pp: int):
    """Layer counts per stage (``pp``: the pipeline's stages, model chunks): given, ``balanced`` (None: by compute), or ``uniform``
    -- Megatron-LM's split of a transformer: ``L / pp`` blocks per stage (the remainder
    to the first stages), the embedding on the first stage and the head on the last.
    The default is ``uniform`` for a transformer with a GPU preset, else ``balanced``."""
    from perfsim.workload import parse_partition

    raw = p["partition"]
    if raw is None and p["gpu"] and model.arch is not None:
        raw = "uniform"
    if str(raw).lower() != "uniform":
        return parse_partition(raw)
    blocks = sum(1 for layer in model.layers if layer.name.startswith("block"))
    if blocks < pp:
        raise ConfigError(f"partition=uniform: {blocks} blocks cannot fill {pp} stages")
    counts = [blocks // pp + (1 if s < blocks % pp else 0) for s in range(pp)]
    counts[0] += 1
    counts[-1] += len(model.layers) - blocks - 1
    return tuple(counts)


def _batch(p, dp: int, micro_batch: int) -> int:
    """macro_batch per replica from ``macro_batch`` and/or ``global_batch``, checked:
    global = dp x micro_batch x accumulation steps."""
    gb = None if p["global_batch"] in (None, "") else _int(p, "global_batch")
    mb_given = p["macro_batch"] not in (None, "")
    macro = _int(p, "macro_batch") if mb_given else None
    if gb is None:
        return macro if macro is not None else DEFAULT_MACRO_BATCH
    if gb < 1 or gb % (dp * micro_batch):
        raise ConfigError(f"global_batch={gb}: must be a multiple of dp x micro_batch = {dp} x {micro_batch}"
                          f" = {dp * micro_batch} (global = dp x micro-batch x accumulation steps)")
    if macro is not None and macro * dp != gb:
        raise ConfigError(f"global_batch={gb}: disagrees with macro_batch={macro} x dp={dp} = {macro * dp}")
    return gb // dp



def predict(**params) -> Result:
    """Simulate one configuration (see the module docstring for parameters)."""
    from perfsim.engine import simulate

    trace = bool(params.pop("trace", False))
    allow_oom = params.pop("allow_oom", False)
    allow_oom = _bool({"allow_oom": allow_oom}, "allow_oom")
    workload, strategy, system, profile = build_configs(**params)
    result = simulate(workload, strategy, system, profile, trace=trace, allow_oom=allow_oom)
    if params.get("topology"):
        result.summary["topology"] = str(params["topology"])
    _check_finite(result)
    return result


def _check_finite(result: Result) -> None:
    """An overflowing prediction (inf/NaN time or rate) is an error, never a
    printed NaN: it comes from input magnitudes the model cannot represent."""
    import math

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
