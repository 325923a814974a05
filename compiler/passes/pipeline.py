"""A pass pipeline that validates the graph after every pass and names the pass that broke it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from compiler.errors import GraphError
from compiler.graph import Graph

Pass = Callable[[Graph], Graph]


@dataclass
class PassPipeline:
    passes: Sequence[Pass]
    history: list[tuple[str, int]] = field(default_factory=list)  # (pass name, node count after)

    def run(self, graph: Graph) -> Graph:
        graph.validate()
        for p in self.passes:
            name = getattr(p, "__name__", repr(p))
            out = p(graph)
            try:
                out.validate()
            except GraphError as exc:
                raise GraphError(f"pass {name} produced an invalid graph: {exc}") from exc
            self.history.append((name, len(out.nodes)))
            graph = out
        return graph


def default_pipeline() -> PassPipeline:
    from compiler.passes import cse, dce, decompose, flatten_pointwise_conv, fold_constants, fold_conv_scale

    return PassPipeline([decompose, fold_constants, fold_conv_scale, flatten_pointwise_conv, cse, dce])


def optimize(graph: Graph) -> Graph:
    """The standard graph-level pipeline: decompose, fold constants, fold per-channel scales into
    convolutions (BatchNorm), view 1x1 convolutions' images as one row of pixels, CSE, DCE."""
    return default_pipeline().run(graph)
