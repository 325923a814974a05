"""The C-style printer base shared by the C and CUDA targets.

Input is a *lowered* PrimFunc: parameter buffers (inputs first) and a body of For / SeqStmt / IfThenElse /
BufferStore / Allocate / Evaluate / Barrier (no Block). Buffers are row-major; indices are flattened with
the buffer's strides and simplified under the enclosing loops' ranges. The printer keeps loop variable names
(renaming only on clashes), one statement per line, two-space indentation. Loop variables are ``int32_t``,
``int64_t`` in a kernel the backend's preparation marked ``attrs["index_dtype"] = "int64"``
(``compiler.loopir.index_width``), where int32 index arithmetic (helpers, casts to int32, int32 lets) is
64-bit too.

Subclasses override the hooks (``param_decl``, ``signature``, ``emit_parallel``, ``emit_thread_loop``,
``emit_vector_loop``, ``emit_store``, ``vector_store``, ``vector_expr``, ``vector_type``, ``extract_lane``,
``alloc_lines``, ``barrier_line``, ``math_call``, ``restrict``) to fit a target. The printer decides nothing:
the backends' loop-IR passes run before it (register promotion, ``compiler.loopir.promote``; the C target's
vectorization; the CUDA target's vector accesses). A ``LetStmt`` is ``const T name = value;`` followed by
its body (the name stays taken until the function ends, as the C declaration lives on to the end of its
block). A local allocation
annotated ``promote`` is declared as scalar or vector variables (``acc_0, acc_1``; element k of a buffer
promoted with W lanes per variable is ``acc_{k / W}[k % W]``), whose accesses have constant indices.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager

from compiler import dtypes
from compiler.codegen.names import NameScope, const_literal
from compiler.errors import CompileError
from compiler.loopir import simplify as simp
from compiler.loopir.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    ExtractLane,
    Load,
    Logical,
    Select,
    Var,
    const,
    element_dtype,
    lanes_of,
    substitute,
)
from compiler.loopir.index_width import is_wide
from compiler.loopir.promote import PROMOTE, promoted_slot
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
    walk_stmts,
)

_SHORT = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "int32": "i32",
    "int64": "i64",
    "int8": "i8",
    "uint8": "u8",
}


def c_type(dtype: str) -> str:
    return dtypes.DTYPES[dtype].c_type


class CStylePrinter(ABC):
    """Prints lowered PrimFuncs as C-like source. One instance prints one translation unit."""

    restrict = "restrict"
    indent_unit = "  "

    def __init__(self, target: object | None = None) -> None:
        self.target = target
        self._reset(None)

    def _reset(self, func: PrimFunc | None) -> None:
        self.func = func
        self.lines: list[str] = []
        self.depth = 1
        self.names = NameScope()
        self.var_names: dict[Var, str] = {}
        self.buf_names: dict[Buffer, str] = {}
        self.consts: dict[Var, int] = {}
        self.ranges: dict[Var, tuple[int, int]] = {}
        self.promoted: dict[Buffer, tuple[int, list[str]]] = {}  # lanes per variable, variable names
        self.in_parallel = False

    # ------------------------------------------------------------------ hooks
    @property
    def index_ctype(self) -> str:
        """The C type of loop variables: ``int64_t`` in a kernel marked for 64-bit indices
        (``compiler.loopir.index_width``), else ``int32_t``."""
        return "int64_t" if is_wide(self.func) else "int32_t"

    def int_short(self, dtype: str) -> str | None:
        """The helper suffix of an integer/float dtype (``i32``), ``i64`` for int32 index arithmetic of a
        64-bit-index kernel."""
        if dtype == "int32" and is_wide(self.func):
            return "i64"
        return _SHORT.get(dtype)

    def param_decl(self, buf: Buffer, name: str, is_input: bool) -> str:
        qual = "const " if is_input else ""
        return f"{qual}{c_type(buf.dtype)}* {self.restrict} {name}"

    def signature(self, func: PrimFunc, params: list[str]) -> str:
        return f"void {func.name}({', '.join(params)})"

    @abstractmethod
    def emit_parallel(self, s: For) -> None:
        """Print a ``parallel`` loop (OpenMP on the CPU; a CompileError where the target has no such loop)."""

    def emit_thread_loop(self, s: For) -> None:
        raise CompileError(f"loop '{s.var.name}' is bound to {s.thread}, which this target cannot run")

    def emit_vector_loop(self, s: For) -> None:
        """A ``vectorized`` loop left by the target's passes: a scalar loop whose iterations are
        independent."""
        self.emit_serial(s, pragma="#pragma GCC ivdep")

    def emit_store(self, s: BufferStore) -> None:
        if lanes_of(s.value.dtype) > 1:
            self.line(f"{self.vector_store(s)};")
        else:
            self.line(f"{self.store_target(s.buffer, s.indices)} = {self.top(s.value)};")

    def vector_store(self, s: BufferStore) -> str:
        raise CompileError(f"store of vector {s.value.dtype} to {s.buffer.name}: this target has no vectors")

    def vector_expr(self, e: Expr) -> str:
        raise CompileError(f"expression of vector type {e.dtype}: this target has no vectors")

    def extract_lane(self, e: ExtractLane) -> str:
        raise CompileError(f"lane {e.lane} of a {e.value.dtype}: this target has no lane extracts")

    def alloc_lines(self, buf: Buffer, name: str) -> tuple[list[str], list[str]]:
        """Lines that declare ``buf`` before its body and release it after."""
        return [f"{c_type(buf.dtype)} {name}[{max(buf.numel, 1)}];"], []

    def barrier_line(self, s: Barrier) -> str | None:
        return None

    @abstractmethod
    def math_call(self, name: str, args: list[str], dtype: str) -> str:
        """The target's spelling of intrinsic ``name`` on ``dtype`` operands (each backend's printer)."""

    # --------------------------------------------------------------- function
    def function(self, func: PrimFunc) -> str:
        """The C text of one kernel."""
        self._reset(func)
        body = func.body
        params = []
        for i, b in enumerate(func.params):
            name = self.names.fresh(b.name)
            self.buf_names[b] = name
            params.append(self.param_decl(b, name, i < func.num_inputs))
        self.stmt(body)
        head = self.signature(func, params)
        return "\n".join([head + " {", *self.lines, "}"]) + "\n"

    # ------------------------------------------------------------- statements
    def line(self, text: str) -> None:
        self.lines.append(self.indent_unit * self.depth + text)

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        self.line(head + " {")
        self.depth += 1
        yield
        self.depth -= 1
        self.line("}")

    @contextmanager
    def loop_var(self, var: Var, extent: int) -> Iterator[str]:
        old = self.var_names.get(var), self.ranges.get(var)
        name = self.names.fresh(var.name)
        self.var_names[var] = name
        self.ranges[var] = (0, max(extent - 1, 0))
        try:
            yield name
        finally:
            self.names.release(name)
            for table, prev in ((self.var_names, old[0]), (self.ranges, old[1])):
                if prev is None:
                    del table[var]
                else:
                    table[var] = prev  # type: ignore[assignment]

    @contextmanager
    def bound_const(self, var: Var, value: int) -> Iterator[None]:
        old = self.consts.get(var), self.ranges.get(var)
        self.consts[var] = value
        self.ranges[var] = (value, value)
        try:
            yield
        finally:
            for table, prev in ((self.consts, old[0]), (self.ranges, old[1])):
                if prev is None:
                    del table[var]
                else:
                    table[var] = prev  # type: ignore[assignment]

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, SeqStmt):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, For):
            self.emit_for(s)
        elif isinstance(s, BufferStore):
            self.emit_store(s)
        elif isinstance(s, IfThenElse):
            self.emit_if(s)
        elif isinstance(s, Allocate):
            self.emit_allocate(s)
        elif isinstance(s, LetStmt):
            self.emit_let(s)
        elif isinstance(s, Evaluate):
            self.line(f"(void){self.expr(s.expr)};")
        elif isinstance(s, Barrier):
            text = self.barrier_line(s)
            if text:
                self.line(text)
        elif isinstance(s, Block):
            raise CompileError(
                f"block '{s.name}' is still in the IR: codegen needs lowered IR (lower it first)"
            )
        else:
            raise CompileError(f"cannot generate code for statement {type(s).__name__}")

    def emit_for(self, s: For) -> None:
        if s.extent <= 0:
            return
        if s.kind == "thread":
            self.emit_thread_loop(s)
        elif s.extent == 1:
            self.emit_expanded(s)
        elif s.kind == "parallel" and not self.in_parallel:
            self.emit_parallel(s)
        elif s.kind == "vectorized":
            self.emit_vector_loop(s)
        elif s.kind == "unrolled":
            n = s.extent
            self.emit_serial(s, pragma=f"#pragma GCC unroll {n}" if n <= 64 else None)
        elif s.kind in ("serial", "parallel"):
            self.emit_serial(s)
        else:
            raise CompileError(f"loop '{s.var.name}' has unknown kind {s.kind!r}")

    def emit_serial(self, s: For, pragma: str | None = None) -> None:
        if pragma:
            self.line(pragma)
        with (
            self.loop_var(s.var, s.extent) as v,
            self.block(f"for ({self.index_ctype} {v} = 0; {v} < {s.extent}; ++{v})"),
        ):
            self.stmt(s.body)

    def emit_expanded(self, s: For) -> None:
        """The loop body once per iteration with the loop variable a constant (full unrolling)."""
        scoped = any(isinstance(x, Allocate) for x in walk_stmts(s.body))
        for k in range(s.extent):
            with self.bound_const(s.var, k):
                if scoped:
                    with self.block(f"/* {s.var.name} = {k} */"):
                        self.stmt(s.body)
                else:
                    self.stmt(s.body)

    def emit_if(self, s: IfThenElse) -> None:
        cond = self.simplified(s.cond)
        if isinstance(cond, Const):
            branch = s.then if cond.value else s.else_
            if branch is not None:
                self.stmt(branch)
            return
        with self.block(f"if ({self.top(cond)})"):
            self.stmt(s.then)
        if s.else_ is not None:
            with self.block("else"):
                self.stmt(s.else_)

    def emit_allocate(self, s: Allocate) -> None:
        buf = s.buffer
        name = self.names.fresh(buf.name)
        self.buf_names[buf] = name
        width = s.annotations.get(PROMOTE)
        if width is not None:
            n = -(-buf.numel // width)
            names = [self.names.fresh(f"{name}_{k}") for k in range(n)]
            ctype = c_type(buf.dtype) if width == 1 else self.vector_type(buf.dtype, width)
            for i in range(0, n, 8):
                self.line(f"{ctype} {', '.join(names[i : i + 8])};")
            self.promoted[buf] = (width, names)
            try:
                self.stmt(s.body)
            finally:
                del self.promoted[buf]
            return
        before, after = self.alloc_lines(buf, name)
        for text in before:
            self.line(text)
        self.stmt(s.body)
        for text in after:
            self.line(text)

    def emit_let(self, s: LetStmt) -> None:
        lanes = lanes_of(s.var.dtype)
        t = c_type(s.var.dtype) if lanes == 1 else self.vector_type(element_dtype(s.var.dtype), lanes)
        if s.var.dtype == "int32" and is_wide(self.func):
            t = self.index_ctype
        name = self.names.fresh(s.var.name)
        self.line(f"const {t} {name} = {self.top(s.value)};")
        self.var_names[s.var] = name
        try:
            self.stmt(s.body)
        finally:
            del self.var_names[s.var]

    # ------------------------------------------------------------ expressions
    def simplified(self, e: Expr) -> Expr:
        if self.consts:
            e = substitute(e, {v: const(c, v.dtype) for v, c in self.consts.items()})
        return simp.simplify(e, self.ranges)

    def flat_index(self, buf: Buffer, indices: tuple[Expr, ...]) -> Expr:
        """The row-major flat index of an access, constants substituted and simplified."""
        if len(indices) != len(buf.shape):
            raise CompileError(
                f"access to {buf.name} has {len(indices)} indices, the buffer has rank {len(buf.shape)}"
            )
        return self.simplified(simp.flat_expr(buf, indices))

    def vector_type(self, dtype: str, lanes: int) -> str:
        raise CompileError(f"vectors of {lanes} x {dtype}: this target has no vectors")

    def promoted_var(self, buf: Buffer, flat: Expr, lanes: int = 1) -> str:
        """The variable (``lanes`` > 1: a whole vector variable) holding element ``flat`` of a promoted
        buffer."""
        width, names = self.promoted[buf]
        slot, lane = promoted_slot(buf, width, flat)
        if lanes > 1:
            if lanes != width or lane:
                raise CompileError(f"internal: {lanes} lanes of {buf.name} at {flat} are not one variable")
            return names[slot]
        return names[slot] if width == 1 else f"{names[slot]}[{lane}]"

    def access(self, buf: Buffer, indices: tuple[Expr, ...]) -> str:
        flat = self.flat_index(buf, indices)
        if buf in self.promoted:
            return self.promoted_var(buf, flat)
        return f"{self.buf_name(buf)}[{self.top(flat)}]"

    def store_target(self, buf: Buffer, indices: tuple[Expr, ...]) -> str:
        return self.access(buf, indices)

    def buf_name(self, buf: Buffer) -> str:
        try:
            return self.buf_names[buf]
        except KeyError:
            raise CompileError(
                f"buffer '{buf.name}' is used in kernel '{self.func.name if self.func else '?'}' but is "
                "neither a parameter nor allocated"
            ) from None

    def top(self, e: Expr) -> str:
        """An expression without redundant outer parentheses."""
        text = self.expr(e)
        if text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
            return text[1:-1]
        return text

    def expr(self, e: Expr) -> str:
        if lanes_of(e.dtype) > 1:
            return self.vector_expr(e)
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Const):
            return const_literal(e)
        if isinstance(e, Load):
            return self.access(e.buffer, e.indices)
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Compare):
            return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"
        if isinstance(e, Logical):
            if e.op == "not":
                return f"(!{self.expr(e.a)})"
            assert e.b is not None
            return f"({self.expr(e.a)} {'&&' if e.op == 'and' else '||'} {self.expr(e.b)})"
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.t)} : {self.expr(e.f)})"
        if isinstance(e, Cast):
            if e.dtype == "bool":
                return f"({self.expr(e.value)} != 0)"
            if e.dtype == "int32" and is_wide(self.func):  # e.g. a gather's ids, scaled by a row stride
                return f"(({self.index_ctype}){self.expr(e.value)})"
            return f"(({c_type(e.dtype)}){self.expr(e.value)})"
        if isinstance(e, Call):
            return self.math_call(e.name, [self.expr(a) for a in e.args], e.dtype)
        if isinstance(e, ExtractLane):
            return self.extract_lane(e)
        raise CompileError(f"cannot generate code for expression {type(e).__name__}")

    def var(self, e: Var) -> str:
        """The C name of a loop or let variable (a loop variable bound to a constant: the constant)."""
        if e in self.consts:
            return const_literal(const(self.consts[e], e.dtype))
        if e not in self.var_names:
            raise CompileError(f"variable '{e.name}' is used outside the statement that defines it")
        return self.var_names[e]

    def nonneg(self, e: Expr) -> bool:
        r = simp.bound(e, self.ranges)
        return r is not None and r[0] >= 0

    def binary(self, e: Binary) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        s = self.int_short(e.dtype)
        if e.op in ("+", "-", "*", "/"):
            return f"({a} {e.op} {b})"
        if e.op in ("min", "max"):
            if s is None:
                raise CompileError(f"{e.op} on {e.dtype} is not supported")
            return f"kiln_{e.op}_{s}({a}, {b})"
        if e.op in ("//", "%"):
            if dtypes.is_int(e.dtype) and self.nonneg(e.a) and self.nonneg(e.b):
                return f"({a} {'/' if e.op == '//' else '%'} {b})"
            if s is None or s == "f16":
                raise CompileError(f"floor {e.op} on {e.dtype} is not supported")
            return f"kiln_{'floordiv' if e.op == '//' else 'floormod'}_{s}({a}, {b})"
        if e.op == "pow":
            if e.dtype == "float64":
                return f"__builtin_pow({a}, {b})"
            if e.dtype == "float32":
                return f"__builtin_powf({a}, {b})"
            return f"(({c_type(e.dtype)})__builtin_pow((double){a}, (double){b}))"
        raise CompileError(f"unknown binary operator {e.op!r}")


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0
