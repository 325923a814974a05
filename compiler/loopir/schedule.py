"""Schedule primitives over block-structured loop IR.

A :class:`Schedule` edits a :class:`PrimFunc` in place. Every primitive checks its legality and raises
:class:`ScheduleError` naming the block, loop or buffer at fault; every applied primitive is appended
to a printable trace. The primitives follow TVM TensorIR's semantics:

- loops: ``split``, ``fuse``, ``reorder``, ``parallel``, ``vectorize``, ``unroll``, ``bind``
- blocks: ``compute_inline``, ``reverse_compute_inline``, ``compute_at``, ``reverse_compute_at``,
  ``cache_read``, ``cache_write``, ``rfactor``, ``decompose_reduction``, ``set_scope``,
  ``transform_layout``

A reduction block's ``init`` runs when all of its reduce iteration variables are zero, so loops may be
reordered freely; ``decompose_reduction`` hoists the init into its own loop nest.
"""

from __future__ import annotations

from compiler.loopir.sched_base import THREAD_TAGS, ScheduleBase
from compiler.loopir.sched_compute import ComputePrimitives
from compiler.loopir.sched_loops import LoopPrimitives
from compiler.loopir.sched_reduce import ReductionPrimitives
from compiler.loopir.sched_storage import StoragePrimitives


class Schedule(LoopPrimitives, ComputePrimitives, StoragePrimitives, ReductionPrimitives, ScheduleBase):
    """Apply schedule primitives to ``func`` (edited in place); ``trace`` records each step.

    The primitives are grouped by what they change: loops (``sched_loops``), where blocks compute
    (``sched_compute``), storage and layout (``sched_storage``), reductions (``sched_reduce``)."""


__all__ = ["THREAD_TAGS", "Schedule"]
