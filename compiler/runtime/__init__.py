"""Runtime shared by every backend: static memory planning (``memory_plan``), the whole-model executor
(``executor``), assembling a model plan into it (``assemble``) and its on-disk form (``artifact``)."""

from __future__ import annotations

from compiler.runtime.executor import CompiledModel, KernelInfo
from compiler.runtime.memory_plan import BufferSpec, Launch, MemoryPlan, plan_memory

__all__ = ["BufferSpec", "CompiledModel", "KernelInfo", "Launch", "MemoryPlan", "plan_memory"]
