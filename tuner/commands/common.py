"""Helpers shared by `kiln` commands: model loading options (``--model``, ``--input-shape``: refused for a
built-in model, whose shapes are fixed; an ONNX file without the ``onnx`` package is a one-line error naming
the extra to install; a model whose inputs, params and outputs alone exceed the available memory is
refused), table output, and the options and database opening shared by the commands that read or maintain
the tuning database (`kiln query`, `kiln db`, `kiln compile --db`).

``DEFAULT_DB_HELP`` is how every command's ``--db`` help names the default database."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
import warnings
from collections.abc import Iterator, Sequence
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from compiler.errors import KilnError
from compiler.frontend import load_model
from db.status import Status
from tuner.commands.output import FORMATS, write_rows

if TYPE_CHECKING:
    from db.database import TuningDatabase

# Every record status, as the --status options of `kiln query records` and `kiln db export` accept it.
STATUS_CHOICES = tuple(s.value for s in Status)

# How every command's --db option names the default database.
DEFAULT_DB_HELP = "default: $KILN_DB, else sqlite:///kiln.db"
ONNX_INSTALL = 'pip install "kiln-tuner[onnx]" (from a clone: pip install -e ".[onnx]")'


def add_model_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--model",
        required=required,
        metavar="NAME|FILE.onnx|MODULE:FUNCTION",
        help="a built-in model name (see `kiln models`), an ONNX file, or a torch model: a function "
        "returning (nn.Module, example_inputs), as package.module:function",
    )
    parser.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=1x128",
        help="static shape for an ONNX input with dynamic dimensions (repeatable)",
    )


def parse_input_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise KilnError(f"--input-shape {item!r} must look like NAME=1x128") from None
    return shapes


def is_onnx_path(model: str) -> bool:
    """Whether ``--model`` names an ONNX file (as :func:`compiler.frontend.load_model` decides)."""
    return model.endswith(".onnx")


def require_onnx(what: str) -> None:
    """A one-line KilnError naming the extra to install when the ``onnx`` package is missing."""
    if find_spec("onnx") is None:
        raise KilnError(f"{what} needs the onnx package, which is not installed: {ONNX_INSTALL}")


def check_model_fits(graph: Any) -> None:
    """Refuse a model whose inputs, params and outputs alone need more memory than is available."""
    from compiler.runtime.memory_plan import check_fits

    values = {id(v): v for v in (*graph.inputs, *graph.params, *graph.outputs)}
    needed = sum(v.type.nbytes for v in values.values())
    check_fits(graph.name, needed, "its inputs, params and outputs")


def load_model_arg(args: argparse.Namespace, *, check_memory: bool = True):
    """The graph ``--model``/``--input-shape`` name. ``--input-shape`` is refused for a built-in model;
    ``check_memory`` refuses a model whose inputs, params and outputs do not fit in memory."""
    shapes = parse_input_shapes(getattr(args, "input_shape", []))
    if ":" in args.model and not is_onnx_path(args.model):  # package.module:function, a torch model
        if shapes:
            raise KilnError(
                f"--input-shape does not apply to the torch model {args.model}: the example inputs its "
                "function returns set the shapes"
            )
        from tuner.torch_backend import load_torch_model  # torch is imported only for a torch model

        graph = load_torch_model(args.model)
        if check_memory:
            check_model_fits(graph)
        return graph
    if is_onnx_path(args.model):
        require_onnx(f"--model {args.model}")
    elif shapes:
        given = " ".join(f"--input-shape {s}" for s in args.input_shape)
        raise KilnError(
            f"{given} does not apply to the built-in model {args.model}: its shapes are fixed "
            "(--input-shape sets dynamic dimensions of an ONNX file)"
        )
    graph = load_model(args.model, shapes)
    if check_memory:
        check_model_fits(graph)
    return graph


def print_table(
    rows: list[dict[str, Any]], columns: Sequence[str], fmt: str = "table", title: str | None = None
) -> None:
    """Print rows as a rich table, CSV or JSON."""
    if fmt == "json":
        print(json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=2, default=str))
        return
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        print(buf.getvalue(), end="")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*("" if r.get(c) is None else str(r.get(c)) for c in columns))
    Console(width=max(120, Console().width)).print(table)


def database_parents() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """Parent parsers of the database commands: ``--db URL``, and ``--db URL --format`` for commands that
    print rows."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help=f"database URL ({DEFAULT_DB_HELP}), e.g. postgresql://user@host/kiln",
    )
    formatted = argparse.ArgumentParser(add_help=False, parents=[common])
    formatted.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: table)"
    )
    return common, formatted


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


@contextlib.contextmanager
def open_database(args: argparse.Namespace, *, create: bool = False) -> Iterator[TuningDatabase]:
    """Open ``args.db`` (closing it afterwards); the database's warnings become one-line messages."""
    from db.database import TuningDatabase  # SQLAlchemy: only when a command opens a database

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        print(f"kiln: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        with TuningDatabase.open(args.db, create=create) as db:
            yield db


def emit_rows(rows: list[dict[str, Any]], columns: list[str], args: argparse.Namespace) -> None:
    """Write rows to stdout in ``args.format`` (table, csv or json)."""
    write_rows(rows, columns, args.format, sys.stdout)
