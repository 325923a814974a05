"""The C target: lowered PrimFuncs -> one C translation unit for gcc.

``generate_c(funcs, target)`` prints the thread pool's client and ``kiln_set_num_threads(int)``
(:mod:`compiler.backends.cpu.pool`: the pool itself is the process's one runtime library), the math
prelude (only the parts used), then every kernel as an ``extern`` function ``void NAME(const float*
restrict x, float* restrict out)`` (inputs first, ``const``). With ``launches`` it also prints ``void
kiln_run(void** buffers)``, which calls each launch in order with ``buffers[id]`` for each buffer id in
its argument list, so one ctypes call runs a whole model.

Loop kinds: ``parallel`` -> the outermost parallel loop is outlined into a chunk function plus a context
struct and run by ``kiln_parallel_for`` on the pool (nested ones run serially inside it; with
``parallel="openmp"`` / ``$KILN_CPU_PARALLEL=openmp``: ``#pragma omp parallel for schedule(static)``);
``unrolled`` -> ``#pragma GCC unroll N`` (N <= 64; a larger N is left to gcc; none for a loop touching a
local buffer too large to promote, :func:`memory_tiles`: a scalar register tile of thousands of elements
lives in memory anyway, and forced unrolling of it cost gcc up to 30 s per kernel); ``thread`` ->
CompileError.
Allocations up to 64 KiB are aligned stack arrays. Larger ones outside parallel loops are slices of
``static __thread unsigned char kiln_scratch[N]`` (64-byte aligned; N is the largest sum over one kernel's
such allocations, since a library's kernels run one after another on a thread: the same memory, warm in
cache, serves every kernel). It is allocated by the C runtime on each calling thread's first call and reused
by every later call: no per-call ``aligned_alloc``/``free``, whose mmap/trim thresholds made calls with
1 MB scratch bimodal; threads calling the library at once each have their own, so calls stay reentrant
across threads; the memory stays until the library is unloaded. Larger ones inside a parallel loop are still
``aligned_alloc``/``free`` around their body (each pool thread allocates its own).

Before printing, :func:`prepare` runs the C target's loop-IR passes on each kernel: vectorized loops split to
the target's vector width, register promotion of local buffers (``compiler.loopir.promote``), explicit SIMD
(``compiler.backends.cpu.vectorize``), expansion of scalar loops over promoted buffers. The printer writes
vector expressions with GCC vector extensions (``kiln_f32x16`` & co. from the prelude: ``kiln_load_f32x16``,
``kiln_store_f32x16``, ``kiln_splat_f32x16``, ``kiln_iota_i32x16``, ``kiln_sel_f32x16``, masks as int32
lanes of 0 / -1; a scalar operand of ``+ - * /`` or of a comparison is written as is, which GCC broadcasts;
a stride-2 gather of one buffer as two contiguous loads and a ``__builtin_shuffle`` of their even lanes,
:meth:`CPrinter.stride2_load`) and a ``vectorized`` loop that stayed scalar with ``#pragma GCC ivdep``.

Loop variables are ``int32_t``; a kernel some index of which can pass 2^31 - 1 (a buffer of more than
2^31 - 1 elements, a longer loop, an overflowing intermediate product: ``compiler.loopir.index_width``) is
marked in :func:`prepare` and declares them ``int64_t`` (its loops whose vector form needs int32 index
vectors stay scalar).

min/max print as ``a > b ? a : b``, which gcc turns into maxps/minps: when ``a`` is NaN the result is ``b``
(NaN is propagated only from the second operand), unlike numpy's NaN-propagating maximum.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from compiler import dtypes
from compiler.backends.cpu import pool, vectorize
from compiler.backends.cpu.kiln_math import MATH_FUNCS, Prelude
from compiler.codegen.cstyle import CStylePrinter, c_type
from compiler.codegen.names import sanitize
from compiler.errors import CompileError
from compiler.loopir.expr import (
    Binary,
    Broadcast,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    MakeVector,
    Ramp,
    Select,
    Var,
    element_dtype,
    lanes_of,
    vector_dtype,
    walk,
)
from compiler.loopir.index_width import index_overflow, mark_index_width
from compiler.loopir.promote import MEMORY_TILE, expand_fallback_loops, promote_locals
from compiler.loopir.stmt import (
    Allocate,
    Buffer,
    BufferStore,
    For,
    PrimFunc,
    Stmt,
    stmt_exprs,
    walk_stmts,
)
from compiler.loopir.unswitch import unswitch_guards

STACK_LIMIT = 64 * 1024  # bytes; larger allocations go to the heap
# most scalar variables a local buffer is promoted to (promote_locals' max_scalars): x86 has 16-32 vector
# registers, so a larger scalar tile spills either way, and its hundreds of variables cost gcc seconds of
# register allocation (conv_net's scalar 8 x 64 tile: 512 variables, 960 KB of C, gcc 6.2 s; as an array
# 34 KB, 0.3 s); a larger one stays an array (a memory tile, :func:`memory_tiles`)
MAX_SCALAR_VARS = 256
# ``PrimFunc.attrs`` key: names of the kernel's buffers whose full-vector stores are non-temporal
# (``kiln_stream_*``; aligned addresses only, the others are ordinary stores). A kernel with any ends each
# thread's share of its parallel loop, and the kernel itself, with ``kiln_sfence()``.
STREAM_STORES = "stream_stores"
# ``PrimFunc.attrs`` key: ``((name, first), ...)``: of those buffers, only the stores at flat element index
# ``first`` or beyond stream (the part before stays in the cache: the reduction sketch's ``store=split``)
STREAM_FROM = "stream_from"
CODEGEN_VERSION = "c-6"  # bump when generated code changes meaning (part of the kernel cache key)
SCRATCH = "kiln_scratch"  # the per-thread scratch array of a library (see the module doc)
# how parallel loops run: "pool" (compiler.backends.cpu.pool, the default) or "openmp" (``#pragma omp``;
# the library must be built with -fopenmp: gcc.flags_for() adds it). $KILN_CPU_PARALLEL picks the default.
PARALLEL_RUNTIMES = ("pool", "openmp")
OPENMP_MARK = "/* parallel: openmp */"


def default_parallel() -> str:
    """The parallel runtime of generated C: ``$KILN_CPU_PARALLEL`` or ``pool``."""
    value = os.environ.get("KILN_CPU_PARALLEL", "pool")
    if value not in PARALLEL_RUNTIMES:
        raise CompileError(f"KILN_CPU_PARALLEL={value!r}: expected one of {PARALLEL_RUNTIMES}")
    return value


def max_lanes(target: Any) -> int | None:
    """float32 lanes of the target's vectors (``Target.vector_bytes``: 64/32/16 -> 16/8/4), None without
    a target."""
    vector_bytes = getattr(target, "vector_bytes", None)
    return max(4, min(16, vector_bytes // 4)) if vector_bytes else None


def unswitch_enabled() -> bool:
    """``$KILN_CPU_UNSWITCH``: ``1`` (the default) unswitches edge guards, ``0`` keeps them in the inner
    loops as lowered (scripts/bench_edge_tiles.py compares the two)."""
    value = os.environ.get("KILN_CPU_UNSWITCH", "1")
    if value not in ("0", "1"):
        raise CompileError(f"KILN_CPU_UNSWITCH={value!r}: expected 1 (unswitch edge guards) or 0")
    return value == "1"


def unswitched(func: PrimFunc) -> PrimFunc:
    """``func`` with its edge guards unswitched out of inner loops (compiler.loopir.unswitch), so a tiled
    kernel runs its whole tiles unguarded; code generation only (the cost model's features describe the
    lowered kernel, one copy of each statement)."""
    if not unswitch_enabled():
        return func
    body = unswitch_guards(func.body)
    if body is func.body:
        return func
    return PrimFunc(func.name, func.params, body, func.num_inputs, dict(func.attrs))


def prepare(func: PrimFunc, target: Any = None) -> PrimFunc:
    """The C target's loop-IR passes on a lowered kernel (``func`` is left untouched): split vectorized
    loops to the target's width, promote local buffers to registers, vectorize, expand the scalar loops
    left over promoted buffers. Without a target a vectorized loop is a CompileError (the vector width
    comes from the target)."""
    lanes = max_lanes(target)
    body = func.body
    wide = index_overflow(func) is not None  # decided on the kernel as lowered and as prepared below
    if lanes is None:
        loop = next((x for x in walk_stmts(body) if isinstance(x, For) and x.kind == "vectorized"), None)
        if loop is not None:
            raise CompileError(
                f"kernel '{func.name}': loop '{loop.var.name}' is vectorized but no target says how wide a "
                "vector is: pass the Target (e.g. generate_c(funcs, Target.host()))"
            )
        body = promote_locals(body, max_scalars=MAX_SCALAR_VARS)
    else:
        body = vectorize.split_vector_loops(body, lanes)
        body = promote_locals(body, vectorize.vectorizable, MAX_SCALAR_VARS)
        body = expand_fallback_loops(vectorize.vectorize_loops(body))
    if body is func.body:
        return mark_index_width(func, wide)
    out = PrimFunc(func.name, func.params, body, func.num_inputs, dict(func.attrs))
    wide = wide or index_overflow(out) is not None
    if wide and _has_ramp(body):
        # index vectors have int32 lanes: a 64-bit-index kernel keeps those loops scalar (ivdep loops)
        out = PrimFunc(
            func.name,
            func.params,
            promote_locals(func.body, max_scalars=MAX_SCALAR_VARS),
            func.num_inputs,
            dict(func.attrs),
        )
    return mark_index_width(out, wide)


def memory_tiles(body: Stmt) -> frozenset[Buffer]:
    """The register tiles of a prepared ``body`` too large to promote (``promote.MEMORY_TILE``: more
    than :data:`MAX_SCALAR_VARS` scalars, or ``promote.MAX_ELEMS`` elements): their ``unrolled`` loops
    print without ``#pragma GCC unroll`` (:meth:`CPrinter.emit_for`)."""
    return frozenset(
        x.buffer for x in walk_stmts(body) if isinstance(x, Allocate) and x.annotations.get(MEMORY_TILE)
    )


