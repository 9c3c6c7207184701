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

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from perfsim.boundaries import parse_boundary_compress
from perfsim.errors import ConfigError
from perfsim.models.registry import get_model_spec
from perfsim.outputs import check_dir_target, locked_dir
from perfsim.params import parse_device_order, run_job
from perfsim.partition import parse_counts, uniform_counts
from perfsim.result import Result
from perfsim.runtime.config import RunConfig
from perfsim.runtime.launch import launch_local
from perfsim.runtime.measure import OUTPUT_FILES, load_result
from perfsim.schedules import stage_count
from perfsim.units import parse_bandwidth, parse_time

_ALIASES = {"bandwidth": "emulate_bandwidth", "latency": "emulate_latency", "timeout": "timeout_s",
            "hang_timeout": "hang_timeout_s"}


#: the output folder a config built only to be checked names when none is given: never created
#: (:func:`make_config`); :func:`run` makes a fresh temporary folder instead
UNSET_OUT = os.path.join(tempfile.gettempdir(), "perfsim-run-unset")


def make_config(create_out: bool = False, **params: Any):
    """Build a validated :class:`~perfsim.runtime.config.RunConfig` from flag-style params.
    Without ``out``: a fresh temporary folder when ``create_out`` (what :func:`run` trains into),
    else :data:`UNSET_OUT`, never created -- checking a job leaves nothing behind (it left an
    empty ``perfsim-run-*`` folder in the temporary directory on every call)."""
    params = {_ALIASES.get(k, k): v for k, v in params.items() if v is not None}
    params.pop("overwrite", None)  # what run() does with an earlier run's folder, not part of the job
    bw = params.pop("emulate_bandwidth", None)
    lat = params.pop("emulate_latency", None)
    if bw is not None:
        params["bandwidth_bps"] = parse_bandwidth(bw, "--emulate-bandwidth")
    if lat is not None:
        params["latency_s"] = parse_time(lat, "--emulate-latency")
        if bw is None and params["latency_s"] > 0:
            raise ConfigError("--emulate-latency needs --emulate-bandwidth")
    if "boundary_compress" in params:  # parsed once, a value (its text: as perfsim predict prints it)
        params["boundary_compress"] = parse_boundary_compress(params["boundary_compress"]) or None
    params.update(run_job(params))  # the job, parsed as perfsim predict parses it (perfsim.params.PARAMS)
    if "timeout_s" in params:
        params["timeout_s"] = parse_time(params["timeout_s"], "--timeout", allow_zero=False)
    if "hang_timeout_s" in params:
        params["hang_timeout_s"] = parse_time(params["hang_timeout_s"], "--hang-timeout", allow_zero=False)
    if params.get("resume") is not None:
        params["resume"] = str(params["resume"])
        from perfsim.runtime import checkpoint  # lazy: perfsim.runtime.checkpoint loads torch

        root, meta = checkpoint.find(params["resume"])  # a clear error before any rank starts
        meta = dict(meta, config=_stored_config(meta.get("config") or {}))
        params = _from_checkpoint(meta, params)
        if params.get("out") is None:  # the run folder that owns the checkpoint, never the step folder
            params["out"] = str(checkpoint.run_folder(root))
    if params.get("partition") == "uniform":  # Megatron-LM's split, as perfsim predict makes it
        spec = get_model_spec(params.get("model", _default("model")))
        schedule = params.get("schedule", _default("schedule"))
        stages = params.get("pp", _default("pp")) * stage_count(schedule, params.get("virtual_stages"))
        params["partition"] = uniform_counts([layer.name for layer in spec.layers()], stages)
    if params.get("device") == "cuda":
        import torch  # lazy: torch is heavy, needed only here

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA GPU is visible here (use --device cpu)")
    if params.get("out") is None:
        params["out"] = tempfile.mkdtemp(prefix="perfsim-run-") if create_out else UNSET_OUT
    params["out"] = str(params["out"])
    check_dir_target(params["out"], "--out")
    cfg = RunConfig.from_dict(params)
    if cfg.resume is not None:
        from perfsim.runtime import checkpoint  # lazy: perfsim.runtime.checkpoint loads torch

        checkpoint.check_compatible(meta, json.loads(cfg.to_json()), RunConfig.RESUME_KEYS,
                                    RunConfig.RESUME_DEFAULTS)
    return cfg


def _default(name: str):
    """RunConfig's default of field ``name`` (the job's: perfsim.job.Job)."""
    return {f.name: f.default for f in dataclasses.fields(RunConfig)}[name]


def _stored_config(stored: dict) -> dict:
    """A checkpoint's stored config in the value forms of today's RunConfig JSON: a run
    written before the job's values were parsed once stored ``device_order`` /
    ``partition`` as text, one before ``--epochs`` counted whole epochs a float."""
    out = dict(stored)
    if isinstance(out.get("device_order"), str):
        order = parse_device_order(out["device_order"], "device_order")
        out["device_order"] = list(order) if order else None
    if isinstance(out.get("partition"), str):
        counts = parse_counts(out["partition"])
        out["partition"] = list(counts) if counts else None
    if isinstance(out.get("epochs"), float) and out["epochs"].is_integer():  # --epochs was a float until issue 38
        out["epochs"] = int(out["epochs"])
    return out


def _json_value(v):
    """A value as the config's JSON holds it (tuples are lists)."""
    return list(v) if isinstance(v, tuple) else v


#: what a resumed run takes from its checkpoint's stored config unless given again; these
#: may change on resume (train longer, checkpoint more often, another emulated link)
RUN_KEYS = ("steps", "epochs", "checkpoint_every", "bandwidth_bps", "latency_s", "timeout_s",
            "hang_timeout_s", "device")


