"""Text form of a graph, in the style of CINN's program dumps:

graph softmax(%0: f32[64,128]) {
  %1 = reduce_max(%0) {axes=[1], keepdims=true} : f32[64,1]
  %2 = broadcast_to(%1) {shape=[64,128]} : f32[64,128]
  %3 = subtract(%0, %2) : f32[64,128]
  ...
  return %7
}
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compiler.graph import Graph, Value


def _fmt_attr(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt_attr(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


def print_graph(graph: Graph, show_names: bool = True) -> str:
    numbers: dict[Value, int] = {}

    def ref(v: Value) -> str:
        return f"%{numbers[v]}"

    for v in graph.inputs:
        numbers[v] = len(numbers)
    header = ", ".join(f"%{numbers[v]}: {v.type}" for v in graph.inputs)
    lines = [f"graph {graph.name}({header}) {{"]
    for p in graph.params:
        numbers[p] = len(numbers)
        lines.append(f'  %{numbers[p]} = param "{p.name}" : {p.type}')
    for node in graph.nodes:
        for v in node.outputs:
            numbers[v] = len(numbers)
        outs = ", ".join(ref(v) for v in node.outputs)
        args = ", ".join(ref(v) for v in node.inputs)
        attrs = {k: a for k, a in node.attrs.items() if a is not None}
        attr_text = (" {" + ", ".join(f"{k}={_fmt_attr(a)}" for k, a in attrs.items()) + "}") if attrs else ""
        types = ", ".join(str(v.type) for v in node.outputs)
        comment = f"  // {node.name}" if show_names else ""
        lines.append(f"  {outs} = {node.op}({args}){attr_text} : {types}{comment}")
    lines.append("  return " + ", ".join(ref(v) for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines)
