"""Code generation: a C-style printer base (``cstyle``) with the C target (``c``)."""

from __future__ import annotations

from compiler.codegen.c import CODEGEN_VERSION, CPrinter, generate_c

__all__ = ["CODEGEN_VERSION", "CPrinter", "generate_c"]
