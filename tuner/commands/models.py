"""`kiln models`: list the built-in models (or summarize an ONNX file with --onnx)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models",
        help="list the built-in models",
        description="List the built-in models: name, description, inputs, op counts.",
    )
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from compiler.frontend.models import MODELS
    from compiler.passes import optimize
    from tuner.commands.common import print_table

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
