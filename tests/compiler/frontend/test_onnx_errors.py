"""Clear errors for files Kiln cannot import, `kiln models --onnx`, and the CLI printing them cleanly."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from compiler.errors import KilnError, ModelError
from compiler.frontend import load_model
from compiler.frontend.onnx import OnnxImportError, load_onnx, summarize_onnx
from tests.cli import kiln
from tests.compiler.frontend.onnx_util import F32, Net, TensorProto, helper, init, make_model, onnx, tinfo


def small_model(opset: int = 13) -> object:
    net = Net(0)
    h = net.op("Relu", net.op("MatMul", "x", net.weight(8, 4)))
    return net.model([("x", [2, 8])], [h], opset=opset)


def saved(tmp_path, model, name="m.onnx") -> str:
    path = tmp_path / name
    onnx.save(model, str(path))
    return str(path)


def test_error_types():
    assert issubclass(OnnxImportError, ModelError) and issubclass(OnnxImportError, KilnError)


def test_load_model_dispatches_onnx_paths(tmp_path):
    g = load_model(saved(tmp_path, small_model()))
    assert [n.op for n in g.nodes] == ["linear", "relu"]


def test_every_unsupported_node_is_listed():
    nodes = [
        helper.make_node("Sin", ["x"], ["a"], name="sine"),
        helper.make_node("Relu", ["a"], ["b"], name="ok"),
        helper.make_node("Cos", ["b"], ["c"], name="cosine"),
        helper.make_node("ArgMax", ["c"], ["d"], name="argmax", axis=1),
        helper.make_node("Sin", ["x"], ["e"], name="sine2"),
    ]
    model = make_model(nodes, [tinfo("x", [2, 3])], [tinfo("d", None, TensorProto.INT64), tinfo("e", [2, 3])])
    with pytest.raises(OnnxImportError) as info:
        load_onnx(model)
    msg = str(info.value)
    assert "4 node(s)" in msg and "ArgMax, Cos, Sin" in msg
    for name, op in [("sine", "Sin"), ("cosine", "Cos"), ("argmax", "ArgMax"), ("sine2", "Sin")]:
        assert f"{name} ({op})" in msg
    assert "ok (Relu)" not in msg


def test_custom_domain_op_is_unsupported():
    node = helper.make_node("FusedMatMul", ["x", "x"], ["y"], name="fmm", domain="com.microsoft")
    graph = helper.make_graph([node], "g", [tinfo("x", [3, 3])], [tinfo("y", [3, 3])])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    )
    with pytest.raises(OnnxImportError, match=r"fmm \(com.microsoft::FusedMatMul\)"):
        load_onnx(model)


def test_constant_only_ops_fold_but_not_on_runtime_inputs():
    nodes = [helper.make_node("Range", ["x", "x", "x"], ["y"], name="rng")]
    model = make_model(nodes, [tinfo("x", [], TensorProto.INT64)], [tinfo("y", None, TensorProto.INT64)])
    with pytest.raises(OnnxImportError, match=r"rng \(Range\)"):
        load_onnx(model)


def test_dynamic_dims_ask_for_input_shape():
    net = Net(0)
    y = net.op("Relu", "ids")
    model = net.model([("ids", ["batch", "seq"]), ("mask", ["batch", 16])], [y, net.op("Relu", "mask")])
    with pytest.raises(OnnxImportError) as info:
        load_onnx(model)
    msg = str(info.value)
    assert "--input-shape ids=1x128" in msg and "--input-shape mask=1x16" in msg
    assert "[batch, seq]" in msg
    g = load_onnx(model, input_shapes={"ids": (2, 7), "mask": (2, 16)})
    assert [v.shape for v in g.inputs] == [(2, 7), (2, 16)]


@pytest.mark.parametrize(
    "shapes,match",
    [
        ({"nope": (1, 2)}, "model's inputs are x"),
        ({"x": (2, 8, 1)}, "has rank 3"),
        ({"x": (3, 8)}, "contradicts the static shape"),
    ],
)
def test_bad_input_shapes(shapes, match):
    with pytest.raises(OnnxImportError, match=match):
        load_onnx(small_model(), input_shapes=shapes)


def test_not_a_file(tmp_path):
    with pytest.raises(OnnxImportError, match="no such file"):
        load_onnx(str(tmp_path / "missing.onnx"))
    with pytest.raises(OnnxImportError, match="not a file"):
        load_onnx(tmp_path)


def test_truncated_file(tmp_path):
    data = small_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxImportError) as info:
        load_onnx(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content", [b"", b"this is not a protobuf \xff\xfe", b"\x08\x07"])
def test_garbage_or_empty_file(tmp_path, content):
    path = tmp_path / "junk.onnx"
    path.write_bytes(content)
    with pytest.raises(OnnxImportError, match=r"junk\.onnx"):
        load_onnx(str(path))


@pytest.mark.parametrize(
    "opset,match", [(99, "unknown opset 99"), (11, "opset 11 is not supported"), (22, "opset 22")]
)
def test_opset_out_of_range(tmp_path, opset, match):
    model = small_model()
    model.opset_import[0].version = opset
    path = saved(tmp_path, model)
    with pytest.raises(OnnxImportError, match=match) as info:
        load_onnx(path)
    assert path in str(info.value)


def test_unknown_domain(tmp_path):
    model = small_model()
    model.graph.node[0].domain = "org.example"
    with pytest.raises(OnnxImportError, match=r"domain 'org\.example'.*unknown domain"):
        load_onnx(saved(tmp_path, model))


def test_cycle(tmp_path):
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
    ]
    graph = helper.make_graph(nodes, "g", [tinfo("x", [2])], [tinfo("b", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxImportError, match=r"cycle.*'first' \(Add\)") as info:
        load_onnx(saved(tmp_path, model))
    assert "m.onnx" in str(info.value)


def test_missing_initializer_and_undefined_input(tmp_path):
    model = small_model()
    del model.graph.initializer[:]
    model.graph.node[1].input[0] = "ghost"
    with pytest.raises(OnnxImportError) as info:
        load_onnx(saved(tmp_path, model))
    msg = str(info.value)
    assert "missing initializer" in msg and "'w_1'" in msg and "'ghost'" in msg and "m.onnx" in msg


def test_sorts_unsorted_nodes():
    model = small_model()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    assert [n.op for n in load_onnx(model).nodes] == ["linear", "relu"]


def test_training_dropout_is_rejected():
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="drop")
    model = make_model(
        [node],
        [tinfo("x", [2, 3])],
        [tinfo("y", [2, 3])],
        [init("r", np.float32(0.5)), init("t", np.array(True))],
    )
    with pytest.raises(OnnxImportError, match=r"drop.*training_mode"):
        load_onnx(model)


def test_used_second_output_is_rejected():
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], name="pool", kernel_shape=[2, 2])
    model = make_model(
        [node], [tinfo("x", [1, 1, 4, 4])], [tinfo("y", None), tinfo("idx", None, TensorProto.INT64)]
    )
    with pytest.raises(OnnxImportError, match="output 'idx' is used"):
        load_onnx(model)


def test_summary(tmp_path):
    s = summarize_onnx(saved(tmp_path, small_model()))
    assert s["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, 8]}]
    assert s["ops"] == {"MatMul": 1, "Relu": 1} and s["supported"] and s["parameters"] == 32
    assert s["opsets"] == {"": 13}


def test_cli_models_onnx(tmp_path):
    net = Net(0)
    y = net.op("Sin", net.op("Relu", net.op("MatMul", "x", net.weight(8, 4))))
    path = saved(tmp_path, net.model([("x", ["batch", 8])], [y]))
    out = kiln("models", "--onnx", path)
    assert out.returncode == 0, out.stderr
    assert "batchx8" in out.stdout and "MatMul" in out.stdout and "not importable" in out.stdout
    assert "Sin" in out.stdout and "--input-shape x=" in out.stdout
    data = json.loads(kiln("models", "--onnx", path, "--format", "json").stdout)
    assert data["support"] == {"MatMul": "yes", "Relu": "yes", "Sin": "no"}
    assert data["dynamic_inputs"] == ["x"]


def test_cli_errors_without_traceback(tmp_path):
    missing = kiln("models", "--onnx", str(tmp_path / "nope.onnx"))
    assert missing.returncode == 2 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    net = Net(0)
    path = saved(tmp_path, net.model([("x", ["batch", 8])], [net.op("Relu", "x")]))
    dyn = kiln("show", "--model", path)
    assert dyn.returncode == 2 and "--input-shape x=1x8" in dyn.stderr and "Traceback" not in dyn.stderr
    ok = kiln("show", "--model", path, "--input-shape", "x=3x8")
    assert ok.returncode == 0 and "relu" in ok.stdout and "f32[3,8]" in ok.stdout


def test_importing_compiler_does_not_import_onnx():
    code = "import sys, compiler, compiler.frontend, compiler.frontend.models; print('onnx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_f32_attributes_hash_like_python_floats():
    node = helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.1)
    g = load_onnx(make_model([node], [tinfo("x", [3], F32)], [tinfo("y", [3])]))
    assert g.nodes[0].attrs["alpha"] == 0.1
