"""Stages of `kiln show` beyond the graph: groups, loopir (scheduled and lowered) and code."""

from __future__ import annotations

from tuner.commands.show import stage


def _groups_of(graph):
    from compiler.fusion import fuse
    from compiler.passes import optimize

    return fuse(optimize(graph))


@stage("groups")
def _groups(graph, args) -> str:
    fused = _groups_of(graph)
    out = [fused.summary(), ""]
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
    from compiler.build import plan_model

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
    if plan.target.kind == "cuda":
        from compiler.backends.cuda.codegen import generate_cuda

        return generate_cuda([k.func for k in kernels], plan.target)
    from compiler.backends.cpu.codegen import generate_c

    return generate_c([k.func for k in kernels], plan.target)
