"""The CPU attention sketch: an ``attention`` group (:mod:`compiler.attention`: QKᵀ, scale/mask, softmax,
P·V with the Q/K/V layout prologues) as one kernel, the score rows kept in a local buffer::

    parallel for (batch x head, block of R query rows)         (the thread pool; ``parallel``)
      kt[N/w][Dk][w] = K of this head in panels of w = nu x V keys (``pack_k``: by columns or by rows of
                                                               a panel; ``none``: K read in place)
      for each tile of mr query rows                           s[mr][N]: the tile's scores (L1)
        for column tiles of nu vectors
          acc[mr][nu x V] = sum_k Q[row][k] * kt[panel][k][..]  (register tile: FMAs, Q broadcast)
          s[rows][cols] = score(acc)                           (scale, mask: the group's own ops)
        for each row: m = max_j s; s = exp(s - m); l = sum_j s (vector partials, balanced trees;
                                                                exp computed once per score)
        for P·V tiles of pv_mr rows (dividing mr), pv_nu vectors of value columns
          o[pv_mr][pv_nu x V] = sum_j s[row][j] * V[j][cols]   (register tile)
          out[rows][cols] = o * (1 / l[row])

The scores never leave L1 (mr x N floats), so the [B, H, M, N] score tensor is neither written nor read back,
and each exp is computed once (as ``exp_le0``: a score less a max is never positive). With ``keys`` = N that
is the exact two-pass softmax over the whole key row (max, then exp/sum). With fewer keys per block
(:func:`_online`, the default beyond 512 keys) it is the online (flash-attention) form: for each key block,
every row tile of the task computes its scores, updates a running max and sum per row and rescales its output
rows by exp(old max - new max) before adding P·V, so a block's K panels and V rows are reused from L1/L2 by
all R rows instead of being streamed once per row tile. The Q, K, V, mask and score expressions are taken from
the group's own tensor-expression lowering (the bodies of its QKᵀ, reduce_max and P·V blocks), so every layout
prologue the fusion rules admit (head reshapes/transposes, slices of a merged Q/K/V projection) and every
score op the matcher admits (scale multiply/divide, additive or ``where`` mask) is computed as the graph says.
Knobs: vector lanes, the two register tiles, the row block, K packing, the key block, the thread pool;
defaults from the target's vector width and register count (:meth:`CpuAttentionSketch.default`).
"""

from __future__ import annotations

import math

from compiler.backends.cpu.sketches.common import PARALLEL_MIN_WORK
from compiler.backends.sketch import Config, Knob, Sketch, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Binary,
    Call,
    Compare,
    Expr,
    Load,
    Var,
    children,
    const,
    replace_buffer_loads,
    select,
    substitute,
)
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Allocate, Block, Buffer, BufferStore, For, PrimFunc, SeqStmt, Stmt
from compiler.target import Target

ROWS = (4, 8, 16, 32, 64, 128)
TILE_ROWS = (1, 2, 4, 8)
TILE_VECTORS = (1, 2, 4)
KEY_BLOCKS = (8, 16, 32, 64, 128, 256)
TWO_PASS_UP_TO = 512  # keys: up to this many, the default keeps whole score rows (two-pass softmax)
ONLINE_KEYS = 256  # the default key block of the online softmax beyond that


def _geometry(group: Group) -> dict[str, int]:
    """Sizes of the core: batch x heads (``bh``), query rows ``m``, keys ``n``, ``dk``, ``dv``."""
    qk = group.anchor
    if group.kind != "attention" or qk is None:
        raise ScheduleError(f"attention: group {group.name} is no attention group")
    pv = next(n for n in reversed(group.nodes) if n.op == "batch_matmul")
    *batch, m, n = qk.output.shape
    a = qk.inputs[0].shape
    dk = a[-1]
    dv = pv.output.shape[-1]
    return {"bh": math.prod(batch), "m": m, "n": n, "dk": dk, "dv": dv}


def _registers(target: Target) -> int:
    return target.vector_registers


