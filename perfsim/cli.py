"""The ``perfsim`` command line: one small dispatcher, one module per subcommand.

Each subcommand lives in ``perfsim/commands/<name>.py`` and defines
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. Command
modules import heavy libraries (torch, simpy, pandas) inside ``run`` so that
``perfsim --help`` stays instant.

User mistakes (:class:`perfsim.errors.ConfigError`, bad flags) print one line on
stderr and exit with code 2; I/O failures (full disk, closed stdout: an
:class:`OSError`) one line and exit code 1; no traceback (``PERFSIM_TRACEBACK=1``
shows it). SIGTERM and SIGHUP end a command like Ctrl-C does (cleanup runs).
A command's ``EXAMPLES`` text ends its ``--help``. ``-v`` / ``-q`` (before or
after the command) set the level of the ``perfsim`` logger: notes ("wrote FILE")
by default, ``-q`` warnings and errors only, ``-v`` debug detail too; all on
stderr. ``perfsim completion bash|zsh|tcsh`` prints a shell completion script
(shtab, optional extra ``perfsim[completion]``).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import re
import signal
import sys

from perfsim import __version__
from perfsim.errors import ConfigError, OutputError
from perfsim.outputs import detach_stdout

#: Subcommands in the order ``perfsim --help`` lists them.
COMMANDS = ("predict", "plan", "memory", "run", "calibrate", "validate", "sweep", "plot", "compressors")


#: the attribute of a namespace that records, per destination, the flag and value given
_GIVEN = "_perfsim_given"


def _given_once(parser: argparse.ArgumentParser, namespace: argparse.Namespace, action: argparse.Action,
                option: str, value) -> None:
    """Refuse a second value for ``action`` (the same flag again, another spelling of it, or a
    switch's ``--no-`` form): argparse keeps the last one silently, so one of the two values
    the user wrote would be dropped from an answer they act on."""
    given = vars(namespace).setdefault(_GIVEN, {})
    if action.dest in given:
        first, before = given[action.dest]
        if isinstance(action, argparse.BooleanOptionalAction):
            parser.error(f"{first} and {option} both given; give one")
        lists = isinstance(value, str) and action.metavar == "LIST"
        parser.error(f"{action.option_strings[0]} given twice ({first} {before}, then {option} {value}); "
                     "give it once" + ("; a comma list runs every value" if lists else ""))
    given[action.dest] = (option, value)


class _StoreOnce(argparse._StoreAction):
    """A value flag (argparse's default ``store``) that may be given once."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string is not None:
            _given_once(parser, namespace, self, option_string, values)
        super().__call__(parser, namespace, values, option_string)


class _SwitchOnce(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x``: the same switch twice says one thing; both forms contradict."""

    def __call__(self, parser, namespace, values, option_string=None):
        value = not option_string.startswith("--no-")
        given = vars(namespace).get(_GIVEN, {}).get(self.dest)
        if given is None or given[1] != value:
            _given_once(parser, namespace, self, option_string, value)
        super().__call__(parser, namespace, values, option_string)


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage + error; perfsim prints one line naming the culprit.
    Options are never abbreviated (``allow_abbrev=False``): ``--ep`` is refused, not
    taken for ``--epochs``, so a flag a user expects can never land on another. A value
    flag given twice (``--bandwidth 1Gbps --bandwidth 10Gbps``, ``-o a --out b``) or a
    switch given both ways (``--overlap --no-overlap``) is refused, naming it: argparse
    would keep the last silently. Every command's flags go through here (its argument
    groups share the parser's action registry)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        self.register("action", argparse.BooleanOptionalAction, _SwitchOnce)

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102 - argparse API
        self._arg_strings = list(sys.argv[1:] if args is None else args)  # for error()'s hint
        namespace, extra = super().parse_known_args(args, namespace)
        vars(namespace).pop(_GIVEN, None)  # bookkeeping, not a flag
        return namespace, extra

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message}{self._dash_hint(message)}\n")

    def _dash_hint(self, message: str) -> str:
        """argparse reads a value that starts with '-' (``--latency -1ms``) as a flag and says
        "expected one argument": the way to give it, ``--latency=-1ms``."""
        m = re.fullmatch(r"argument (\S+): expected one argument", message)
        given = getattr(self, "_arg_strings", [])
        for option in m.group(1).split("/") if m else ():
            at = [i for i, a in enumerate(given[:-1]) if a == option and given[i + 1].startswith("-")
                  and given[i + 1].split("=")[0] not in self._option_string_actions]  # not a flag of ours
            if at:
                value = given[at[0] + 1]
                return f" ({value!r} starts with '-', read as a flag: write {option}={value})"
        return ""


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="perfsim",
        description="Predict, measure and validate the speed of distributed training "
        "with communication compression over slow networks.",
    )
    parser.add_argument("--version", action="version", version=f"perfsim {__version__}")
    _add_verbosity(parser, None)
    parser.set_defaults(_run=None)  # no command: print the help
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineParser)
    for name in COMMANDS:
        module = importlib.import_module(f"perfsim.commands.{name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP,
                           epilog=getattr(module, "EXAMPLES", None),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        _add_verbosity(p, argparse.SUPPRESS)  # also after the command: perfsim predict -q
        p.set_defaults(_run=module.run)
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh or tcsh)",
                       description="print a shell completion script (needs shtab: "
                                   "pip install 'perfsim[completion]')",
                       epilog="examples:\n  perfsim completion bash > ~/.local/share/bash-completion/"
                              "completions/perfsim\n  perfsim completion zsh > ~/.zfunc/_perfsim\n",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    p.set_defaults(_run=lambda args: _completion(parser, args.shell))
    return parser


def _add_verbosity(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0 if default is None else default,
                        help="debug detail on stderr")
    parser.add_argument("-q", "--quiet", action="store_true", default=False if default is None else default,
                        help="warnings and errors only on stderr")


def _completion(parser: argparse.ArgumentParser, shell: str) -> int:
    try:
        import shtab  # lazy: optional extra (perfsim[completion])
    except ModuleNotFoundError:
        raise ConfigError("completion needs shtab (pip install 'perfsim[completion]')") from None
    print(shtab.complete(parser, shell=shell))
    return 0


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    """Notes of the ``perfsim`` logger go to stderr, one line each, at the level
    ``-q`` / ``-v`` chose."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    log = logging.getLogger("perfsim")
    log.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it
        pass

def _terminate(signum, frame):  # SIGTERM / SIGHUP: unwind like Ctrl-C, so cleanup runs
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _io_error(exc: OSError) -> str:
    if isinstance(exc, OutputError):
        return str(exc)
    where = f" {exc.filename}" if exc.filename else ""
    return f"I/O error{where}: {exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, '?')})"


class _ClosedStdout:
    """Stands in for ``sys.stdout`` when fd 1 was closed (``perfsim ... >&-``):
    Python would otherwise drop every print silently."""

    def write(self, text: str) -> int:
        raise OutputError("writing stdout: it is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _settle_stdout() -> None:
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):
        detach_stdout()


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand ``command`` (the top parser when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: list[str] | None = None) -> int:
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse's top parser would say "perfsim: error:"; the command's own names it
        command = _command_parser(parser, getattr(args, "command", None))
        command.error(f"unrecognized arguments: {' '.join(extra)} ({command.prog} --help lists the flags)")
    if args._run is None:
        parser.print_help()
        return 0
    setup_logging(args.verbose, args.quiet)
    if argv is None:  # the perfsim process itself (not a caller's in-process main([...]))
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _terminate)
    try:
        code = int(args._run(args) or 0)
        sys.stdout.flush()
        return code
    except ConfigError as exc:
        print(f"perfsim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        if argv is None:  # the perfsim process itself: further Ctrl-C must not break its exit
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
        print(f"perfsim {args.command}: interrupted" + (f" ({exc})" if str(exc) else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:  # `perfsim ... | head`
        detach_stdout()
        return 0
    except OSError as exc:  # full disk, closed stdout, read-only filesystem
        if os.environ.get("PERFSIM_TRACEBACK"):
            raise
        _settle_stdout()
        print(f"perfsim {args.command}: error: {_io_error(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
