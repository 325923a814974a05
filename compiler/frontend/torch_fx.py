"""ATen FX graphs -> Kiln graphs: the converter under the ``torch.compile`` backend.

``convert_fx(gm, example_inputs, consts)`` turns an FX graph of ATen/prims ops (what AOTAutograd's inference
decompositions leave, static shapes) into a Kiln :class:`~compiler.graph.Graph`. Placeholders listed in
``consts`` (parameters and buffers) become graph params; every node whose inputs are all constant (masks
built with ``arange``/``full``, transposed weights ...) is evaluated once with torch and becomes a param too.
The result says which placeholders are runtime inputs and how to rebuild the graph's outputs.

``unsupported_reason(node)`` asks the converter whether one node can be imported (it converts the node
alone, on inputs typed from the node's ``meta['val']``) and returns why not, or None; the backend uses it to
partition a graph into Kiln pieces and pieces that stay in PyTorch eager.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import fx

from compiler import dtypes
from compiler.builder import GraphBuilder
from compiler.errors import KilnError
from compiler.graph import Graph, Value

aten = torch.ops.aten

TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU copy of ``t`` as numpy; bfloat16 (which torch cannot hand to numpy) as ml_dtypes' bfloat16."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtypes.to_numpy("bfloat16"))
    return t.numpy()


def numpy_to_tensor(a: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` that also takes ml_dtypes' bfloat16 arrays (to torch.bfloat16)."""
    if a.dtype == dtypes.to_numpy("bfloat16"):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class Unsupported(KilnError):
    """A node the converter cannot import (the message says why)."""


@dataclass
class Converted:
    """A converted FX graph: the Kiln graph, the FX placeholder index of each Kiln input, and one entry per
    FX output: ``("kiln", i)`` (Kiln output i), ``("const", tensor)`` or ``("none", None)``."""

    graph: Graph
    input_indices: list[int]
    outputs: list[tuple[str, Any]] = field(default_factory=list)


Handler = Callable[..., Any]
HANDLERS: dict[Any, Handler] = {}


def handles(*targets: Any) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for t in targets:
            HANDLERS[t] = fn
        return fn

    return deco


def _dims(rank: int, dims: Sequence[int] | int) -> list[int]:
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % rank if rank else 0 for d in dims]


# ---------------------------------------------------------------- pointwise
_UNARY = {
    aten.relu.default: "relu",
    aten.sigmoid.default: "sigmoid",
    aten.tanh.default: "tanh",
    aten.exp.default: "exp",
    aten.log.default: "log",
    aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt",
    aten.neg.default: "neg",
    aten.abs.default: "abs",
    aten.erf.default: "erf",
    aten.reciprocal.default: "reciprocal",
    aten.silu.default: "silu",
    aten.logical_not.default: "logical_not",
}
_BINARY = {
    aten.add.Tensor: "add",
    aten.add.Scalar: "add",
    aten.sub.Tensor: "subtract",
    aten.sub.Scalar: "subtract",
    aten.mul.Tensor: "multiply",
    aten.mul.Scalar: "multiply",
    aten.div.Tensor: "divide",
    aten.div.Scalar: "divide",
    aten.pow.Tensor_Scalar: "power",
    aten.pow.Tensor_Tensor: "power",
    aten.maximum.default: "maximum",
    aten.minimum.default: "minimum",
    aten.eq.Tensor: "equal",
    aten.eq.Scalar: "equal",
    aten.ne.Tensor: "not_equal",
    aten.ne.Scalar: "not_equal",
    aten.lt.Tensor: "less",
    aten.lt.Scalar: "less",
    aten.le.Tensor: "less_equal",
    aten.le.Scalar: "less_equal",
    aten.gt.Tensor: "greater",
    aten.gt.Scalar: "greater",
    aten.ge.Tensor: "greater_equal",
    aten.ge.Scalar: "greater_equal",
    aten.logical_and.default: "logical_and",
    aten.logical_or.default: "logical_or",
}


