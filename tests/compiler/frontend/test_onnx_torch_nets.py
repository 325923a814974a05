"""The nets of scripts/bench_onnx_nets.py at test sizes, exported from torch (opset 17), imported and
checked against onnxruntime on every Kiln path (numpy reference, optimized graph, compiled CPU model).
The convolution nets' BatchNorms end up folded into the convolution weights. Skipped, with the reason
printed, where torch is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install torch) for the export tests")

from compiler.fusion import fuse
from compiler.passes import optimize
from tests.compiler.frontend.onnx_util import check_model, onnx  # noqa: F401
from tests.compiler.frontend.torch_nets import CONV_NETS, NETS, export


@pytest.mark.parametrize("name", [*CONV_NETS, "mnist_mlp", "rmsnorm_swiglu", "mlp_mixer"])
def test_torch_net_matches_onnxruntime(name):
    module, x = NETS[name][1]("test")
    check_model(export(module, x, keep_batchnorm=name in CONV_NETS), {"x": x.numpy()}, compiled=True)


@pytest.mark.parametrize("name", CONV_NETS)
def test_batchnorm_folds_into_the_convolutions(name):
    module, x = NETS[name][1]("test")
    model = export(module, x, keep_batchnorm=True)
    assert "BatchNormalization" in [n.op_type for n in model.graph.node]
    graph = check_model(model, {"x": x.numpy()}, compiled=False)
    convs = [g for g in fuse(optimize(graph)).groups if g.anchor is not None and g.anchor.op == "conv2d"]
    assert convs
    for g in convs:
        assert "multiply" not in [n.op for n in g.nodes], g
