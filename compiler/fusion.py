"""Partition a graph into kernel groups (TVM FuseOps / CINN group clustering).

Every producer -> consumer pair that some rule could fuse is a :class:`FusionEdge` with a stable id
(``e<p>_<c>``, from the canonical node numbering, so it does not depend on names or insertion order).
A :class:`FusionPlan` (edge id -> fuse or not) overrides the rules; :func:`default_plan` is the rules'
own choice. Edges are applied in a fixed order; a merge that would make an illegal group or a cycle
between groups is skipped and reported.

Rules (by op category):
- elementwise/broadcast/injective chains fuse;
- they fuse into the reductions that read them (prologue), and a reduction fuses with its
  elementwise/broadcast consumers (epilogue) and with later reductions over the same input shape and
  axes — so softmax, layer_norm and rms_norm each become one group;
- a contraction (matmul, batch_matmul, conv2d) takes an elementwise epilogue (bias, activation,
  residual) and, by default, pure layout producers (reshape/transpose/...) as its prologue;
- pooling takes an elementwise epilogue; opaque ops stand alone; scalar constants are copied into
  every group that reads them.

Group kinds: ``pointwise`` (including pooling windows), ``reduction``, ``contraction``, ``conv_pool`` (a
conv2d and its epilogue with the pooling window that reads it: edge ``pool_prologue``, off by default),
``opaque``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from compiler.builder import GraphBuilder
from compiler.canonical import canonical_hash
from compiler.errors import KilnError
from compiler.graph import Graph, Node, Value
from compiler.ops import PatternKind, get_op
from compiler.target import Target

WORKLOAD_VERSION = 1
CONTRACTIONS = {"matmul", "batch_matmul", "conv2d"}
POOLS = {"max_pool2d", "avg_pool2d"}
LAYOUT_OPS = {"reshape", "transpose", "expand_dims", "squeeze", "broadcast_to", "slice"}
VIEW_OPS = {"reshape", "expand_dims", "squeeze"}

FusionPlan = dict[str, bool]


def category(node: Node) -> str:
    if node.op == "constant":
        return "const"
    if node.op in CONTRACTIONS:
        return "contract"
    if node.op in POOLS:
        return "pool"
    kind = get_op(node.op).kind
    if kind == PatternKind.Reduction:
        return "reduce"
    if kind == PatternKind.Opaque:
        return "opaque"
    if kind in (PatternKind.ElementWise, PatternKind.Broadcast, PatternKind.Injective):
        return "ew"
    return "opaque"


@dataclass(frozen=True)
class FusionEdge:
    id: str
    producer: Node
    consumer: Node
    default: bool
    rule: str

    def describe(self) -> str:
        p, c = self.producer, self.consumer
        return f"{self.id}: {p.name} ({p.op}) -> {c.name} ({c.op})"


def _canonical_numbers(graph: Graph) -> dict[int, int]:
    _, order = graph.canonical_order()
    return {id(n): k for k, n in enumerate(order)}


def fusion_edges(graph: Graph) -> list[FusionEdge]:
    """Every producer -> consumer pair a rule could fuse, with the rules' default decision."""
    numbers = _canonical_numbers(graph)
    edges: list[FusionEdge] = []
    seen: set[tuple[int, int]] = set()
    for c in sorted((n for n in graph.nodes if id(n) in numbers), key=lambda n: numbers[id(n)]):
        for v in c.inputs:
            p = v.producer
            if p is None or (id(p), id(c)) in seen or id(p) not in numbers:
                continue
            seen.add((id(p), id(c)))
            rule = _edge_rule(p, c)
            if rule is None:
                continue
            default = rule != "pool_prologue"
            edges.append(FusionEdge(f"e{numbers[id(p)]}_{numbers[id(c)]}", p, c, default, rule))
    return edges


def horizontal_edges(graph: Graph, const: Callable[[Value], bool] | None = None) -> list[FusionEdge]:
    """One edge per set of sibling GEMMs sharing their A operand (:mod:`compiler.horizontal`): fused, they
    are one GEMM over concatenated weights. Producer/consumer are the first and last sibling; id
    ``h<a>_<b>...``; the rules leave it off."""
    from compiler.horizontal import sibling_sets

    numbers = _canonical_numbers(graph)
    return [
        FusionEdge(s.id, s.matmuls[0], s.matmuls[-1], False, "horizontal")
        for s in sibling_sets(graph, numbers, const)
    ]


