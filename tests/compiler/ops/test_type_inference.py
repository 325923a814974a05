"""Type inference raises clear errors that name the node, the op and the offending shapes or attrs."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.builder import GraphBuilder
from compiler.errors import GraphError, TypeInferenceError, UnknownOpError


def test_bad_broadcast_names_node_op_and_shapes():
    b = GraphBuilder()
    x, y = b.input("x", (64, 128)), b.input("y", (64, 127))
    with pytest.raises(TypeInferenceError) as e:
        b.add(x, y, name="residual")
    msg = str(e.value)
    assert "residual" in msg and "(add)" in msg
    assert "[64, 128]" in msg and "[64, 127]" in msg and "f32[64,128]" in msg


def test_bad_reshape():
    b = GraphBuilder()
    x = b.input("x", (4, 6))
    with pytest.raises(TypeInferenceError, match=r"reshape.*24 elements.*\[5, 5\]"):
        b.reshape(x, (5, 5))
    with pytest.raises(TypeInferenceError, match="more than one -1"):
        b.reshape(x, (-1, -1))
    assert b.reshape(x, (3, -1)).shape == (3, 8)


def test_matmul_wrong_rank_and_inner_dim():
    b = GraphBuilder()
    a3, m = b.input("a3", (2, 3, 4)), b.input("m", (4, 5))
    assert b.matmul(a3, m).shape == (2, 3, 5)  # leading dims on A, numpy style
    with pytest.raises(TypeInferenceError, match="matmul needs A of rank >= 2"):
        b.matmul(m, a3)
    a = b.input("a", (3, 7))
    with pytest.raises(TypeInferenceError, match="inner dimensions differ"):
        b.matmul(a, m)
    assert b.matmul(a, b.input("w", (5, 7)), transpose_b=True).shape == (3, 5)
    with pytest.raises(TypeInferenceError, match="same rank"):
        b.batch_matmul(a3, m)


def test_conv_wrong_rank_groups_and_channels():
    b = GraphBuilder()
    x = b.input("x", (1, 8, 10, 10))
    with pytest.raises(TypeInferenceError, match="NCHW"):
        b.conv2d(b.input("x3", (8, 10, 10)), b.input("w", (4, 8, 3, 3)))
    with pytest.raises(TypeInferenceError, match="groups=3"):
        b.conv2d(x, b.input("w2", (6, 8, 3, 3)), groups=3)
    with pytest.raises(TypeInferenceError, match="input channels per group"):
        b.conv2d(x, b.input("w3", (4, 3, 3, 3)))
    with pytest.raises(TypeInferenceError, match="does not fit"):
        b.conv2d(x, b.input("w4", (4, 8, 11, 11)))
    y = b.conv2d(x, b.input("w5", (16, 4, 3, 3)), strides=2, padding=1, groups=2)
    assert y.shape == (1, 16, 5, 5)


def test_dtype_and_attr_errors():
    b = GraphBuilder()
    x, i = b.input("x", (4,)), b.input("i", (4,), "int32")
    with pytest.raises(TypeInferenceError, match="one dtype"):
        b.add(x, i)
    with pytest.raises(TypeInferenceError, match="floating-point"):
        b.exp(i)
    with pytest.raises(TypeInferenceError, match="unknown attribute"):
        b.apply("relu", x, alpha=0.1)
    with pytest.raises(TypeInferenceError, match="out of range"):
        b.reduce_sum(x, axes=[3])
    with pytest.raises(TypeInferenceError, match="approximate"):
        b.gelu(x, approximate="fast")
    with pytest.raises(TypeInferenceError, match="bool condition"):
        b.where(x, x, x)


def test_unknown_op_and_dangling_value():
    b = GraphBuilder()
    x = b.input("x", (4,))
    with pytest.raises(UnknownOpError, match="unknown op 'frobnicate'"):
        b.apply("frobnicate", x)
    other = GraphBuilder().input("z", (4,))
    y = b.add(x, other)
    with pytest.raises(GraphError, match="not defined before the node"):
        b.build([y])


def test_param_type_mismatch_detected():
    b = GraphBuilder()
    w = b.param("w", np.zeros((3,), np.float32))
    g = b.build([b.relu(w)])
    g.params[0].data = np.zeros((4,), np.float32)
    with pytest.raises(GraphError, match="param w"):
        g.validate()
