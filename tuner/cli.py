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
    "tuner.commands.query",
    "tuner.commands.db",
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
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line a tuning run records
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