class CpuAttentionSketch(Sketch):
    """Attention groups on the CPU: one kernel per core, parallel over (batch x head, row block)."""

    name = "attention"
    version = 1
    kinds = ("attention",)

    # ------------------------------------------------------------------ space
    def space(self, group: Group, target: Target) -> list[Knob]:
        geo = _geometry(group)
        lanes = target.vector_lanes_f32
        vectors = tuple(v for v in (1, 4, 8, 16) if v <= lanes and geo["n"] % v == 0 and geo["dv"] % v == 0)
        rows = tuple(r for r in ROWS if r <= geo["m"] and geo["m"] % r == 0) or (geo["m"],)
        return [
            Knob("vector", vectors, "SIMD lanes along keys (scores) and along the value columns (P·V)"),
            Knob("rows", rows, "query rows per task (the score block kept in a local buffer)"),
            Knob("mr", TILE_ROWS, "rows of the QKᵀ register tile"),
            Knob("nu", TILE_VECTORS, "vectors (of keys) of the QKᵀ register tile"),
            Knob("pv_mr", TILE_ROWS, "rows of the P·V register tile"),
            Knob("pv_nu", TILE_VECTORS, "vectors (of value columns) of the P·V register tile"),
            Knob(
                "pack_k",
                ("blocked", "transpose", "none"),
                "K of the head packed into panels of nu x vector keys (one column of a panel's keys at a "
                "time, or one key's row at a time), or read in place",
            ),
            Knob(
                "keys",
                (*(kb for kb in KEY_BLOCKS if kb < geo["n"] and geo["n"] % kb == 0), geo["n"]),
                "keys per block: all of them (two-pass softmax of whole score rows) or fewer (online "
                "softmax: a running max and sum per row, the output rescaled per key block, each K/V block "
                "reused by every row of the task)",
            ),
            Knob("parallel", ("tasks", "none"), "thread pool over (batch x head, row block) tasks"),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        geo = _geometry(group)
        v, r = config["vector"], config["rows"]
        if r % config["mr"]:
            raise ScheduleError(f"attention: mr {config['mr']} does not divide rows {r}")
        if config["mr"] % config["pv_mr"]:
            raise ScheduleError(f"attention: pv_mr {config['pv_mr']} does not divide mr {config['mr']}")
        if config["keys"] % (v * config["nu"]):
            raise ScheduleError(
                f"attention: vector*nu = {v * config['nu']} does not divide the key block {config['keys']}"
            )
        if geo["n"] % (v * config["nu"]):
            raise ScheduleError(
                f"attention: vector*nu = {v * config['nu']} does not divide the keys {geo['n']}"
            )
        if geo["dv"] % (v * config["pv_nu"]):
            raise ScheduleError(
                f"attention: vector*pv_nu = {v * config['pv_nu']} does not divide the value width {geo['dv']}"
            )
        budget = _registers(target) - 2
        for mr, nu in (("mr", "nu"), ("pv_mr", "pv_nu")):
            if v > 1 and config[mr] * config[nu] > budget:
                raise ScheduleError(
                    f"attention: a {mr} x {nu} = {config[mr] * config[nu]} accumulator tile does not fit "
                    f"{_registers(target)} vector registers"
                )

    def default(self, group: Group, target: Target) -> Config:
        """Largest row block leaving two tasks per thread (K packed once per block); register tiles with
        the most rows (query rows broadcast, fewer vector loads per FMA) and then the most vectors within
        half the vector registers. Measured on attention (12 heads, 128 x 128 x 64), Zen 5, 2 threads,
        against the three unfused kernels: AVX-512 8x2 / 8x2 tiles 1.09-1.13x, 4x4 P·V tiles 0.70-0.74x;
        AVX2 8x1 / 8x1 1.08x, 4x2 0.85x."""
        geo = _geometry(group)
        space = {k.name: k.values for k in self.space(group, target)}
        v = max(space["vector"])
        tasks_wanted = 2 * max(1, target.cores)
        rows = space["rows"]
        r = max((x for x in rows if geo["bh"] * (geo["m"] // x) >= tasks_wanted), default=min(rows))
        budget = _registers(target) // 2

        def tile(cols: int, rows_of: int) -> tuple[int, int]:
            mr = max(x for x in TILE_ROWS if rows_of % x == 0 and (v == 1 or x <= budget))
            nu = max(x for x in TILE_VECTORS if cols % (v * x) == 0 and (v == 1 or mr * x <= budget))
            return mr, nu

        mr, nu = tile(geo["n"], r)
        pmr, pnu = tile(geo["dv"], mr)
        work = geo["bh"] * geo["m"] * geo["n"] * (geo["dk"] + geo["dv"]) // 8
        config = {
            "vector": v,
            "rows": r,
            "mr": mr,
            "nu": nu,
            "pv_mr": pmr,
            "pv_nu": pnu,
            # by columns of a panel (its w K rows stay in L1); by rows measured the same (128, 512 keys)
            "pack_k": "blocked",
            # whole score rows up to TWO_PASS_UP_TO keys (512: 1.98 vs 2.15 ms online by 128), then online
            # softmax by blocks of 256 (1024 keys: 7.7 vs 10.1 ms two-pass; 2048: 31.5 vs 38.3 ms)
            "keys": geo["n"] if geo["n"] <= TWO_PASS_UP_TO or geo["n"] % ONLINE_KEYS else ONLINE_KEYS,
            "parallel": "tasks" if geo["bh"] * geo["m"] // r >= 2 and work >= PARALLEL_MIN_WORK else "none",
        }
        self.check(group, config, target)
        return config

    # ------------------------------------------------------------------ build
    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        geo = _geometry(group)
        sch, _blocks = prepare(group)
        func = sch.func
        parts = _core_exprs(group, func)
        body = _kernel(geo, config, parts, func.outputs[0])
        root = Block("root", [], [], body)
        new = PrimFunc(func.name, list(func.params), root, func.num_inputs, dict(func.attrs))
        return Schedule(new)


# ---------------------------------------------------------------- expressions
class _Parts:
    """The group's own expressions, as functions of (batch indices, row, col, reduction index)."""

    def __init__(self, qk: Block, rmax: Block, pv: Block, scores: Buffer) -> None:
        self.qk, self.rmax, self.pv, self.scores = qk, rmax, pv, scores
        prod = _product(qk)
        self._q, self._k = prod.a, prod.b
        self._v = _product(pv).b
        self._score = children(A.block_stores(rmax)[0].value)[1]

    @staticmethod
    def _bind(block: Block, batch: list[Expr], row: Expr, col: Expr, red: Expr) -> dict[Var, Expr]:
        ivs = [iv.var for iv in block.iter_vars]
        spatial, reduce_ = ivs[:-1], ivs[-1]
        vals = [*batch, row, col]
        mapping = dict(zip(spatial, vals))
        mapping[reduce_] = red
        return mapping

    def q(self, batch: list[Expr], row: Expr, k: Expr) -> Expr:
        return substitute(self._q, self._bind(self.qk, batch, row, const(0), k))

    def k(self, batch: list[Expr], col: Expr, k: Expr) -> Expr:
        return substitute(self._k, self._bind(self.qk, batch, const(0), col, k))

    def v(self, batch: list[Expr], j: Expr, col: Expr) -> Expr:
        return substitute(self._v, self._bind(self.pv, batch, const(0), col, j))

    def score(self, acc: Expr, batch: list[Expr], row: Expr, col: Expr) -> Expr:
        # reduce_max's body: max(acc, f(scores[b.., row, r0], mask[..])) with r0 the key
        e = replace_buffer_loads(self._score, lambda ld: acc if ld.buffer is self.scores else None)
        ivs = [iv.var for iv in self.rmax.iter_vars]
        mapping = dict(zip(ivs[: len(batch) + 1], [*batch, row]))
        mapping[ivs[-1]] = col
        for extra in ivs[len(batch) + 1 : -1]:
            mapping[extra] = const(0)
        return substitute(e, mapping)


def _product(block: Block) -> Binary:
    value = A.block_stores(block)[0].value  # acc + a * b
    prod = value.b if isinstance(value, Binary) and value.op == "+" else None
    if not isinstance(prod, Binary) or prod.op != "*":
        raise ScheduleError(f"attention: block {block.name} is not a sum of products")
    return prod


def _core_exprs(group: Group, func: PrimFunc) -> _Parts:
    blocks = [b for b in A.blocks_under(func.body) if isinstance(b, Block) and b.is_reduction]
    qk_name = group.anchor.name  # type: ignore[union-attr]
    pv_node = next(n for n in reversed(group.nodes) if n.op == "batch_matmul")
    rmax_node = next(n for n in group.nodes if n.op == "reduce_max")
    by_name = {b.name: b for b in blocks}
    try:
        qk, pv, rmax = by_name[qk_name], by_name[pv_node.name], by_name[rmax_node.name]
    except KeyError as exc:
        raise ScheduleError(f"attention: group {group.name} has no lowered block {exc}") from exc
    return _Parts(qk, rmax, pv, A.writes(qk)[0])


# ---------------------------------------------------------------- loop IR
def _loop(name: str, extent: int, body_fn, kind: str = "serial") -> For:
    var = Var(name)
    return For(var, extent, body_fn(var), kind)


def _seq(*stmts: Stmt) -> Stmt:
    flat = [s for s in stmts if s is not None]
    return flat[0] if len(flat) == 1 else SeqStmt(flat)


def _tree(op: str, items: list[Expr], dtype: str) -> Expr:
    while len(items) > 1:
        nxt = [Binary(op, items[k], items[k + 1], dtype) for k in range(0, len(items) - 1, 2)]
        if len(items) % 2:
            nxt.append(items[-1])
        items = nxt
    return items[0]


def _lane_kind(v: int) -> str:
    """The kind of a loop over ``v`` lanes: vectorized unless there is one."""
    return "vectorized" if v > 1 else "serial"


def _lanes(op: str, part: Buffer, v: int) -> Expr:
    """``part[0] op part[1] op ..`` over its ``v`` lanes, as a balanced tree."""
    return _tree(op, [Load(part, (const(x),)) for x in range(v)], "float32")


def _zero_tile(buf: Buffer, tag: str, v: int) -> For:
    """``buf`` (rows x columns, ``v``-lane vectors) = 0, rows unrolled, columns vectorized; loops ``<tag>i``,
    ``<tag>c``."""
    rows, cols = buf.shape
    vec = _lane_kind(v)
    zero = const(0.0, "float32")
    return _loop(
        tag + "i",
        rows,
        lambda i: _loop(tag + "c", cols, lambda c: BufferStore(buf, (i, c), zero), vec),
        "unrolled",
    )


def _tile_loops(tag: str, rows: int, nu: int, v: int, fn) -> For:
    """The nest over a register tile of ``rows`` x ``nu`` vectors of ``v`` lanes: rows and vectors unrolled,
    lanes vectorized (loops ``<tag>i``, ``<tag>u``, ``<tag>x``); ``fn(i, u, x)`` is the statement of row i,
    tile column u * v + x."""
    vec = _lane_kind(v)
    return _loop(
        tag + "i",
        rows,
        lambda i: _loop(tag + "u", nu, lambda u: _loop(tag + "x", v, lambda x: fn(i, u, x), vec), "unrolled"),
        "unrolled",
    )


def _row_partials(
    part: Buffer, s: Buffer, i: Expr, cols: int, start: Expr, combine, tags: tuple[str, str, str]
):
    """``part`` (v lanes) = ``start``, then ``part[x] = combine(part[x], s[i, j * v + x])`` over the ``cols``
    values of row i of ``s``: the vector partials of a row max or sum (reduce them with :func:`_lanes`)."""
    v = part.shape[0]
    vec = _lane_kind(v)
    first, outer, inner = tags
    return [
        _loop(first, v, lambda x: BufferStore(part, (x,), start), vec),
        _loop(
            outer,
            cols // v,
            lambda j: _loop(
                inner,
                v,
                lambda x: BufferStore(part, (x,), combine(Load(part, (x,)), Load(s, (i, j * v + x)))),
                vec,
            ),
        ),
    ]


def _row_exp(s: Buffer, i: Expr, cols: int, v: int, shift: Expr) -> For:
    """``s[i, :cols] = exp(s[i, :cols] - shift)`` in place, ``v`` lanes at a time. ``shift`` is at least
    every score of the row (its max, or the running max; 0 when that is -inf, where every score is -inf), so
    the argument is never positive: ``exp_le0``."""
    vec = _lane_kind(v)
    return _loop(
        "ej",
        cols // v,
        lambda j: _loop(
            "ex",
            v,
            lambda x: BufferStore(
                s, (i, j * v + x), Call("exp_le0", (Load(s, (i, j * v + x)) - shift,), "float32")
            ),
            vec,
        ),
    )


def _max(a: Expr, b: Expr) -> Expr:
    return Binary("max", a, b, "float32")


def _add(a: Expr, b: Expr) -> Expr:
    return a + b


def _unravel(flat: Expr, shape: tuple[int, ...]) -> list[Expr]:
    """Row-major indices of the flat index ``flat`` into ``shape``."""
    out: list[Expr] = []
    stride = math.prod(shape)
    for k, d in enumerate(shape):
        stride //= d
        e = flat // stride if stride > 1 else flat
        out.append(e % d if k > 0 and d > 1 else (const(0) if d == 1 else e))
    return out


def _kernel(geo: dict[str, int], cfg: Config, parts: _Parts, out: Buffer) -> Stmt:
    f32 = "float32"
    bh, m, n, dk, dv = geo["bh"], geo["m"], geo["n"], geo["dk"], geo["dv"]
    v, r = cfg["vector"], cfg["rows"]
    mr, nu, pmr, pnu = cfg["mr"], cfg["nu"], cfg["pv_mr"], cfg["pv_nu"]
    blocks = m // r
    batch_shape = tuple(out.shape[:-2])

    def task(t: Var) -> Stmt:
        flat_bh = t // blocks if blocks > 1 else t
        row0 = (t % blocks) * r if blocks > 1 else const(0)
        batch = _unravel(flat_bh, batch_shape) if batch_shape else []
        s = Buffer("scores", (mr, n), f32, "local")
        lsum = Buffer("row_sum", (mr,), f32, "local")
        w = nu * v  # keys per QKᵀ register tile: K is packed in panels of w keys, [N / w][Dk][w]
        kt = Buffer("k_packed", (n // w, dk, w), f32, "local") if cfg["pack_k"] != "none" else None

        def vval(j: Expr, col: Expr) -> Expr:
            return parts.v(batch, j, col)

        def kval(panel: Expr, c: Expr, k: Expr) -> Expr:
            return Load(kt, (panel, k, c)) if kt is not None else parts.k(batch, panel * w + c, k)

        # --- K of the head, transposed
        pack = None
        if kt is not None:
            # per panel of w keys (a contiguous Dk x w block: each register tile reads one, no 4 KiB-strided
            # rows at long sequences): blocked = one column of the panel's w keys at a time (their K rows, a
            # few pages strided by the model width, stay in L1; contiguous writes), transpose = one key's
            # row at a time (contiguous reads)
            def pack_panel(p_: Var) -> Stmt:
                def put(c: Expr, k: Expr) -> Stmt:
                    return BufferStore(kt, (p_, k, c), parts.k(batch, p_ * w + c, k))

                if cfg["pack_k"] == "blocked":
                    return _loop("pk", dk, lambda k: _loop("pc", w, lambda c: put(c, k)))
                return _loop("pc", w, lambda c: _loop("pk", dk, lambda k: put(c, k)))

            pack = _loop("pp", n // w, pack_panel)

        # --- scores
        def score_tile(io: Var, jo: Var, s: Buffer = s, key0: Expr | None = None) -> Stmt:
            """Scores of rows io * mr .. and keys key0 + jo * w .. into s[.., jo * w ..]; key0 is a multiple
            of w (the key block is)."""
            key0 = const(0) if key0 is None else key0
            panel = key0 // w + jo
            acc = Buffer("acc", (mr, nu * v), f32, "local")

            def fma(i: Var, u: Var, x: Var, k: Var) -> Stmt:
                c = u * v + x
                product = parts.q(batch, row0 + io * mr + i, k) * kval(panel, c, k)
                return BufferStore(acc, (i, c), Load(acc, (i, c)) + product)

            def store(i: Var, u: Var, x: Var) -> Stmt:
                c = u * v + x
                col = jo * (nu * v) + c
                return BufferStore(
                    s, (i, col), parts.score(Load(acc, (i, c)), batch, row0 + io * mr + i, key0 + col)
                )

            nest = _seq(
                _zero_tile(acc, "a", v),
                _loop("k", dk, lambda k: _tile_loops("s", mr, nu, v, lambda i, u, x: fma(i, u, x, k))),
                _tile_loops("w", mr, nu, v, store),
            )
            return Allocate(acc, nest)

        def scores(io: Var) -> Stmt:
            return _loop("jo", n // (nu * v), lambda jo: score_tile(io, jo))

        # --- softmax rows: max, exp once (in place), sum
        def softmax_row(i: Var) -> Stmt:
            mp = Buffer("max_part", (v,), f32, "local")
            sp = Buffer("sum_part", (v,), f32, "local")
            mx = Buffer("row_max", (1,), f32, "local")
            stmts = [
                *_row_partials(mp, s, i, n, const(-math.inf, f32), _max, ("mx0", "mj", "mx")),
                BufferStore(mx, (const(0),), _lanes("max", mp, v)),
                _row_exp(s, i, n, v, Load(mx, (const(0),))),
                *_row_partials(sp, s, i, n, const(0.0, f32), _add, ("sx0", "sj", "sx")),
                BufferStore(lsum, (i,), _lanes("+", sp, v)),
            ]
            return Allocate(mp, Allocate(sp, Allocate(mx, SeqStmt(stmts))))

        softmax = _loop("ri", mr, softmax_row)

        # --- P·V
        def pv_tile(io: Var, po: Var, do: Var) -> Stmt:
            o = Buffer("out_acc", (pmr, pnu * v), f32, "local")

            def fma(i: Var, u: Var, x: Var, j: Var) -> Stmt:
                c = u * v + x
                p = Load(s, (po * pmr + i, j))
                return BufferStore(o, (i, c), Load(o, (i, c)) + p * vval(j, do * (pnu * v) + c))

            def store(i: Var, u: Var, x: Var) -> Stmt:
                c = u * v + x
                row = po * pmr + i
                value = Load(o, (i, c)) * Call("recip", (Load(lsum, (row,)),), f32)
                return BufferStore(out, (*batch, row0 + io * mr + row, do * (pnu * v) + c), value)

            nest = _seq(
                _zero_tile(o, "o", v),
                _loop("j", n, lambda j: _tile_loops("p", pmr, pnu, v, lambda i, u, x: fma(i, u, x, j))),
                _tile_loops("q", pmr, pnu, v, store),
            )
            return Allocate(o, nest)

        def pv(io: Var) -> Stmt:
            return _loop(
                "po", mr // pmr, lambda po: _loop("do", dv // (pnu * v), lambda do: pv_tile(io, po, do))
            )

        if cfg["keys"] < n:
            rows = _online(cfg, geo, parts, batch, row0, out, score_tile, vval)
        else:
            # each tile of mr query rows: its scores (all keys), their softmax, then P·V, the rows in L1
            rows = _loop(
                "io", r // mr, lambda io: Allocate(s, Allocate(lsum, _seq(scores(io), softmax, pv(io))))
            )
        inner = _seq(pack, rows) if pack is not None else rows
        return Allocate(kt, inner) if kt is not None else inner

    kind = "parallel" if cfg["parallel"] == "tasks" else "serial"
    return _loop("task", bh * blocks, task, kind)


def _online(
    cfg: Config,
    geo: dict[str, int],
    parts: _Parts,
    batch: list[Expr],
    row0: Expr,
    out: Buffer,
    score_tile,
    vval,
) -> Stmt:
    """The task's rows with an online softmax over blocks of ``keys`` keys (flash-attention order): for each
    key block, every row tile's scores, the running max ``mx`` and sum ``sm`` updated (the earlier output
    rescaled by exp(old max - new max)), P·V accumulated into the task's output rows ``acc_o``; at the end
    ``out = acc_o / sm``. A row whose max is still -inf (every key so far masked) counts its block's
    exponentials and correction against 0 instead (they are all 0: no NaN)."""
    f32 = "float32"
    n, dv = geo["n"], geo["dv"]
    v, r, kb = cfg["vector"], cfg["rows"], cfg["keys"]
    mr, pmr, pnu = cfg["mr"], cfg["pv_mr"], cfg["pv_nu"]
    vec = _lane_kind(v)
    acc_o = Buffer("out_rows", (r, dv), f32, "local")
    mx = Buffer("run_max", (r,), f32, "local")
    sm = Buffer("run_sum", (r,), f32, "local")
    neg_inf = const(-math.inf, f32)
    init = _seq(
        _loop("zr", r, lambda i: _loop("zc", dv, lambda c: BufferStore(acc_o, (i, c), const(0.0, f32)), vec)),
        _loop(
            "zm", r, lambda i: _seq(BufferStore(mx, (i,), neg_inf), BufferStore(sm, (i,), const(0.0, f32)))
        ),
    )

    def block(kbo: Var) -> Stmt:
        key0 = kbo * kb

        def tile(io: Var) -> Stmt:
            s = Buffer("scores", (mr, kb), f32, "local")
            scores = _loop("jo", kb // (cfg["nu"] * v), lambda jo: score_tile(io, jo, s, key0))

            def update(i: Var) -> Stmt:
                row = io * mr + i
                mp = Buffer("max_part", (v,), f32, "local")
                sp = Buffer("sum_part", (v,), f32, "local")
                new = Buffer("new_max", (2,), f32, "local")  # [0]: the new max, [1]: it or 0 if -inf
                cur = Load(new, (const(1),))
                stmts = [
                    *_row_partials(mp, s, i, kb, neg_inf, _max, ("mx0", "mj", "mx")),
                    BufferStore(new, (const(0),), _max(Load(mx, (row,)), _lanes("max", mp, v))),
                    BufferStore(
                        new,
                        (const(1),),
                        select(
                            Compare("==", Load(new, (const(0),)), neg_inf),
                            const(0.0, f32),
                            Load(new, (const(0),)),
                        ),
                    ),
                    _row_exp(s, i, kb, v, cur),
                    *_row_partials(sp, s, i, kb, const(0.0, f32), _add, ("sx0", "sj", "sx")),
                ]
                corr = Buffer("correction", (1,), f32, "local")
                c0 = Load(corr, (const(0),))
                stmts += [
                    # the old max is at most the new one (or -inf): exp_le0
                    BufferStore(corr, (const(0),), Call("exp_le0", (Load(mx, (row,)) - cur,), f32)),
                    BufferStore(
                        sm,
                        (row,),
                        Load(sm, (row,)) * c0 + _lanes("+", sp, v),
                    ),
                    BufferStore(mx, (row,), Load(new, (const(0),))),
                    _loop("rc", dv, lambda c: BufferStore(acc_o, (row, c), Load(acc_o, (row, c)) * c0), vec),
                ]
                return Allocate(mp, Allocate(sp, Allocate(new, Allocate(corr, SeqStmt(stmts)))))

            def pv_tile(po: Var, do: Var) -> Stmt:
                o = Buffer("out_acc", (pmr, pnu * v), f32, "local")

                def col_of(u: Expr, x: Expr) -> Expr:
                    return do * (pnu * v) + u * v + x

                def each(tag: str, fn) -> Stmt:
                    return _tile_loops(tag, pmr, pnu, v, fn)

                row = lambda i: io * mr + po * pmr + i  # noqa: E731
                load = each(
                    "l", lambda i, u, x: BufferStore(o, (i, u * v + x), Load(acc_o, (row(i), col_of(u, x))))
                )

                def fma(j: Var) -> Stmt:
                    return each(
                        "p",
                        lambda i, u, x: BufferStore(
                            o,
                            (i, u * v + x),
                            Load(o, (i, u * v + x))
                            + Load(s, (po * pmr + i, j)) * vval(key0 + j, col_of(u, x)),
                        ),
                    )

                store = each(
                    "s", lambda i, u, x: BufferStore(acc_o, (row(i), col_of(u, x)), Load(o, (i, u * v + x)))
                )
                return Allocate(o, _seq(load, _loop("j", kb, fma), store))

            pv = _loop("po", mr // pmr, lambda po: _loop("do", dv // (pnu * v), lambda do: pv_tile(po, do)))
            return Allocate(s, _seq(scores, _loop("ri", mr, update), pv))

        return _loop("io", r // mr, tile)

    final = _loop(
        "fr",
        r,
        lambda i: _loop(
            "fc",
            dv,
            lambda c: BufferStore(
                out, (*batch, row0 + i, c), Load(acc_o, (i, c)) * Call("recip", (Load(sm, (i,)),), f32)
            ),
            vec,
        ),
    )
    body = _seq(init, _loop("kbo", n // kb, block), final)
    return Allocate(acc_o, Allocate(mx, Allocate(sm, body)))
