"""Online (single-pass) softmax for the CUDA reduction sketch: rows too long for registers and shared memory.

The reduction sketch with ``keep_row=reread`` reads a softmax row three times: once for the row max, once
for the sum of ``exp(x - max)``, once to normalize. ``online_softmax`` rewrites that scheduled loop nest so
each thread keeps a running max ``m`` and a sum ``s`` rescaled to it in one pass over its columns, with
one ``exp`` per element (``e = exp(-|x - m|)``: the rescaling when ``x`` is a new max, else the term)::

    s = x > m ? s * e + 1 : s + e;  m = max(m, x)

then the row max is the all-reduce of the threads' ``m`` (max) and the row sum the all-reduce of
``s * exp(m - M)`` (sum), and one more pass normalizes: two reads of the row instead of three, and two
``exp`` per element as before. Both cross-thread steps stay plain max/sum reductions, so the CUDA
lowering (warp shuffles + shared memory) and the SIMT interpreter run them unchanged. ``-inf`` is handled
without NaN: while the running max is ``-inf`` (every value so far ``-inf``) ``e`` is 0, and a ``-inf``
value adds ``exp(-inf) = 0``.

It applies to float32 groups of the softmax form only (``reduce_max -> subtract -> exp -> reduce_sum ->
divide``, the decomposition of ``softmax``): :func:`is_softmax` is the legality check."""

from __future__ import annotations

from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir.expr import Binary, Call, Expr, Load, call, compare, const, maximum, minimum, select
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, BufferStore, For, SeqStmt, Stmt
from compiler.loopir.visitor import post_order, substitute_stmt

_EXP = ("exp", "fast_exp")


def is_softmax(group: Group) -> bool:
    """Whether ``group`` is one float32 softmax (max, then a sum of ``exp(x - max)``, then a divide)."""
    ops = [n.op for n in group.nodes if n.op != "constant"]
    reductions = [op for op in ops if op.startswith("reduce_")]
    return (
        reductions == ["reduce_max", "reduce_sum"]
        and {"subtract", "exp", "divide"} <= set(ops)
        and all(v.dtype == "float32" for n in group.nodes for v in (*n.inputs, *n.outputs))
    )


def _find(s: Stmt, name: str, path: list[Stmt]) -> list[Stmt] | None:
    """The statements from ``s`` down to the block called ``name`` (None: not under ``s``)."""
    path = [*path, s]
    if isinstance(s, Block) and s.name == name:
        return path
    kids: list[Stmt] = []
    if isinstance(s, SeqStmt):
        kids = s.stmts
    elif isinstance(s, (For, Block)) or hasattr(s, "body"):
        kids = [s.body]
    for k in kids:
        found = _find(k, name, path)
        if found is not None:
            return found
    return None


def _thread_loop(path: list[Stmt]) -> For:
    return next(s for s in reversed(path) if isinstance(s, For) and s.thread == "threadIdx.x")


def _store(b: Block) -> BufferStore:
    if not isinstance(b.body, BufferStore):
        raise ScheduleError(f"online softmax: block {b.name} is not one store")
    return b.body


def online_softmax(sch: Schedule, max_name: str, sum_name: str) -> None:
    """Rewrite the scheduled (reread) softmax of ``sch`` into the online form; ``max_name``/``sum_name``
    are the row max and row sum reduction blocks (their per-thread parts are ``<name>_rf``)."""
    root = sch.root
    paths = {n: _find(root.body, n, []) for n in (f"{max_name}_rf", f"{sum_name}_rf", f"{sum_name}_rf_init")}
    paths[sum_name] = _find(root.body, sum_name, [])
    if any(p is None for p in paths.values()):
        raise ScheduleError("online softmax: the row max / row sum are not split over the row's threads")
    max_rf, sum_rf = paths[f"{max_name}_rf"][-1], paths[f"{sum_name}_rf"][-1]
    sum_init, sum_red = paths[f"{sum_name}_rf_init"][-1], paths[sum_name][-1]
    l1, l2 = _thread_loop(paths[f"{max_name}_rf"]), _thread_loop(paths[f"{sum_name}_rf"])
    ms, ss = _store(max_rf), _store(sum_rf)
    if not (isinstance(ms.value, Binary) and ms.value.op == "max" and ms.buffer.shape == ss.buffer.shape):
        raise ScheduleError("online softmax: the row max is not a max over the row")
    sv = ss.value
    if not (isinstance(sv, Binary) and sv.op == "+" and isinstance(sv.b, Call) and sv.b.name in _EXP):
        raise ScheduleError("online softmax: the row sum is not a sum of exp(x - max)")
    exp_name, arg = sv.b.name, sv.b.args[0]
    row_max = ms.value.b
    if not (isinstance(arg, Binary) and arg.op == "-" and isinstance(arg.b, Load)):
        raise ScheduleError("online softmax: the row sum is not a sum of exp(x - max)")
    max_buf = arg.b.buffer

    def ex(e: Expr) -> Expr:
        return call(exp_name, e, dtype="float32")

    ninf = const(float("-inf"), "float32")
    # pass 1: the running max and the sum rescaled to it, in the max's per-thread loop
    # one exp per element: e = exp(-|x - m|) rescales the sum (x is a new max) or is the new term
    x, m_old, s_old = row_max, Load(ms.buffer, ms.indices), Load(ss.buffer, ms.indices)
    m_new = maximum(m_old, x)
    e = select(compare("==", m_new, ninf), const(0.0, "float32"), ex(minimum(x - m_old, m_old - x)))
    s_new = select(compare(">", x, m_old), s_old * e + const(1.0, "float32"), s_old + e)
    max_rf.body = SeqStmt(
        [BufferStore(ss.buffer, ms.indices, s_new), BufferStore(ms.buffer, ms.indices, m_new)]
    )
    init = substitute_stmt(sum_init, {l2.var: l1.var})
    l1.body = (
        SeqStmt([init, l1.body]) if not isinstance(l1.body, SeqStmt) else SeqStmt([init, *l1.body.stmts])
    )
    # the row sum: each thread's sum rescaled to the row max
    st = _store(sum_red)
    if not (isinstance(st.value, Binary) and isinstance(st.value.b, Load) and st.value.b.buffer is ss.buffer):
        raise ScheduleError("online softmax: the row sum does not read the per-thread sums")
    idx = st.value.b.indices
    m_t = Load(ms.buffer, idx)
    part = select(
        compare("==", m_t, ninf),
        const(0.0, "float32"),
        Load(ss.buffer, idx) * ex(m_t - Load(max_buf, st.indices)),
    )
    st.value = Binary("+", st.value.a, part, st.value.dtype)
    # drop the sum's own pass over the row
    root.body = post_order(root.body, lambda s: _without(s, l2))
    if _find(root.body, f"{sum_name}_rf", []) is not None:
        raise ScheduleError("online softmax: the row sum's pass could not be removed")


def _without(s: Stmt, loop: For) -> Stmt | None:
    if isinstance(s, SeqStmt) and any(x is loop for x in s.stmts):
        rest = [x for x in s.stmts if x is not loop]
        return rest[0] if len(rest) == 1 else SeqStmt(rest)
    return None
