"""C identifiers and literals for generated code: sanitized unique names, constants of every dtype."""

from __future__ import annotations

import math
import re

import numpy as np

from compiler.errors import CompileError
from compiler.loopir.expr import Const

_WORDS = """auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef union unsigned void
volatile while bool true false main abs exp log sqrt tanh erf free abort"""
C_KEYWORDS = frozenset(_WORDS.split())


def sanitize(name: str) -> str:
    """A valid C identifier close to ``name``."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", name) or "v"
    if s[0].isdigit():
        s = "v" + s
    if s in C_KEYWORDS or s.startswith("kiln_") or s.startswith("__"):
        s = "v_" + s
    return s


class NameScope:
    """Hands out unique identifiers; names can be released when their C scope closes."""

    def __init__(self, reserved: set[str] | None = None) -> None:
        self.used: set[str] = set(reserved or ())

    def fresh(self, hint: str) -> str:
        base = sanitize(hint)
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name

    def release(self, name: str) -> None:
        self.used.discard(name)


def float_literal(value: float, dtype: str) -> str:
    """A C literal for a float constant (inf and nan through builtins; shortest round-trip digits)."""
    suffix = "f" if dtype in ("float32", "float16") else ""
    if math.isnan(value):
        text = f'__builtin_nan{suffix}("")'
    elif math.isinf(value):
        text = f"__builtin_inf{suffix}()"
        if value < 0:
            text = f"(-{text})"
    else:
        digits = str(np.float32(value)) if suffix else repr(float(value))
        if not any(c in digits for c in ".en"):
            digits += ".0"
        text = digits + suffix
        if value < 0 or text.startswith("-"):
            text = f"({text})"
    if dtype == "float16":
        return f"((_Float16){text})"
    return text


def const_literal(c: Const) -> str:
    """A C literal for an IR constant."""
    if c.dtype == "bool":
        return "true" if c.value else "false"
    if c.dtype in ("float32", "float64", "float16"):
        return float_literal(float(c.value), c.dtype)
    v = int(c.value)
    if c.dtype == "int64":
        return f"INT64_C({v})" if v >= 0 else f"(-INT64_C({-v}))"
    if c.dtype in ("int32", "int8", "uint8"):
        if v == -(2**31):
            return "(-2147483647 - 1)"
        return str(v) if v >= 0 else f"({v})"
    raise CompileError(f"constant {c.value!r} has unsupported dtype {c.dtype}")