def _from_checkpoint(meta: dict, params: dict) -> dict:
    """``params`` of a resumed run completed from the checkpoint's stored config: the job
    (:attr:`RunConfig.RESUME_KEYS`: model, parallelism, compression, batch, seed...) comes
    from the checkpoint, and a job flag given again must agree (one line naming the flag,
    its stored and its given value); the :data:`RUN_KEYS` given now win, the others are
    the stored ones (``--steps`` or ``--epochs`` given now replaces both stored ones)."""
    stored = dict(meta.get("config") or {})
    field_defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)
                      if f.default is not dataclasses.MISSING}
    merged = dict(params)
    for k in RunConfig.RESUME_KEYS:
        if k not in stored and k not in RunConfig.RESUME_DEFAULTS:
            continue  # a checkpoint older than the key: the run's value stands (checked later)
        was = stored.get(k, RunConfig.RESUME_DEFAULTS.get(k))
        if k == "boundary_compress" and params.get(k) is not None:  # stored as its canonical text
            params = {**params, k: params[k].text}
        if k == "placement" and isinstance(params.get(k), str):  # the flag's text
            params = {**params, k: tuple(x.strip().lower() for x in params[k].split(","))}
        if k in params and _json_value(params[k]) != was:
            flag = "--" + k.replace("_", "-")
            raise ConfigError(f"{flag} {params[k]!r}: the checkpoint's run has {flag} {was!r} (--resume takes "
                              f"the job from the checkpoint: leave {flag} out, or start a new run elsewhere)")
        merged[k] = was
    if "steps" in params or "epochs" in params:
        stored.pop("steps", None)
        stored.pop("epochs", None)
    for k in RUN_KEYS:
        if k not in params and stored.get(k, field_defaults.get(k)) is not None:
            merged[k] = stored.get(k, field_defaults.get(k))
    return merged


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run(progress: Callable[[dict], None] | None = None, overwrite: bool = False, **params: Any) -> Result | None:
    """Train for real and return the measured Result (``source="measured"``).

    Writes ``out/result.json``, ``summary.csv``, ``stages.csv``,
    ``microbatches.csv``, ``links.csv``, ``losses.csv``, ``trace.json`` and the
    checkpoint ``out/ckpt``. ``progress`` is called with ``{"step", "steps",
    "loss"}`` as training advances (local launch only).

    A run never replaces another silently: an ``out`` that holds an earlier run's
    results or checkpoints is refused (:class:`ConfigError`) unless ``resume``
    continues that run there or ``overwrite=True`` removes them first (``ckpt/``
    included, so two runs' checkpoints never mix). ``resume`` takes the job from the
    checkpoint (:func:`make_config`) and writes into the run folder that owns it.
    """
    if under_torchrun() and params.get("out") is None and params.get("resume") is None:
        raise ConfigError("perfsim run under torchrun needs --out: one folder name for every rank (each writes "
                          "its checkpoint there; without it each rank would make a temporary folder of its own "
                          "and --resume would find one rank's)")
    cfg = make_config(create_out=True, **params)
    if under_torchrun():
        if cfg.bandwidth_bps is not None:
            raise ConfigError("--emulate-bandwidth starts its own ranks; do not combine it with torchrun")
        import torch.distributed as dist  # lazy: loads torch

        from perfsim.runtime.worker import init_and_train  # lazy: perfsim.runtime.worker loads torch

        if dist.is_available() and dist.is_initialized():
            raise ConfigError("perfsim.runtime.run under torchrun joins a process group of its own, and this "
                              "process already holds one: call run() before dist.init_process_group(), or "
                              "after dist.destroy_process_group()")
        claim_out(cfg, overwrite)  # every rank, before the rendezvous: nothing is written yet
        init_and_train(cfg)
        return load_result(cfg.out) if int(os.environ["RANK"]) == 0 else None
    with locked_dir(cfg.out, "--out"):  # a second run on the same folder is refused
        claim_out(cfg, overwrite)
        launch_local(cfg, progress=progress)
        return load_result(cfg.out)


def earlier_run(out: str | Path) -> list[str]:
    """What folder ``out`` holds of an earlier run (its result files, ``ckpt/``), in words;
    empty when nothing."""
    out = Path(out)
    files = [name for name in OUTPUT_FILES if (out / name).exists()]
    held = ["result.json" if "result.json" in files else files[0]] if files else []
    if len(files) > 1:
        held[0] += f" and {len(files) - 1} more result files"
    ckpt = out / "ckpt"
    if ckpt.is_dir() and any(ckpt.iterdir()):
        held.append("ckpt/")
    return held


def claim_out(cfg, overwrite: bool = False) -> None:
    """Refuse an ``out`` holding an earlier run (one line naming what it holds and the
    flags that continue or replace it), or, with ``overwrite``, remove that run's
    results and checkpoints first."""
    out = Path(cfg.out)
    if overwrite and cfg.resume is not None:
        raise ConfigError("--overwrite with --resume: --resume continues the run in its folder, "
                          "--overwrite replaces it; give one")
    held = earlier_run(out)
    if not held:
        return
    if cfg.resume is not None:
        from perfsim.runtime import checkpoint  # lazy: perfsim.runtime.checkpoint loads torch

        owner = checkpoint.run_folder(checkpoint.find(cfg.resume)[0])
        if owner.resolve() == out.resolve():
            return  # continuing that run in its own folder
        raise ConfigError(f"--out {str(out)!r}: holds another run ({', '.join(held)}); leave --out out to "
                          f"continue in {str(owner)!r}, or choose an empty folder")
    if not overwrite:
        raise ConfigError(f"--out {str(out)!r}: holds an earlier run ({', '.join(held)}); continue it with "
                          f"--resume {out}, replace it with --overwrite, or choose another folder")
    for name in OUTPUT_FILES:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "ckpt", ignore_errors=True)
