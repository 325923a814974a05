"""The CPU backend: C with a thread pool and GCC vector extensions, built with gcc, run through ctypes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compiler.backends.base import Backend
from compiler.backends.cpu import gcc
from compiler.backends.cpu.codegen import generate_c
from compiler.backends.cpu.executor import CpuCompiledModel
from compiler.backends.cpu.sketches.attention import CpuAttentionSketch
from compiler.backends.cpu.sketches.contraction import CpuContractionSketch
from compiler.backends.cpu.sketches.conv import CpuConvSketch
from compiler.backends.cpu.sketches.conv_pool import CpuConvPoolSketch
from compiler.backends.cpu.sketches.generic import CpuGenericSketch
from compiler.backends.cpu.sketches.pointwise import CpuPointwiseSketch
from compiler.backends.cpu.sketches.reduction import CpuReductionSketch
from compiler.backends.sketch import Sketch
from compiler.errors import KilnError
from compiler.fusion import Group
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
        CpuAttentionSketch,
        CpuConvSketch,
        CpuConvPoolSketch,
        CpuContractionSketch,
        CpuGenericSketch,
    )

    def lower(self, func: PrimFunc, unroll: bool = True) -> PrimFunc:
        """``lower_func``, then the sibling-loop fusion a sketch asked for (``attrs[FUSE_SIBLINGS]``)."""
        out = lower_func(func, unroll)
        if not out.attrs.get(FUSE_SIBLINGS):
            return out
        return PrimFunc(out.name, out.params, fuse_sibling_loops(out.body), out.num_inputs, dict(out.attrs))

    def sketch_for(self, group: Group, target: Target | None = None) -> Sketch:
        refuse_bfloat16(group)
        return super().sketch_for(group, target)

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


def refuse_bfloat16(group: Group) -> None:
    """KilnError naming the first op of ``group`` that touches bfloat16: gcc 12 (the CPU build) has no
    bfloat16 arithmetic, and computing it in float32 would give other results than the graph says."""
    for node in group.nodes:
        for v in (*node.inputs, *node.outputs):
            if v.dtype == "bfloat16":
                raise KilnError(
                    f"cpu: node {node.name} ({node.op}) of group {group.name} has the bfloat16 tensor "
                    f"'{v.name}'; the cpu target does not support bfloat16 (compile for cuda, or cast the "
                    "model to float32)"
                )


BACKEND = CpuBackend
