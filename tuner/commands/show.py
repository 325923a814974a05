"""`kiln show --model NAME --stage STAGE`: print a model at one stage of compilation."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from tuner.commands.common import add_model_arg, load_model_arg

# stage name -> function(graph, args) -> text. Later stages (groups, loopir, code) register here.
STAGES: dict[str, Callable] = {}


def stage(name: str):
    def deco(fn: Callable) -> Callable:
        STAGES[name] = fn
        return fn

    return deco


@stage("graph")
def _graph(graph, args) -> str:
    return str(graph)


@stage("decomposed")
def _decomposed(graph, args) -> str:
    from compiler.passes import optimize

    return str(optimize(graph))


def _load_later_stages() -> None:
    try:
        import compiler.show_stages  # noqa: F401  (registers groups / loopir / code)
    except ModuleNotFoundError as exc:
        if exc.name != "compiler.show_stages":
            raise


def register(subparsers: argparse._SubParsersAction) -> None:
    _load_later_stages()
    p = subparsers.add_parser(
        "show",
        help="print a model at a compilation stage",
        description="Print a model at one stage: " + ", ".join(STAGES),
    )
    add_model_arg(p)
    p.add_argument("--stage", choices=list(STAGES), default="graph")
    p.add_argument("--target", default="cpu", help="target for loopir/code stages (cpu or cuda)")
    p.add_argument("--group", type=int, default=None, help="only this group (index) for per-group stages")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(STAGES[args.stage](load_model_arg(args), args))
    return 0
