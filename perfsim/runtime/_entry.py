"""Entry points of execute mode, exported by :mod:`perfsim.runtime` (import them
from there): ``perfsim.runtime.run(**params) -> Result``.

Parameters have the names and values of ``perfsim run``'s flags (one value
each; ``"100Mbps"`` / ``"5ms"`` strings or SI numbers)::

    from perfsim.runtime import run
    r = run(model="digits-mlp", pp=2, compress="aqsgd:fw3bw6", steps=20,
            emulate_bandwidth="100Mbps", emulate_latency="5ms", out="runs/a")
    r.summary["throughput_samples_per_s"]

``bandwidth`` / ``latency`` are accepted as aliases of ``emulate_bandwidth`` /
``emulate_latency`` (the names ``perfsim.api.predict`` uses), so one parameter
dict can describe a prediction and its measurement.

Under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` in the environment) the calling
process *is* a rank: it trains in-process, and rank 0 returns the Result
(other ranks return None).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable

from perfsim.errors import ConfigError
from perfsim.result import Result
from perfsim.units import parse_bandwidth, parse_time

_ALIASES = {"bandwidth": "emulate_bandwidth", "latency": "emulate_latency", "timeout": "timeout_s",
            "hang_timeout": "hang_timeout_s"}


def make_config(**params: Any):
    """Build a validated :class:`~perfsim.runtime.config.RunConfig` from flag-style params."""
    from perfsim.runtime.config import RunConfig

    params = {_ALIASES.get(k, k): v for k, v in params.items() if v is not None}
    bw = params.pop("emulate_bandwidth", None)
    lat = params.pop("emulate_latency", None)
    if bw is not None:
        params["bandwidth_bps"] = parse_bandwidth(bw, "--emulate-bandwidth")
    if lat is not None:
        params["latency_s"] = parse_time(lat, "--emulate-latency")
        if bw is None and params["latency_s"] > 0:
            raise ConfigError("--emulate-latency needs --emulate-bandwidth")
    if "boundary_compress" in params:  # canonical text, as perfsim predict prints it
        from perfsim.boundaries import canonical

        params["boundary_compress"] = canonical(params["boundary_compress"]) or None
    if "device_order" in params:
        from perfsim.params import parse_device_order

        order = parse_device_order(params["device_order"], "--device-order")
        params["device_order"] = ",".join(map(str, order)) if order else None
    if "timeout_s" in params:
        params["timeout_s"] = parse_time(params["timeout_s"], "--timeout", allow_zero=False)
    if "hang_timeout_s" in params:
        params["hang_timeout_s"] = parse_time(params["hang_timeout_s"], "--hang-timeout", allow_zero=False)
    if params.get("out") is None:
        params["out"] = params.get("resume") or tempfile.mkdtemp(prefix="perfsim-run-")
    params["out"] = str(params["out"])
    from perfsim.outputs import check_dir_target

    check_dir_target(params["out"], "--out")
    if params.get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA GPU is visible here (use --device cpu)")
    if params.get("resume") is not None:
        params["resume"] = str(params["resume"])
        from perfsim.runtime import checkpoint

        _, meta = checkpoint.find(params["resume"])  # a clear error before any rank starts
        cfg = RunConfig.from_dict(params)
        checkpoint.check_compatible(meta, json.loads(cfg.to_json()), RunConfig.RESUME_KEYS,
                                    RunConfig.RESUME_DEFAULTS)
        return cfg
    return RunConfig.from_dict(params)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run(progress: Callable[[dict], None] | None = None, **params: Any) -> Result | None:
    """Train for real and return the measured Result (``source="measured"``).

    Writes ``out/result.json``, ``summary.csv``, ``stages.csv``,
    ``microbatches.csv``, ``links.csv``, ``losses.csv``, ``trace.json`` and the
    checkpoint ``out/ckpt``. ``progress`` is called with ``{"step", "steps",
    "loss"}`` as training advances (local launch only).
    """
    from perfsim.runtime.measure import load_result

    cfg = make_config(**params)
    if under_torchrun():
        if cfg.bandwidth_bps is not None:
            raise ConfigError("--emulate-bandwidth starts its own ranks; do not combine it with torchrun")
        from perfsim.runtime.worker import init_and_train

        init_and_train(cfg)
        return load_result(cfg.out) if int(os.environ["RANK"]) == 0 else None
    from perfsim.outputs import locked_dir
    from perfsim.runtime.launch import launch_local

    with locked_dir(cfg.out, "--out"):  # a second run on the same folder is refused
        launch_local(cfg, progress=progress)
        return load_result(cfg.out)