def recompute_edges(graph: Graph) -> list[FusionEdge]:
    """One edge per cheap producer read by several nodes (:mod:`compiler.recompute`): on, every reader after
    the first gets its own copy of it. Producer = the node, consumer = its last reader; id ``r<p>``; the
    rules leave it off."""
    from compiler.recompute import recompute_candidates

    numbers = _canonical_numbers(graph)
    return [
        FusionEdge(f"r{numbers[id(p)]}", p, readers[-1], False, "recompute")
        for p, readers in recompute_candidates(graph, numbers)
    ]


def split_k_edges(graph: Graph, target: Target | None) -> list[FusionEdge]:
    """One edge per ``matmul`` that split-K would split on ``target``, a CUDA target
    (:mod:`compiler.passes.split_k`: few output tiles for its SMs, S > 1): on, it becomes S partial GEMMs and
    a reduce_sum. Producer = consumer = the matmul; id ``s<n>``; on in the rules' plan for a float32 GEMM
    without TF32 (:func:`~compiler.passes.split_k.split_by_default`). None or a CPU target: no edges."""
    sm_count = target.sm_count if target is not None else None
    if not sm_count:
        return []
    from compiler.passes.split_k import node_split_factor, split_by_default

    numbers = _canonical_numbers(graph)
    return [
        FusionEdge(f"s{numbers[id(n)]}", n, n, split_by_default(n, target), "split_k")
        for n in sorted((n for n in graph.nodes if id(n) in numbers), key=lambda n: numbers[id(n)])
        if node_split_factor(n, sm_count) > 1
    ]


def attention_edges(graph: Graph, const: Callable[[Value], bool] | None = None) -> list[FusionEdge]:
    """One edge per attention core (:mod:`compiler.attention`: QKᵀ -> scale/mask -> softmax -> P·V): on,
    the core is one group of kind ``attention``. Producer = the QKᵀ batch_matmul, consumer = P·V; id
    ``a<qk>_<pv>``; the rules leave it off. ``const``: which values are model constants (default params)."""
    from compiler.attention import match_cores

    numbers = _canonical_numbers(graph)
    return [
        FusionEdge(f"a{numbers[id(c.qk)]}_{numbers[id(c.pv)]}", c.qk, c.pv, False, "attention")
        for c in match_cores(graph, const)
        if id(c.qk) in numbers and id(c.pv) in numbers
    ]


def rewrite_edges(graph: Graph, target: Target | None = None) -> list[FusionEdge]:
    """The edges that rewrite the graph when on: horizontal, recompute and (on a CUDA ``target``) split-K."""
    return horizontal_edges(graph) + recompute_edges(graph) + split_k_edges(graph, target)


def all_edges(graph: Graph, target: Target | None = None) -> list[FusionEdge]:
    """The producer -> consumer edges (:func:`fusion_edges`), the attention cores, the horizontal and the
    recompute ones, and on a CUDA ``target`` the split-K ones."""
    return fusion_edges(graph) + attention_edges(graph) + rewrite_edges(graph, target)


def _edge_rule(p: Node, c: Node) -> str | None:
    pc, cc = category(p), category(c)
    if "const" in (pc, cc) or "opaque" in (pc, cc):
        return None
    if pc == "ew" and cc == "ew":
        return "elementwise"
    if pc == "ew" and cc == "reduce":
        return "reduce_prologue"
    if pc == "ew" and cc == "contract":  # only pure index remaps: anything else would be recomputed per tile
        return "layout_prologue" if p.op in LAYOUT_OPS else None
    if pc == "ew" and cc == "pool":
        return "pool_prologue"
    if pc == "reduce" and cc == "ew":
        return "reduce_epilogue"
    if pc == "reduce" and cc == "reduce":
        return "multi_reduce"
    if pc in ("contract", "pool") and cc == "ew":
        return f"{pc}_epilogue"
    if p.op == "conv2d" and cc == "pool":  # off by default: a searched decision (kind conv_pool)
        return "pool_prologue"
    return None


