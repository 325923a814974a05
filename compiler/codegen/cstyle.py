"""The C-style printer base shared by the C and CUDA targets.

Input is a *lowered* PrimFunc: parameter buffers (inputs first) and a body of For / SeqStmt / IfThenElse /
BufferStore / Allocate / Evaluate / Barrier (no Block). Buffers are row-major; indices are flattened with
the buffer's strides and simplified under the enclosing loops' ranges. The printer keeps loop variable names
(renaming only on clashes), one statement per line, two-space indentation.

Subclasses override the hooks (``param_decl``, ``signature``, ``emit_parallel``, ``emit_thread_loop``,
``emit_vector_loop``, ``alloc_lines``, ``barrier_line``, ``math_call``, ``restrict``) to fit a target.
Local buffers whose accesses all have compile-time-constant flat indices are promoted to scalar or vector
variables (see ``compiler.codegen.promote``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from compiler import dtypes
from compiler.backends.cpu.kiln_math import Prelude
from compiler.codegen.names import NameScope, const_literal
from compiler.codegen.promote import Promotion, analyze, declare_promoted, mentions, promoted_scalar
from compiler.errors import CompileError
from compiler.loopir import simplify as simp
from compiler.loopir.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    Select,
    Var,
    const,
    substitute,
)
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
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


class CStylePrinter:
    """Prints lowered PrimFuncs as C-like source. One instance prints one translation unit."""

    restrict = "restrict"
    indent_unit = "  "

    def __init__(self, target: object | None = None) -> None:
        self.target = target
        self.prelude = Prelude()
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
        self.promoted: dict[Buffer, Promotion] = {}
        self.expand: set[Var] = set()
        self.in_parallel = False

    # ------------------------------------------------------------------ hooks
    def param_decl(self, buf: Buffer, name: str, is_input: bool) -> str:
        qual = "const " if is_input else ""
        return f"{qual}{c_type(buf.dtype)}* {self.restrict} {name}"

    def signature(self, func: PrimFunc, params: list[str]) -> str:
        return f"void {func.name}({', '.join(params)})"

    def emit_parallel(self, s: For) -> None:
        raise NotImplementedError

    def emit_thread_loop(self, s: For) -> None:
        raise CompileError(f"loop '{s.var.name}' is bound to {s.thread}, which this target cannot run")

    def emit_vector_loop(self, s: For) -> None:
        self.emit_scalar_fallback(s)

    def try_vector(self, s: For) -> bool:
        """Whether ``s`` (a vectorized loop, variables bound) would be printed as explicit vector code."""
        return False

    def prepare_body(self, body: Stmt) -> Stmt:
        """A target's rewrite of the body before printing (the input function is never modified)."""
        return body

    def alloc_lines(self, buf: Buffer, name: str) -> tuple[list[str], list[str]]:
        """Lines that declare ``buf`` before its body and release it after."""
        return [f"{c_type(buf.dtype)} {name}[{max(buf.numel, 1)}];"], []

    def barrier_line(self, s: Barrier) -> str | None:
        return None

    def math_call(self, name: str, args: list[str], dtype: str) -> str:
        a = args[0] if args else ""
        if dtype == "float16":
            inner = self.math_call(name, [f"(float)({x})" for x in args], "float32")
            return f"((_Float16){inner})"
        if dtype == "float32":
            if name in ("exp", "log", "tanh", "erf", "sigmoid"):
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

    # --------------------------------------------------------------- function
    def function(self, func: PrimFunc) -> str:
        """The C text of one kernel."""
        self._reset(func)
        body = self.prepare_body(func.body)
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
            self.line(f"{self.store_target(s.buffer, s.indices)} = {self.top(s.value)};")
        elif isinstance(s, IfThenElse):
            self.emit_if(s)
        elif isinstance(s, Allocate):
            self.emit_allocate(s)
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
        elif s.var in self.expand or s.extent == 1:
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
            self.block(f"for (int32_t {v} = 0; {v} < {s.extent}; ++{v})"),
        ):
            self.stmt(s.body)

    def emit_scalar_fallback(self, s: For) -> None:
        """A vectorized loop as plain scalar code (expanded when it touches promoted buffers)."""
        if self.touches_promoted(s.body) and s.extent <= 64:
            self.emit_expanded(s)
        else:
            self.emit_serial(s, pragma="#pragma GCC ivdep")

    def touches_promoted(self, s: Stmt) -> bool:
        if not self.promoted:
            return False
        return any(mentions(s, b) for b in self.promoted)

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
        result = analyze(self, s) if buf.scope == "local" else None
        name = self.names.fresh(buf.name)
        self.buf_names[buf] = name
        if result is not None:
            plan, expand = result
            for text in declare_promoted(plan, buf, self, name):
                self.line(text)
            added = expand - self.expand
            self.promoted[buf] = plan
            self.expand |= added
            try:
                self.stmt(s.body)
            finally:
                del self.promoted[buf]
                self.expand -= added
            return
        before, after = self.alloc_lines(buf, name)
        for text in before:
            self.line(text)
        self.stmt(s.body)
        for text in after:
            self.line(text)

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
        flat: Expr = const(0)
        for idx, stride in zip(indices, buf.strides):
            flat = flat + idx * stride if stride != 1 else flat + idx
        return self.simplified(flat)

    def access(self, buf: Buffer, indices: tuple[Expr, ...]) -> str:
        flat = self.flat_index(buf, indices)
        plan = self.promoted.get(buf)
        if plan is not None:
            return promoted_scalar(plan, buf, flat)  # type: ignore[arg-type]
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
        if isinstance(e, Var):
            if e in self.consts:
                return const_literal(const(self.consts[e], e.dtype))
            if e not in self.var_names:
                raise CompileError(f"variable '{e.name}' is used outside the loop that defines it")
            return self.var_names[e]
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
            return f"(({c_type(e.dtype)}){self.expr(e.value)})"
        if isinstance(e, Call):
            return self.math_call(e.name, [self.expr(a) for a in e.args], e.dtype)
        raise CompileError(f"cannot generate code for expression {type(e).__name__}")

    def nonneg(self, e: Expr) -> bool:
        r = simp.bound(e, self.ranges)
        return r is not None and r[0] >= 0

    def binary(self, e: Binary) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        s = _SHORT.get(e.dtype)
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
