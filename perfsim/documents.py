"""Reading the user's documents: one JSON, TOML or CSV reader for every input file.

Profiles, workloads, topologies, sweep files and plot inputs are all read here,
so a missing file, a file that is not UTF-8 text and a malformed document give
the same one-line :class:`ConfigError` everywhere::

    profile 'x.json': cannot read (file not found)
    workload 'w.toml': malformed TOML (Expected '=' after a key ... (line 1, column 9))

The message names the kind of document and the file; the CLI prints it as its
one line on stderr and exits with code 2.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time
import tomllib
from pathlib import Path
from typing import Any

from perfsim.errors import ConfigError

#: the document kinds, and the file suffix that selects each
KINDS = {".json": "json", ".toml": "toml", ".csv": "csv"}


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of ``path``; ConfigError ``<what> '<path>': cannot read (...)``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(p)!r}: cannot read (file not found)") from None
    except OSError as exc:
        raise ConfigError(f"{what} {str(p)!r}: cannot read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {str(p)!r}: cannot read (not UTF-8 text: {exc.reason} "
                          f"at byte {exc.start})") from None


class _RepeatedKey(ValueError):
    """A JSON object that gives one key twice."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of :func:`json.loads` that refuses a key given twice in one object
    (JSON itself keeps the last value silently; TOML refuses): which value was meant?"""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _RepeatedKey(key)
        obj[key] = value
    return obj


def load_json(text: str, where: str, **kw) -> Any:
    """``text`` as JSON with :func:`unique_keys`; ConfigError ``<where>: key 'K' given twice``
    for a repeated key (other errors propagate: the caller words them)."""
    try:
        return json.loads(text, object_pairs_hook=unique_keys, **kw)
    except _RepeatedKey as exc:
        raise ConfigError(f"{where}: key {exc.args[0]!r} given twice in one object (which value "
                          "is meant? JSON keeps the last silently); give it once") from None


def parse_document(text: str, kind: str, where: str) -> Any:
    """``text`` parsed as ``kind`` (``json``, ``toml``; ``csv``: a list of row dicts
    keyed by the header); ConfigError ``<where>: malformed <KIND> (...)``, or naming a
    JSON key given twice (:func:`unique_keys`)."""
    try:
        if kind == "json":
            return load_json(text, where)
        if kind == "toml":
            return tomllib.loads(text)
        if kind == "csv":
            return list(csv.DictReader(io.StringIO(text)))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: malformed JSON ({exc.msg}, line {exc.lineno})") from None
    except (tomllib.TOMLDecodeError, csv.Error) as exc:
        raise ConfigError(f"{where}: malformed {kind.upper()} ({exc})") from None
    raise ValueError(f"document kind {kind!r}: one of {', '.join(sorted(set(KINDS.values())))}")


def document_kind(path: str | os.PathLike, default: str) -> str:
    """The kind a file's suffix names (``.json``, ``.toml``, ``.csv``), else ``default``."""
    return KINDS.get(Path(path).suffix.lower(), default)


def read_document(path: str | os.PathLike, what: str, *, kind: str | None = None,
                  default: str = "json") -> Any:
    """Read and parse the ``what`` file ``path`` (``profile``, ``workload``...).

    ``kind``: the format, else the one the suffix names, else ``default``.
    ConfigError naming ``what`` and the file when it cannot be read or parsed."""
    text = read_text(path, what)
    return parse_document(text, kind or document_kind(path, default), f"{what} {str(Path(path))!r}")


#: a file modified this recently (seconds) may be written again within its file system's
#: timestamp granularity (a few ms on ext4), leaving its stamp unchanged: its content is read
RACY_S = 2.0


def file_stamp(path: str | os.PathLike) -> tuple:
    """What tells one version of a file from another without reading it: its resolved path,
    size, modification and change times (ns) and inode -- the change time moves when a copy
    restores an old modification time (``cp -p``, ``rsync -t``, ``os.utime``), a rename
    moves the inode -- and, for a file modified in the last :data:`RACY_S` seconds, its
    content's digest (git's "racy" files). Raises OSError for a file that cannot be read."""
    p = Path(path)
    st = p.stat()
    stamp: tuple = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if time.time() - max(st.st_mtime, st.st_ctime) < RACY_S:
        stamp += (file_sha256(p),)
    return stamp


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 (FIPS 180-4) of a file's bytes, in hex."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
