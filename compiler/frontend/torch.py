"""The ``torch.compile`` backend at the compiler level: Dynamo's FX graph in, a callable running Kiln
kernels out (no tuning database here: ``compiler`` never imports ``tuner``; the registered backend
``kiln`` is :func:`tuner.torch_backend.kiln_backend`, which adds the database's records and tuning).

``kiln_backend(gm, example_inputs, options=...)`` lowers ``gm`` with AOTAutograd's inference
decompositions (core ATen), treats parameters and buffers as constants (baked in at compile time, as
inductor's freezing does), converts the ATen graph with :mod:`compiler.frontend.torch_fx`, compiles it
with :func:`compiler.build.compile` for the CPU (or ``options["target"]``) and returns the callable
AOTAutograd wraps. With gradients enabled, the forward graph is Kiln's and the backward graph runs in
PyTorch eager. Nodes the converter cannot import run in PyTorch eager: the graph is partitioned with
``CapabilityBasedPartitioner`` and one log line (logger ``kiln.torch``) per graph says what fell back and why.

Options: ``target`` (a Target or its text, default ``cpu``, ``cuda`` for CUDA inputs), ``configs`` (a
``compiler.build.ConfigSource``: which config each group uses) and ``on_graph`` (called with each Kiln
graph and target before it is compiled; the tuner uses it to tune) and ``on_model`` (called with each Kiln
graph and its compiled model) and ``compile`` (False: convert only, everything runs in eager;
:func:`capture_graphs` uses it).

``capture_graphs(module, example_inputs)`` returns the Kiln graphs of a module without compiling them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch._decomp import core_aten_decompositions
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from compiler.build import compile as build_model
from compiler.errors import KilnError
from compiler.frontend.torch_fx import (
    Converted,
    const_nodes,
    convert_fx,
    numpy_to_tensor,
    tensor_to_numpy,
    unsupported_reason,
)
from compiler.graph import Graph
from compiler.target import Target

log = logging.getLogger("kiln.torch")

OPTIONS = ("target", "configs", "on_graph", "on_model", "compile")


class KilnPiece(nn.Module):
    """One Kiln-compiled piece of an FX graph: takes the piece's FX inputs (torch tensors), returns its
    outputs as the FX graph did (a tuple, or one tensor when ``single``)."""

    def __init__(self, converted: Converted, model: Any, single: bool) -> None:
        super().__init__()
        self.converted, self.model, self.single = converted, model, single

    def forward(self, *args: Any) -> Any:
        device = None
        inputs = []
        for i in self.converted.input_indices:
            t = args[i].detach()
            if t.device.type != "cpu":
                device = t.device
            inputs.append(tensor_to_numpy(t))
        results = self.model.run(inputs)
        outs: list[Any] = []
        for kind, x in self.converted.outputs:
            if kind == "kiln":
                t = numpy_to_tensor(results[x])
                outs.append(t.to(device) if device is not None else t)
            else:
                outs.append(x)
        return outs[0] if self.single else tuple(outs)


def _target(options: dict[str, Any], example_inputs: Sequence[Any]) -> Target:
    if options.get("target") is not None:
        return Target.parse(options["target"])
    cuda = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs)
    return Target.parse("cuda" if cuda else "cpu")


def _is_static(t: Any) -> bool:
    return isinstance(t, nn.Parameter) or hasattr(t, "_dynamo_static_input_type")


def _compile_piece(
    gm: fx.GraphModule, fake_inputs: Sequence[Any], consts: dict[int, torch.Tensor], options: dict[str, Any]
) -> nn.Module:
    out_arg = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    single = not isinstance(out_arg, (list, tuple))
    converted = convert_fx(gm, fake_inputs, consts)
    target = _target(options, fake_inputs)
    if options.get("on_graph") is not None:
        options["on_graph"](converted.graph, target)
    if options.get("compile") is False:  # conversion only (capture_graphs): the piece stays eager
        return gm
    model = build_model(converted.graph, target, configs=options.get("configs"))
    if options.get("on_model") is not None:
        options["on_model"](converted.graph, model)
    return KilnPiece(converted, model, single)


class _Support(OperatorSupport):
    def __init__(self, unsupported: dict[fx.Node, str]) -> None:
        super().__init__()
        self.unsupported = unsupported

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        return node.op == "call_function" and node not in self.unsupported


def _describe(node: fx.Node, reason: str) -> str:
    return reason if str(node.target) in reason else f"{node.target}: {reason}"


def compile_aten(
    gm: fx.GraphModule, fake_inputs: Sequence[Any], consts: dict[int, torch.Tensor], options: dict[str, Any]
) -> Callable[..., Any]:
    """Compile an ATen FX graph: whole with Kiln when every node imports, else partitioned into Kiln
    pieces and eager pieces; returns a callable taking the graph's inputs (a list of tensors)."""
    known = const_nodes(gm, consts)
    unsupported = {
        n: reason
        for n in gm.graph.nodes
        if n.op == "call_function" and (reason := unsupported_reason(n, known)) is not None
    }
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    if not unsupported:
        try:
            piece = _compile_piece(gm, fake_inputs, consts, options)
            return lambda args: piece(*args)
        except KilnError as exc:
            log.warning("kiln: the whole graph (%d ops) runs in PyTorch eager: %s", ops, exc)
            return lambda args: gm(*args)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    const_of = {placeholders[i]: t for i, t in consts.items()}
    fused = CapabilityBasedPartitioner(
        gm, _Support(unsupported), allows_single_node_partition=True
    ).partition_and_fuse()
    failed: list[str] = []
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not node.target.startswith("fused_"):
            continue
        sub = getattr(fused, node.target)
        sub_consts, sub_fake = {}, []
        for j, arg in enumerate(node.args):
            if arg in const_of:
                sub_consts[j] = const_of[arg]
            sub_fake.append(arg.meta.get("val"))
        try:
            setattr(fused, node.target, _compile_piece(sub, sub_fake, sub_consts, options))
        except KilnError as exc:
            failed.append(f"{node.target} ({exc})")
    fused.recompile()
    reasons = sorted({_describe(n, r) for n, r in unsupported.items()})
    log.warning(
        "kiln: %d of %d ops run in PyTorch eager: %s%s",
        len(unsupported),
        ops,
        "; ".join(reasons),
        f"; pieces left in eager: {', '.join(failed)}" if failed else "",
    )
    return lambda args: fused(*args)


