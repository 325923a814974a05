"""Helpers shared by `kiln` commands: model loading options and table output."""

from __future__ import annotations

import argparse
import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from compiler.errors import KilnError


def add_model_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--model",
        required=required,
        metavar="NAME|FILE.onnx",
        help="a built-in model name (see `kiln models`) or an ONNX file",
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


def load_model_arg(args: argparse.Namespace):
    from compiler.frontend import load_model

    return load_model(args.model, parse_input_shapes(getattr(args, "input_shape", [])))


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
