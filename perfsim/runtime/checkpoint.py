"""Checkpoints that resume bit-for-bit.

Layout under ``<out>/ckpt/``::

    step00000012/rank0.pt ... rankN.pt   one file per rank (torch.save)
    latest.json                          {"step": 12, "world_size": N, "config": {...}}

Every rank writes its own file atomically (temp file + rename); after a barrier
rank 0 atomically rewrites ``latest.json``, which is the commit point. A run
that dies while saving leaves the previous ``latest.json`` and its files
untouched, so the last checkpoint is always intact. The previous complete
checkpoint is kept as well; older ones are removed.

A rank's state: model and optimizer ``state_dict``, the four stage-boundary
compressors' ``state_dict`` (AQ-SGD message buffers on both sides, error
feedback, random counters), the gradient-sync state (per-bucket error
feedback), torch's RNG state, the next step and the loss history. The data
order is a pure function of ``(seed, step)`` (:class:`perfsim.runtime.data.Order`),
so the step number restores it.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from perfsim.errors import ConfigError
from perfsim.result import atomic_write_bytes, atomic_write_text

FORMAT = "perfsim-checkpoint"
VERSION = 1
_STEP_DIR = re.compile(r"step(\d{8})")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step{int(step):08d}"


def save_rank(root: str | Path, step: int, rank: int, state: dict[str, Any]) -> Path:
    """Write one rank's state for the checkpoint taken after ``step`` steps."""
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "version": VERSION, **state}, buf)
    path = step_dir(root, step) / f"rank{rank}.pt"
    atomic_write_bytes(path, buf.getvalue())
    return path


def commit(root: str | Path, step: int, world_size: int, config: dict[str, Any]) -> None:
    """Mark the checkpoint of ``step`` complete (rank 0, after every rank saved)."""
    root = Path(root)
    for r in range(world_size):
        if not (step_dir(root, step) / f"rank{r}.pt").exists():
            raise RuntimeError(f"checkpoint step {step}: rank {r}'s file is missing")
    previous = latest(root)
    atomic_write_text(root / "latest.json", json.dumps(
        {"format": FORMAT, "version": VERSION, "step": int(step), "world_size": int(world_size),
         "config": config}, indent=1, sort_keys=True))
    keep = {step_dir(root, step).name}
    if previous is not None:
        keep.add(step_dir(root, previous["step"]).name)
    for d in root.iterdir():
        if d.is_dir() and _STEP_DIR.fullmatch(d.name) and d.name not in keep:
            shutil.rmtree(d, ignore_errors=True)


def latest(root: str | Path) -> dict[str, Any] | None:
    """The committed checkpoint's metadata, or None when there is none."""
    path = Path(root) / "latest.json"
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"checkpoint {path}: unreadable ({exc})") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ConfigError(f"checkpoint {path}: format {meta.get('format')!r} version "
                          f"{meta.get('version')!r} is not {FORMAT} v{VERSION}")
    return meta


def find(resume: str | Path) -> tuple[Path, dict[str, Any]]:
    """Locate the checkpoint of ``--resume DIR`` (DIR or DIR/ckpt)."""
    resume = Path(resume)
    for root in (resume / "ckpt", resume):
        meta = latest(root)
        if meta is not None:
            return root, meta
    raise ConfigError(f"resume {str(resume)!r}: no checkpoint (no ckpt/latest.json)")


def check_compatible(meta: dict[str, Any], config: dict[str, Any], keys) -> None:
    """A checkpoint resumes only the same job (model, parallelism, compression...)."""
    saved = meta.get("config", {})
    for k in keys:
        if saved.get(k) != config.get(k):
            raise ConfigError(f"resume: checkpoint has {k}={saved.get(k)!r}, this run {k}={config.get(k)!r}")


def load_rank(root: str | Path, step: int, rank: int) -> dict[str, Any]:
    path = step_dir(root, step) / f"rank{rank}.pt"
    if not path.exists():
        raise ConfigError(f"checkpoint {path}: missing")
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") != FORMAT or state.get("version") != VERSION:
        raise ConfigError(f"checkpoint {path}: not a {FORMAT} v{VERSION} file")
    return state
