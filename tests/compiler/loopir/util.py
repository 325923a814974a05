"""Helpers: build a scheduled function from a small graph and check it with the interpreter."""

from __future__ import annotations

import numpy as np

from compiler.builder import GraphBuilder
from compiler.graph import Graph
from compiler.loopir import Schedule, evaluate, lower_func
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.te import lower
from compiler.te_ops import graph_to_te


def schedule_of(graph: Graph) -> Schedule:
    return Schedule(lower(graph_to_te(optimize(graph))))


def assert_matches(sch: Schedule, graph: Graph, seed: int = 0, rtol: float = 1e-4) -> None:
    g = optimize(graph)
    rng = np.random.default_rng(seed)
    ins = [rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs]
    ins += [p.data for p in g.params]
    outs = evaluate(lower_func(sch.func), ins)
    refs = run_reference(g, ins[: len(g.inputs)])
    for o, r in zip(outs, refs):
        scale = max(1.0, float(np.abs(r).max()))
        assert float(np.abs(o - r).max()) <= rtol * scale, f"max err {np.abs(o - r).max()}"


def matmul_graph(m: int = 6, n: int = 10, k: int = 5) -> Graph:
    b = GraphBuilder("mm")
    return b.build([b.matmul(b.input("a", (m, k)), b.input("b", (k, n)))])


def softmax_graph(rows: int = 3, cols: int = 16) -> Graph:
    b = GraphBuilder("sm")
    return b.build([b.softmax(b.input("x", (rows, cols)))])


def chain_graph(shape=(4, 12)) -> Graph:
    b = GraphBuilder("chain")
    x = b.input("x", shape)
    return b.build([b.tanh(b.multiply(b.exp(x), 0.5))])