def kiln_backend(
    gm: fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None, **_: Any
) -> Callable[..., Any]:
    """A Dynamo backend: ``torch.compile(model, backend=kiln_backend, options={...})``."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise KilnError(f"unknown kiln backend option(s) {unknown}; the options are {', '.join(OPTIONS)}")
    if any(not isinstance(t, torch.Tensor) for t in example_inputs):
        log.warning(
            "kiln: a graph with dynamic shapes runs in PyTorch eager (Kiln compiles static shapes: "
            "use torch.compile(..., dynamic=False))"
        )
        return gm.forward
    own = [*gm.parameters(), *gm.buffers()]
    real = [*own, *example_inputs]
    # weights are constants for inference; a graph traced for training takes the ones that need gradients as
    # inputs, so that an optimizer step is seen by the next call
    training = torch.is_grad_enabled()
    static = [
        (i < len(own) or _is_static(t)) and not (training and t.requires_grad) for i, t in enumerate(real)
    ]

    def fw_compiler(fw_gm: fx.GraphModule, fake_inputs: Sequence[Any]) -> Callable[..., Any]:
        n = sum(1 for node in fw_gm.graph.nodes if node.op == "placeholder")
        with unset_fake_temporarily():  # AOTAutograd calls this under its fake mode; constants are real
            consts = {i: real[i].detach() for i in range(n) if n == len(real) and static[i]}
            run = compile_aten(fw_gm, fake_inputs, consts, options)

        def call(*args: Any) -> Any:
            if len(args) == 1 and isinstance(args[0], list):  # the boxed calling convention
                args = tuple(args[0])
            with torch.no_grad():
                return run(args)

        return make_boxed_func(call)

    def bw_compiler(bw_gm: fx.GraphModule, fake_inputs: Sequence[Any]) -> Callable[..., Any]:
        log.warning("kiln: the backward graph (%d nodes) runs in PyTorch eager", len(bw_gm.graph.nodes))
        return make_boxed_func(bw_gm.forward)

    return aot_module_simplified(
        gm,
        example_inputs,
        fw_compiler=fw_compiler,
        bw_compiler=bw_compiler,
        decompositions=core_aten_decompositions(),
        keep_inference_input_mutations=True,
    )


def capture_graphs(module: nn.Module, example_inputs: Sequence[torch.Tensor]) -> list[Graph]:
    """The Kiln graphs ``torch.compile`` makes of ``module`` on ``example_inputs`` (static shapes, under
    ``no_grad``, weights as constants), in the order Dynamo hands them over; nothing is compiled."""
    graphs: list[Graph] = []
    options = {"on_graph": lambda graph, target: graphs.append(graph), "compile": False}
    backend = functools.partial(kiln_backend, options=options)
    with torch.no_grad():
        torch.compile(module, backend=backend, dynamic=False)(*example_inputs)
    if not graphs:
        raise KilnError(
            "torch.compile handed Kiln no graph (the module ran in eager: Dynamo's recompile limit for its "
            "forward may be reached; torch._dynamo.reset() clears it)"
        )
    return graphs
