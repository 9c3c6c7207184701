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
