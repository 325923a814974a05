"""CPU runtime: gcc builds with an on-disk cache (``cbuild``), static memory planning (``memory_plan``),
the whole-model executor (``executor``) and its on-disk form (``artifact``)."""

from __future__ import annotations

from compiler.runtime.cbuild import KernelLibrary, build, compile_source
from compiler.runtime.executor import CompiledModel, KernelInfo
from compiler.runtime.memory_plan import BufferSpec, Launch, MemoryPlan, plan_memory

__all__ = [
    "BufferSpec",
    "CompiledModel",
    "KernelInfo",
    "KernelLibrary",
    "Launch",
    "MemoryPlan",
    "build",
    "compile_source",
    "plan_memory",
]
