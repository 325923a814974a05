"""`kiln show --model NAME --stage STAGE`: print a model at one stage of compilation."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from compiler.backends import get_backend
from compiler.build import plan_model
from compiler.fusion import fuse
from compiler.passes import optimize
from compiler.target import tf32_spec
from tuner.commands.common import add_model_arg, load_model_arg

# stage name -> function(graph, args) -> text, in pipeline order
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
    return str(optimize(graph))


def _groups_of(graph, args):
    """The groups compile makes: with ``--db``, under the stored fusion plans that beat the rules."""
    from compiler.target import Target

    g = optimize(graph)
    target = Target.parse(args.target)
    if getattr(args, "db", None) is None:
        return fuse(g, target=target), []
    from tuner.commands.common import open_database
    from tuner.plan_search import database_plan

    with open_database(args) as db:
        report = database_plan(db, g, target)
    head = []
    for line in report.lines:
        what = {
            "applied": "applied, edges flipped from the rules: " + ", ".join(line["flipped"]),
            "rules": "the rules' plan (" + line["why"] + ")",
            "stale": "stale, skipped: " + line["why"],
        }[line["status"]]
        head.append(f"fusion plan of region {line['region']} [{line['region_key'][:12]}]: {what}")
    if not report.lines:
        head.append("no stored fusion plan for this model's regions: the rules' groups")
    return fuse(g, report.plan or None, target), [*head, ""]


@stage("groups")
def _groups(graph, args) -> str:
    fused, head = _groups_of(graph, args)
    out = [*head, fused.summary(), ""]
    for g in fused.groups:
        if args.group is not None and g.index != args.group:
            continue
        head = f"// group {g.index}: {g.kind}" + (" (view: aliased, no kernel)" if g.is_view else "")
        out += [head, f"// workload {g.workload_key}", str(g.subgraph), ""]
    if fused.rejected:
        out.append("fusion edges the rules wanted but could not take:")
        out += [f"  {e}: {why}" for e, why in sorted(fused.rejected.items())]
    return "\n".join(out)


def _kernels(graph, args):
    plan = plan_model(graph, args.target)
    return [k for k in plan.kernels if args.group is None or k.group.index == args.group], plan


@stage("loopir")
def _loopir(graph, args) -> str:
    kernels, _ = _kernels(graph, args)
    out = []
    for k in kernels:
        out += [
            f"// {k.name}: sketch {k.sketch} v{k.sketch_version}, config {k.config} ({k.origin})",
            "// schedule:",
            *("//   " + line for line in k.trace.splitlines()),
            repr(k.func),
            "",
        ]
    return "\n".join(out)


@stage("code")
def _code(graph, args) -> str:
    kernels, plan = _kernels(graph, args)
    return get_backend(plan.target).codegen([k.func for k in kernels], plan.target)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "show",
        help="print a model at a compilation stage",
        description="Print a model at one stage: " + ", ".join(STAGES),
    )
    add_model_arg(p)
    p.add_argument("--stage", choices=list(STAGES), default="graph")
    p.add_argument("--target", default="cpu", help="target for loopir/code stages (cpu or cuda)")
    p.add_argument("--tf32", action="store_true", help="cuda: float32 matmuls may use TF32 tensor cores")
    p.add_argument("--group", type=int, default=None, help="only this group (index) for per-group stages")
    p.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="groups stage: apply the fusion plans stored in this tuning database (as compile does)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    args.target = tf32_spec(args.target, args.tf32)
    print(STAGES[args.stage](load_model_arg(args, check_memory=False), args))
    return 0
