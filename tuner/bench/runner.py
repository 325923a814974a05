"""The harness of `kiln bench`: for each workload of a suite, prepare every contender, check its outputs
against the numpy reference, then time the ones that passed together (:mod:`tuner.bench.timing`), and
measure the copy ceiling at the workload's own working set with the same threads.

Nothing here raises for one bad contender or workload: a contender that cannot run, cannot compute a
workload, or computes it wrong gets a result with that status and the reason, and the run goes on.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import numpy as np

from tuner.bench import ceilings
from tuner.bench.contenders import BenchContext, Contender, Prepared, PreparedWorkload
from tuner.bench.results import ERROR, OK, UNAVAILABLE, WRONG, BenchResult, BenchRun
from tuner.bench.suite import Suite, Workload
from tuner.bench.timing import cpu_snapshot, interleave, load_average, others_cpu

COPY, SGEMM = "ceiling: copy", "ceiling: sgemm"  # timed with the contenders, not contenders themselves
COMPUTE_BOUND = 10.0  # contraction FLOPs per byte above which a workload is compared with SGEMM
TOLERANCE = 1e-3  # max|out - ref| / max(1, max|ref|); fused kernels and other libraries round differently


def graph_costs(graph: Any) -> tuple[float, float, float]:
    """(FLOPs of every node, FLOPs of the contractions, bytes of inputs + params + outputs) of ``graph``,
    counted on the graph after the optimizing passes (composite ops decomposed)."""
    from compiler.fusion import node_flops
    from compiler.passes import optimize

    g = optimize(graph)
    flops = float(sum(node_flops(n) for n in g.nodes))
    contraction = float(sum(node_flops(n) for n in g.nodes if n.op in ("matmul", "batch_matmul", "conv2d")))
    values = {id(v): v for v in (*graph.inputs, *graph.params, *graph.outputs)}
    nbytes = float(sum(v.type.nbytes for v in values.values()))
    return flops, contraction, nbytes


def prepare_workload(w: Workload) -> PreparedWorkload:
    from compiler.frontend import load_model
    from compiler.reference import random_inputs, run_reference

    graph = load_model(w.model, w.input_shapes or None)
    inputs = random_inputs(graph, seed=0)
    refs = run_reference(graph, inputs)
    flops, contraction, nbytes = graph_costs(graph)
    onnx = str(w.onnx_path) if w.onnx_path else None
    return PreparedWorkload(w.name, w.model, graph, inputs, refs, flops, contraction, nbytes, onnx)


def rel_err(got: Sequence[Any], refs: Sequence[np.ndarray], to_numpy: Callable[[Any], np.ndarray]) -> float:
    """The worst max|out - ref| / max(1, max|ref|) over the outputs (inf for a wrong count or shape)."""
    got = list(got)
    if len(got) != len(refs):
        return float("inf")
    worst = 0.0
    for g, r in zip(got, refs):
        a = np.asarray(to_numpy(g), dtype=np.float64)
        if a.size != r.size:
            return float("inf")
        a = a.reshape(r.shape)
        err = float(np.abs(a - r).max() / max(1.0, float(np.abs(r).max()))) if r.size else 0.0
        if not np.isfinite(err):
            return float("inf")
        worst = max(worst, err)
    return worst


def run_suite(
    suite: Suite,
    contenders: list[Contender],
    ctx: BenchContext,
    *,
    target_key: str,
    environment: dict[str, Any],
    settings: dict[str, Any],
    command_line: str = "",
    slowdown: dict[str, float] | None = None,
    measure_ceilings: bool = True,
    log: TextIO = sys.stderr,
) -> BenchRun:
    """Run ``suite`` (see the module doc); ``settings`` (rounds, min_time, ...) are stored as given."""
    rounds, min_time = int(settings["rounds"]), float(settings["min_time"])
    run = BenchRun(
        suite=suite.name,
        target_key=target_key,
        command_line=command_line,
        environment=environment,
        settings={**settings, "slowdown": slowdown or {}},
        ceilings={},
        started_at=datetime.now(UTC).replace(tzinfo=None),
        load_before=load_average(),
    )
    missing = {c.name: c.unavailable(ctx) for c in contenders}
    for w in suite.workloads:
        print(f"{w.name}: preparing", file=log, flush=True)
        pw = prepare_workload(w)
        prepared: dict[str, Prepared] = {}
        results: dict[str, BenchResult] = {}
        for c in contenders:
            res = BenchResult(w.name, c.name, OK, flops=pw.flops, bytes=pw.bytes, note=c.note)
            results[c.name] = res
            if missing[c.name] is not None:
                res.status, res.error = UNAVAILABLE, missing[c.name]
                continue
            try:
                p = c.prepare(pw, ctx)
                res.max_rel_err = rel_err(p.call(), pw.refs, p.to_numpy)
            except Exception as exc:  # recorded with the result; one contender never stops the run
                res.status, res.error = ERROR, f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
                continue
            res.info.update(p.info)
            if not res.max_rel_err <= TOLERANCE:
                res.status = WRONG
                res.error = f"max|err| / max(1, max|ref|) = {res.max_rel_err:.2e} > {TOLERANCE:g}"
                continue
            prepared[c.name] = p
        calls: dict[str, Callable[[], Any]] = {k: p.call for k, p in prepared.items()}
        copy = sgemm = None
        if measure_ceilings and ctx.target == "cpu" and prepared:  # timed in the same rounds, same load
            copy = calls[COPY] = ceilings.CopyCeiling(int(pw.bytes), ctx.threads)
            if pw.bytes and pw.contraction_flops / pw.bytes > COMPUTE_BOUND:
                sgemm = calls[SGEMM] = ceilings.SgemmCeiling(ctx.threads)
        load0, cpu0 = load_average(), cpu_snapshot()
        try:
            timed = interleave(
                calls, rounds, min_time, clocks={k: p.clock for k, p in prepared.items()}, slowdown=slowdown
            )
        finally:
            if copy is not None:
                copy.close()
        load1, others = load_average(), others_cpu(cpu0, cpu_snapshot())
        for name, t in timed.items():
            if name in results:
                results[name].rounds_us = t.rounds
        ceiling_info: dict[str, Any] = {}
        if copy is not None:
            ceiling_info["copy_gbs_same_set"] = copy.gbs(statistics.median(timed[COPY].round_medians))
        if sgemm is not None:
            ceiling_info["sgemm_gflops_same_rounds"] = sgemm.gflops(
                statistics.median(timed[SGEMM].round_medians)
            )
        for res in results.values():
            res.info.update(load=[load0, load1], graph=pw.graph.name, contraction_flops=pw.contraction_flops)
            if others is not None:
                res.info["others_cpu"] = round(others, 3)
        for res in results.values():
            res.info.update(ceiling_info)
        run.results.extend(results.values())
        line = ", ".join(
            f"{r.contender} {r.median_us:,.1f} us" if r.median_us is not None else f"{r.contender} {r.status}"
            for r in results.values()
        )
        print(f"{w.name}: {line}", file=log, flush=True)
    if measure_ceilings:
        run.ceilings = (
            ceilings.machine_ceilings(ctx.threads) if ctx.target == "cpu" else ceilings.cuda_ceilings()
        )
    run.load_after = load_average()
    run.finished_at = datetime.now(UTC).replace(tzinfo=None)
    return run