def default_plan(graph: Graph, target: Target | None = None) -> FusionPlan:
    return {e.id: e.default for e in all_edges(graph, target)}


# ------------------------------------------------------------------ groups
@dataclass(eq=False)
class Group:
    """A set of nodes compiled into one kernel."""

    index: int
    kind: str
    nodes: list[Node]
    inputs: list[Value]
    outputs: list[Value]
    anchor: Node | None
    constants: list[Node] = field(default_factory=list)
    const_inputs: tuple[
        bool, ...
    ] = ()  # input i is a model constant (a weight): may be re-laid-out at compile time

    @property
    def name(self) -> str:
        ops = [n.op for n in self.nodes if n.op != "constant"]
        main = self.anchor.op if self.anchor is not None else (ops[-1] if ops else "copy")
        return f"g{self.index}_{main}"

    @property
    def is_view(self) -> bool:
        """Only reshapes of one input: the runtime aliases the buffer instead of launching a kernel."""
        return all(n.op in VIEW_OPS for n in self.nodes) and len(self.inputs) == 1 and len(self.outputs) == 1

    @cached_property
    def subgraph(self) -> Graph:
        """The group as a standalone graph: external values (params included) become inputs."""
        b = GraphBuilder(self.name)
        mapping: dict[Value, Value] = {}
        for i, v in enumerate(self.inputs):
            mapping[v] = b.input(f"in{i}", v.shape, v.dtype)
        for n in self.constants:
            mapping[n.output] = b.add_node("constant", [], n.attrs, n.name)
        for n in self.nodes:
            mapping[n.output] = b.add_node(n.op, [mapping[v] for v in n.inputs], n.attrs, n.name)
        return b.build([mapping[v] for v in self.outputs])

    def canonical(self) -> dict:
        data = {"v": WORKLOAD_VERSION, "kind": self.kind, "graph": self.subgraph.canonical()}
        if any(self.const_inputs):
            data["const_inputs"] = [i for i, c in enumerate(self.const_inputs) if c]
        return data

    def is_const_input(self, value: Value) -> bool:
        return any(v is value and c for v, c in zip(self.inputs, self.const_inputs))

    @cached_property
    def workload_key(self) -> str:
        return canonical_hash(self.canonical())

    @property
    def flops(self) -> float:
        return float(sum(node_flops(n) for n in self.nodes))

    @property
    def bytes(self) -> float:
        return float(sum(v.type.nbytes for v in self.inputs) + sum(v.type.nbytes for v in self.outputs))

    def __repr__(self) -> str:
        return f"Group({self.name}, {self.kind}, {[n.op for n in self.nodes]})"


def node_flops(n: Node) -> int:
    out = n.output.type
    if n.op in ("matmul", "batch_matmul"):
        a = n.inputs[0].shape
        k = a[-2] if n.attrs["transpose_a"] else a[-1]
        return 2 * out.numel * k
    if n.op == "conv2d":
        _o, cg, kh, kw = n.inputs[1].shape
        return 2 * out.numel * cg * kh * kw
    if n.op in POOLS:
        kh, kw = n.attrs["kernel"]
        return out.numel * kh * kw
    if category(n) == "reduce":
        return n.inputs[0].type.numel
    return out.numel if n.op != "constant" else 0


@dataclass
class FusedGraph:
    graph: Graph
    groups: list[Group]
    edges: list[FusionEdge]
    decisions: FusionPlan
    rejected: dict[str, str]  # edge id -> why the merge was not possible
    # id of a node of ``graph`` -> the node of the graph given to fuse() it stands for, when a horizontal
    # edge rewrote the graph (``graph`` is then the rewritten one); empty otherwise
    origin: dict[int, Node] = field(default_factory=dict)

    def source(self, node: Node) -> Node:
        """The node of the graph given to :func:`fuse` that ``node`` (a node of a group) stands for."""
        return self.origin.get(id(node), node)

    def group_of(self, value: Value) -> Group | None:
        for g in self.groups:
            if value in g.outputs:
                return g
        return None

    def summary(self) -> str:
        lines = [f"{len(self.groups)} groups from {len(self.graph.nodes)} nodes"]
        for g in self.groups:
            lines.append(f"  {g.name:28s} {g.kind:12s} {len(g.nodes):3d} ops  {g.workload_key[:12]}")
        return "\n".join(lines)


