"""Rows to text for the ``kiln query`` / ``kiln db`` commands: an aligned table, CSV or JSON.

JSON keeps structured values (configs are objects); CSV writes them as compact JSON; the table shortens long
cells. Standard library only, so importing it is cheap.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from compiler.canonical import canonical_json

FORMATS = ("table", "csv", "json")


def _plain(value: Any) -> Any:
    """A JSON-able version of a cell (datetimes as ISO text, NaN as null)."""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "value") and isinstance(getattr(value, "value", None), str):  # str enums
        return value.value
    return value


def _cell(value: Any, width: int | None) -> str:
    value = _plain(value)
    if value is None:
        text = "-"
    elif isinstance(value, dict | list):
        text = canonical_json(value)
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = f"{value:.6g}" if abs(value) < 1e6 else f"{value:.4g}"
    else:
        text = " ".join(str(value).split())
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def write_rows(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    fmt: str,
    out: TextIO,
    *,
    widths: dict[str, int] | None = None,
) -> None:
    """Write ``rows`` (dicts) restricted to ``columns`` as ``table``, ``csv`` or ``json`` to ``out``.

    ``widths`` caps the width of some table columns (e.g. workload keys shown by prefix).
    """
    if fmt == "json":
        data = [{c: _plain(r.get(c)) for c in columns} for r in rows]
        out.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
        return
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for r in rows:
            cells = []
            for c in columns:
                v = _plain(r.get(c))
                cells.append(canonical_json(v) if isinstance(v, dict | list) else v)
            writer.writerow(["" if v is None else v for v in cells])
        return
    widths = widths or {}
    table = [[_cell(r.get(c), widths.get(c, 60)) for c in columns] for r in rows]
    sizes = [max([len(c)] + [len(row[i]) for row in table]) for i, c in enumerate(columns)]
    buf = io.StringIO()
    buf.write("  ".join(c.ljust(sizes[i]) for i, c in enumerate(columns)).rstrip() + "\n")
    buf.write("  ".join("-" * s for s in sizes) + "\n")
    for row in table:
        buf.write("  ".join(cell.ljust(sizes[i]) for i, cell in enumerate(row)).rstrip() + "\n")
    out.write(buf.getvalue())