def _accesses(body: Stmt, buffers: frozenset[Buffer]) -> bool:
    """Whether ``body`` stores to or loads from one of ``buffers``."""
    for x in walk_stmts(body):
        if isinstance(x, BufferStore) and x.buffer in buffers:
            return True
        for e in stmt_exprs(x):
            if any(isinstance(y, Load) and y.buffer in buffers for y in walk(e)):
                return True
    return False


_VT = {"float32": "f32", "int32": "i32", "bool": "i32"}  # masks are int32 lanes of 0 / -1
_INFIX = ("+", "-", "*", "/", "//", "%")


class CPrinter(CStylePrinter):
    """C99 (gnu11) with GCC vector extensions; parallel loops on the thread pool (or OpenMP)."""

    def __init__(self, target: object | None = None, parallel: str = "pool") -> None:
        super().__init__(target)
        if parallel not in PARALLEL_RUNTIMES:
            raise CompileError(f"unknown CPU parallel runtime {parallel!r} (one of {PARALLEL_RUNTIMES})")
        self.parallel = parallel
        self.prelude = Prelude()  # the parts of the math library the printed code uses
        self.uses_pool = False  # some kernel has a parallel loop (the pool is printed)
        self.outlined: list[str] = []
        self.scratch_bytes = 0  # size of SCRATCH: the most any kernel printed so far uses
        self._scratch_used = 0

    def _reset(self, func: PrimFunc | None) -> None:
        super()._reset(func)
        self.outlined = []  # chunk functions of the kernel being printed
        self._scratch_used = 0  # bytes of SCRATCH the kernel being printed has placed so far
        self._memory_tiles = memory_tiles(func.body) if func is not None else frozenset()

    def emit_for(self, s: For) -> None:
        tile = s.kind == "unrolled" and 1 < s.extent <= 64 and bool(self._memory_tiles)
        if tile and _accesses(s.body, self._memory_tiles):
            # a register tile too large to promote lives in memory: unrolling its loops buys no
            # registers, and gcc, forced to, spends up to 30 s on one kernel (its alias walks over
            # thousands of stores: conv_net's scalar 12 x 4 x 64 tile, 30 s with the pragma, 4.5 s
            # without); gcc decides how far to unroll these
            self.emit_serial(s)
            return
        super().emit_for(s)

    def scratch_decl(self) -> str:
        """The declaration of SCRATCH (empty when no kernel uses it)."""
        if not self.scratch_bytes:
            return ""
        size = self.scratch_bytes
        return f"static __thread unsigned char {SCRATCH}[{size}] __attribute__((aligned(64)));\n"

    def math_call(self, name: str, args: list[str], dtype: str) -> str:
        a = args[0] if args else ""
        if dtype == "float16":
            inner = self.math_call(name, [f"(float)({x})" for x in args], "float32")
            return f"((_Float16){inner})"
        if dtype == "float32":
            if name in MATH_FUNCS:
                return f"{self.prelude.use_math(name)}({a})"
            simple = {
                "sqrt": f"__builtin_sqrtf({a})",
                "rsqrt": f"(1.0f / __builtin_sqrtf({a}))",
                "abs": f"__builtin_fabsf({a})",
                "neg": f"(-{a})",
                "recip": f"(1.0f / {a})",
            }
        elif dtype == "float64":
            simple = {
                "exp": f"__builtin_exp({a})",
                "exp_le0": f"__builtin_exp({a})",
                "log": f"__builtin_log({a})",
                "tanh": f"__builtin_tanh({a})",
                "erf": f"__builtin_erf({a})",
                "sigmoid": f"(1.0 / (1.0 + __builtin_exp(-({a}))))",
                "sqrt": f"__builtin_sqrt({a})",
                "rsqrt": f"(1.0 / __builtin_sqrt({a}))",
                "abs": f"__builtin_fabs({a})",
                "neg": f"(-{a})",
                "recip": f"(1.0 / {a})",
            }
        elif dtypes.is_int(dtype):
            t = c_type(dtype)
            simple = {"abs": f"(({t})__builtin_llabs({a}))", "neg": f"(-{a})"}
        else:
            simple = {}
        if name not in simple:
            raise CompileError(f"intrinsic {name}() on {dtype} is not supported by this target")
        return simple[name]

    def _streams(self) -> bool:
        return bool(self.func is not None and self.func.attrs.get(STREAM_STORES))

    def function(self, func: PrimFunc) -> str:
        text = super().function(func)
        if self._streams():
            head, _, _ = text.rstrip().rpartition("}")
            text = f"{head}{self.indent_unit}kiln_sfence();\n}}\n"
        if not self.outlined:
            return text
        self.uses_pool = True
        # the prototype first: gcc's errors in the chunk functions are blamed on this kernel (KERNEL_PATTERN)
        proto = text.split(" {\n", 1)[0] + ";"
        return "\n".join([proto, *self.outlined, text])

    def emit_parallel(self, s: For) -> None:
        self.in_parallel = True
        try:
            if self.parallel == "openmp":
                self._emit_openmp(s)
            else:
                self._emit_outlined(s)
        finally:
            self.in_parallel = False

    def _emit_openmp(self, s: For) -> None:
        if self._streams():  # every thread fences its own streaming stores before the barrier
            self.line("#pragma omp parallel")
            self.line("{")
            self.depth += 1
            self.line("#pragma omp for schedule(static) nowait")
            self.emit_serial(s)
            self.line("kiln_sfence();")
            self.depth -= 1
            self.line("}")
        else:
            self.line("#pragma omp parallel for schedule(static)")
            self.emit_serial(s)

    def _emit_outlined(self, s: For) -> None:
        """The loop as a chunk function ``static void F(void* ctx, int64_t lo, int64_t hi)`` printed before
        the kernel, with a context struct of everything its body uses from the kernel (buffer pointers,
        loop and let variables), and here the struct and
        ``kiln_parallel_for(F, &ctx, extent)`` (:mod:`compiler.backends.cpu.pool`)."""
        assert self.func is not None
        fname = f"kiln_par_{self.func.name}_{len(self.outlined)}"
        fields = self._captures(s)
        saved_lines, saved_depth = self.lines, self.depth
        self.lines, self.depth = [], 1
        try:
            arg, lo, hi = (self.names.fresh(x) for x in ("kiln_arg", "kiln_lo", "kiln_hi"))
            ctx = self.names.fresh("kiln_ctx")
            self.line(f"const struct {fname}* {ctx} = (const struct {fname}*){arg};")
            for _, name, local in fields:
                self.line(f"{local} = {ctx}->{name};")
            with (
                self.loop_var(s.var, s.extent) as v,
                self.block(f"for ({self.index_ctype} {v} = {lo}; {v} < {hi}; ++{v})"),
            ):
                self.stmt(s.body)
            if self._streams():
                self.line("kiln_sfence();")  # before the chunk counts as finished
            for x in (arg, lo, hi, ctx):
                self.names.release(x)
            body = self.lines
        finally:
            self.lines, self.depth = saved_lines, saved_depth
        struct = [f"struct {fname} {{", *(f"  {ctype} {name};" for ctype, name, _ in fields), "};"]
        if not fields:
            struct = [f"struct {fname} {{ char unused; }};"]
        self.outlined.append(
            "\n".join(
                [*struct, f"static void {fname}(void* {arg}, int64_t {lo}, int64_t {hi}) {{", *body, "}"]
            )
        )
        init = ", ".join(name for _, name, _ in fields) or "0"
        cvar = self.names.fresh("kiln_c")
        self.line("{")
        self.line(f"{self.indent_unit}struct {fname} {cvar} = {{{init}}};")
        self.line(f"{self.indent_unit}kiln_parallel_for({fname}, &{cvar}, {s.extent});")
        self.line("}")
        self.names.release(cvar)

    def _captures(self, s: For) -> list[tuple[str, str, str]]:
        """What the body of parallel loop ``s`` uses from the enclosing kernel: (field type, C name,
        declaration of the chunk function's local copy), in first-use order."""
        assert self.func is not None
        inner = {x.buffer for x in walk_stmts(s.body) if isinstance(x, Allocate)}
        inputs = set(self.func.params[: self.func.num_inputs])
        out: list[tuple[str, str, str]] = []
        seen: set[str] = set()

        def add(ctype: str, name: str, local: str) -> None:
            if name not in seen:
                seen.add(name)
                out.append((ctype, name, local))

        for st in walk_stmts(s.body):
            used_bufs = [st.buffer] if isinstance(st, BufferStore) else []
            for e in stmt_exprs(st):
                for x in walk(e):
                    if isinstance(x, Load):
                        used_bufs.append(x.buffer)
                    elif isinstance(x, Var) and x in self.var_names and x not in self.consts:
                        t = self.let_ctype(x)
                        name = self.var_names[x]
                        add(t, name, f"const {t} {name}")
            for b in used_bufs:
                if b in inner or b not in self.buf_names:
                    continue
                name = self.buf_names[b]
                if b in self.promoted:  # promote_locals leaves buffers used in parallel loops alone
                    raise CompileError(
                        f"internal: register buffer '{b.name}' of kernel '{self.func.name}' is used inside "
                        f"parallel loop '{s.var.name}'"
                    )
                t = f"{'const ' if b in inputs else ''}{c_type(b.dtype)}*"
                add(t, name, f"{t} {self.restrict} {name}")
        return out

    def let_ctype(self, var: Var) -> str:
        """The C type of a loop or let variable (as the base printer declares it)."""
        lanes = lanes_of(var.dtype)
        if lanes > 1:
            return self.vector_type(element_dtype(var.dtype), lanes)
        if var.dtype == "int32":
            return self.index_ctype
        return c_type(var.dtype)

    def emit_thread_loop(self, s: For) -> None:
        name = self.func.name if self.func else "?"
        raise CompileError(
            f"kernel '{name}': loop '{s.var.name}' is bound to {s.thread or 'a GPU thread'}, which only the "
            "CUDA target can run; schedule it as serial/parallel for the CPU"
        )

    # ------------------------------------------------------------------ vectors
    def vector_type(self, dtype: str, lanes: int) -> str:
        return f"kiln_{self.vt(vector_dtype(dtype, lanes))}"

    def vt(self, dtype: str) -> str:
        """``f32x16`` for ``float32x16`` (``i32x16`` for int32 and for masks)."""
        elem = element_dtype(dtype)
        if elem not in _VT:
            raise CompileError(f"the C target has no vectors of {elem}")
        return f"{_VT[elem]}x{lanes_of(dtype)}"

    def vector_store(self, s: BufferStore) -> str:
        lanes = lanes_of(s.value.dtype)
        self.prelude.use_width(lanes)
        flat = self.flat_index(s.buffer, s.indices)
        if s.buffer in self.promoted:
            return f"{self.promoted_var(s.buffer, flat, lanes)} = {self.top(s.value)}"
        target = f"&{self.buf_name(s.buffer)}[{self.top(flat)}]"
        kind = "store"
        if self._streams() and s.buffer.name in self.func.attrs[STREAM_STORES]:  # type: ignore[union-attr]
            kind = "stream" if element_dtype(s.value.dtype) == "float32" else "store"
        vt, value = self.vt(s.value.dtype), self.expr(s.value)
        first = dict(self.func.attrs.get(STREAM_FROM, ())).get(s.buffer.name)  # type: ignore[union-attr]
        if kind == "stream" and first:
            return f"kiln_stream_if_{vt}({target}, {value}, {self.top(flat)} >= {first})"
        return f"kiln_{kind}_{vt}({target}, {value})"

    def operand(self, e: Expr) -> str:
        """An operand of infix vector arithmetic or a comparison: a broadcast scalar is written as is."""
        return self.expr(e.value) if isinstance(e, Broadcast) else self.expr(e)

    def vector_expr(self, e: Expr) -> str:
        w = lanes_of(e.dtype)
        vt = self.vt(e.dtype)
        if isinstance(e, Load):
            flat = self.flat_index(e.buffer, e.indices)
            if e.buffer in self.promoted:
                return self.promoted_var(e.buffer, flat, w)
            return f"kiln_load_{vt}(&{self.buf_name(e.buffer)}[{self.top(flat)}])"
        if isinstance(e, Ramp):
            iota = f"kiln_iota_{vt}()"
            if not (_is(e.base, 0) and _is(e.stride, 1)):
                iota = f"({self.expr(e.base)} + {iota} * {self.expr(e.stride)})"
            return iota
        if isinstance(e, Broadcast):
            if e.value.dtype == "bool":
                return f"kiln_splat_i32x{w}(-(int32_t){self.expr(e.value)})"
            return f"kiln_splat_{vt}({self.top(e.value)})"
        if isinstance(e, MakeVector):
            return self.stride2_load(e, vt) or f"(kiln_{vt}){{{', '.join(self.expr(x) for x in e.elems)}}}"
        if isinstance(e, Binary):
            fma = self.masked_fma(e, vt)
            if fma is not None:
                return fma
            if e.op in _INFIX:
                op = {"//": "/"}.get(e.op, e.op)  # the vectorizer proved both sides non-negative
                return f"({self.operand(e.a)} {op} {self.operand(e.b)})"
            return f"kiln_{e.op}_{vt}({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, Compare):
            return f"({self.operand(e.a)} {e.op} {self.operand(e.b)})"
        if isinstance(e, Logical):
            if e.op == "not":
                return f"(~{self.expr(e.a)})"
            assert e.b is not None
            return f"({self.expr(e.a)} {'&' if e.op == 'and' else '|'} {self.expr(e.b)})"
        if isinstance(e, Select):
            masked = self.maskz_load(e, vt)
            if masked is not None:
                return masked
            t, f = self.expr(e.t), self.expr(e.f)
            if isinstance(e.cond, MakeVector):  # a constant lane mask (the vectorizer's)
                lanes = ", ".join("-1" if x.value else "0" for x in e.cond.elems)  # type: ignore[attr-defined]
                return f"kiln_sel_{vt}((kiln_i32x{w}){{{lanes}}}, {t}, {f})"
            if lanes_of(e.cond.dtype) == 1:
                return f"({self.top(e.cond)} ? {t} : {f})"
            return f"kiln_sel_{vt}({self.expr(e.cond)}, {t}, {f})"
        if isinstance(e, Cast):
            return self.vector_cast(e, w)
        if isinstance(e, Call):
            return self.vector_call(e, vt, w)
        raise CompileError(f"cannot generate C for the vector expression {type(e).__name__}")

    def masked_fma(self, e: Binary, vt: str) -> str | None:
        """``c + select(mask, a, 0) * b`` with a constant lane mask (the vectorizer's: a convolution tile's
        column padding) as a merge-masked FMA, so ``a`` (a load) stays the FMA's memory operand; None for
        any other expression."""
        if e.op != "+" or not vt.startswith("f32"):
            return None
        for c, prod in ((e.a, e.b), (e.b, e.a)):
            if not (isinstance(prod, Binary) and prod.op == "*"):
                continue
            for sel, b in ((prod.a, prod.b), (prod.b, prod.a)):
                if not (isinstance(sel, Select) and isinstance(sel.cond, MakeVector)):
                    continue
                if not (isinstance(sel.f, Broadcast) and _is(sel.f.value, 0)):
                    continue
                args = f"{self.expr(c)}, {self.expr(sel.t)}, {self.expr(b)}, {_lane_bits(sel.cond)}u"
                return f"kiln_fma_mask_{vt}({args})"
        return None

    def maskz_load(self, e: Select, vt: str) -> str | None:
        """A select on a constant lane mask between a contiguous load and zero, as a zero-masking load
        (``kiln_maskz_load``); None for any other select."""
        t, f = e.t, e.f
        if not (isinstance(e.cond, MakeVector) and vt.startswith("f32")):
            return None
        if not (isinstance(t, Load) and t.lanes > 1 and t.buffer not in self.promoted):
            return None
        if not (isinstance(f, Broadcast) and _is(f.value, 0)):
            return None
        flat = self.flat_index(t.buffer, t.indices)
        return f"kiln_maskz_load_{vt}(&{self.buf_name(t.buffer)}[{self.top(flat)}], {_lane_bits(e.cond)}u)"

    def stride2_load(self, e: MakeVector, vt: str) -> str | None:
        """A gather of the elements ``p[0], p[2], .., p[2W-2]`` of one buffer (a stride-2 pooling tap) as two
        contiguous loads deinterleaved: the even lanes of ``p[0..W-1]`` and the odd lanes of
        ``p[W-1..2W-2]`` (the second load starts one element early, so nothing past ``p[2W-2]`` is read);
        None for any other gather."""
        first = e.elems[0]
        if not isinstance(first, Load) or first.lanes != 1 or first.buffer in self.promoted:
            return None
        w = len(e.elems)
        base = self.flat_index(first.buffer, first.indices)
        for k, x in enumerate(e.elems):
            if not (isinstance(x, Load) and x.buffer is first.buffer and x.lanes == 1):
                return None
            if not _is(self.simplified(self.flat_index(x.buffer, x.indices) - base), 2 * k):
                return None
        p = f"&{self.buf_name(first.buffer)}[{self.top(base)}]"
        lanes = [*range(0, w, 2), *range(w + 1, 2 * w, 2)]
        mask = f"(kiln_{vt.replace('f32', 'i32')}){{{', '.join(map(str, lanes))}}}"
        return f"__builtin_shuffle(kiln_load_{vt}({p}), kiln_load_{vt}({p} + {w - 1}), {mask})"

    def vector_cast(self, e: Cast, w: int) -> str:
        src = element_dtype(e.value.dtype)
        dst = element_dtype(e.dtype)
        v = self.expr(e.value)
        if src == "bool" and dst == "float32":
            return f"kiln_sel_f32x{w}({v}, kiln_splat_f32x{w}(1.0f), kiln_splat_f32x{w}(0.0f))"
        if src == "bool" and dst == "int32":
            return f"({v} & 1)"
        if dst == "bool":
            return f"({v} != {'0.0f' if src == 'float32' else '0'})"
        return f"__builtin_convertvector({v}, kiln_{self.vt(e.dtype)})"

    def vector_call(self, e: Call, vt: str, w: int) -> str:
        a = self.expr(e.args[0]) if e.args else ""
        if e.dtype.startswith("float32"):
            if e.name in MATH_FUNCS:
                return f"{self.prelude.use_math(e.name, w)}({a})"
            simple = {
                "sqrt": f"kiln_sqrt_{vt}({a})",
                "rsqrt": f"(1.0f / kiln_sqrt_{vt}({a}))",
                "abs": f"kiln_abs_{vt}({a})",
                "neg": f"(-{a})",
                "recip": f"(1.0f / {a})",
            }
        else:
            simple = {"abs": f"kiln_abs_{vt}({a})", "neg": f"(-{a})"}
        if e.name not in simple:
            raise CompileError(f"the C target has no vector {e.name}() on {e.dtype}")
        return simple[e.name]

    def alloc_lines(self, buf: Buffer, name: str) -> tuple[list[str], list[str]]:
        t = c_type(buf.dtype)
        n = max(buf.numel, 1)
        if buf.nbytes <= STACK_LIMIT:
            return [f"{t} {name}[{n}] __attribute__((aligned(64)));"], []
        size = -(-buf.nbytes // 64) * 64
        if not self.in_parallel:  # a slice of the thread's scratch array (see the module doc)
            offset = self._scratch_used
            self._scratch_used += size
            self.scratch_bytes = max(self.scratch_bytes, self._scratch_used)
            return [f"{t}* {self.restrict} {name} = ({t}*)({SCRATCH} + {offset});"], []
        return (
            [f"{t}* {self.restrict} {name} = ({t}*)aligned_alloc(64, {size});", f"if (!{name}) abort();"],
            [f"free({name});"],
        )


def generate_c(
    funcs: Sequence[PrimFunc],
    target: Any = None,
    launches: Sequence[Any] | None = None,
    parallel: str | None = None,
) -> str:
    """One C translation unit: the pool's client (when a kernel has a parallel loop), the prelude, every
    kernel, ``kiln_set_num_threads`` and, when ``launches`` (objects with ``.kernel`` and ``.args``, buffer
    ids) is given, ``kiln_run``. ``parallel``: ``pool`` or ``openmp`` (default :func:`default_parallel`)."""
    printer = CPrinter(target, parallel or default_parallel())
    seen: dict[str, PrimFunc] = {}
    kernels = []
    for f in funcs:
        if sanitize(f.name) != f.name or f.name in ("kiln_run", "kiln_set_num_threads", SCRATCH):
            raise CompileError(f"kernel name {f.name!r} is not a valid C identifier (or is reserved)")
        if f.name in seen:
            raise CompileError(f"two kernels are named {f.name!r}")
        seen[f.name] = f
        for b in f.params:
            if b.dtype == "bfloat16":
                raise CompileError(
                    f"kernel {f.name}: buffer {b.name} is bfloat16, which the cpu target lacks"
                )
        kernels.append(printer.function(prepare(unswitched(f), target)))
    if printer.parallel == "openmp":
        runtime = (
            f"{OPENMP_MARK}\nextern void omp_set_num_threads(int);\n"
            "void kiln_set_num_threads(int n) { if (n > 0) omp_set_num_threads(n); }\n"
        )
    else:
        runtime = pool.CLIENT_C if printer.uses_pool else pool.SERIAL_C
    parts = [f"/* generated by kiln ({CODEGEN_VERSION}) */", runtime, printer.prelude.render()]
    parts += [printer.scratch_decl(), *kernels]
    if launches is not None:
        parts.append(_entry(seen, launches))
    return "\n".join(parts)


def _entry(funcs: dict[str, PrimFunc], launches: Sequence[Any]) -> str:
    lines = ["void kiln_run(void** buffers) {"]
    for launch in launches:
        f = funcs.get(launch.kernel)
        if f is None:
            raise CompileError(f"launch of unknown kernel {launch.kernel!r}")
        if len(launch.args) != len(f.params):
            raise CompileError(
                f"launch of {f.name} passes {len(launch.args)} buffers, the kernel takes {len(f.params)}"
            )
        lines.append(f"  {f.name}({', '.join(f'buffers[{int(a)}]' for a in launch.args)});")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _has_ramp(body: Stmt) -> bool:
    return any(isinstance(x, Ramp) for s in walk_stmts(body) for e in stmt_exprs(s) for x in walk(e))


def _is(e: Expr, value: int) -> bool:
    return isinstance(e, Const) and e.value == value


def _lane_bits(mask: MakeVector) -> int:
    """A constant lane mask (the vectorizer's ``MakeVector`` of booleans) as a bit mask, lane k -> bit k."""
    return sum(1 << k for k, x in enumerate(mask.elems) if x.value)  # type: ignore[attr-defined]
