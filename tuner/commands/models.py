"""`kiln models`: list the built-in models, summarize an ONNX file (``--onnx FILE``), or write a built-in
model as an ONNX file (``--export-onnx MODEL FILE.onnx``, what the README's ONNX example starts from).
Both ONNX options need the ``onnx`` package (the ``onnx`` extra): without it they say what to install."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from compiler.errors import KilnError
from compiler.frontend.models import MODELS, get_model
from compiler.frontend.onnx import summarize_onnx
from compiler.passes import optimize
from tuner.commands.common import print_table, require_onnx


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models",
        help="list the built-in models (or summarize an ONNX file)",
        description="List the built-in models: name, description, inputs, op counts. With --onnx FILE, "
        "summarize an ONNX file: inputs, op histogram and which ops Kiln supports.",
    )
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument(
        "--onnx",
        metavar="FILE",
        help="summarize an ONNX file instead: inputs with shapes, op histogram, which ops Kiln supports",
    )
    p.add_argument(
        "--export-onnx",
        nargs=2,
        metavar=("MODEL", "FILE.onnx"),
        help="write the built-in MODEL as an ONNX file (static shapes; tune it with --model FILE.onnx)",
    )
    p.set_defaults(handler=run)


def _dims(dims: list) -> str:
    return "x".join("?" if d is None else str(d) for d in dims) or "scalar"


def run_onnx(args: argparse.Namespace) -> int:
    s = summarize_onnx(args.onnx)
    if args.format == "json":
        print(json.dumps(s, indent=2))
        return 0
    rows = [{"op": op, "count": n, "supported": s["support"][op]} for op, n in s["ops"].items()]
    if args.format == "csv":
        print_table(rows, ["op", "count", "supported"], "csv")
        return 0
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in s["opsets"].items())
    print(
        f"{s['file']}: {s['producer'] or 'unknown producer'}, opsets {opsets}, {s['nodes']} nodes, "
        f"{s['parameters']:,} parameters in {s['initializers']} initializers"
    )
    print_table(
        [{"input": i["name"], "dtype": i["dtype"], "shape": _dims(i["shape"])} for i in s["inputs"]],
        ["input", "dtype", "shape"],
        title="inputs",
    )
    print_table(rows, ["op", "count", "supported"], title="ops")
    if s["dynamic_inputs"]:
        names = " ".join(f"--input-shape {n}=..." for n in s["dynamic_inputs"])
        print(f"dynamic inputs: give static shapes when compiling ({names})")
    if s["unsupported_nodes"]:
        print(
            f"not importable: {len(s['unsupported_nodes'])} node(s) use unsupported ops: "
            + ", ".join(sorted({n["op"] for n in s["unsupported_nodes"]}))
        )
    else:
        print("every op is supported")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from compiler.frontend.onnx_export import export_onnx

    name, out = args.export_onnx
    require_onnx("--export-onnx")
    if not out.endswith(".onnx"):
        raise KilnError(f"--export-onnx {name} {out}: the file name must end in .onnx (how --model finds it)")
    graph = get_model(name)
    model = export_onnx(graph)
    path = Path(out)
    if not path.parent.is_dir():
        raise KilnError(f"--export-onnx {name} {out}: directory {str(path.parent)!r} does not exist")
    try:
        path.write_bytes(model.SerializeToString())
    except OSError as exc:
        raise KilnError(f"cannot write {out}: {exc.strerror or exc}") from None
    inputs = ", ".join(f"{v.name}: {v.type}" for v in graph.inputs)
    print(
        f"wrote {out}: model {name} ({inputs}), {len(model.graph.node)} ONNX nodes, opset "
        f"{model.opset_import[0].version}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.onnx and args.export_onnx:
        raise KilnError("--onnx and --export-onnx do not go together: give one")
    if args.export_onnx:
        return run_export(args)
    if args.onnx:
        require_onnx("--onnx")
        return run_onnx(args)
    rows = []
    for spec in MODELS.values():
        g = spec.graph()
        rows.append(
            {
                "name": spec.name,
                "description": spec.description,
                "inputs": ", ".join(f"{v.name}: {v.type}" for v in g.inputs),
                "ops": len(g.nodes),
                "primitive ops": len(optimize(g).nodes),
            }
        )
    print_table(
        rows,
        ["name", "description", "inputs", "ops", "primitive ops"],
        args.format,
        title="Kiln built-in models",
    )
    return 0
