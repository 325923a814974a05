"""The CPU backend: C with OpenMP and GCC vector extensions, built with gcc, run through ctypes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compiler.backends.base import Backend
from compiler.backends.cpu import gcc
from compiler.backends.cpu.codegen import generate_c
from compiler.backends.cpu.executor import CpuCompiledModel
from compiler.backends.cpu.sketches.contraction import CpuContractionSketch
from compiler.backends.cpu.sketches.conv import CpuConvSketch
from compiler.backends.cpu.sketches.generic import CpuGenericSketch
from compiler.backends.cpu.sketches.pointwise import CpuPointwiseSketch
from compiler.backends.cpu.sketches.reduction import CpuReductionSketch
from compiler.loopir import lower_func
from compiler.loopir.fuse_siblings import FUSE_SIBLINGS, fuse_sibling_loops
from compiler.loopir.stmt import PrimFunc
from compiler.runtime.executor import CompiledModel
from compiler.target import Target
from compiler.te import TEProgram, compute, lower, placeholder


class CpuBackend(Backend):
    name = "cpu"
    # the convolution sketch comes before the contraction sketch: it takes every conv2d with constant weights
    sketch_classes = (
        CpuPointwiseSketch,
        CpuReductionSketch,
        CpuConvSketch,
        CpuContractionSketch,
        CpuGenericSketch,
    )

    def lower(self, func: PrimFunc, unroll: bool = True) -> PrimFunc:
        """``lower_func``, then the sibling-loop fusion a sketch asked for (``attrs[FUSE_SIBLINGS]``)."""
        out = lower_func(func, unroll)
        if not out.attrs.get(FUSE_SIBLINGS):
            return out
        return PrimFunc(out.name, out.params, fuse_sibling_loops(out.body), out.num_inputs, dict(out.attrs))

    def codegen(
        self, funcs: Sequence[PrimFunc], target: Target, launches: Sequence[Any] | None = None
    ) -> str:
        return generate_c(list(funcs), target, launches)

    def compile_module(self, source: str, target: Target) -> gcc.KernelLibrary:
        return gcc.build(source)  # gcc -march=native: the module is for this host

    def copy_kernel(self, shape: tuple[int, ...], dtype: str, name: str) -> PrimFunc:
        x = placeholder(shape, dtype, "src")
        y = compute(shape, lambda *i: x[i] if i else x[()], "dst")
        return lower_func(lower(TEProgram(name, [x], [y], [y])))

    def compiled_model_class(self) -> type[CompiledModel]:
        return CpuCompiledModel


BACKEND = CpuBackend
