"""Checkpoints that resume bit-for-bit.

Layout under ``<out>/ckpt/``::

    step00000012/rank0.pt ... rankN.pt   one file per rank (torch.save)
    latest.json                          {"step": 12, "world_size": N, "config": {...}}

Every rank writes its own file atomically (temp file + rename) and confirms
it through a collective (:func:`perfsim.runtime.worker` gathers every rank's
outcome), so no rank looks for another's file: nodes need no shared
filesystem. Then every rank atomically writes ``stepN/commit.json`` and
``latest.json`` on its own disk (the same bytes on a shared one), the commit
point. A run that dies while saving leaves the previous ``latest.json`` and its
files untouched. The last two complete checkpoints are kept (each rank prunes
its own older files), so when the newest is damaged the previous one resumes:
``--resume OUT/ckpt/stepN``; a corrupt file is reported in one line naming it.

A rank's state: model and optimizer ``state_dict``, the four stage-boundary
compressors' ``state_dict`` (AQ-SGD message buffers on both sides -- ``disk=``
buffers copied into ``stepN/rankR-buffers/`` --, error feedback, random counters), the gradient-sync state (per-bucket error
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


def buffers_dir(root: str | Path, step: int, rank: int) -> Path:
    """Where one rank's checkpoint keeps copies of files its state refers to (AQ-SGD's
    ``disk=`` buffers, :func:`perfsim.compression.aqsgd_store.snapshot_into`); pruned with
    the rank's file."""
    return step_dir(root, step) / f"rank{rank}-buffers"


def save_rank(root: str | Path, step: int, rank: int, state: dict[str, Any]) -> Path:
    """Write one rank's state for the checkpoint taken after ``step`` steps."""
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "version": VERSION, **state}, buf)
    path = step_dir(root, step) / f"rank{rank}.pt"
    atomic_write_bytes(path, buf.getvalue())
    return path


def commit(root: str | Path, step: int, world_size: int, config: dict[str, Any], rank: int = 0,
           previous: dict[str, Any] | None = None) -> None:
    """Mark the checkpoint of ``step`` complete on this rank's disk, once
    every rank confirmed its save (a collective, not a look at files), and
    prune this rank's files of checkpoints older than the last two.
    ``previous``: :func:`latest` read *before* the confirming collective (on a
    shared disk another rank may already have committed)."""
    root = Path(root)
    meta = json.dumps({"format": FORMAT, "version": VERSION, "step": int(step), "world_size": int(world_size),
                       "config": config}, indent=1, sort_keys=True)
    atomic_write_text(step_dir(root, step) / "commit.json", meta)
    atomic_write_text(root / "latest.json", meta)
    keep = {step_dir(root, step).name}
    if previous is not None:
        keep.add(step_dir(root, previous["step"]).name)
    for d in root.iterdir():
        if d.is_dir() and _STEP_DIR.fullmatch(d.name) and d.name not in keep:
            (d / f"rank{rank}.pt").unlink(missing_ok=True)
            shutil.rmtree(buffers_dir(root, int(d.name[4:]), rank), ignore_errors=True)
            try:
                emptied = not any(d.glob("rank*.pt"))
            except FileNotFoundError:  # on a shared disk another rank removed the folder first
                continue
            if emptied:  # the last rank out removes the folder
                shutil.rmtree(d, ignore_errors=True)


def latest(root: str | Path) -> dict[str, Any] | None:
    """The committed checkpoint's metadata, or None when there is none."""
    path = Path(root) / "latest.json"
    if not path.exists():
        return None
    return _read_meta(path)


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"checkpoint {path}: unreadable ({exc})") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ConfigError(f"checkpoint {path}: format {meta.get('format')!r} version "
                          f"{meta.get('version')!r} is not {FORMAT} v{VERSION}")
    return meta


def find(resume: str | Path) -> tuple[Path, dict[str, Any]]:
    """Locate the checkpoint of ``--resume DIR``: DIR or DIR/ckpt (the newest),
    or a step folder DIR/ckpt/stepN (that one)."""
    resume = Path(resume)
    if _STEP_DIR.fullmatch(resume.name) and (resume / "commit.json").exists():
        meta = _read_meta(resume / "commit.json")
        return resume.parent, meta
    for root in (resume / "ckpt", resume):
        meta = latest(root)
        if meta is not None:
            return root, meta
    raise ConfigError(f"resume {str(resume)!r}: no checkpoint (no ckpt/latest.json)")


def run_folder(root: str | Path) -> Path:
    """The run folder that owns checkpoint folder ``root`` (``OUT`` of ``OUT/ckpt``): where a
    run resumed from any of its checkpoints writes its outputs and new checkpoints, so a
    resume from ``OUT/ckpt/stepN`` never nests a run inside a checkpoint."""
    root = Path(root)
    return root.parent if root.name == "ckpt" else root


def _previous(root: Path, step: int) -> Path | None:
    steps = sorted(int(m.group(1)) for d in root.iterdir()
                   if (m := _STEP_DIR.fullmatch(d.name)) and (d / "commit.json").exists())
    older = [s for s in steps if s < step]
    return step_dir(root, older[-1]) if older else None


def check_compatible(meta: dict[str, Any], config: dict[str, Any], keys,
                     defaults: dict[str, Any] | None = None) -> None:
    """A checkpoint resumes only the same job (model, parallelism, compression...);
    ``defaults``: the value of a key that a checkpoint written before the key existed lacks."""
    saved = meta.get("config", {})
    for k in keys:
        if saved.get(k, (defaults or {}).get(k)) != config.get(k):
            raise ConfigError(f"resume: checkpoint has {k}={saved.get(k)!r}, this run {k}={config.get(k)!r}")


def load_rank(root: str | Path, step: int, rank: int) -> dict[str, Any]:
    path = step_dir(root, step) / f"rank{rank}.pt"
    if not path.exists():
        raise ConfigError(f"checkpoint {path}: missing")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # truncated / overwritten: torch's message is not the user's business
        prev = _previous(Path(root), step)
        hint = f"; the previous checkpoint is intact: --resume {prev}" if prev else ""
        raise ConfigError(f"checkpoint {path}: corrupt or unreadable ({type(exc).__name__}){hint}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("version") != VERSION:
        raise ConfigError(f"checkpoint {path}: not a {FORMAT} v{VERSION} file")
    return state
