"""Runtime shared by every backend: static memory planning (``memory_plan``), the executor core that
each backend's compiled-model class extends with its launch step (``executor``), assembling a model plan
into it (``assemble``), its on-disk form (``artifact``) and the on-disk cache of built kernel modules
(``module_cache``)."""

from __future__ import annotations

from compiler.runtime.executor import CompiledModel, KernelInfo
from compiler.runtime.memory_plan import BufferSpec, Launch, MemoryPlan, plan_memory

__all__ = ["BufferSpec", "CompiledModel", "KernelInfo", "Launch", "MemoryPlan", "plan_memory"]