# ------------------------------------------------------------------- fusing
class _Partition:
    def __init__(self, nodes: list[Node]) -> None:
        self.group_of: dict[int, int] = {id(n): k for k, n in enumerate(nodes)}
        self.members: dict[int, list[Node]] = {k: [n] for k, n in enumerate(nodes)}
        self.users: dict[int, list[Node]] = {}
        for n in nodes:
            for v in n.inputs:
                if v.producer is not None and id(v.producer) in self.group_of:
                    self.users.setdefault(id(v.producer), []).append(n)

    def successors(self, g: int) -> set[int]:
        out = set()
        for n in self.members[g]:
            for u in self.users.get(id(n), []):
                h = self.group_of[id(u)]
                if h != g:
                    out.add(h)
        return out

    def reaches_through_others(self, src: int, dst: int) -> bool:
        stack = [s for s in self.successors(src) if s != dst]
        seen = set(stack)
        while stack:
            g = stack.pop()
            for s in self.successors(g):
                if s == dst:
                    return True
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    def merge(self, a: int, b: int) -> None:
        for n in self.members[b]:
            self.group_of[id(n)] = a
        self.members[a].extend(self.members.pop(b))


def group_problem(nodes: list[Node]) -> str | None:
    """Why a set of nodes cannot be one group (None when it can)."""
    cats = {id(n): category(n) for n in nodes}
    if any(c == "opaque" for c in cats.values()) and len(nodes) > 1:
        return "opaque ops stand alone"
    contracts = [n for n in nodes if cats[id(n)] == "contract"]
    pools = [n for n in nodes if cats[id(n)] == "pool"]
    reduces = [n for n in nodes if cats[id(n)] == "reduce"]
    inside = {id(n) for n in nodes}
    # a conv2d whose (epilogue's) output one pooling window reads: the ``conv_pool`` kind
    conv_pool = (
        len(contracts) == len(pools) == 1
        and contracts[0].op == "conv2d"
        and pools[0] in _downstream(contracts, nodes, inside)
    )
    if len(contracts) + len(pools) > 1 and not conv_pool:
        return "a group holds at most one contraction or pooling op"
    if (contracts or pools) and reduces:
        return "a contraction or pooling group cannot hold a reduction"
    if reduces:
        first = reduces[0]
        shape, axes = first.inputs[0].shape, first.attrs["axes"]
        for r in reduces[1:]:
            if r.inputs[0].shape != shape or r.attrs["axes"] != axes:
                return f"reductions {first.name} and {r.name} are over different rows"
        allowed = {shape} | {r.output.shape for r in reduces}
        for n in _downstream(reduces, nodes, inside):
            if cats[id(n)] == "ew" and (
                get_op(n.op).kind == PatternKind.Injective or n.output.shape not in allowed
            ):
                return f"{n.name} ({n.op}) after a reduction leaves the reduction's row space"
    anchor = (contracts or pools or [None])[0]
    if contracts:
        upstream = [n for n in nodes if n is not anchor and n not in _downstream([anchor], nodes, inside)]
        for n in upstream:
            if n.op not in LAYOUT_OPS:
                return (
                    f"{n.name} ({n.op}) would be recomputed inside {anchor.op}: "
                    "only layout ops fuse before it"
                )
    if anchor is not None:
        after_pool = {id(n) for n in _downstream(pools, nodes, inside)} if conv_pool else set()
        for n in _downstream([anchor], nodes, inside):
            if conv_pool and n is pools[0]:
                continue
            base = pools[0] if id(n) in after_pool else anchor
            if get_op(n.op).kind == PatternKind.Injective or n.output.shape != base.output.shape:
                return f"epilogue {n.name} ({n.op}) of {base.op} is not elementwise on its output"
    return None


