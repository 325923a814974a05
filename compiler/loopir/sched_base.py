"""Schedule state and the helpers every primitive uses: lookups, tree edits, trace."""

from __future__ import annotations

from collections.abc import Sequence

from compiler.errors import ScheduleError
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Const,
    Expr,
    IterVar,
    Load,
    Logical,
    Var,
    free_vars,
    logical_and,
    substitute,
)
from compiler.loopir.simplify import simplify
from compiler.loopir.stmt import (
    Block,
    Buffer,
    BufferStore,
    For,
    PrimFunc,
    SeqStmt,
    Stmt,
    stmt_children,
)

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
_COMBINER_OF = {"+": "sum", "max": "max", "min": "min"}


class ScheduleBase:
    """State shared by the primitive mixins: the function being edited and the trace."""

    def __init__(self, func: PrimFunc) -> None:
        if not isinstance(func.body, Block):
            raise ScheduleError(f"function {func.name} has no root block; schedule a TE-lowered function")
        self.func = func
        self.root: Block = func.body
        if not isinstance(self.root.body, SeqStmt):
            self.root.body = SeqStmt([self.root.body])
        self.trace: list[str] = []
        self._parents: dict[int, Stmt] = {}  # id -> parent, as of some earlier tree: see _ancestors

    def _ancestors(self, node: Stmt) -> list[Stmt] | None:
        """The statements enclosing ``node`` up to the root, outermost first (None: not in the function).

        Primitives edit the tree in place, so the remembered parent map may be stale: every link of the
        chain it gives is checked (the parent really holds the child) up to the root, and the map is
        rebuilt once when a link fails. A chain of checked links ending at the root is the true one (a
        statement has one parent), so a stale map costs a rebuild, never a wrong answer."""
        for fresh in (False, True):
            if fresh:
                self._parents = A.parent_map(self.root)
            chain: list[Stmt] = []
            cur = node
            while cur is not self.root:
                p = self._parents.get(id(cur))
                if p is None or not any(c is cur for c in stmt_children(p)):
                    break
                chain.append(p)
                cur = p
            else:
                return chain[::-1]
        return None

    def blocks(self) -> list[Block]:
        return A.blocks_under(self.root)

    def get_block(self, name: str) -> Block:
        for b in self.blocks():
            if b.name == name:
                return b
        raise ScheduleError(
            f"no block named '{name}' in {self.func.name}; blocks: {', '.join(b.name for b in self.blocks())}"
        )

    def get_loops(self, block: Block) -> list[For]:
        return [s for s in self._ancestors(block) or () if isinstance(s, For)]

    def producers(self, buffer: Buffer) -> list[Block]:
        return [b for b in self.blocks() if buffer in A.writes(b)]

    def consumers(self, buffer: Buffer) -> list[Block]:
        return [b for b in self.blocks() if buffer in A.reads(b)]

    def _log(self, text: str) -> None:
        self.trace.append(text)

    def show_trace(self) -> str:
        return "\n".join(self.trace)

    def _parent(self, node: Stmt) -> Stmt:
        chain = self._ancestors(node)
        if not chain:
            raise ScheduleError(f"{_name(node)} is not part of function {self.func.name}")
        return chain[-1]

    def _check_loop(self, loop: For) -> None:
        if not isinstance(loop, For):
            raise ScheduleError(f"expected a loop, got {type(loop).__name__}")
        self._parent(loop)

    def _subst_under(self, stmt: Stmt, mapping: dict[Var, Expr], extra_pred: Expr | None = None) -> None:
        for b in A.blocks_under(stmt) if not isinstance(stmt, Block) else [stmt]:
            b.bindings = [substitute(e, mapping) for e in b.bindings]
            if b.predicate is not None:
                b.predicate = substitute(b.predicate, mapping)
            if extra_pred is not None:
                b.predicate = extra_pred if b.predicate is None else Logical("and", b.predicate, extra_pred)

    def _single_store(self, block: Block, what: str) -> BufferStore:
        stores = A.block_stores(block)
        if len(stores) != 1 or not isinstance(block.body, BufferStore):
            raise ScheduleError(f"{what}: block {block.name} must consist of a single store")
        return stores[0]

    def _is_param(self, buf: Buffer) -> bool:
        return any(p is buf for p in self.func.params)

    def _remove_nest(self, block: Block) -> None:
        """Remove ``block`` and every enclosing loop or sequence that would be left empty."""
        node: Stmt = block
        while True:
            parent = self._parent(node)
            single_seq = (
                isinstance(parent, SeqStmt) and len(parent.stmts) == 1 and parent is not self.root.body
            )
            if isinstance(parent, For) or single_seq:
                node = parent
                continue
            break
        if not isinstance(parent, SeqStmt):
            raise ScheduleError(f"cannot remove block {block.name} from under a {type(parent).__name__}")
        A.replace_child(parent, node, None)

    def _nest_top(self, block: Block) -> Stmt:
        """The outermost loop containing only ``block`` (or the block itself)."""
        node: Stmt = block
        parent = self._parent(node)
        while isinstance(parent, For) and parent.body is node:
            node = parent
            parent = self._parent(node)
        return node

    def _top_level(self, node: Stmt) -> Stmt:
        """The statement directly under the root that contains ``node``."""
        chain = [*(self._ancestors(node) or ()), node]
        i = next(k for k, s in enumerate(chain) if s is self.root.body)
        return chain[i + 1]

    def _drop_alloc(self, buf: Buffer) -> None:
        self.root.alloc_buffers = [b for b in self.root.alloc_buffers if b is not buf]

    def _check_identity_store(self, block: Block, buf: Buffer, what: str) -> None:
        sp = [iv.var for iv in block.iter_vars if iv.kind == "S"]
        for st in A.block_stores(block):
            if len(st.indices) != len(sp) or any(i is not v for i, v in zip(st.indices, sp)):
                raise ScheduleError(
                    f"{what}: block {block.name} must store {buf.name} at its spatial iteration vars"
                )

    def _region_nest(self, block: Block, per_var: list[tuple[Expr, int]]) -> Stmt:
        """Rebuild ``block``'s loops so iteration variable k covers [start_k, start_k + extent_k)."""
        loops: list[tuple[Var, int]] = []
        bindings: list[Expr] = []
        preds: list[Expr] = []
        for d, (iv, (start, ext)) in enumerate(zip(block.iter_vars, per_var)):
            whole = isinstance(start, Const) and start.value == 0 and ext == iv.extent
            if ext == 1:
                value = start
            else:
                lv = Var(f"ax{d}" if iv.kind == "S" else f"{iv.var.name}_l")
                loops.append((lv, ext))
                value = start + lv if not (isinstance(start, Const) and start.value == 0) else lv
            bindings.append(simplify(value))
            if not whole:
                preds.append(value.ge(0))
                preds.append(value.lt(iv.extent))
        block.bindings = bindings
        block.predicate = logical_and(*preds) if preds else None
        stmt: Stmt = block
        for lv, ext in reversed(loops):
            stmt = For(lv, ext, stmt)
        return stmt

    def _insert_in_loop(self, loop: For, new: Stmt, anchors: list[Block], before: bool) -> None:
        body = loop.body if isinstance(loop.body, SeqStmt) else SeqStmt([loop.body])
        ids = {id(a) for a in anchors}
        hits = [
            k
            for k, s in enumerate(body.stmts)
            if id(s) in ids or any(id(b) in ids for b in A.blocks_under(s))
        ]
        pos = (hits[0] if hits else 0) if before else (hits[-1] + 1 if hits else len(body.stmts))
        body.stmts.insert(pos, new)
        loop.body = body

    @staticmethod
    def _copy_block(name: str, src: Buffer, dst: Buffer) -> Block:
        ivs = [IterVar(Var(f"v{d}"), n, "S") for d, n in enumerate(src.shape)]
        idx = tuple(iv.var for iv in ivs)
        loops = [Var(f"{name}_i{d}") for d in range(len(ivs))]
        return Block(name, ivs, list(loops), BufferStore(dst, idx, Load(src, idx)))

    @staticmethod
    def _nest_for(block: Block) -> Stmt:
        stmt: Stmt = block
        for lv, iv in reversed(list(zip(block.bindings, block.iter_vars))):
            stmt = For(lv, iv.extent, stmt)  # type: ignore[arg-type]
        return stmt


