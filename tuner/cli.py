"""The `kiln` command line.

Each command lives in a small module that exposes ``register(subparsers)``; this module only builds the
parser and turns :class:`KilnError` (and other expected user errors) into a one-line message and exit
status 2 instead of a traceback. Heavy imports happen inside the command handlers so ``kiln --help``
stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from compiler.errors import KilnError

# Modules that register subcommands, in the order they appear in `kiln --help`.
COMMAND_MODULES = (
    "tuner.commands.models",
    "tuner.commands.show",
    "tuner.commands.tune",
    "tuner.commands.compile",
    "tuner.commands.cost_model",
    "db.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiln",
        description="Kiln: an auto-tuning deep-learning compiler. Tune a model, query the tuning "
        "database, compile with the best records, run and benchmark.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command module that has not landed yet
            if exc.name == name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.handler(args)
    except KilnError as exc:
        print(f"kiln {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kiln {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