def _downstream(starts: list[Node], nodes: list[Node], inside: set[int]) -> list[Node]:
    out, frontier = [], {id(s) for s in starts}
    for n in nodes:  # nodes are in topological order
        if id(n) in frontier:
            continue
        if any(v.producer is not None and id(v.producer) in frontier for v in n.inputs) and id(n) in inside:
            frontier.add(id(n))
            out.append(n)
    return out


def fuse(graph: Graph, plan: FusionPlan | None = None, target: Target | None = None) -> FusedGraph:
    """Partition ``graph`` (decomposed and optimized) into groups following ``plan`` or the defaults.
    ``target``: a CUDA target gives the graph its split-K edges (from its ``sm_count``); a CPU target or
    None, none."""
    edges = fusion_edges(graph) + attention_edges(graph)
    rewrites = rewrite_edges(graph, target)
    decisions = {e.id: e.default for e in edges + rewrites}
    if plan:
        unknown = sorted(set(plan) - set(decisions))
        if unknown:
            raise KilnError(
                f"fusion plan names edges that graph {graph.name} does not have: {', '.join(unknown)} "
                f"(it has {len(decisions)} edges: {', '.join(sorted(decisions))})"
            )
        decisions.update(plan)
    on = [e for e in rewrites if decisions[e.id]]
    if on:
        return _fuse_rewritten(graph, edges + rewrites, decisions, on, target)
    groups, rejected = _fuse_edges(graph, edges, decisions)
    return FusedGraph(graph, groups, edges + rewrites, decisions, rejected)


def _fuse_rewritten(
    graph: Graph, edges: list[FusionEdge], decisions: FusionPlan, on: list[FusionEdge], target: Target | None
) -> FusedGraph:
    """Rewrite the graph as the plan's horizontal, recompute and split-K edges ask
    (:mod:`compiler.plan_rewrite`), then fuse it with the plan's producer -> consumer decisions carried over
    to the new graph's edges (a producer's copy takes the decision of the producer's edge to the same
    consumer; an edge from outside into a split matmul's new nodes with no such edge before stays off: the
    split GEMM reads A as the matmul did)."""
    from compiler.horizontal import sibling_sets
    from compiler.plan_rewrite import rewrite_for_plan

    numbers = _canonical_numbers(graph)
    wanted = {e.id for e in on}
    sets = [s for s in sibling_sets(graph, numbers) if s.id in wanted]
    recompute = [e.producer for e in on if e.rule == "recompute"]
    split = [e.producer for e in on if e.rule == "split_k"]
    sm_count = (target.sm_count if target is not None else None) or 0
    merged, origin, copies = rewrite_for_plan(graph, sets, recompute, split, sm_count)
    split_ids = {id(n) for n in split}
    # a copy joins its reader first (else its producer's chain could pull it back into the first reader's
    # group, which would then write the copy out: materialized again)
    new_edges = sorted(fusion_edges(merged), key=lambda e: id(e.producer) not in copies)
    new_edges += attention_edges(merged)
    new_decisions: FusionPlan = {}
    to_old: dict[str, str] = {}
    for e in new_edges:
        p, c = origin.get(id(e.producer)), origin.get(id(e.consumer))
        known = p is not None and c is not None and id(p) in numbers and id(c) in numbers
        old = f"{e.id[0]}{numbers[id(p)]}_{numbers[id(c)]}" if known else None
        if old is not None and old in decisions:
            new_decisions[e.id] = decisions[old]
            to_old[e.id] = old
        elif c is not None and id(c) in split_ids and p is not c:
            new_decisions[e.id] = False
        else:
            new_decisions[e.id] = e.default
    groups, rejected = _fuse_edges(merged, new_edges, new_decisions)
    rejected = {to_old.get(k, k): v for k, v in rejected.items()}
    return FusedGraph(merged, groups, edges, decisions, rejected, origin)