@handles(*_UNARY)
def _unary(b: GraphBuilder, node: fx.Node, x: Value) -> Value:
    return b.apply(_UNARY[node.target], x)


@handles(*_BINARY)
def _binary(b: GraphBuilder, node: fx.Node, x: Any, y: Any, alpha: Any = 1) -> Value:
    op = _BINARY[node.target]
    if alpha != 1:
        if op not in ("add", "subtract"):
            raise Unsupported(f"{node.target} with alpha={alpha}")
        y = b.multiply(y, alpha) if isinstance(y, Value) else y * alpha
    if not isinstance(x, Value) and not isinstance(y, Value):
        raise Unsupported(f"{node.target} of two scalars")
    if op == "power" and isinstance(y, (int, float)) and y == 2:
        return b.multiply(x, x)
    return b.apply(op, x, y)


@handles(aten.gelu.default)
def _gelu(b: GraphBuilder, node: fx.Node, x: Value, approximate: str = "none") -> Value:
    return b.gelu(x, approximate=approximate)


@handles(aten.clamp.default, aten.hardtanh.default)
def _clamp(b: GraphBuilder, node: fx.Node, x: Value, lo: Any = None, hi: Any = None) -> Value:
    if node.target == aten.hardtanh.default:
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi
    if lo is not None:
        x = b.maximum(x, float(lo))
    if hi is not None:
        x = b.minimum(x, float(hi))
    return x


@handles(aten.leaky_relu.default)
def _leaky_relu(b: GraphBuilder, node: fx.Node, x: Value, slope: float = 0.01) -> Value:
    return b.leaky_relu(x, float(slope))


@handles(aten.hardswish.default)
def _hardswish(b: GraphBuilder, node: fx.Node, x: Value) -> Value:
    return b.hard_swish(x)


@handles(aten.hardsigmoid.default)
def _hardsigmoid(b: GraphBuilder, node: fx.Node, x: Value) -> Value:
    return b.hard_sigmoid(x, 1.0 / 6.0, 0.5)


@handles(aten.where.self)
def _where(b: GraphBuilder, node: fx.Node, cond: Value, x: Any, y: Any) -> Value:
    return b.where(cond, x, y)