def _identity(block: Block) -> Expr:
    assert block.init is not None and isinstance(block.init, BufferStore)
    return block.init.value


def _subst_stmt(s: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    assert isinstance(s, BufferStore)
    return BufferStore(
        s.buffer, tuple(substitute(i, mapping) for i in s.indices), substitute(s.value, mapping)
    )


def _in_bounds(idx: Sequence[Expr], shape: Sequence[int], ranges: dict) -> bool:
    from compiler.loopir.simplify import bound

    for e, n in zip(idx, shape):
        b = bound(simplify(e, ranges), ranges)
        if b is None or b[0] < 0 or b[1] >= n:
            return False
    return True


def _in_iter_vars(block: Block, guard: Expr) -> Expr:
    """Rewrite a guard over loop variables in terms of the block's iteration variables, by matching
    each binding expression structurally (guards are built from the bindings)."""
    from compiler.loopir.expr import children, rebuild
    from compiler.loopir.simplify import key

    by_key = {key(simplify(e)): iv.var for iv, e in zip(block.iter_vars, block.bindings)}
    by_key.update({key(e): iv.var for iv, e in zip(block.iter_vars, block.bindings)})

    def swap(e: Expr) -> Expr:  # pre-order: the largest matching sub-expression wins
        hit = by_key.get(key(e))
        return hit if hit is not None else rebuild(e, [swap(c) for c in children(e)])

    out = swap(guard)
    loop_vars = {v for e in block.bindings for v in free_vars(e)}
    if free_vars(out) & loop_vars:
        raise ScheduleError(
            f"pad: the guard of block {block.name} is not a condition on its iteration variables"
        )
    return out


def _name(node: Stmt) -> str:
    if isinstance(node, For):
        return f"loop {node.var.name}"
    if isinstance(node, Block):
        return f"block {node.name}"
    return type(node).__name__