def _fuse_edges(
    graph: Graph, edges: list[FusionEdge], decisions: FusionPlan
) -> tuple[list[Group], dict[str, str]]:
    from compiler.attention import attention_group_problem, premerge_cores

    position = {id(n): k for k, n in enumerate(graph.nodes)}
    nodes = [n for n in graph.nodes if n.op != "constant"]
    part = _Partition(nodes)
    rejected: dict[str, str] = {}
    cores = premerge_cores(graph, part, [e for e in edges if e.rule == "attention" and decisions[e.id]])
    for e in edges:
        if not decisions[e.id] or e.rule == "attention":
            continue
        gp, gc = part.group_of[id(e.producer)], part.group_of[id(e.consumer)]
        if gp == gc:
            continue
        merged = sorted(part.members[gp] + part.members[gc], key=lambda n: position[id(n)])
        core = cores.get(gp, cores.get(gc))
        problem = group_problem(merged) if core is None else attention_group_problem(graph, merged, core)
        if problem is None and part.reaches_through_others(gp, gc):
            problem = "fusing would create a cycle between groups"
        if problem is not None:
            rejected[e.id] = problem
            continue
        part.merge(gp, gc)
        if core is not None:
            cores.pop(gc, None)
            cores[gp] = core
    return _build_groups(graph, part, position, frozenset(id(c.qk) for c in cores.values())), rejected


def _build_groups(
    graph: Graph, part: _Partition, position: dict[int, int], attention_anchors: frozenset[int] = frozenset()
) -> list[Group]:
    consumers = graph.consumers()
    graph_outputs = set(graph.outputs)
    order = sorted(part.members, key=lambda g: min(position[id(n)] for n in part.members[g]))
    # topological order of groups (merging may move a group after one that feeds it)
    done: set[int] = set()
    topo: list[int] = []

    def visit(g: int) -> None:
        if g in done:
            return
        done.add(g)
        for n in part.members[g]:
            for v in n.inputs:
                p = v.producer
                if p is not None and id(p) in part.group_of and part.group_of[id(p)] != g:
                    visit(part.group_of[id(p)])
        topo.append(g)

    for g in order:
        visit(g)
    groups = []
    for idx, g in enumerate(topo):
        members = sorted(part.members[g], key=lambda n: position[id(n)])
        inside = {id(n) for n in members}
        outputs = [
            n.output
            for n in members
            if n.output in graph_outputs or any(id(u) not in inside for u in consumers.get(n.output, []))
        ]
        inputs, constants = _external_inputs(members, outputs, inside)
        anchor = next((n for n in members if category(n) in ("contract", "pool")), None)
        reduces = [n for n in members if category(n) == "reduce"]
        if category(members[0]) == "opaque":
            kind = "opaque"
        elif anchor is not None and id(anchor) in attention_anchors:
            kind = "attention"
        elif anchor is not None and category(anchor) == "contract":
            kind = "conv_pool" if any(category(n) == "pool" for n in members) else "contraction"
        elif reduces:
            kind, anchor = "reduction", reduces[0]
        else:
            kind = "pointwise"
        const = tuple(v.kind == "param" for v in inputs)
        groups.append(Group(idx, kind, members, inputs, outputs, anchor, constants, const))
    return groups


def _external_inputs(
    members: list[Node], outputs: list[Value], inside: set[int]
) -> tuple[list[Value], list[Node]]:
    """External values in first-use order of a depth-first walk from the outputs (canonical)."""
    inputs: list[Value] = []
    constants: list[Node] = []
    seen: set[int] = set()

    def walk(v: Value) -> None:
        p = v.producer
        if p is not None and p.op == "constant":
            if id(p) not in seen:
                seen.add(id(p))
                constants.append(p)
            return
        if p is None or id(p) not in inside:
            if id(v) not in seen:
                seen.add(id(v))
                inputs.append(v)
            return
        if id(p) in seen:
            return
        seen.add(id(p))
        for u in p.inputs:
            walk(u)

    for v in outputs:
        walk(v)
    return inputs, constants