@handles(aten.any.dim, aten.any.dims)
def _any(b: GraphBuilder, node: fx.Node, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    axes = None if dim is None else _dims(len(x.shape), dim)
    hit = b.reduce_max(b.cast(x, "float32"), axes, keepdims=bool(keepdim))
    return b.greater(hit, 0.0)


@handles(aten.full_like.default)
def _full_like(b: GraphBuilder, node: fx.Node, x: Value, value: Any, **kw: Any) -> Value:
    dtype = TORCH_DTYPES.get(kw.get("dtype") or _out_dtype(node))
    if dtype is None:
        raise Unsupported(f"full_like of dtype {kw.get('dtype')}")
    return b.broadcast_to(b.constant(value, dtype), x.shape)


@handles(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def _identity(b: GraphBuilder, node: fx.Node, x: Value, **_: Any) -> Value:
    return x


@handles(aten._to_copy.default)
def _to_copy(b: GraphBuilder, node: fx.Node, x: Value, dtype: torch.dtype | None = None, **_: Any) -> Value:
    if dtype is None or TORCH_DTYPES.get(dtype) == x.dtype:
        return x
    if dtype not in TORCH_DTYPES:
        raise Unsupported(f"cast to {dtype}")
    return b.cast(x, TORCH_DTYPES[dtype])


# ------------------------------------------------------------------- layout
@handles(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(b: GraphBuilder, node: fx.Node, x: Value, shape: Sequence[int]) -> Value:
    return b.reshape(x, _out_shape(node))


@handles(aten.permute.default)
def _permute(b: GraphBuilder, node: fx.Node, x: Value, perm: Sequence[int]) -> Value:
    return b.transpose(x, _dims(len(x.shape), perm))


@handles(aten.t.default)
def _t(b: GraphBuilder, node: fx.Node, x: Value) -> Value:
    return b.transpose(x, [1, 0]) if len(x.shape) == 2 else x


@handles(aten.transpose.int)
def _transpose(b: GraphBuilder, node: fx.Node, x: Value, d0: int, d1: int) -> Value:
    perm = list(range(len(x.shape)))
    d0, d1 = _dims(len(x.shape), [d0, d1])
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return b.transpose(x, perm)


@handles(aten.expand.default)
def _expand(b: GraphBuilder, node: fx.Node, x: Value, shape: Sequence[int], **_: Any) -> Value:
    out = _out_shape(node)
    return x if tuple(out) == tuple(x.shape) else b.broadcast_to(x, out)


@handles(aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _reshape_like(b: GraphBuilder, node: fx.Node, x: Value, *_: Any) -> Value:
    return b.reshape(x, _out_shape(node))


@handles(aten.cat.default)
def _cat(b: GraphBuilder, node: fx.Node, xs: Sequence[Value], dim: int = 0) -> Value:
    return b.concat(list(xs), axis=_dims(len(xs[0].shape), dim)[0])


@handles(aten.slice.Tensor)
def _slice(
    b: GraphBuilder, node: fx.Node, x: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Value:
    d = _dims(len(x.shape), dim)[0]
    size = x.shape[d]
    start = 0 if start is None else max(-size, min(start, size))
    end = size if end is None else max(-size, min(end, size))
    return b.slice(x, [start], [end], [d], [step])


@handles(aten.select.int)
def _select(b: GraphBuilder, node: fx.Node, x: Value, dim: int, index: int) -> Value:
    d = _dims(len(x.shape), dim)[0]
    index = index % x.shape[d]
    return b.reshape(b.slice(x, [index], [index + 1], [d]), _out_shape(node))


@handles(aten.embedding.default)
def _embedding(b: GraphBuilder, node: fx.Node, weight: Value, indices: Value, *_: Any) -> Value:
    return b.gather(weight, indices, axis=0)


@handles(aten.index_select.default)
def _index_select(b: GraphBuilder, node: fx.Node, x: Value, dim: int, indices: Value) -> Value:
    return b.gather(x, indices, axis=_dims(len(x.shape), dim)[0])


@handles(aten.constant_pad_nd.default)
def _pad(b: GraphBuilder, node: fx.Node, x: Value, pad: Sequence[int], value: float = 0.0) -> Value:
    # torch lists (before, after) pairs from the last dimension backwards; negative pads crop
    if any(p < 0 for p in pad):
        raise Unsupported("constant_pad_nd with negative padding")
    rank = len(x.shape)
    before, after = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):
        before[rank - 1 - k], after[rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
    return b.pad(x, before + after, float(value))


@handles(aten.split_with_sizes.default)
def _split(b: GraphBuilder, node: fx.Node, x: Value, sizes: Sequence[int], dim: int = 0) -> list[Value]:
    d = _dims(len(x.shape), dim)[0]
    out, start = [], 0
    for s in sizes:
        out.append(b.slice(x, [start], [start + s], [d]))
        start += s
    return out


@handles(aten.split.Tensor)
def _split_tensor(b: GraphBuilder, node: fx.Node, x: Value, size: int, dim: int = 0) -> list[Value]:
    d = _dims(len(x.shape), dim)[0]
    n = x.shape[d]
    return _split(b, node, x, [min(size, n - s) for s in range(0, n, size)], d)


# --------------------------------------------------------------- reductions
def _reduce(op: str) -> Handler:
    def handler(
        b: GraphBuilder, node: fx.Node, x: Value, dim: Any = None, keepdim: bool = False, **kw: Any
    ) -> Value:
        if kw.get("dtype") is not None:
            raise Unsupported(f"{node.target} with a dtype")
        axes = None if dim is None or dim == [] else _dims(len(x.shape), dim)
        return b.apply(op, x, axes=axes, keepdims=bool(keepdim))

    return handler


HANDLERS[aten.mean.dim] = _reduce("reduce_mean")
HANDLERS[aten.sum.dim_IntList] = _reduce("reduce_sum")
HANDLERS[aten.amax.default] = _reduce("reduce_max")
HANDLERS[aten.amin.default] = _reduce("reduce_min")


@handles(aten._softmax.default, aten._log_softmax.default)
def _softmax(b: GraphBuilder, node: fx.Node, x: Value, dim: int, half_to_float: bool = False) -> Value:
    axis = _dims(len(x.shape), dim)[0]
    return b.softmax(x, axis) if node.target == aten._softmax.default else b.log_softmax(x, axis)


@handles(aten.native_layer_norm.default)
def _layer_norm(
    b: GraphBuilder, node: fx.Node, x: Value, shape: Sequence[int], w: Any, bias: Any, eps: float
) -> list[Value | None]:
    inner = tuple(shape)
    if w is None:
        w = b.param(b._unique("ln_weight"), np.ones(inner, np.float32))
    if bias is None:
        bias = b.param(b._unique("ln_bias"), np.zeros(inner, np.float32))
    return [b.layer_norm(x, w, bias, axis=len(x.shape) - len(inner), eps=float(eps)), None, None]


@handles(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(
    b: GraphBuilder, node: fx.Node, x: Value, w: Any, bias: Any, mean: Value, var: Value, _m: Any, eps: float
) -> list[Value | None]:
    c = x.shape[1]
    if w is None:
        w = b.param(b._unique("bn_weight"), np.ones((c,), np.float32))
    if bias is None:
        bias = b.param(b._unique("bn_bias"), np.zeros((c,), np.float32))
    return [b.batch_norm(x, w, bias, mean, var, axis=1, eps=float(eps)), None, None]


# ------------------------------------------------------------- contractions
@handles(aten.mm.default)
def _mm(b: GraphBuilder, node: fx.Node, x: Value, w: Value) -> Value:
    return b.matmul(x, w)


@handles(aten.bmm.default)
def _bmm(b: GraphBuilder, node: fx.Node, x: Value, w: Value) -> Value:
    return b.batch_matmul(x, w)


@handles(aten.addmm.default)
def _addmm(
    b: GraphBuilder, node: fx.Node, bias: Any, x: Value, w: Value, beta: Any = 1, alpha: Any = 1
) -> Value:
    if beta != 1 or alpha != 1:
        raise Unsupported(f"addmm with beta={beta}, alpha={alpha}")
    return b.add(b.matmul(x, w), bias)


@handles(aten.convolution.default)
def _conv(
    b: GraphBuilder,
    node: fx.Node,
    x: Value,
    w: Value,
    bias: Any,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> Value:
    if transposed or len(x.shape) != 4:
        raise Unsupported("only 2-d, non-transposed convolutions")
    y = b.conv2d(x, w, tuple(stride), tuple(padding), tuple(dilation), groups)
    if bias is not None:
        y = b.add(y, b.reshape(bias, (1, bias.shape[0], 1, 1)))
    return y


@handles(aten.max_pool2d_with_indices.default)
def _max_pool(
    b: GraphBuilder,
    node: fx.Node,
    x: Value,
    kernel: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
) -> list[Value | None]:
    if ceil_mode or any(d != 1 for d in dilation):
        raise Unsupported("max pooling with ceil_mode or dilation")
    k = _pair(kernel)
    return [b.max_pool2d(x, k, _pair(stride) if stride else k, _pair(padding)), None]


@handles(aten.avg_pool2d.default)
def _avg_pool(
    b: GraphBuilder,
    node: fx.Node,
    x: Value,
    kernel: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Value:
    if ceil_mode or divisor_override is not None:
        raise Unsupported("average pooling with ceil_mode or divisor_override")
    k = _pair(kernel)
    return b.avg_pool2d(x, k, _pair(stride) if stride else k, _pair(padding), count_include_pad)


def _pair(v: Sequence[int] | int) -> tuple[int, int]:
    v = [v] if isinstance(v, int) else list(v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


@handles(operator.getitem)
def _getitem(b: GraphBuilder, node: fx.Node, xs: Sequence[Any], i: int) -> Any:
    out = xs[i]
    if out is None:
        raise Unsupported(f"output {i} of {node.args[0]} (not computed by Kiln)")
    return out


def _out_shape(node: fx.Node) -> tuple[int, ...]:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{node.name} has no static shape")
    return _static(val.shape)


def _out_dtype(node: fx.Node) -> torch.dtype:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{node.name} has no static type")
    return val.dtype


def _static(shape: Sequence[Any]) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise Unsupported(f"dynamic shape {tuple(shape)}") from None


# --------------------------------------------------------------- conversion
def _is_const(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def _flat(args: Any) -> list[Any]:
    if isinstance(args, (list, tuple)):
        return [y for a in args for y in _flat(a)]
    if isinstance(args, dict):
        return [y for a in args.values() for y in _flat(a)]
    return [args]


class _Env:
    """Maps FX nodes to Kiln values or constant torch tensors while a graph is converted."""

    def __init__(self, b: GraphBuilder) -> None:
        self.b = b
        self.values: dict[fx.Node, Any] = {}
        self.params: dict[int, Value] = {}

    def operand(self, x: Any) -> Any:
        """A node argument as a handler sees it: Values for tensors (constants become params, 0-d
        constants Python scalars), lists element-wise, other things unchanged."""
        if isinstance(x, fx.Node):
            x = self.values[x]
        if isinstance(x, (list, tuple)):
            return type(x)(self.operand(y) for y in x)
        if isinstance(x, torch.Tensor):
            if x.dim() == 0 and x.dtype.is_floating_point:
                return float(x)
            return self.param(x)
        return x

    def param(self, t: torch.Tensor) -> Value:
        key = id(t)
        if key not in self.params:
            if t.dtype not in TORCH_DTYPES:
                raise Unsupported(f"constant of dtype {t.dtype}")
            self.params[key] = self.b.param(self.b._unique("const"), tensor_to_numpy(t))
        return self.params[key]


def _resolve(x: Any, values: dict[fx.Node, Any]) -> Any:
    if isinstance(x, fx.Node):
        return values[x]
    if isinstance(x, (list, tuple)):
        return type(x)(_resolve(y, values) for y in x)
    if isinstance(x, dict):
        return {k: _resolve(v, values) for k, v in x.items()}
    return x


def convert_node(env: _Env, node: fx.Node) -> Any:
    """Convert one call_function node (its inputs already in ``env``); all-constant nodes are evaluated."""
    raw_args, raw_kwargs = _resolve(node.args, env.values), _resolve(node.kwargs, env.values)
    if not any(isinstance(x, Value) for x in _flat([raw_args, raw_kwargs])):
        try:
            with torch.no_grad():
                return node.target(*raw_args, **raw_kwargs)
        except Exception as exc:  # whatever torch raises: the node stays out of Kiln
            raise Unsupported(f"{node.target} on constants failed in torch: {exc}") from None
    handler = HANDLERS.get(node.target)
    if handler is None:
        raise Unsupported(f"no Kiln import for {node.target}")
    args = [env.operand(a) for a in node.args]
    kwargs = {k: env.operand(v) for k, v in node.kwargs.items()}
    try:
        return handler(env.b, node, *args, **kwargs)
    except Unsupported:
        raise
    except (KilnError, TypeError, ValueError) as exc:
        raise Unsupported(f"{node.target}: {exc}") from None


def _check_val(val: Any, what: str) -> None:
    for t in _flat(val):
        if isinstance(t, torch.Tensor):
            if t.dtype not in TORCH_DTYPES:
                raise Unsupported(f"{what} has dtype {t.dtype}")
            _static(t.shape)


def unsupported_reason(node: fx.Node, const_nodes: set[fx.Node] | None = None) -> str | None:
    """Why ``node`` (a call_function node with ``meta['val']``) cannot be imported, or None when it can.
    Nodes in ``const_nodes`` (their values known at compile time) are always importable (evaluated)."""
    if node.op != "call_function":
        return None
    if const_nodes is not None and node in const_nodes:
        return None
    try:
        _check_val(node.meta.get("val"), f"the output of {node.name}")
        b = GraphBuilder("probe")
        env = _Env(b)
        for i, arg in enumerate(node.all_input_nodes):
            val = arg.meta.get("val")
            _check_val(val, f"input {arg.name}")
            if isinstance(val, torch.Tensor):
                env.values[arg] = b.input(f"in{i}", _static(val.shape), TORCH_DTYPES[val.dtype])
            elif isinstance(val, (list, tuple)):
                env.values[arg] = [
                    b.input(f"in{i}_{j}", _static(v.shape), TORCH_DTYPES[v.dtype]) if v is not None else None
                    for j, v in enumerate(val)
                ]
            else:
                return f"input {arg.name} of {node.target} is not a tensor"
        out = convert_node(env, node)
        for v, ref in zip(_flat(out), _flat(node.meta.get("val"))):
            if isinstance(v, Value) and isinstance(ref, torch.Tensor) and tuple(v.shape) != tuple(ref.shape):
                return f"{node.target}: Kiln infers shape {v.shape}, torch {tuple(ref.shape)}"
    except Unsupported as exc:
        return str(exc)
    return None


def const_nodes(gm: fx.GraphModule, consts: dict[int, torch.Tensor]) -> set[fx.Node]:
    """Nodes whose values are known at compile time: constant placeholders, get_attr nodes and every
    call_function node whose inputs are all such nodes (no input at all: arange, full ...)."""
    out: set[fx.Node] = set()
    i = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if i in consts:
                out.add(node)
            i += 1
        elif node.op == "get_attr" or (
            node.op == "call_function" and all(a in out for a in node.all_input_nodes)
        ):
            out.add(node)
    return out


def convert_fx(
    gm: fx.GraphModule, example_inputs: Sequence[Any], consts: dict[int, torch.Tensor], name: str = "torch"
) -> Converted:
    """Convert ``gm`` (ATen ops, static shapes); ``consts`` maps placeholder indices to their constant
    tensors. Raises :class:`Unsupported` naming the first node Kiln cannot import."""
    b = GraphBuilder(name)
    env = _Env(b)
    input_indices: list[int] = []
    i = 0
    output_args: Any = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if i in consts:
                env.values[node] = consts[i]
            else:
                val = example_inputs[i]
                if not isinstance(val, torch.Tensor):
                    raise Unsupported(f"input {node.name} is a {type(val).__name__}, not a tensor")
                _check_val(val, f"input {node.name}")
                env.values[node] = b.input(f"in{i}", _static(val.shape), TORCH_DTYPES[val.dtype])
                input_indices.append(i)
            i += 1
        elif node.op == "get_attr":
            obj: Any = gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            env.values[node] = obj
        elif node.op == "call_function":
            env.values[node] = convert_node(env, node)
        elif node.op == "output":
            output_args = node.args[0]
        else:
            raise Unsupported(f"FX node kind {node.op} ({node.name})")
    outs = list(output_args) if isinstance(output_args, (list, tuple)) else [output_args]
    kiln_outputs: list[Value] = []
    spec: list[tuple[str, Any]] = []
    for o in outs:
        v = env.values[o] if isinstance(o, fx.Node) else o
        if v is None:
            spec.append(("none", None))
        elif isinstance(v, Value):
            spec.append(("kiln", len(kiln_outputs)))
            kiln_outputs.append(v)
        elif _is_const(v):
            spec.append(("const", v))
        else:
            raise Unsupported(f"graph output {o} is a {type(v).__name__}")
    if not kiln_outputs:
        raise Unsupported("the graph computes nothing from its inputs")
    return Converted(b.build(kiln_outputs), input_indices, spec)
