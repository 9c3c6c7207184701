"""What determines an answer: the key under which a stored result may be reused.

A stored row -- a sweep's finished configuration, a validation grid's measured run
-- is reused only while everything that determines it is unchanged: its parameters
(the caller's own id of them: a sweep's ``config_id``), perfsim's version, and the
content of every input file it read (profile, topology, workload file, model
``config.json``), hashed with SHA-256 (FIPS 180-4). A file edited in place keeps
its name and its parameters: only its content tells the two answers apart.

:func:`input_key` builds the key as one line of text, ``perfsim=0.1.0;profile=<16
hex digits of its sha256>;...`` (a column of a table, a field of a JSON line);
:func:`stale_reasons` says in words why a stored key no longer holds, and
:func:`stale_notes` makes the one-line notes a command prints before recomputing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import perfsim  # perfsim.__version__ read on use (a test or an edited install may change it)
from perfsim.documents import file_sha256, file_stamp

#: hex digits kept of each SHA-256 (64 bits: an accidental match is ~1 in 1.8e19)
DIGEST_CHARS = 16
#: the key's entry for the version of perfsim that computed the row
VERSION_KEY = "perfsim"
NO_KEY = "no input key"

_DIGESTS: dict[tuple, str] = {}


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (:data:`DIGEST_CHARS` hex digits); ``missing``
    when it cannot be read (the command that reads it names the error). Cached per
    process by :func:`file_stamp`."""
    try:
        stamp = file_stamp(path)
        if stamp not in _DIGESTS:
            _DIGESTS[stamp] = (stamp[5] if len(stamp) > 5 else file_sha256(path))[:DIGEST_CHARS]
        return _DIGESTS[stamp]
    except OSError:
        return "missing"


def value_digest(value: Any) -> str:
    """The SHA-256 of a value's canonical JSON (an object with ``to_dict``, e.g. a
    loaded Profile given to the API, by its document)."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


@lru_cache(maxsize=1)
def code_digest() -> str:
    """The SHA-256 of perfsim's own source and shipped data (every ``*.py``, ``*.json`` and
    ``*.toml`` under the package, by relative path and content): a development tree's
    version number stays put while its code changes, so a key names the code itself."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(p for ext in ("*.py", "*.json", "*.toml") for p in root.rglob(ext)):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:DIGEST_CHARS]


def input_key(files: Mapping[str, Any] = {}, values: Mapping[str, Any] = {}, code: bool = True) -> str:
    """``perfsim=VERSION+CODE;ROLE=DIGEST;...``: perfsim's version and (``code``) the digest of
    its source (:func:`code_digest`), the content digest of each input file by role
    (``files``: a path, or an already-loaded object hashed by :func:`value_digest`; None:
    no such input) and of each value in ``values``."""
    parts = [f"{VERSION_KEY}={perfsim.__version__}" + (f"+{code_digest()}" if code else "")]
    for role in sorted(files):
        f = files[role]
        if f is None:
            continue
        digest = file_digest(f) if isinstance(f, (str, os.PathLike)) else value_digest(f)
        parts.append(f"{role}={digest}")
    parts += [f"{role}={value_digest(values[role])}" for role in sorted(values)]
    return ";".join(parts)


def parse_key(text: Any) -> dict[str, str] | None:
    """A key's entries (None for a row that carries no key: NaN, empty, not text)."""
    if not isinstance(text, str) or "=" not in text:
        return None
    return dict(item.split("=", 1) for item in text.split(";") if "=" in item)


def stale_reasons(stored: Any, current: str, where: Mapping[str, Any] = {}) -> list[str]:
    """Why a row stored under key ``stored`` is not the answer under ``current``
    (empty: it is): each changed input by role and path (``where``: role -> path the
    user gave), a different perfsim version, or no key at all (a row written before
    perfsim keyed its rows)."""
    old, new = parse_key(stored), parse_key(current)
    if old is None:
        return [NO_KEY]
    reasons = []
    if old.get(VERSION_KEY) != new.get(VERSION_KEY):
        reasons.append(f"perfsim {old.get(VERSION_KEY)} -> {new.get(VERSION_KEY)}")
    for role in sorted(set(old) | set(new)):
        if role != VERSION_KEY and old.get(role) != new.get(role):
            path = where.get(role)
            label = f"{role} {path}" if isinstance(path, (str, os.PathLike)) else role
            reasons.append(f"{label} changed")
    return reasons


def stale_notes(reasons: Iterable[str], what: str = "rows") -> list[str]:
    """One line per reason, with how many stored ``what`` it makes recompute:
    ``profile traces/x.json changed since the stored rows: recomputing 2 rows``."""
    notes = []
    for reason, n in Counter(reasons).items():
        if reason == NO_KEY:
            notes.append(f"{n} stored {what} carry no input key (written before perfsim keyed them "
                         f"on their inputs): recomputing them")
        else:
            notes.append(f"{reason} since the stored {what}: recomputing {n} {what}")
    return notes
