"""Every file perfsim writes goes through here: one output writer.

* :func:`output_format` picks the format from ``--format`` or the path's suffix
  (table, csv, json, parquet) and refuses an unknown suffix before any work;
  :func:`require_parquet` checks for pyarrow (the ``perfsim[parquet]`` extra)
  up front too.
* :func:`check_file_target` / :func:`check_dir_target` turn a directory given
  as a file, a file given as a folder or an unwritable folder into one line
  (:class:`~perfsim.errors.ConfigError`, exit 2) before a run starts;
  :func:`check_not_input` an output that is one of the command's input files.
* :func:`write_bytes` / :func:`write_text` write a regular file atomically
  (temp file in the same folder + rename) at the symlink's *real* target, so a
  link stays a link; special files (a FIFO, ``/dev/null``, a terminal) are
  written in place, never replaced. An I/O failure (full disk, read-only
  filesystem) raises :class:`~perfsim.errors.OutputError`: one line, exit 1.
* :func:`write_stdout` does the same for standard output (closed, full).
* ``-`` (:data:`STDIO`) as an output file is standard output, for every command
  that writes a file (``predict -o -``, ``sweep -o -``, ``calibrate -o -``,
  ``plot -o -``); a folder output (``run``, ``validate``) refuses it.
* A ``--format`` that disagrees with the output's suffix (``-o x.csv --format
  json``) is refused: the suffix and the content never disagree.
* The formats themselves live here too, so that no command or library module
  serialises a table on its own: :func:`json_text` (JSON documents),
  :func:`records_csv` (rows of dicts), :func:`frame_bytes` (a DataFrame as CSV,
  JSON lines or Parquet), :func:`write_frame` (a table file by its suffix) and
  :func:`emit` (text or bytes to a file, or to standard output for ``None`` / ``-``).
* :func:`locked_dir` takes an exclusive lock on an output folder, so two runs
  cannot interleave in one ``--out``; the second is refused naming the holder.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from perfsim.errors import ConfigError, OutputError

FORMATS = ("table", "csv", "json", "parquet")
#: suffix -> format (a path without a suffix takes the command's default)
SUFFIXES = {".txt": "table", ".csv": "csv", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
LOCK_NAME = ".perfsim.lock"
#: the file name that means standard output (as an output) or standard input (an input)
STDIO = "-"


def is_stdio(path: str | os.PathLike | None) -> bool:
    """``path`` is ``-``: standard output (or input)."""
    return path is not None and str(path) == STDIO


# ------------------------------------------------------------------ formats
def output_format(path: str | os.PathLike | None, fmt: str | None = None,
                  allowed: tuple[str, ...] = FORMATS, default: str = "table",
                  flag: str = "--output", has_format_flag: bool = True) -> str:
    """The format to write ``path`` in: ``fmt`` when given, else from the
    suffix, else ``default``. Unknown or unsupported suffixes are refused (the hint
    names ``--format`` only for a command that has it: ``has_format_flag``)."""
    if fmt is not None:
        if fmt not in allowed:
            raise ConfigError(f"--format {fmt!r}: choose from {', '.join(allowed)}")
        named = SUFFIXES.get(Path(str(path)).suffix.lower()) if path is not None and not is_stdio(path) else None
        if named is not None and named != fmt:  # JSON in x.csv: refused, never written
            raise ConfigError(f"{flag} {str(path)!r}: its suffix says {named}, --format says {fmt}; "
                              f"make them agree (or drop --format: the suffix chooses)")
        chosen = fmt
    elif path is None or is_stdio(path):
        chosen = default
    else:
        suffix = Path(str(path)).suffix.lower()
        if not suffix:
            chosen = default
        elif suffix not in SUFFIXES or SUFFIXES[suffix] not in allowed:
            known = ", ".join(s for s, f in SUFFIXES.items() if f in allowed)
            raise ConfigError(f"{flag} {str(path)!r}: unknown suffix {suffix!r} (use {known}"
                              + (", or --format)" if has_format_flag else ")"))
        else:
            chosen = SUFFIXES[suffix]
    if chosen == "parquet":
        require_parquet(f"{flag} {path}" if path else "--format parquet")
    return chosen


def require_parquet(what: str) -> None:
    """Refuse Parquet output up front when pyarrow is missing."""
    try:
        import pyarrow  # noqa: F401  # lazy: optional extra (perfsim[parquet]), probed
    except ImportError:
        raise ConfigError(f"{what}: Parquet needs pyarrow (pip install 'perfsim[parquet]'), "
                          "or write .csv") from None


# ------------------------------------------------------------ path checks
def check_file_target(path: str | os.PathLike, flag: str = "--output") -> None:
    """One line (exit 2) when ``path`` cannot be an output file (``-``, stdout, can)."""
    if is_stdio(path):
        return
    p = Path(os.path.realpath(path))
    if p.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: is a directory (give a file name)")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: {parent} is not a directory")
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(path)!r}: directory {parent} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{flag} {str(path)!r}: not writable")


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)  # a link or a second name of one file too
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def check_not_input(path: str | os.PathLike | None, inputs: Mapping[str, Any] | Iterable[tuple[str, Any]],
                    flag: str = "--output") -> None:
    """One line (exit 2) when output ``path`` is one of the files the command reads
    (``inputs``: ``{flag: path}`` or ``(flag, path)`` pairs, e.g. ``{"--profile": "p.json"}``;
    values that are not paths are skipped):
    written, the output would replace that input -- a calibration profile, a model's
    config.json, loss curves -- and the next run would read the output instead."""
    if path is None or is_stdio(path):
        return
    for what, source in (inputs.items() if isinstance(inputs, Mapping) else inputs):
        if isinstance(source, (str, os.PathLike)) and not is_stdio(source) and _same_file(path, source):
            raise ConfigError(f"{flag} {str(path)!r}: the same file as {what} {str(source)!r} (the output "
                              f"would replace it); give another {flag}")


def check_dir_target(path: str | os.PathLike, flag: str = "--out") -> None:
    """One line (exit 2) when ``path`` cannot be an output folder."""
    if is_stdio(path):
        raise ConfigError(f"{flag} '-': this output is a folder; '-' (standard output) is for "
                          "commands that write one file")
    p = Path(path)
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(path)!r}: {probe} is not writable")


# ------------------------------------------------------------------ writing
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _describe(exc: OSError, path) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"writing {path}: {exc.strerror or exc}" + (f" ({name})" if name else "")


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path``: atomically for a regular file (at a
    symlink's real target), in place for a FIFO or device; ``-`` is standard output.
    Raises :class:`OutputError` (one line) on an I/O failure."""
    if is_stdio(path):
        _write_stdout_bytes(data)
        return
    real = Path(os.path.realpath(path))
    try:
        st = real.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(_describe(exc, path)) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"writing {path}: is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):  # FIFO, character device, socket...
        try:
            with open(real, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise OutputError(_describe(exc, path)) from None
        return
    tmp = None
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
        os.chmod(tmp, mode)  # mkstemp makes 0600; keep the file's mode or the usual one
        os.replace(tmp, real)
        tmp = None
    except OSError as exc:
        raise OutputError(_describe(exc, path)) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Text twin of :func:`write_bytes` (UTF-8)."""
    write_bytes(path, text.encode())


def write_stdout(text: str) -> None:
    """Write ``text`` to standard output and flush; a closed or full stdout
    raises :class:`OutputError`. A reader that went away (``| head``) raises
    BrokenPipeError, which the CLI treats as success."""
    if sys.stdout is None:
        raise OutputError("writing stdout: it is closed")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:
        detach_stdout()
        if isinstance(exc, OSError):
            raise OutputError(_describe(exc, "stdout")) from None
        raise OutputError("writing stdout: it is closed") from None


def _write_stdout_bytes(data: bytes) -> None:
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text stream (a caller's redirect): text only
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise OutputError("writing stdout: binary output to a text stream") from None
        write_stdout(text)
        return
    try:
        sys.stdout.flush()
        buffer.write(data)
        buffer.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:
        detach_stdout()
        raise OutputError(_describe(exc, "stdout") if isinstance(exc, OSError)
                          else "writing stdout: it is closed") from None


def detach_stdout() -> None:
    """Point fd 1 at /dev/null so that the interpreter's final flush of what
    could not be written does not print a second error."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


# ------------------------------------------------------------------ formats
def json_text(obj: Any, *, indent: int | None = 1, default: Callable[[Any], Any] | None = None,
              allow_nan: bool = True) -> str:
    """``obj`` as a JSON document ending in a newline (every JSON file and ``--format json``)."""
    return json.dumps(obj, indent=indent, default=default, allow_nan=allow_nan) + "\n"


def jsonl_text(records: Sequence[Any], default: Callable[[Any], Any] | None = None) -> str:
    """JSON lines: one compact JSON document per record, each ending in a newline."""
    return "".join(json.dumps(r, default=default) + "\n" for r in records)


#: what joins the items of a list cell (a summary's ``notes``) in a CSV cell
LIST_SEP = "; "


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell holds it: a list (a summary's ``notes``) as its items joined by
    :data:`LIST_SEP` (an empty list: an empty cell); anything else as it is."""
    return LIST_SEP.join(map(str, value)) if isinstance(value, list) else value


def records_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = ()) -> str:
    """Rows of dicts as CSV text: ``columns`` first, then every other key in first-seen
    order; a missing key or None is an empty cell, a list one cell (:func:`csv_cell`; no
    pandas: predict's CSV stays light)."""
    import csv  # lazy: perfsim --help does not load csv

    cols = list(columns)
    for row in rows:
        cols += [k for k in row if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


#: the formats :func:`frame_bytes` writes a DataFrame in
FRAME_FORMATS = ("csv", "parquet", "jsonl")


def frame_bytes(df, fmt: str, default: Callable[[Any], Any] | None = None) -> bytes:
    """A pandas DataFrame as ``csv`` (no index; a list cell joined, :func:`csv_cell`), ``parquet`` (pyarrow) or ``jsonl``
    (one JSON object per row; ``default`` turns other values into JSON)."""
    if fmt == "csv":
        lists = [c for c in df.columns if df[c].dtype == object and df[c].map(lambda v: isinstance(v, list)).any()]
        if lists:  # a list cell (a summary's notes): one CSV cell (csv_cell)
            df = df.assign(**{c: df[c].map(csv_cell) for c in lists})
        return df.to_csv(index=False).encode()
    if fmt == "parquet":
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        return buf.getvalue()
    if fmt == "jsonl":
        return jsonl_text(df.to_dict("records"), default).encode()
    raise ValueError(f"frame format {fmt!r}: choose from {', '.join(FRAME_FORMATS)}")


def write_frame(path: str | os.PathLike, df, fmt: str | None = None) -> None:
    """Write table ``df`` to ``path`` atomically, in ``fmt`` or the format its suffix names
    (``.parquet``/``.pq``: Parquet, ``.jsonl``: JSON lines, else CSV); ``-``: CSV on stdout."""
    if fmt is None:
        suffix = "" if is_stdio(path) else Path(str(path)).suffix.lower()
        fmt = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl"}.get(suffix, "csv")
    write_bytes(path, frame_bytes(df, fmt))


def emit(path: str | os.PathLike | None, data: str | bytes) -> None:
    """``data`` to file ``path`` atomically, or to standard output when ``path`` is None or ``-``."""
    raw = data.encode() if isinstance(data, str) else data
    if path is None or is_stdio(path):
        if isinstance(data, str):
            write_stdout(data)
        else:
            _write_stdout_bytes(raw)
        return
    write_bytes(path, raw)


# ------------------------------------------------------------------ locking
@contextlib.contextmanager
def locked_dir(path: str | os.PathLike, flag: str = "--out", file: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on output folder (or file) ``path`` while the
    block runs. The lock is ``flock`` on ``<path>/.perfsim.lock`` (a file
    output: ``.<name>.lock`` beside it), which the kernel releases when its
    holder dies, so a stale lock file of a dead process never blocks; the file
    records the holder's pid for the refusal message. ``file=True``: ``path``
    is an output file (a sweep table)."""
    import fcntl  # lazy: perfsim --help does not load fcntl

    path = Path(path)
    if file:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.parent / f".{path.name}.lock"
    else:
        path.mkdir(parents=True, exist_ok=True)
        lock = path / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError(_describe(exc, lock)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(f"{flag} {str(path)!r}: in use by another perfsim (pid {holder}); "
                          "wait for it or choose another output") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock; the file stays (unlinking would race a new holder)
