"""The CPU generic sketch for opaque groups: the group's loop nests as lowered, reductions with their init
hoisted, the outermost loop of each nest parallel when it is data-parallel.

Only the CPU backend offers it: a loop nest with no thread binding is no GPU kernel, so the CUDA backend
has no sketch for opaque groups (compiling one for CUDA fails with an error naming the group)."""

from __future__ import annotations

import contextlib

from compiler.backends import group_analysis as G
from compiler.backends.sketch import Config, Knob, Sketch, output_blocks, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir.schedule import Schedule
from compiler.target import Target


class CpuGenericSketch(Sketch):
    """Opaque groups on the CPU; one knob, the thread pool over each nest's outermost loop or not."""

    name = "generic"
    version = 1
    kinds = ("opaque",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        return [Knob("parallel", ("outer", "none"), "OpenMP over each nest's outermost loop")]

    def default(self, group: Group, target: Target) -> Config:
        return {"parallel": "outer"}

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        sch, _ = prepare(group)
        for b in sch.blocks():
            loops = sch.get_loops(b)
            n_sp = G.n_spatial(b)
            if b.init is not None and len(loops) > n_sp:
                sch.decompose_reduction(b, loops[n_sp])
        if config["parallel"] == "outer":
            for b in output_blocks(sch):
                loops = sch.get_loops(b)
                if loops and b.iter_vars and b.iter_vars[0].kind == "S":
                    with contextlib.suppress(ScheduleError):
                        sch.parallel(loops[0])
        return sch
