"""Machine metadata stored in a profile's ``metadata`` block.

A profile is only meaningful for the machine it was measured on, so every
profile records what that machine was: device name, core count, library
versions (torch, triton, NCCL / gloo), the date, and the perfsim version and
git commit that measured it. Reading the metadata back tells a user whether a
profile fits the machine they want to predict for.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware, cgroup quota ignored)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _git_commit() -> str | None:
    """Commit of the perfsim checkout (None outside a git work tree)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5)
    return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def other_cpu(metadata: dict[str, Any]) -> str | None:
    """What differs between this machine's CPU and the one a CPU profile's ``metadata`` was
    measured on (model name, usable cores), in words; None when they agree or the profile
    was measured on a GPU (its CPU is not what it times)."""
    if metadata.get("device", "cpu") != "cpu" or not metadata.get("cpu_model"):
        return None
    here, cores = _cpu_model(), usable_cores()
    if metadata.get("cpu_model") == here and metadata.get("cores") in (None, cores):
        return None
    return (f"calibrated on {metadata['cpu_model']} ({metadata.get('cores', '?')} cores), "
            f"this machine is {here} ({cores} cores)")


def machine_metadata(device: str | None = None) -> dict[str, Any]:
    """Describe the machine and software that a profile is measured with.

    ``device`` is ``"cuda"`` or ``"cpu"`` (default: cuda when available).
    Keys: ``device``, ``device_name``, ``device_count``, ``cpu_model``, ``cores``,
    ``hostname``, ``os``, ``python``, ``torch``, ``triton``, ``nccl``,
    ``backend`` (nccl on GPU, gloo on CPU), ``torch_threads``, ``date`` (UTC,
    ISO 8601), ``perfsim``, ``git_commit``, ``load_average`` (1/5/15 min at the
    start: a loaded machine measures slower, and the reader should know).
    """
    import torch

    import perfsim

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = device == "cuda" and torch.cuda.is_available()
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional
        triton_version = None
    nccl = None
    if on_gpu:
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            nccl = None
    return {
        "device": "cuda" if on_gpu else "cpu",
        "device_name": torch.cuda.get_device_name(0) if on_gpu else _cpu_model(),
        "device_count": torch.cuda.device_count() if on_gpu else 1,
        "cpu_model": _cpu_model(),
        "cores": usable_cores(),
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "nccl": nccl,
        "backend": "nccl" if on_gpu else "gloo",
        "torch_threads": torch.get_num_threads(),
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "perfsim": perfsim.__version__,
        "git_commit": _git_commit(),
        "load_average": _load_average(),
    }
