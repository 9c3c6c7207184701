"""Errors that are the user's to fix.

A :class:`ConfigError` is raised for bad input (a flag, a file, a tensor). The
CLI turns it into one line on stderr and exit code 2, with no traceback. It is
a ``ValueError`` so library users can catch it the ordinary way.
"""


class ConfigError(ValueError):
    """Bad user input. The message names the culprit (flag, field, file or value)."""


class OutputError(OSError):
    """An output could not be written (full disk, closed stdout, read-only
    filesystem). The CLI prints one line and exits with code 1."""


class NonFiniteError(ConfigError):
    """A data-parallel exchange refused on *every* rank because some rank's input was
    NaN/Inf (or too large to encode). A compressor raises it only after the refusal
    travelled to every rank inside its own collectives (a non-finite norm or scale),
    so every rank raises it at the same point and none is left waiting; nothing of the
    compressor's state has changed. ``local`` tells whether this rank's own input was
    refused; the caller names the step and the parameter (:mod:`perfsim.runtime.nonfinite`)."""

    def __init__(self, message: str, *, local: bool = False):
        super().__init__(message)
        self.local = bool(local)
