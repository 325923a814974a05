"""The CUDA backend: CUDA C built with NVRTC through CuPy (``nvcc -cubin`` checks it without a GPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compiler.backends.base import Backend
from compiler.backends.cuda import nvrtc
from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.device import device_arch
from compiler.backends.cuda.executor import CudaCompiledModel
from compiler.backends.cuda.lower import lower_gpu_func
from compiler.backends.cuda.sketches.contraction import CudaContractionSketch
from compiler.backends.cuda.sketches.pointwise import CudaPointwiseSketch, copy_func
from compiler.backends.cuda.sketches.reduction import CudaReductionSketch
from compiler.backends.cuda.sketches.tensorcore import CudaTensorCoreSketch
from compiler.loopir.stmt import PrimFunc
from compiler.target import Target


class CudaBackend(Backend):
    name = "cuda"
    # the tensor-core sketch takes the GEMMs it applies to (float16, or float32 with TF32 on sm_80+)
    sketch_classes = (CudaPointwiseSketch, CudaReductionSketch, CudaTensorCoreSketch, CudaContractionSketch)

    def lower(self, func: PrimFunc, unroll: bool = True) -> PrimFunc:
        return lower_gpu_func(func, unroll)

    def codegen(
        self, funcs: Sequence[PrimFunc], target: Target, launches: Sequence[Any] | None = None
    ) -> str:
        return generate_cuda(list(funcs), target)

    def compile_module(self, source: str, target: Target) -> nvrtc.CudaModule:
        return nvrtc.build(source, device_arch(target))

    def copy_kernel(self, shape: tuple[int, ...], dtype: str, name: str) -> PrimFunc:
        return copy_func(shape, dtype, name)

    def compiled_model_class(self) -> type[CudaCompiledModel]:
        return CudaCompiledModel


BACKEND = CudaBackend
