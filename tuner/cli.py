"""The `kiln` command line.

Each command lives in a small module that exposes ``register(subparsers)``; this module only builds the
parser and turns :class:`KilnError` (and other expected user errors, running out of memory included) into
a one-line message and exit status 2 instead of a traceback. Python warnings print as one line each,
``kiln: warning: MESSAGE``, without the source line. ``kiln --version`` reports the installed
distribution's version. Heavy imports happen inside the command handlers so ``kiln --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

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
    "tuner.commands.bench",
)

DISTRIBUTION = "kiln-tuner"


def version() -> str:
    """Kiln's version: the installed distribution's metadata, else the package's ``__version__``."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        import tuner

        return getattr(tuner, "__version__", "unknown")


def format_warning(message, category, filename, lineno, line=None) -> str:  # type: ignore[no-untyped-def]
    """``warnings.formatwarning`` for the CLI: one line, no source file or line."""
    return f"kiln: warning: {message}\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiln",
        description="Kiln: an auto-tuning deep-learning compiler. Tune a model, query the tuning "
        "database, compile with the best records, run and benchmark.",
    )
    parser.add_argument("--version", action="version", version=f"kiln {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line a tuning run records
    saved_format = warnings.formatwarning
    warnings.formatwarning = format_warning
    try:
        result = args.handler(args)
    except KilnError as exc:
        print(f"kiln {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # numpy's "Unable to allocate 37.3 GiB for an array ..."
        detail = str(exc) or "an allocation failed"
        print(f"kiln {args.command}: error: out of memory: {detail}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kiln {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = saved_format
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
