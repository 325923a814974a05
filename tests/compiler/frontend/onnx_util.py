"""Helpers for the ONNX importer tests: build models with onnx.helper, run them with onnxruntime (the
ground truth), import them, and compare every Kiln execution path through :func:`kiln_outputs` (numpy
reference, optimized graph, compiled CPU model)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX importer tests need the onnx package (extra 'onnx')")
ort = pytest.importorskip("onnxruntime", reason="the ONNX importer tests compare against onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from compiler.frontend.onnx import load_onnx  # noqa: E402
from compiler.graph import Graph  # noqa: E402
from compiler.passes import optimize  # noqa: E402
from compiler.reference import run_reference  # noqa: E402

NEWEST = 21  # the newest opset Kiln imports (onnx 1.23 knows more)
F32 = TensorProto.FLOAT


def tinfo(name: str, shape: Sequence[int | str] | None, elem: int = F32) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, arr: np.ndarray) -> Any:
    return numpy_helper.from_array(np.asarray(arr), name)


def make_model(
    nodes: Sequence[Any],
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    initializers: Sequence[Any] = (),
    opset: int = 13,
    name: str = "test",
) -> Any:
    """A checked ModelProto with one default-domain opset (IR version low enough for onnxruntime)."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)  # output shapes
    del model.graph.value_info[:]
    if all(o.type.tensor_type.HasField("shape") for o in model.graph.output):
        onnx.checker.check_model(model)  # (it insists on output shapes, which inference cannot always tell)
    return model


def random_feeds(model: Any, seed: int = 0, shapes: Mapping[str, Sequence[int]] | None = None) -> dict:
    """Deterministic inputs for the model's graph inputs (floats ~N(0,1), ints in [0, 8), bools)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for v in model.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        shape = tuple((shapes or {}).get(v.name) or [d.dim_value for d in t.shape.dim])
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[v.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[v.name] = rng.random(shape) < 0.5
        else:
            feeds[v.name] = rng.integers(0, 8, shape).astype(dtype)
    return feeds


def ort_outputs(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))


# Every check_model compiles the imported graph for the CPU too (each distinct graph once per session, a
# few seconds for the whole op suite); KILN_ONNX_COMPILE=0 skips that for a quick importer-only loop (the
# net tests, which pass compiled=True, still compile).
COMPILE = os.environ.get("KILN_ONNX_COMPILE", "1") not in ("", "0")
_compiled: dict[tuple[str, str], Any] = {}


def compiled_model(graph: Graph) -> Any:
    """``compiler.build.compile(graph, "cpu")`` with default schedules, once per distinct graph (structure,
    input order and weights) per test session."""
    from compiler.build import compile as kiln_compile

    key = (graph.structural_hash(), graph.params_hash())
    if key not in _compiled:
        _compiled[key] = kiln_compile(graph, "cpu")
    return _compiled[key]


def kiln_outputs(
    graph: Graph, inputs: Sequence[np.ndarray], compiled: bool | None = None
) -> Iterator[tuple[str, list[np.ndarray]]]:
    """Run an imported graph every way Kiln can, yielding (path, outputs) one path at a time (so a wrong
    reference is reported before a later path fails): the numpy reference on the graph as imported and on
    the optimized (decomposed, folded) graph, then the model compiled for the CPU with default schedules
    (``compiled=True``; None follows ``KILN_ONNX_COMPILE``, on unless set to 0)."""
    yield "reference", run_reference(graph, inputs)
    yield "optimized", run_reference(optimize(graph), inputs)
    if compiled or (compiled is None and COMPILE):
        yield "compiled", compiled_model(graph).run(list(inputs))


def assert_close(got: np.ndarray, ref: np.ndarray, what: str, tol: float = 1e-4) -> None:
    """max|err| <= tol * max(1, max|ref|) for floats; exact for ints and bools."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != onnxruntime {ref.shape}"
    if np.issubdtype(ref.dtype, np.floating):
        assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != onnxruntime {ref.dtype}"
        finite = np.isfinite(ref)
        assert (np.isfinite(got) == finite).all() and (got[~finite] == ref[~finite]).all(), f"{what}: inf/nan"
        if finite.any():
            err = float(np.abs(got[finite].astype(np.float64) - ref[finite]).max())
            scale = max(1.0, float(np.abs(ref[finite]).max()))
            assert err <= tol * scale, f"{what}: max|err| {err:.3g} > {tol} * {scale:.3g}"
    else:
        np.testing.assert_array_equal(got, ref, err_msg=what)


def check_model(
    model: Any,
    feeds: Mapping[str, np.ndarray] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    tol: float = 1e-4,
    patterns: bool = True,
    compiled: bool | None = None,
) -> Graph:
    """Import ``model``, run it with onnxruntime and every Kiln path, compare outputs; return the graph.
    ``compiled`` as in :func:`kiln_outputs`."""
    feeds = dict(feeds) if feeds is not None else random_feeds(model, seed, input_shapes)
    ref = ort_outputs(model, feeds)
    graph = load_onnx(model, input_shapes=input_shapes, patterns=patterns)
    names = [v.name for v in model.graph.input if v.name in feeds]
    inputs = [feeds[n] for n in names]
    for path, outs in kiln_outputs(graph, inputs, compiled):
        assert len(outs) == len(ref)
        for i, (got, want) in enumerate(zip(outs, ref)):
            assert_close(got, want, f"{path} output {i}", tol)
    return graph


def single_op(
    op: str,
    inputs: Sequence[tuple[str, Sequence[int], int]],
    out_elem: int = F32,
    initializers: Sequence[Any] = (),
    opset: int = 13,
    n_outputs: int = 1,
    extra_inputs: Sequence[str] = (),
    **attrs: Any,
) -> Any:
    """A model with one node: graph inputs (name, shape, elem), extra (initializer) inputs, outputs y0.."""
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, [n for n, _, _ in inputs] + list(extra_inputs), outs, **attrs)
    return make_model(
        [node],
        [tinfo(n, s, e) for n, s, e in inputs],
        [tinfo(o, None, out_elem) for o in outs],
        initializers,
        opset,
    )


class Net:
    """Build test models node by node: ``net.op("MatMul", x, net.weight(64, 32))`` returns the output name."""

    def __init__(self, seed: int = 0) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, arr: Any, name: str | None = None) -> str:
        name = name or self.fresh("c")
        self.inits.append(init(name, np.asarray(arr)))
        return name

    def weight(
        self, *shape: int, scale: float | None = None, center: float = 0.0, name: str | None = None
    ) -> str:
        scale = 1 / np.sqrt(shape[0]) if scale is None else scale
        arr = center + scale * self.rng.standard_normal(shape)
        return self.const(arr.astype(np.float32), name or self.fresh("w"))

    def op(self, op: str, *inputs: str, outputs: int = 1, name: str | None = None, **attrs: Any) -> Any:
        outs = [self.fresh(op) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name or outs[0], **attrs))
        return outs[0] if outputs == 1 else outs

    def model(
        self, inputs: Sequence[tuple[str, Sequence[int | str]]], outputs: Sequence[str], opset: int = 13
    ) -> Any:
        ins = [
            tinfo(n, s) if len(spec) == 2 else tinfo(n, s, spec[2]) for spec in inputs for n, s in [spec[:2]]
        ]
        return make_model(self.nodes, ins, [tinfo(o, None) for o in outputs], self.inits, opset)