def group_from_workload(canonical: dict | str, index: int = 0) -> Group:
    """Rebuild a group from its stored workload JSON (``Group.canonical()``), e.g. to validate a
    database record's config against the sketch's space. Raises KilnError if it does not round-trip."""
    data = json.loads(canonical) if isinstance(canonical, str) else canonical
    if not isinstance(data, dict) or data.get("v") != WORKLOAD_VERSION or "graph" not in data:
        raise KilnError(f"workload JSON is not a version-{WORKLOAD_VERSION} Kiln workload")
    sub = Graph.from_canonical(data["graph"], name=f"g{index}")
    nodes = [n for n in sub.nodes if n.op != "constant"]
    constants = [n for n in sub.nodes if n.op == "constant"]
    anchor = next((n for n in nodes if category(n) in ("contract", "pool")), None)
    if anchor is None:
        anchor = next((n for n in nodes if category(n) == "reduce"), None)
    const_idx = set(data.get("const_inputs", []))
    const = tuple(i in const_idx for i in range(len(sub.inputs)))
    return Group(index, data["kind"], nodes, list(sub.inputs), list(sub.outputs), anchor, constants, const)


# ------------------------------------------------------------------ regions
REGION_VERSION = 1

# Why an edge is never offered to the plan search (its fused form is always at least as good).
PARAM_LAYOUT = "a layout/broadcast of a weight: unfused it only materializes a copy of the weight"


@dataclass
class Region:
    """An independent part of a graph for the fusion-plan search: the nodes linked by fusion edges (a group
    never spans two regions), and the region's optional edges — the decisions a plan makes.

    ``key`` is the sha256 of the region's canonical subgraph (external values as inputs, which of them are
    model constants), so the same region in two models shares its plans. Optional edges have region-local
    ids (``e<p>_<c>`` numbered on the region's own subgraph); ``local_id``/``global_id`` translate to the
    ids of the whole graph, which :func:`fuse` takes."""

    index: int
    nodes: list[Node]
    edges: list[FusionEdge]  # optional edges (whole-graph ids), in fuse order
    local_ids: dict[str, str]  # whole-graph edge id -> region-local id
    key: str
    fixed: dict[str, str] = field(default_factory=dict)  # whole-graph edge id -> why it is not offered
    target: Target | None = None  # what the region's split-K edges were decided for (a CUDA target)

    @property
    def global_ids(self) -> dict[str, str]:
        return {v: k for k, v in self.local_ids.items()}

    def rule_plan(self) -> FusionPlan:
        """The rules' choice for the optional edges, region-local ids."""
        return {self.local_ids[e.id]: e.default for e in self.edges}

    def to_global(self, local_plan: FusionPlan) -> FusionPlan:
        """A region-local plan as whole-graph edge ids; KilnError naming the edges the region lacks."""
        ids = self.global_ids
        stale = sorted(k for k in local_plan if k not in ids)
        if stale:
            raise KilnError(
                f"fusion plan for region {self.index} ({self.key[:12]}) names edges it does not have: "
                f"{', '.join(stale)} (its optional edges: {', '.join(sorted(ids)) or 'none'})"
            )
        return {ids[k]: bool(v) for k, v in local_plan.items()}

    def flipped(self, local_plan: FusionPlan) -> list[str]:
        """The region-local edges whose decision in ``local_plan`` differs from the rules'."""
        rule = self.rule_plan()
        return sorted(k for k, v in local_plan.items() if k in rule and bool(v) != rule[k])

    def describe_edge(self, local_id: str) -> str:
        e = next(e for e in self.edges if self.local_ids[e.id] == local_id)
        return f"{local_id} {e.producer.op}->{e.consumer.op} ({e.rule})"


def _region_nodes(graph: Graph, edges: list[FusionEdge]) -> list[list[Node]]:
    nodes = [n for n in graph.nodes if n.op != "constant"]
    parent = {id(n): id(n) for n in nodes}

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in edges:
        parent[root(id(e.producer))] = root(id(e.consumer))
    comps: dict[int, list[Node]] = {}
    for n in nodes:
        comps.setdefault(root(id(n)), []).append(n)
    return list(comps.values())


