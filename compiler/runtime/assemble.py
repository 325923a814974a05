"""Turn a ModelPlan (groups with lowered kernels) into a CompiledModel: buffers, launches, one library.

Buffer roles: graph inputs, params (weights, bound once), kernel outputs (graph outputs or
intermediates planned into one arena), and views (aliases of another buffer, no copy). A graph output
that no kernel produces (an input or param returned as is) gets a small copy kernel."""

from __future__ import annotations

from typing import Any

from compiler.backends import get_backend
from compiler.canonical import canonical_json
from compiler.errors import KilnError
from compiler.graph import Value
from compiler.layouts import layout_from_json
from compiler.runtime.executor import CompiledModel, KernelInfo
from compiler.runtime.memory_plan import BufferSpec, Launch


def assemble(plan: Any) -> CompiledModel:
    """Build the CompiledModel of a :class:`compiler.build.ModelPlan` with its target's backend."""
    backend = get_backend(plan.target)
    g = plan.graph
    ids: dict[Value, int] = {}
    buffers: list[BufferSpec] = []
    params = {}

    def add(v: Value, role: str, name: str, alias_of: int | None = None) -> int:
        i = len(buffers)
        buffers.append(BufferSpec(i, name, tuple(v.shape), v.dtype, role, alias_of))
        ids[v] = i
        return i

    names: set[str] = set()
    for v in g.inputs:
        if v.name in names:
            raise KilnError(f"model {g.name} has two inputs named {v.name!r}")
        names.add(v.name or f"input{len(names)}")
        add(v, "input", v.name or f"input{len(names)}")
    for p in g.params:
        params[add(p, "param", p.name or f"param{len(params)}")] = p.data
    graph_outputs = set(g.outputs)
    relaid_cache: dict[tuple[int, str], int] = {}

    def relaid(v: Value, spec: dict) -> int:
        """A param laid out as a kernel asks (packed weights), computed once and shared by kernels."""
        if v.kind != "param":
            raise KilnError(
                f"a kernel asks for input {v.name} in layout {spec}, but it is not a model constant"
            )
        key = (ids[v], canonical_json(spec))
        if key not in relaid_cache:
            data = layout_from_json(spec).apply(v.data)
            i = len(buffers)
            buffers.append(BufferSpec(i, f"{v.name}.packed", tuple(data.shape), v.dtype, "param", None))
            params[i] = data
            relaid_cache[key] = i
        return relaid_cache[key]

    producer_of = {}
    for k in plan.kernels:
        for v in k.group.outputs:
            producer_of[v] = k
    view_of = {grp.outputs[0]: grp for grp in plan.views}
    launches: list[Launch] = []
    funcs = []
    infos: list[KernelInfo] = []
    pending = list(plan.fused.groups)
    for grp in pending:  # groups are in topological order
        if grp.outputs[0] in view_of and view_of[grp.outputs[0]] is grp:
            v = grp.outputs[0]
            role = "output" if v in graph_outputs else "intermediate"
            add(v, role, v.name or grp.name, alias_of=ids[grp.inputs[0]])
            continue
        k = next(k for k in plan.kernels if k.group is grp)
        for v in grp.outputs:
            add(v, "output" if v in graph_outputs else "intermediate", v.name or grp.name)
        args = [ids[v] for v in grp.inputs]
        for pos, spec in (k.func.attrs.get("input_layouts") or {}).items():
            args[int(pos)] = relaid(grp.inputs[int(pos)], spec)
        launches.append(Launch(k.name, args + [ids[v] for v in grp.outputs]))
        funcs.append(k.func)
        infos.append(
            KernelInfo(
                k.name,
                k.group.workload_key,
                k.sketch,
                k.config,
                {
                    "origin": k.origin,
                    "sketch_version": k.sketch_version,
                    "group_kind": k.group.kind,
                    "ops": [n.op for n in k.group.nodes],
                    **({"record": k.record} if k.record is not None else {}),
                },
            )
        )
    outputs = []
    for n, v in enumerate(g.outputs):
        i = ids.get(v)
        if i is None or buffers[i].role != "output" or i in outputs:
            src = ids[v]
            name = f"copy_out{n}"
            out_v = Value(v.type, "node", f"output{n}")
            j = add(out_v, "output", v.name or f"output{n}")
            funcs.append(backend.copy_kernel(tuple(v.shape), v.dtype, name))
            launches.append(Launch(name, [src, j]))
            infos.append(KernelInfo(name, None, "copy", {}, {"origin": "default"}))
            i = j
        outputs.append(i)
    meta = {
        "model": g.name,
        "graph_hash": g.structural_hash(),
        "output_names": [v.name or f"output{n}" for n, v in enumerate(g.outputs)],
        "groups": len(plan.fused.groups),
        "views": len(plan.views),
    }
    return backend.compiled_model_class().from_funcs(
        g.name,
        funcs,
        buffers,
        launches,
        params,
        [ids[v] for v in g.inputs],
        [v.name for v in g.inputs],
        outputs,
        target=plan.target,
        kernels=infos,
        meta=meta,
    )
