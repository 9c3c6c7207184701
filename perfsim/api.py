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
schedule              ``gpipe`` or ``1f1b``                             gpipe
pp, dp                pipeline / data-parallel degree                   8, 1
micro_batch           samples per micro-batch                           1
macro_batch           samples per macro-batch (per replica)             32
epochs                epochs for ``total_s``                            1
partition             layer counts per stage (``"7,6,..."``)            balanced
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
intra_node_fabric     ``pcie3`` .. ``nvlink4`` (perfsim.fabrics)        None
nic                   node NICs ``[COUNTx]RATE[:KIND]`` (``4x200Gbps``)  None
collective_algo       ``auto``, ``ring``, ``tree``, ``hierarchical``    auto
link_model            ``auto``, ``calibrated``, ``nominal``             auto
comm_slowdown         compute slowdown under communication (0.1)        profile
===================== ================================================ ==========

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
from perfsim.units import parse_bandwidth, parse_size, parse_time

DEFAULTS: dict[str, Any] = {
    "model": "gpt2-xl", "workload": None, "profile": None, "bandwidth": "10Gbps", "latency": "0s",
    "topology": None, "compress": "fp32", "grad_compress": "none", "schedule": "gpipe",
    "pp": 8, "dp": 1, "micro_batch": 1, "macro_batch": 32, "epochs": 1, "partition": None,
    "gpus_per_node": 1, "intra_node_bandwidth": "300GB/s", "bucket_size": "25MiB", "overlap": True,
    "nic_sharing": True, "dataset_samples": 2359, "trace": False,
    "link_burst": 0, "p2p_protocol": "eager", "p2p_control_latency": None,
    "intra_node_fabric": None, "nic": None, "collective_algo": "auto", "link_model": "auto",
    "comm_slowdown": None,
}


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
def _model(model: str | None, workload_key: tuple[str, float] | None):
    from perfsim.workload import get_model, load_workload_file

    return load_workload_file(workload_key[0]) if workload_key else get_model(model)


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
    from perfsim.workload import layer_times, parse_partition

    profile = _load_profile(p["profile"])
    if p["workload"]:
        wkey = _file_key(p["workload"])
        if not os.path.exists(wkey[0]):
            raise ConfigError(f"workload {str(p['workload'])!r}: no such file")
        model = _model(None, wkey)
    else:
        model = _model(str(p["model"]).lower(), None)
    micro_batch = _int(p, "micro_batch")
    if micro_batch < 1:
        raise ConfigError(f"micro_batch={micro_batch}: must be >= 1")
    fwd, bwd = layer_times(model, profile, micro_batch)
    workload = Workload(model.name, model.layers, tuple(fwd), tuple(bwd), model.tokens_per_sample)
    strategy = Strategy(
        pp=_int(p, "pp"), dp=_int(p, "dp"), micro_batch=micro_batch, macro_batch=_int(p, "macro_batch"),
        schedule=str(p["schedule"]).lower(), compress=str(p["compress"]),
        grad_compress=str(p["grad_compress"]), partition=parse_partition(p["partition"]),
        bucket_bytes=parse_size(p["bucket_size"], "bucket_size"), overlap_grad_sync=_bool(p, "overlap"),
        epochs=_int(p, "epochs"), dataset_samples=_int(p, "dataset_samples"))
    topology = _topology(_file_key(p["topology"])) if p["topology"] else None
    if p["topology"] and not os.path.exists(str(p["topology"])):
        raise ConfigError(f"topology {str(p['topology'])!r}: no such file")
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
                    parse_time(p["p2p_control_latency"], "p2p_control_latency"))
    return workload, strategy, system, profile


def predict(**params) -> Result:
    """Simulate one configuration (see the module docstring for parameters)."""
    from perfsim.engine import simulate

    trace = bool(params.pop("trace", False))
    workload, strategy, system, profile = build_configs(**params)
    result = simulate(workload, strategy, system, profile, trace=trace)
    if params.get("topology"):
        result.summary["topology"] = str(params["topology"])
    return result


def predict_many(param_dicts: Iterable[dict[str, Any]]) -> list[Result]:
    """``predict`` for each dict, in order."""
    return [predict(**dict(d)) for d in param_dicts]
