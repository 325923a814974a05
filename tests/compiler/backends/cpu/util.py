"""Build hand-lowered PrimFuncs with the C target and run them on numpy arrays."""

from __future__ import annotations

import numpy as np

from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.codegen import generate_c
from compiler.dtypes import to_numpy
from compiler.loopir.stmt import PrimFunc
from compiler.target import Target


def build(funcs: list[PrimFunc]) -> tuple[str, cbuild.KernelLibrary]:
    src = generate_c(funcs, Target.host())
    return src, cbuild.build(src)


def run(func: PrimFunc, *inputs: np.ndarray, lib: cbuild.KernelLibrary | None = None) -> list[np.ndarray]:
    """Run ``func`` on ``inputs``; returns its outputs (freshly allocated, filled with NaN/garbage first)."""
    if lib is None:
        _, lib = build([func])
    args = [np.ascontiguousarray(x, dtype=to_numpy(b.dtype)) for x, b in zip(inputs, func.inputs)]
    outs = []
    for b in func.outputs:
        o = np.empty(b.shape, to_numpy(b.dtype))
        if o.dtype.kind == "f":
            o.fill(np.nan)
        outs.append(o)
    lib.function(func.name, len(func.params))(*[a.ctypes.data for a in args + outs])
    return outs


def kernel_text(src: str, name: str) -> str:
    """The text of kernel ``name`` in a generated translation unit (with the chunk functions of its
    parallel loops, printed between its prototype and its definition)."""
    start = src.index(f"void {name}(")
    head_end = src.index("\n", start)
    definition = src.index(f"\nvoid {name}(", head_end) if src[head_end - 1] == ";" else start
    end = src.index("\n}\n", definition)
    return src[start : end + 3]
