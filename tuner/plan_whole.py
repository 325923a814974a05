"""A fusion plan checked on the whole compiled model: the rules' plan and the finalists, timed end to end.

The plan search (:mod:`tuner.plan_search`) scores a plan by the sum of its groups' isolated kernel latencies.
That sum cannot see what separates two kernels in a model: the intermediate written by one and read back by
the next, the cache state a kernel finds (its inputs warm in the harness that repeats it, just written by the
producer in the model), and each extra call. A plan that un-fuses an edge can win the sum and lose the
model (layernorm's e2_3, divide -> broadcast_to, un-fused: faster by the sum, slower as a model). So before
a plan replaces the rules', :func:`time_plans` compiles the model once under the rules' plan and once under
each finalist (the region's plan, the other regions on the rules' plan; each group with the best measured
schedule compile would apply, from ``configs``), checks every output against the numpy reference, and
times the compiled models end to end with a :class:`WholeTimer` (interleaved rounds in rotated order). The
plan search decides with these medians.

Why the whole model and not the region alone: a region cut out as a graph of its own turns the model's
weights into plain inputs, which changes its groups' workload keys (their records would not apply) and what
``optimize`` does to it; zoo models have one or two regions, and the other regions are the same in every
contender (the rules' plan, the same records), so they add the same work to each.

CPU only: a CUDA compiled model is timed on a stream (events, CUDA graphs), which this module does not do;
on CUDA the plan search keeps the sum-of-kernels rule (and logs it).
"""

from __future__ import annotations

import logging
import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compiler.fusion import FusionPlan
from compiler.graph import Graph
from compiler.target import Target

log = logging.getLogger("kiln.plans")

WHOLE_ROUNDS = 7  # interleaved rounds of the rules' plan and the finalists
WHOLE_MIN_TIME = 0.03  # seconds each contender runs back to back in a round
OUTPUT_TOLERANCE = 1e-3  # relative to the reference's largest magnitude (at least 1)


class WholeTimer(ABC):
    """Times compiled models end to end. Contract: :meth:`time` returns, for every name of ``models``,
    ``rounds`` per-round latencies in microseconds (a round's median call); the models are timed in the same
    rounds, the order rotated every round (:func:`tuner.bench.timing.rotated_orders`), with nothing else
    timed on the host meanwhile."""

    @abstractmethod
    def time(self, models: Mapping[str, Any], inputs: list[Any], rounds: int) -> dict[str, list[float]]: ...


class InterleavedWholeTimer(WholeTimer):
    """The real timer: each model bound to the inputs once (:meth:`CompiledModel.bind`, one ctypes call per
    run on the CPU), warmed up, then :func:`tuner.bench.timing.interleave` under the host's timing lock
    (:mod:`tuner.measure.host_lock`: another worker's candidates are not timed at the same moment)."""

    def __init__(self, min_time: float = WHOLE_MIN_TIME) -> None:
        self.min_time = min_time

    def time(self, models: Mapping[str, Any], inputs: list[Any], rounds: int) -> dict[str, list[float]]:
        from tuner.bench.timing import interleave
        from tuner.measure.host_lock import host_timing_lock

        calls = {name: model.bind(inputs) for name, model in models.items()}
        with host_timing_lock():
            for call in calls.values():
                call()
                call()
            timed = interleave(calls, rounds, self.min_time)
        return {name: t.round_medians for name, t in timed.items()}


class KernelCostTimer(WholeTimer):
    """In-memory timer for tests: a model's latency is the sum of ``cost(kernel)`` over its kernels
    (:class:`~compiler.runtime.executor.KernelInfo`: ops, workload key, config), the same every round.
    ``calls`` counts the models timed."""

    def __init__(self, cost: Callable[[Any], float]) -> None:
        self.cost = cost
        self.calls = 0

    def time(self, models: Mapping[str, Any], inputs: list[Any], rounds: int) -> dict[str, list[float]]:
        self.calls += len(models)
        return {name: [sum(self.cost(k) for k in m.kernels)] * rounds for name, m in models.items()}


@dataclass
class WholeTiming:
    """What :func:`time_plans` measured: the per-round latencies of the model under each contender
    (``rules`` and the finalists' names), or ``problem``: why nothing was timed (a build that failed, an
    output that differs from the reference)."""

    rounds: dict[str, list[float]] = field(default_factory=dict)
    problem: str | None = None

    @property
    def medians(self) -> dict[str, float]:
        """Each contender's median over its rounds."""
        return {k: float(statistics.median(v)) for k, v in self.rounds.items()}


def time_plans(
    graph: Graph,
    target: Target,
    plans: Mapping[str, FusionPlan],
    configs: Any,
    timer: WholeTimer,
    rounds: int = WHOLE_ROUNDS,
) -> WholeTiming:
    """Compile ``graph`` (optimized) for ``target`` under each of ``plans`` (name -> whole-graph edge ids;
    ``rules`` among them), every group with ``configs``'s schedule (a
    :data:`~compiler.build.ConfigSource`, what compile applies), check each model's outputs against the
    numpy reference, and time them with ``timer``. A build that fails or an output that differs is
    ``problem`` (nothing timed): the caller keeps the rules' plan."""
    import numpy as np

    from compiler.build import compile as build_model
    from compiler.reference import random_inputs, run_reference
    from tuner.bench.runner import rel_err

    models = {}
    for name, plan in plans.items():
        try:
            models[name] = build_model(graph, target, plan=plan or None, configs=configs)
        except Exception as exc:  # any failure to build keeps the rules' plan, never breaks tuning
            return WholeTiming(problem=f"the model under {name} did not build: {type(exc).__name__}: {exc}")
    inputs = random_inputs(graph, 0)
    try:
        refs = run_reference(graph, inputs)
        for name, model in models.items():
            err = rel_err(model.run(inputs), refs, np.asarray)
            if not err <= OUTPUT_TOLERANCE:
                why = f"the model under {name} differs from the numpy reference (relative error {err:.2e})"
                return WholeTiming(problem=why)
    except Exception as exc:
        return WholeTiming(problem=f"the models could not be run: {type(exc).__name__}: {exc}")
    return WholeTiming(timer.time(models, inputs, rounds))
