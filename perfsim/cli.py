"""The ``perfsim`` command line: one small dispatcher, one module per subcommand.

Each subcommand lives in ``perfsim/commands/<name>.py`` and defines
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. Command
modules import heavy libraries (torch, simpy, pandas) inside ``run`` so that
``perfsim --help`` stays instant.

User mistakes (:class:`perfsim.errors.ConfigError`, bad flags) print one line on
stderr and exit with code 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from perfsim import __version__
from perfsim.errors import ConfigError

#: Subcommands in the order ``perfsim --help`` lists them.
COMMANDS = ("predict", "plan", "run", "calibrate", "validate", "sweep", "plot", "compressors")


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage + error; perfsim prints one line naming the culprit."""

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="perfsim",
        description="Predict, measure and validate the speed of distributed training "
        "with communication compression over slow networks.",
    )
    parser.add_argument("--version", action="version", version=f"perfsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineParser)
    for name in COMMANDS:
        module = importlib.import_module(f"perfsim.commands.{name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except ConfigError as exc:
        print(f"perfsim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"perfsim {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `perfsim ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
