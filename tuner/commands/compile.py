"""`kiln compile` and `kiln run`: build a model into a directory, run a compiled model.

`kiln compile --db URL` / `--use-db` only reads the tuning database: one that does not exist is an error
(never created empty). A model whose buffers do not fit in memory is refused with the bytes it needs.

The compile report says which record each kernel uses by the selection rule of :mod:`db.selection` and
counts them: records confirmed faster than the default, unconfirmed ones (the lowest median: no
confirmation against the current default), default configs that measured best, kernels that keep the
default schedule because a record of theirs was confirmed not faster (or failed), and kernels without a
record. When no kernel found a record for this machine's target key but the database holds records
for other targets of the same kind (another CPU model or ISA level, another GPU), the report names them
and says how to proceed instead of applying them."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable

from compiler.errors import KilnError
from compiler.target import tf32_spec
from db.selection import STANDINGS
from tuner.commands.common import (
    DEFAULT_DB_HELP,
    add_model_arg,
    load_model_arg,
    open_database,
    parse_input_shapes,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compile",
        help="compile a model (with the best tuning records when --db is given)",
        description="Compile a model for a target. With --db, each kernel uses the tuning record the "
        "selection rule picks for the target (a record confirmed faster than the default first; none "
        "where a record was confirmed not faster; else the lowest median); kernels without one use the "
        "rule-based default schedule.",
    )
    add_model_arg(p)
    p.add_argument("--target", default="cpu", help="cpu (this host), cuda, or a full target key")
    p.add_argument(
        "--tf32",
        action="store_true",
        help="cuda: float32 matmuls may use TF32 tensor cores (10-bit mantissas; part of the target key)",
    )
    p.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="directory to write the compiled model to"
    )
    p.add_argument(
        "--db",
        default=None,
        help=f"tuning database URL ({DEFAULT_DB_HELP}); omit it and --use-db to compile with default "
        "schedules only",
    )
    p.add_argument("--use-db", action="store_true", help="use the default database even without --db")
    _add_format_arg(p)
    p.set_defaults(handler=_json_result(run_compile))

    r = subparsers.add_parser(
        "run",
        help="run a compiled model and report its latency",
        description="Run a compiled model directory on given or random inputs.",
    )
    r.add_argument("path", metavar="DIR", help="a directory written by kiln compile")
    r.add_argument("--inputs", metavar="FILE.npz", help="inputs by name (default: seeded random inputs)")
    r.add_argument("--save-outputs", metavar="FILE.npz", help="write the outputs here")
    r.add_argument("--repeats", type=int, default=20, help="timed runs (default 20)")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--check", action="store_true", help="compare with the numpy reference of the model")
    _add_format_arg(r)
    r.set_defaults(handler=_json_result(run_run))


def run_compile(args: argparse.Namespace) -> int:
    from tuner.api import compile as kiln_compile

    graph = load_model_arg(args)
    db = None
    with contextlib.ExitStack() as stack:
        if args.db or args.use_db:  # read only: a database that does not exist is an error, not created
            db = stack.enter_context(open_database(args, create=False))
        model = kiln_compile(graph, tf32_spec(args.target, args.tf32), db=db)
    # what `kiln run --check` needs to rebuild the reference: the model name or ONNX path and its shapes
    model.meta["model_source"] = args.model
    model.meta["input_shapes"] = {k: list(v) for k, v in parse_input_shapes(args.input_shape).items()}
    model.save(args.output)
    tuned = [k for k in model.kernels if k.extra.get("origin") == "record"]
    unconfirmed = [
        k.name
        for k in tuned
        if not (k.extra.get("record") or {}).get("confirmed")
        and not (k.extra.get("record") or {}).get("default_is_best")
    ]
    kept = {
        k.name: k.extra["record"]["kept_default"]
        for k in model.kernels
        if k.extra.get("origin") != "record" and (k.extra.get("record") or {}).get("kept_default")
    }
    standings = {k.name: _standing(k) for k in model.kernels if k.workload_key}
    counts = {s: sum(1 for v in standings.values() if v == s) for s in STANDINGS}
    args.result = {
        "model": graph.name,
        "target": model.target.key,
        "output": args.output,
        "kernels": len(model.kernels),
        "kernels_from_records": len(tuned) if db is not None else None,
        "unconfirmed_records": unconfirmed if db is not None else None,
        "kept_default": kept if db is not None else None,
        "selection": counts if db is not None else None,
        "default_schedule": [k.name for k in model.kernels if k.extra.get("origin") != "record"],
        "other_targets": None,
    }
    print(f"compiled {graph.name} for {model.target.key}: {len(model.kernels)} kernels -> {args.output}")
    for line in model.meta.get("fusion_plans", []):
        if line["status"] == "applied":
            whole = ""
            if line.get("whole_us") is not None and line.get("rule_whole_us") is not None:
                whole = (
                    f" (whole model {line['whole_us']:,.1f} us, rules' plan {line['rule_whole_us']:,.1f} us)"
                )
            print(
                f"fusion plan of region {line['region']} applied: {', '.join(line['flipped'])} flipped{whole}"
            )
        elif line["status"] == "rules" and line["flipped"]:
            print(f"fusion plan of region {line['region']} not applied: {line['why']}")
        elif line["status"] == "stale":
            print(f"fusion plan of region {line['region']} skipped (stale): {line['why']}")
    if db is not None:
        print(
            f"coverage: {len(tuned)} of {len(model.kernels)} kernels use tuning records"
            + (f" ({len(unconfirmed)} unconfirmed)" if unconfirmed else "")
        )
        print(
            f"selection: {counts['confirmed']} confirmed faster than the default, {counts['unconfirmed']} "
            f"unconfirmed (lowest median), {counts['default_is_best']} default config measured best; "
            f"{counts['kept_default']} keep the default schedule (confirmed not faster), "
            f"{counts['no_record']} without a record"
        )
        for k in model.kernels:
            if k.extra.get("origin") == "record":
                info = k.extra.get("record") or {}
                shown = "unconfirmed"
                if info.get("confirmed"):
                    shown = f"{info['speedup']:.2f}x (±{100 * info['spread']:.0f}%) over default"
                elif info.get("default_is_best"):
                    shown = "the default config is the best found"
                print(f"  record: {k.name} ({k.sketch}, workload {k.workload_key[:12]}): {shown}")
            elif k.name in kept:
                print(f"  default schedule kept: {k.name} (record {kept[k.name]})")
            elif k.workload_key:
                print(f"  default schedule: {k.name} ({k.sketch}, workload {k.workload_key[:12]}): no record")
        if not tuned and not kept:
            others = _other_targets(db, model.target.key)
            args.result["other_targets"] = others
            if others:
                print(
                    f"hint: the database has records for {', '.join(others)} but this machine is "
                    f"{model.target.key}; records are never applied to another machine class: tune here "
                    "(kiln tune), or pass --target with one of those keys to apply its records anyway"
                )
    return 0


def _standing(kernel) -> str:
    """How the selection rule (:mod:`db.selection`) placed a kernel; a record that no longer builds counts
    as keeping the default."""
    info = kernel.extra.get("record") or {}
    if kernel.extra.get("origin") != "record" and info.get("kept_default"):
        return "kept_default"
    return info.get("standing", "no_record")


def _other_targets(db, target_key: str) -> list[str]:
    """Target keys of the same kind as ``target_key`` that hold records in ``db`` (other machines)."""
    kind = target_key.split("/", 1)[0]
    return [
        k
        for k in db.target_keys()
        if k != target_key and k.split("/", 1)[0] == kind and db.find_records(target_key=k, limit=1)
    ]


def _inputs(model, path: str | None):
    import numpy as np

    if path is None:
        rng = np.random.default_rng(0)
        return {
            spec["name"]: rng.standard_normal(spec["shape"]).astype(spec["dtype"])
            for spec in model.input_specs
        }
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise KilnError(f"cannot read inputs from {path}: {exc}") from None


def run_run(args: argparse.Namespace) -> int:
    import numpy as np

    from compiler.runtime import CompiledModel

    model = CompiledModel.load(args.path)  # a CPU or a CUDA model directory (the manifest says which)
    inputs = _inputs(model, args.inputs)
    outputs = model.run(inputs)
    stats = model.timeit(inputs, repeats=args.repeats, warmup=args.warmup)
    args.result = {
        "model": model.name,
        "target": model.target.key,
        "median_us": stats["median_us"],
        "min_us": min(stats["samples_us"]),
        "max_us": max(stats["samples_us"]),
        "repeats": args.repeats,
        "outputs": [
            {"name": spec["name"], "dtype": str(o.dtype), "shape": list(o.shape)}
            for spec, o in zip(model.output_specs, outputs)
        ],
        "check": None,
    }
    print(
        f"{model.name} on {model.target.key}: median {stats['median_us']:.1f} us over {args.repeats} runs "
        f"(min {min(stats['samples_us']):.1f}, max {max(stats['samples_us']):.1f})"
    )
    for spec, out in zip(model.output_specs, outputs):
        print(f"  output {spec['name']}: {out.dtype}{list(out.shape)}")
    if args.save_outputs:
        np.savez(args.save_outputs, **{spec["name"]: o for spec, o in zip(model.output_specs, outputs)})
    if args.check:
        from compiler.frontend import load_model
        from compiler.reference import run_reference

        source = model.meta.get("model_source") or model.meta["model"]
        shapes = {k: tuple(v) for k, v in (model.meta.get("input_shapes") or {}).items()}
        graph = load_model(source, shapes or None)
        refs = run_reference(graph, inputs)
        worst = max(float(np.abs(o - r).max() / max(1.0, np.abs(r).max())) for o, r in zip(outputs, refs))
        print(f"  max |err| / max |ref| vs the numpy reference: {worst:.2e}")
        args.result["check"] = {"max_rel_err": worst, "ok": worst <= 1e-4}
        if worst > 1e-4:
            print("kiln run: outputs differ from the reference", file=sys.stderr)
            return 1
    return 0


def _add_format_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text (default), or json: the result as JSON on stdout, other output on stderr",
    )


def _json_result(
    handler: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """``handler`` with ``--format json``: its text goes to stderr and the ``args.result`` it sets is
    printed as JSON on stdout."""

    def run(args: argparse.Namespace) -> int:
        if args.format != "json":
            return handler(args)
        with contextlib.redirect_stdout(sys.stderr):
            code = handler(args)
        print(json.dumps({**getattr(args, "result", {}), "exit_status": code}, indent=2))
        return code

    return run
