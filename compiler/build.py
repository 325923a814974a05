"""compile(model) -> CompiledModel: the whole pipeline.

    graph -> optimize (decompose, fold, cse, dce) -> fuse (default rules or a FusionPlan)
          -> per group: config = tuned record (if a config source has one) or the sketch's default
                        loop IR = sketch.build(group, config, target), lowered
          -> codegen (one translation unit) -> runtime (build, memory plan, executor)

Groups that only reshape one buffer become aliases (no kernel). Every kernel's provenance (workload
key, sketch, config, whether it came from a record, and what the config source said about that record) is
kept in the compiled model's metadata.

The apply rule belongs to the config source (the compiler knows nothing of databases): it answers a
group with ``(sketch, config, origin)`` or ``(sketch, config, origin, info)``; ``info`` (plain JSON: e.g.
whether the record's speed-up over the default was confirmed) is kept as the kernel's ``record`` field.
A config of None with ``info`` means "there is a record, but use the default" (a record confirmed not
faster than the default): the kernel gets the sketch's default and the reason stays in ``record``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compiler.backends import get_backend
from compiler.backends.sketch import Config
from compiler.errors import KilnError, ScheduleError
from compiler.frontend import load_model
from compiler.fusion import FusedGraph, FusionPlan, Group, fuse
from compiler.graph import Graph
from compiler.loopir.stmt import PrimFunc
from compiler.passes import optimize
from compiler.runtime.assemble import assemble
from compiler.runtime.executor import CompiledModel
from compiler.target import Target

log = logging.getLogger("kiln.build")

# (group, target) -> (sketch name, config, origin[, info]) or None to use the sketch's default; a config of
# None with info: use the default, and keep why (see the module docstring)
ConfigSource = Callable[
    [Group, Target], "tuple[str, Config, str] | tuple[str, Config | None, str, dict] | None"
]


@dataclass
class KernelPlan:
    name: str
    group: Group
    sketch: str
    sketch_version: int
    config: Config
    origin: str  # "default" | "record" | "given"
    func: PrimFunc
    trace: str
    record: dict[str, Any] | None = None  # what the config source said about the group's record

    def meta(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workload_key": self.group.workload_key,
            "group_kind": self.group.kind,
            "sketch": self.sketch,
            "sketch_version": self.sketch_version,
            "config": self.config,
            "origin": self.origin,
            "ops": [n.op for n in self.group.nodes],
            **({"record": self.record} if self.record is not None else {}),
        }


@dataclass
class ModelPlan:
    graph: Graph
    fused: FusedGraph
    target: Target
    kernels: list[KernelPlan]
    views: list[Group] = field(default_factory=list)

    @property
    def coverage(self) -> tuple[int, int]:
        """(kernels configured from tuning records, all kernels)."""
        return sum(k.origin == "record" for k in self.kernels), len(self.kernels)


def kernel_for(
    group: Group,
    target: Target,
    config: Config | None = None,
    sketch_name: str | None = None,
    origin: str = "default",
    name: str | None = None,
) -> KernelPlan:
    """Schedule and lower one group for ``target`` with ``config`` (or the sketch's default), using the
    sketch called ``sketch_name`` (or the one ``target``'s backend picks for the group)."""
    backend = get_backend(target)
    sketch = backend.get_sketch(sketch_name) if sketch_name else backend.sketch_for(group, target)
    if config is None:
        config, origin = sketch.default(group, target), "default"
    try:
        sch = sketch.build(group, config, target)
    except ScheduleError as exc:
        raise ScheduleError(
            f"group {group.name} ({group.kind}), sketch {sketch.name}, config {config}: {exc}"
        ) from exc
    func = backend.lower(sch.func)
    func.name = name or group.name
    return KernelPlan(func.name, group, sketch.name, sketch.version, config, origin, func, sch.show_trace())


def plan_model(
    model: Graph | str,
    target: Target | str = "cpu",
    configs: ConfigSource | None = None,
    plan: FusionPlan | None = None,
) -> ModelPlan:
    """Everything up to code generation: optimized graph, groups, and one lowered kernel per group."""
    graph = load_model(model) if isinstance(model, str) else model
    target = Target.parse(target)
    g = optimize(graph)
    fused = fuse(g, plan, target)
    kernels: list[KernelPlan] = []
    views: list[Group] = []
    for group in fused.groups:
        if group.is_view and group.inputs[0].producer is not None:
            views.append(group)
            continue
        chosen = configs(group, target) if configs is not None else None
        info = None
        if chosen is not None:
            sketch_name, config, origin = chosen[:3]
            info = dict(chosen[3]) if len(chosen) > 3 else None
            if config is not None:
                try:
                    kernel = kernel_for(group, target, config, sketch_name, origin)
                    kernel.record = info
                    kernels.append(kernel)
                    continue
                except (ScheduleError, KilnError) as exc:  # a stale record must never break compile
                    log.warning(
                        "record for %s (%s) no longer builds (%s); using the default schedule",
                        group.name,
                        group.workload_key[:12],
                        exc,
                    )
                    info = {**(info or {}), "kept_default": f"no longer builds: {exc}"}
        kernel = kernel_for(group, target)
        kernel.record = info
        kernels.append(kernel)
    # fused.graph: the graph the groups belong to (rewritten when the plan merges sibling GEMMs)
    return ModelPlan(fused.graph, fused, target, kernels, views)


def compile(
    model: Graph | str,
    target: Target | str = "cpu",
    plan: FusionPlan | None = None,
    configs: ConfigSource | None = None,
) -> CompiledModel:
    """Compile a model (graph, built-in name or ONNX path) for ``target``. ``configs`` says which config
    each group uses (``tuner.records.database_config_source(db)`` reads a tuning database); groups it
    has nothing for use their sketch's default."""
    return assemble(plan_model(model, target, configs, plan))
