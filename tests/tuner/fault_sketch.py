"""A test-only sketch whose ``fault`` knob makes a candidate misbehave, for the measurement tests.

It schedules groups that compute ``y = x * c`` (one ``multiply`` by a scalar constant); see
:func:`fault_task`. Every fault is built the honest way, as loop IR the normal pipeline lowers and compiles:

- ``none``: the real pointwise schedule (``vector`` and ``parallel`` knobs pick among good candidates);
- ``wrong``: a different computation, ``x * c + 0.5``;
- ``oob_write``: the right values plus one store one element past the end of the output;
- ``crash``: a store to an absurd index (2**44 elements past the output), which segfaults;
- ``hang``: two nested loops of 2**30 iterations, each a dependent float add to the output;
- ``invalid``: ``check`` rejects it, so nothing is built;
- ``compile_error``: valid IR, but :func:`fault_codegen` (passed to ``LocalBuilder(codegen=...)``) injects a
  line that is not C into this kernel's body, so gcc rejects it (:func:`fault_codegen_prelude` puts it
  before the first kernel instead, where gcc's errors cannot be attributed to a candidate);
- ``slow_build``: scheduling never finishes (for the builder's timeout).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

from compiler.backends.cpu.codegen import generate_c
from compiler.backends.cpu.sketches.pointwise import CpuPointwiseSketch
from compiler.backends.sketch import Config, Knob, Sketch
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir.expr import Load, Var, const
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, Buffer, BufferStore, For, PrimFunc, SeqStmt
from compiler.target import Target
from tuner.task import Task, extract_tasks

FAULTS = ("none", "wrong", "oob_write", "crash", "hang", "invalid", "compile_error")
SLOW_BUILD = "slow_build"  # not in FAULTS: scheduling never finishes (sleeps), for the builder's timeout
EXPECTED = {
    "none": "ok",
    "wrong": "wrong_result",
    "oob_write": "runtime_error",
    "crash": "runtime_error",
    "hang": "timeout",
    "invalid": "invalid_config",
    "compile_error": "compile_error",
}


class FaultSketch(Sketch):
    name = "fault"
    version = 1
    kinds = ("pointwise",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        return [
            Knob("fault", (*FAULTS, SLOW_BUILD)),
            Knob("vector", (1, 8)),
            Knob("parallel", ("outer", "none")),
        ]

    def default(self, group: Group, target: Target) -> Config:
        return {"fault": "none", "vector": 8, "parallel": "none"}

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        if config["fault"] == "invalid":
            raise ScheduleError("fault: this config is invalid on purpose")

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        fault = config["fault"]
        if fault == SLOW_BUILD:
            time.sleep(3600)
        if fault in ("none", "compile_error"):
            pw = {
                "flatten": 1,
                "vector": config["vector"],
                "unroll": 1,
                "parallel": config["parallel"],
                "store": "cached",
            }
            sch = CpuPointwiseSketch().build(group, pw, target)
            if fault == "compile_error":
                sch.func.attrs["fault"] = "compile_error"
            return sch
        sch = CpuPointwiseSketch().build(
            group, {"flatten": 1, "vector": 1, "unroll": 1, "parallel": "none", "store": "cached"}, target
        )
        x, y = sch.func.params
        c = _scale(group)
        n = math.prod(x.shape)
        flat_x = _flat(x, n)
        flat_y = _flat(y, n)
        i = Var("i")
        if fault == "wrong":
            body = For(i, n, BufferStore(flat_y, (i,), Load(flat_x, (i,)) * const(c) + const(0.5)))
        elif fault == "oob_write":
            last = Load(flat_x, (const(n - 1),)) * const(c)
            body = SeqStmt(
                [
                    For(i, n, BufferStore(flat_y, (i,), Load(flat_x, (i,)) * const(c))),
                    BufferStore(flat_y, (const(n),), last),
                ]
            )
        elif fault == "crash":
            body = BufferStore(flat_y, (const(1 << 44),), const(1.0))
        elif fault == "hang":
            j, k = Var("j"), Var("k")
            add = BufferStore(flat_y, (const(0),), Load(flat_y, (const(0),)) + Load(flat_x, (const(0),)))
            body = For(j, 1 << 30, For(k, 1 << 30, add))
        else:
            raise ScheduleError(f"fault: unknown fault {fault!r}")
        func = PrimFunc(sch.func.name, [flat_x, flat_y], Block("root", [], [], SeqStmt([body])), 1)
        return Schedule(func)


def _flat(buf: Buffer, n: int) -> Buffer:
    return Buffer(buf.name, (n,), buf.dtype)


def _scale(group: Group) -> float:
    consts = [n for n in group.subgraph.nodes if n.op == "constant"]
    if len(consts) != 1 or [n.op for n in group.subgraph.nodes if n.op != "constant"] != ["multiply"]:
        raise ScheduleError("fault: schedules only y = x * c groups")
    return float(consts[0].attrs["value"])


def fault_codegen(funcs: Sequence[PrimFunc], target: Any = None) -> str:
    """``generate_c``, then a line that is not C at the top of every kernel marked ``compile_error``."""
    source = generate_c(funcs, target)
    for f in funcs:
        if f.attrs.get("fault") == "compile_error":
            head = f"void {f.name}("
            at = source.index(head)
            body = source.index("{", at) + 1
            source = source[:body] + "\n  this is not C;" + source[body:]
    return source


def fault_codegen_prelude(funcs: Sequence[PrimFunc], target: Any = None) -> str:
    """``generate_c``, then a line that is not C before the first kernel when any kernel is marked
    ``compile_error`` (an error gcc reports outside every candidate's kernel)."""
    source = generate_c(funcs, target)
    if any(f.attrs.get("fault") == "compile_error" for f in funcs):
        at = source.index(f"void {funcs[0].name}(")
        source = source[:at] + "this is not C;\n" + source[at:]
    return source


def fault_task(target: Target | str = "cpu", shape: tuple[int, int] = (64, 128), scale: float = 2.0) -> Task:
    """A task computing ``x * scale`` on ``shape`` scheduled by :class:`FaultSketch`: a task carries its
    sketch (the measurement workers receive it with the task), so no backend needs to list it."""
    b = GraphBuilder("fault")
    graph = b.build([b.multiply(b.input("x", shape), scale)])
    (task,) = extract_tasks(graph, target)
    return dataclasses.replace(task, sketch=FaultSketch())