def _region_subgraph(graph: Graph, members: list[Node]) -> tuple[Graph, dict[int, Node], tuple[bool, ...]]:
    """The region as a standalone graph; original node id -> its copy; which inputs are model constants."""
    inside = {id(n) for n in members}
    consumers = graph.consumers()
    outs = set(graph.outputs)
    outputs = [
        n.output
        for n in members
        if n.output in outs or any(id(u) not in inside for u in consumers.get(n.output, []))
    ]
    inputs, constants = _external_inputs(members, outputs, inside)
    b = GraphBuilder("region")
    mapping: dict[Value, Value] = {}
    copies: dict[int, Node] = {}
    for i, v in enumerate(inputs):
        mapping[v] = b.input(f"in{i}", v.shape, v.dtype)
    for n in constants:
        mapping[n.output] = b.add_node("constant", [], n.attrs, n.name)
    for n in members:
        mapping[n.output] = b.add_node(n.op, [mapping[v] for v in n.inputs], n.attrs, n.name)
        copies[id(n)] = mapping[n.output].producer
    return b.build([mapping[v] for v in outputs]), copies, tuple(v.kind == "param" for v in inputs)


def _edge_kind(e: FusionEdge) -> str:
    """A recompute edge can join the same two nodes as a producer -> consumer edge."""
    return e.rule if e.rule in ("horizontal", "recompute", "split_k", "attention") else "edge"


def _partition(fused: FusedGraph) -> frozenset[frozenset[int]]:
    """The groups as sets of the given graph's nodes (a copy or a merged node counts as its origin)."""
    return frozenset(frozenset(id(fused.source(n)) for n in g.nodes) for g in fused.groups)


def regions(
    graph: Graph, has_sketch: Callable[[Group], bool] | None = None, target: Target | None = None
) -> list[Region]:
    """The regions of ``graph`` (decomposed and optimized) that have optional fusion edges.

    An edge is optional when flipping it alone from the rules' plan changes the groups and every group of
    the flipped plan has a sketch (``has_sketch(group)``, e.g. the target backend's; default: any group).
    Edges that only bring a broadcast/layout of a weight into its consumer stay fused (the unfused form is
    a copy of the weight, never faster), and so do edges whose flip changes nothing (a merge the rules
    reject for a cycle or an illegal group either way). A CUDA ``target`` adds the split-K edges."""
    edges = all_edges(graph, target)
    rule = {e.id: e.default for e in edges}
    base = _partition(fuse(graph, target=target))
    optional: list[FusionEdge] = []
    fixed: dict[str, str] = {}
    for e in edges:
        p = e.producer
        if p.op in LAYOUT_OPS and all(
            v.kind == "param" or (v.producer is not None and v.producer.op == "constant") for v in p.inputs
        ):
            fixed[e.id] = PARAM_LAYOUT
            continue
        flipped = fuse(graph, {**rule, e.id: not e.default}, target)
        if _partition(flipped) == base:
            fixed[e.id] = "flipping it alone changes no group"
            continue
        if has_sketch is not None:
            missing = [g for g in flipped.groups if not g.is_view and not has_sketch(g)]
            if missing:
                fixed[e.id] = f"no sketch for group {missing[0]!r}"
                continue
        optional.append(e)
    out: list[Region] = []
    for members in _region_nodes(graph, edges):
        ids = {id(n) for n in members}
        mine = [e for e in optional if id(e.producer) in ids]
        if not mine:
            continue
        sub, copies, const = _region_subgraph(graph, members)
        const_values = {v for v, c in zip(sub.inputs, const) if c}
        sub_all = (
            fusion_edges(sub)
            + attention_edges(sub, const_values.__contains__)
            + horizontal_edges(sub, const_values.__contains__)
            + recompute_edges(sub)
            + split_k_edges(sub, target)
        )
        sub_edges = {(_edge_kind(e), id(e.producer), id(e.consumer)): e.id for e in sub_all}
        local_ids = {}
        for e in list(mine):
            local = sub_edges.get((_edge_kind(e), id(copies[id(e.producer)]), id(copies[id(e.consumer)])))
            if local is None:  # a producer also read outside the region: the region alone cannot decide it
                fixed[e.id] = "it reaches outside its region"
                mine.remove(e)
            else:
                local_ids[e.id] = local
        if not mine:
            continue
        data = {
            "v": REGION_VERSION,
            "graph": sub.canonical(),
            "const_inputs": [i for i, c in enumerate(const) if c],
        }
        region_fixed = {e.id: fixed[e.id] for e in edges if id(e.producer) in ids and e.id in fixed}
        out.append(Region(len(out), members, mine, local_ids, canonical_hash(data), region_fixed, target))
    return out
