"""The CUDA target: lowered GPU-scheduled PrimFuncs -> one CUDA C++ translation unit (NVRTC or nvcc).

``generate_cuda(funcs, target)`` prints a small prelude (fixed-width integer types, floor division,
warp all-reduce helpers: only what is used) and every kernel as
``extern "C" __global__ void __launch_bounds__(THREADS) NAME(const float* __restrict__ x, ...)`` (with
``func.attrs["min_blocks_per_sm"]`` = B > 1: ``__launch_bounds__(THREADS, B)``).
A function whose body has several top-level loop nests becomes several kernels ``NAME_k0, NAME_k1 ...``
launched in order (:func:`kernel_names`).

* Loops bound to ``blockIdx.*`` / ``threadIdx.*``: the loop variable *is* the index
  (``const int32_t tx = (int32_t)threadIdx.x;``); a thread loop whose extent is below the block size is
  guarded (``if (tx < 48)``), one of extent 1 runs on thread 0 only. ``blockIdx`` loops must enclose the
  kernel. A kernel some index of which can pass 2^31 - 1 (``compiler.loopir.index_width``, decided per
  kernel after :func:`prepare`) reads them as ``int64_t`` instead, so every offset built on them is
  64-bit; a grid over the hardware limit is a CompileError naming the kernel and its largest buffer.
* ``shared`` allocations are ``__shared__ __align__(16)`` arrays; past 48 KiB per block they are carved
  from dynamic shared memory (``extern __shared__``), recorded as ``dynamic_shared_bytes``. ``local``
  allocations are per-thread arrays (registers once their indices are constants). ``global`` scratch
  inside a kernel is a CompileError.
* ``Barrier`` -> ``__syncthreads()``; ``warp_reduce_sum/max/min(v, w)`` -> an xor-shuffle butterfly over
  aligned groups of ``w`` lanes (``__shfl_xor_sync`` with the group's mask).
* Before printing, :func:`prepare` runs the target's loop-IR passes on each kernel
  (``compiler.backends.cuda.vector_access``, ``compiler.loopir.promote``): ``vectorized`` loops (extent up
  to 16) are expanded into straight-line code (a body guarded by a condition linear in the lane runs a
  vector path when the first and last lanes pass, else a scalar one), local buffers are promoted to
  registers, and loads and stores of float32 global/shared memory at 4 (or 2) consecutive indices of
  straight-line code whose base is provably a multiple of 4 (2) become vector accesses. The printer writes
  those as ``const float4 v = *reinterpret_cast<const float4*>(&x[i]);`` (lanes ``v.x .. v.w``) and
  ``*reinterpret_cast<float4*>(&y[i]) = make_float4(st, st_1, st_2, st_3);``.
* Math keeps the op's semantics: ``expf logf sqrtf rsqrtf tanhf erff`` (never ``__expf`` & co. unless
  ``fast_math`` is asked for, or the IR says ``fast_exp``/``fast_log``: a sketch's fast-math knob);
  min/max are ``fminf``/``fmaxf`` (a NaN operand yields the other one).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from compiler import dtypes
from compiler.backends.cuda import codegen_tc
from compiler.backends.cuda import lower as lower_cuda
from compiler.backends.cuda.prelude import NARROW, Narrow, render_prelude
from compiler.backends.cuda.vector_access import expand_vector_loops, uses_var, vectorize_accesses
from compiler.codegen.cstyle import CStylePrinter, c_type
from compiler.codegen.names import sanitize
from compiler.errors import CompileError
from compiler.loopir.expr import (
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    ExtractLane,
    Load,
    MakeVector,
    Var,
    element_dtype,
    lanes_of,
)
from compiler.loopir.index_width import index_overflow, is_wide, mark_index_width
from compiler.loopir.promote import PROMOTE, promote_locals
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Buffer,
    BufferStore,
    For,
    Intrinsic,
    LetStmt,
    PrimFunc,
    Stmt,
    walk_stmts,
)

CODEGEN_VERSION = "cuda-3"  # bump when generated code changes meaning (part of the build cache key)
STATIC_SHARED_LIMIT = 48 * 1024
LANES = "xyzw"


def prepare(kernel: Stmt) -> Stmt:
    """The CUDA target's loop-IR passes on one kernel before printing: vectorized loops expanded into
    straight-line code (``expand_vector_loops``), local buffers promoted to registers
    (``compiler.loopir.promote``), aligned consecutive float32 accesses of straight-line code made
    ``float4``/``float2`` accesses (``vectorize_accesses``)."""
    return vectorize_accesses(promote_locals(expand_vector_loops(kernel)))


def kernel_names(func: PrimFunc) -> list[str]:
    """The ``__global__`` names of ``func``'s kernels, in launch order."""
    n = len(lower_cuda.kernel_parts(func.body))
    return [func.name] if n == 1 else [f"{func.name}_k{i}" for i in range(n)]


def kernel_launches(func: PrimFunc) -> list[dict[str, Any]]:
    """Per kernel of ``func``: name, grid, block, shared_bytes (static + dynamic) and dynamic_shared_bytes."""
    out = []
    for name, part in zip(kernel_names(func), lower_cuda.kernel_parts(func.body)):
        info = lower_cuda.launch_info(part)
        dyn = info["shared_bytes"] if info["shared_bytes"] > STATIC_SHARED_LIMIT else 0
        out.append({"name": name, **info, "dynamic_shared_bytes": dyn})
    return out


class CudaPrinter(CStylePrinter):
    """CUDA C++ for NVRTC/nvcc (see the module docstring)."""

    restrict = "__restrict__"

    def __init__(self, target: Any = None, fast_math: bool = False) -> None:
        super().__init__(target)
        self.fast_math = fast_math
        self.helpers: set[str] = set()
        self.arch = getattr(target, "arch", "sm_90") if target is not None else "sm_90"

    def _reset(self, func: PrimFunc | None) -> None:
        super()._reset(func)
        self.dims: dict[str, int] = {}
        self.smem_offset = 0
        self.dynamic = False
        self.threads = 1

    # ---------------------------------------------------------------- kernels
    def kernels(self, func: PrimFunc) -> list[tuple[str, str, dict[str, Any]]]:
        """(name, CUDA text, launch) of each kernel of a lowered function."""
        if sanitize(func.name) != func.name:
            raise CompileError(f"kernel name {func.name!r} is not a valid C identifier")
        out = []
        for launch, part in zip(kernel_launches(func), lower_cuda.kernel_parts(func.body)):
            raw = PrimFunc(launch["name"], func.params, part, func.num_inputs, dict(func.attrs))
            sub = PrimFunc(launch["name"], func.params, prepare(part), func.num_inputs, dict(func.attrs))
            sub = mark_index_width(sub, index_overflow(raw) is not None or index_overflow(sub) is not None)
            out.append((launch["name"], self.kernel(sub, launch), launch))
        return out

    def kernel(self, func: PrimFunc, launch: dict[str, Any]) -> str:
        self._check_structure(func)
        for axis, n, limit in zip("xyz", launch["grid"], (2**31 - 1, 65535, 65535)):
            if n > limit:
                big = max(_buffers(func), key=lambda b: b.numel, default=None)
                what = f" (buffer {big.name}: {big.numel} elements)" if big is not None else ""
                raise CompileError(
                    f"kernel {func.name}: grid {axis} of {n} blocks exceeds the limit {limit}{what}; "
                    "give each block more elements (a larger threadIdx extent or an inner loop)"
                )
        if math.prod(launch["block"]) > 1024:
            raise CompileError(
                f"kernel {func.name}: {math.prod(launch['block'])} threads per block exceed 1024"
            )
        self.pending_launch = launch
        text = self.function(func)
        head = (
            f"// {func.name}: grid ({', '.join(map(str, launch['grid']))}), block "
            f"({', '.join(map(str, launch['block']))}), shared {launch['shared_bytes']} bytes"
            + (" (dynamic)" if launch["dynamic_shared_bytes"] else "")
        )
        return head + "\n" + text

    def _check_structure(self, func: PrimFunc) -> None:
        for s in walk_stmts(func.body):
            if isinstance(s, For) and s.kind == "parallel":
                raise CompileError(
                    f"kernel {func.name}: loop {s.var.name} is 'parallel' (OpenMP); "
                    "bind it to blockIdx/threadIdx"
                )
            if isinstance(s, Allocate) and s.buffer.scope == "global":
                raise CompileError(
                    f"kernel {func.name}: buffer {s.buffer.name} is a global scratch allocation inside a "
                    "kernel; "
                    "give it local or shared scope"
                )
        spine = 0
        s: Stmt = func.body
        while True:
            if isinstance(s, Allocate):
                s = s.body
            elif isinstance(s, For) and s.kind == "thread" and (s.thread or "").startswith("blockIdx"):
                spine += 1
                s = s.body
            else:
                break
        total = sum(
            1 for x in walk_stmts(func.body) if isinstance(x, For) and (x.thread or "").startswith("blockIdx")
        )
        if total != spine:
            raise CompileError(
                f"kernel {func.name}: loops bound to blockIdx must enclose the whole kernel "
                "(one chain at the top)"
            )

    def signature(self, func: PrimFunc, params: list[str]) -> str:
        launch = getattr(self, "pending_launch", None) or lower_cuda.launch_info(func.body)
        bounds = str(math.prod(launch["block"]))
        if func.attrs.get("min_blocks_per_sm", 1) > 1:  # occupancy asked of ptxas: caps registers per thread
            bounds += f", {int(func.attrs['min_blocks_per_sm'])}"
        return f'extern "C" __global__ void __launch_bounds__({bounds}) {func.name}({", ".join(params)})'

    def function(self, func: PrimFunc) -> str:
        launch = getattr(self, "pending_launch", None) or lower_cuda.launch_info(func.body)
        self._reset(func)
        self.dims = lower_cuda.thread_dims(func.body)
        self.dynamic = launch["shared_bytes"] > STATIC_SHARED_LIMIT
        body = func.body
        params = []
        for i, b in enumerate(func.params):
            name = self.names.fresh(b.name)
            self.buf_names[b] = name
            params.append(self.param_decl(b, name, i < func.num_inputs))
        if self.dynamic:
            self.line("extern __shared__ __align__(16) unsigned char kiln_smem[];")
        self.stmt(body)
        return "\n".join([self.signature(func, params) + " {", *self.lines, "}"]) + "\n"

    # ------------------------------------------------------- float16 / bfloat16
    # The 16-bit floats live in memory as their bits (``kiln_half`` binary16, ``kiln_bf16`` bfloat16) and
    # in registers as a float holding a representable value: loads widen (``kiln_h2f`` / ``kiln_b2f``),
    # stores narrow (``kiln_f2h`` / ``kiln_f2b``), and every operation is computed in float and rounded
    # (``kiln_h`` / ``kiln_b``), which gives the correctly rounded result for + - * / sqrt (float has
    # 24 >= 2 * p + 2 bits for p = 11 and p = 8) and the IR's semantics.
    def _half(self, buf: Buffer) -> bool:
        return buf.dtype in NARROW and buf.scope != "local"

    def _narrow(self, dtype: str) -> Narrow:
        n = NARROW[dtype]
        self.helpers.add(n.helper)
        return n

    def param_decl(self, buf: Buffer, name: str, is_input: bool) -> str:
        if buf.dtype in NARROW:
            return f"{'const ' if is_input else ''}{self._narrow(buf.dtype).bits}* {self.restrict} {name}"
        return super().param_decl(buf, name, is_input)

    def emit_store(self, s: BufferStore) -> None:
        if s.buffer.dtype in NARROW and lanes_of(s.value.dtype) == 1 and s.buffer not in self.promoted:
            value = self.top(s.value)
            if self._half(s.buffer):
                value = f"{self._narrow(s.buffer.dtype).narrow}({value})"
            self.line(f"{self.store_target(s.buffer, s.indices)} = {value};")
            return
        super().emit_store(s)

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Intrinsic):  # tensor-core operations: inline PTX (codegen_tc)
            codegen_tc.emit_intrinsic(self, s)
            return
        super().stmt(s)

    def emit_allocate(self, s: Allocate) -> None:
        if codegen_tc.is_fragment(s.buffer, s.body):  # mma/ldmatrix fragments: 32-bit registers
            name = self.names.fresh(s.buffer.name)
            self.buf_names[s.buffer] = name
            self.line(codegen_tc.fragment_decl(s.buffer, name))
            self.stmt(s.body)
            return
        if s.buffer.dtype in NARROW and s.annotations.get(PROMOTE) == 1:  # registers: float variables
            buf = s.buffer
            name = self.names.fresh(buf.name)
            self.buf_names[buf] = name
            names = [self.names.fresh(f"{name}_{k}") for k in range(buf.numel)]
            for i in range(0, len(names), 8):
                self.line(f"float {', '.join(names[i : i + 8])};")
            self.promoted[buf] = (1, names)
            try:
                self.stmt(s.body)
            finally:
                del self.promoted[buf]
            return
        super().emit_allocate(s)

    def emit_let(self, s: LetStmt) -> None:
        if s.var.dtype not in NARROW:
            super().emit_let(s)
            return
        name = self.names.fresh(s.var.name)
        self.line(f"const float {name} = {self.top(s.value)};")
        self.var_names[s.var] = name
        try:
            self.stmt(s.body)
        finally:
            del self.var_names[s.var]

    def _half_expr(self, e: Expr) -> str | None:
        """The float text of a float16/bfloat16 expression (None: not one, or nothing special)."""
        if isinstance(e, Const):
            v = float(dtypes.to_numpy(e.dtype).type(e.value))
            return self.expr(Const(v, "float32"))
        if isinstance(e, Load) and e.buffer not in self.promoted:
            text = self.access(e.buffer, e.indices)
            return f"{self._narrow(e.dtype).widen}({text})" if self._half(e.buffer) else text
        if isinstance(e, Cast):
            return f"{self._narrow(e.dtype).round}((float)({self.top(e.value)}))"
        if isinstance(e, Binary):
            if e.op in ("min", "max"):  # the result is an operand: already representable
                return f"f{e.op}f({self.top(e.a)}, {self.top(e.b)})"
            r = self._narrow(e.dtype).round
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in ("+", "-", "*", "/"):
                return f"{r}({a} {e.op} {b})"
            if e.op == "pow":
                return f"{r}(powf({a}, {b}))"
            if e.op == "//":
                return f"{r}(floorf({a} / {b}))"
            if e.op == "%":
                return f"{r}({a} - {b} * floorf({a} / {b}))"
            raise CompileError(f"{e.op} on {e.dtype} is not supported by the CUDA target")
        if isinstance(e, Call) and not e.name.startswith("warp_reduce_"):
            r = self._narrow(e.dtype).round
            return f"{r}({self.math_call(e.name, [self.top(a) for a in e.args], 'float32')})"
        return None

    # ------------------------------------------------------------ statements
    def emit_thread_loop(self, s: For) -> None:
        tag = s.thread or ""
        used = uses_var(s.body, s.var)
        if tag.startswith("blockIdx"):
            with self.loop_var(s.var, s.extent) as v:
                if used:
                    self.line(f"const {self.index_ctype} {v} = ({self.index_ctype}){tag};")
                self.stmt(s.body)
            return
        full = self.dims.get(tag, s.extent)
        if s.extent == 1 and full > 1:
            with self.block(f"if ({tag} == 0)"), self.bound_const(s.var, 0):
                self.stmt(s.body)
            return
        with self.block(""), self.loop_var(s.var, s.extent) as v:
            if used:
                self.line(f"const {self.index_ctype} {v} = ({self.index_ctype}){tag};")
            if s.extent < full:
                with self.block(f"if ({v if used else tag} < {s.extent})"):
                    self.stmt(s.body)
            else:
                self.stmt(s.body)

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        self.line((head + " {") if head else "{")
        self.depth += 1
        yield
        self.depth -= 1
        self.line("}")

    def emit_for(self, s: For) -> None:
        if s.kind == "unrolled" and s.extent > 1:
            self.emit_serial(s, pragma="#pragma unroll")
            return
        if s.kind == "vectorized" and s.extent > 1:
            self.emit_serial(s, pragma="#pragma unroll")
            return
        super().emit_for(s)

    def emit_parallel(self, s: For) -> None:
        raise CompileError(f"loop {s.var.name} is 'parallel' (OpenMP); bind it to blockIdx/threadIdx")

    def barrier_line(self, s: Barrier) -> str | None:
        return "__syncthreads();"

    def alloc_lines(self, buf: Buffer, name: str) -> tuple[list[str], list[str]]:
        t = c_type(buf.dtype)
        if buf.dtype in NARROW:  # 16-bit float bits in shared memory, floats in registers
            t = self._narrow(buf.dtype).bits if buf.scope == "shared" else "float"
        n = max(buf.numel, 1)
        if buf.scope == "shared":
            if self.dynamic:
                off = self.smem_offset
                self.smem_offset += -(-buf.nbytes // 16) * 16
                return [f"{t}* {self.restrict} {name} = reinterpret_cast<{t}*>(kiln_smem + {off});"], []
            return [f"__shared__ __align__(16) {t} {name}[{n}];"], []
        if buf.scope == "local":
            return [f"{t} {name}[{n}];"], []
        raise CompileError(f"buffer {buf.name}: global scratch cannot be allocated inside a kernel")

    # ---------------------------------------------------------------- vectors
    def vector_type(self, dtype: str, lanes: int) -> str:
        if dtype in NARROW:
            return _narrow_vector_type(dtype, lanes)
        if dtype != "float32" or lanes not in (2, 4):
            raise CompileError(f"the CUDA target has no vectors of {lanes} x {dtype} (float2/float4 only)")
        return f"float{lanes}"

    def vector_expr(self, e: Expr) -> str:
        """A vector variable, a vector load (``*reinterpret_cast<const float4*>(&buf[i])``) or
        ``make_float4(...)``: the nodes ``vectorize_accesses`` makes."""
        w = lanes_of(e.dtype)
        vt = self.vector_type(element_dtype(e.dtype), w)
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Load) and e.buffer.scope != "local":
            flat = self.flat_index(e.buffer, e.indices)
            return f"*reinterpret_cast<const {vt}*>(&{self.buf_name(e.buffer)}[{self.top(flat)}])"
        if isinstance(e, MakeVector) and element_dtype(e.dtype) in NARROW:
            return self._narrow_pack(e)
        if isinstance(e, MakeVector):
            return f"make_{vt}({', '.join(self.top(x) for x in e.elems)})"
        raise CompileError(f"the CUDA target cannot print the vector expression {e!r}")

    def vector_store(self, s: BufferStore) -> str:
        vt = self.vector_type(element_dtype(s.value.dtype), lanes_of(s.value.dtype))
        if s.buffer.scope == "local":
            raise CompileError(f"vector store to the local buffer {s.buffer.name}: the CUDA target has none")
        target = f"&{self.buf_name(s.buffer)}[{self.top(self.flat_index(s.buffer, s.indices))}]"
        return f"*reinterpret_cast<{vt}*>({target}) = {self.expr(s.value)}"

    # 16-bit float vectors: 2, 4 or 8 lanes are 4, 8 or 16 bytes of bits (unsigned, uint2, uint4), two
    # lanes per 32-bit word (lane 2k in its low half); lanes widen to float and floats narrow and pack.
    def _narrow_pack(self, e: MakeVector) -> str:
        n = self._narrow(element_dtype(e.dtype))
        self.helpers.add("pack16")
        bits = [f"{n.narrow}({self.top(x)})" for x in e.elems]
        words = [f"kiln_pack16({bits[k]}, {bits[k + 1]})" for k in range(0, len(bits), 2)]
        if len(words) == 1:
            return words[0]
        return f"make_{self.vector_type(element_dtype(e.dtype), len(bits))}({', '.join(words)})"

    def _narrow_lane(self, e: ExtractLane) -> str:
        n = self._narrow(element_dtype(e.value.dtype))
        word = self.expr(e.value)
        if lanes_of(e.value.dtype) > 2:
            word = f"{word}.{LANES[e.lane // 2]}"
        return f"{n.widen}(({n.bits})({word} >> 16))" if e.lane % 2 else f"{n.widen}(({n.bits}){word})"

    def extract_lane(self, e: ExtractLane) -> str:
        if element_dtype(e.value.dtype) in NARROW:
            return self._narrow_lane(e)
        if not 0 <= e.lane < 4:
            raise CompileError(f"lane {e.lane} of a {e.value.dtype}: CUDA vectors have lanes x, y, z, w")
        return f"{self.expr(e.value)}.{LANES[e.lane]}"

    # ------------------------------------------------------------ expressions
    def expr(self, e: Expr) -> str:
        if e.dtype in NARROW:
            half = self._half_expr(e)
            if half is not None:
                return half
        if isinstance(e, Const) and dtypes.is_float(e.dtype):
            v = float(e.value)
            if math.isnan(v) or math.isinf(v):
                if e.dtype == "float64":
                    bits = "0x7ff8000000000000LL" if math.isnan(v) else "0x7ff0000000000000LL"
                    text = f"__longlong_as_double({bits})"
                else:
                    text = f"__int_as_float({'0x7fc00000' if math.isnan(v) else '0x7f800000'})"
                return f"(-{text})" if v < 0 else text
        if isinstance(e, Const) and e.dtype == "int64":
            return f"{int(e.value)}LL" if e.value >= 0 else f"({int(e.value)}LL)"
        if isinstance(e, Call) and e.name.startswith("warp_reduce_"):
            return self._warp(e)
        if isinstance(e, Call) and e.name == "xor":
            return f"({self.expr(e.args[0])} ^ {self.expr(e.args[1])})"
        if isinstance(e, Call) and e.name == "tf32_round":
            self.helpers.add("tf32")
            return f"kiln_tf32({self.top(e.args[0])})"
        return super().expr(e)

    def _warp(self, e: Call) -> str:
        comb = e.name[len("warp_reduce_") :]
        s = {"float32": "f32", "float64": "f64", "int32": "i32", "float16": "f16", "bfloat16": "bf16"}.get(
            e.dtype
        )
        if comb not in ("sum", "max", "min") or s is None or len(e.args) != 2:
            raise CompileError(f"intrinsic {e.name} on {e.dtype} is not supported by the CUDA target")
        width = e.args[1]
        if not isinstance(width, Const) or int(width.value) not in (1, 2, 4, 8, 16, 32):
            raise CompileError(f"{e.name}: the width must be a constant power of two up to 32")
        self.helpers.add(f"warp_{comb}_{s}")
        if e.dtype in NARROW:
            self._narrow(e.dtype)
        return f"kiln_warp_reduce_{comb}_{s}({self.top(e.args[0])}, {int(width.value)})"

    def binary(self, e: Binary) -> str:
        if e.op in ("min", "max"):
            a, b = self.top(e.a), self.top(e.b)
            if e.dtype == "float32":
                return f"f{e.op}f({a}, {b})"
            if e.dtype == "float64":
                return f"f{e.op}({a}, {b})"
            if dtypes.is_int(e.dtype):
                if is_wide(self.func) and e.dtype in ("int32", "int64"):  # one overload: long long
                    return f"{e.op}((long long)({a}), (long long)({b}))"
                return f"{e.op}({a}, {b})"
            raise CompileError(f"{e.op} on {e.dtype} is not supported by the CUDA target")
        if e.op in ("//", "%") and dtypes.is_int(e.dtype) and not (self.nonneg(e.a) and self.nonneg(e.b)):
            s = self.int_short(e.dtype) if e.dtype in ("int32", "int64") else None
            if s is None:
                raise CompileError(f"floor {e.op} on {e.dtype} is not supported by the CUDA target")
            name = "floordiv" if e.op == "//" else "floormod"
            self.helpers.add(f"{name}_{s}")
            return f"kiln_{name}_{s}({self.top(e.a)}, {self.top(e.b)})"
        if e.op in ("//", "%") and dtypes.is_float(e.dtype):
            a, b = self.expr(e.a), self.expr(e.b)
            fl = "floorf" if e.dtype == "float32" else "floor"
            q = f"{fl}({a} / {b})"
            return q if e.op == "//" else f"({a} - {b} * {q})"
        if e.op == "pow":
            a, b = self.top(e.a), self.top(e.b)
            if e.dtype == "float32":
                return f"powf({a}, {b})"
            if e.dtype == "float64":
                return f"pow({a}, {b})"
            return f"(({c_type(e.dtype)})pow((double)({a}), (double)({b})))"
        return super().binary(e)

    def math_call(self, name: str, args: list[str], dtype: str) -> str:
        a = args[0] if args else ""
        if dtype == "float32":
            fast = self.fast_math
            table = {
                "exp": f"__expf({a})" if fast else f"expf({a})",
                "log": f"__logf({a})" if fast else f"logf({a})",
                "sqrt": f"sqrtf({a})",
                "rsqrt": f"rsqrtf({a})",
                "tanh": f"tanhf({a})",
                "erf": f"erff({a})",
                "sigmoid": f"(1.0f / (1.0f + {'__expf' if fast else 'expf'}(-({a}))))",
                "abs": f"fabsf({a})",
                "neg": f"(-{a})",
                "recip": f"__frcp_rn({a})" if fast else f"(1.0f / {a})",
                "fast_exp": f"__expf({a})",
                "fast_log": f"__logf({a})",
            }
        elif dtype == "float64":
            table = {
                "exp": f"exp({a})",
                "log": f"log({a})",
                "sqrt": f"sqrt({a})",
                "rsqrt": f"rsqrt({a})",
                "tanh": f"tanh({a})",
                "erf": f"erf({a})",
                "sigmoid": f"(1.0 / (1.0 + exp(-({a}))))",
                "abs": f"fabs({a})",
                "neg": f"(-{a})",
                "recip": f"(1.0 / {a})",
            }
        elif dtypes.is_int(dtype):
            table = {"abs": f"abs({a})", "neg": f"(-{a})"}
        else:
            table = {}
        if name not in table:
            raise CompileError(f"intrinsic {name}() on {dtype} is not supported by the CUDA target")
        return table[name]

    # ---------------------------------------------------------------- prelude
    def prelude_text(self) -> str:
        text = render_prelude(self.helpers - {"tf32"})
        return text + "\n" + codegen_tc.TF32_HELPER if "tf32" in self.helpers else text


def _narrow_vector_type(dtype: str, lanes: int) -> str:
    """The bits type of ``lanes`` 16-bit floats: 2 -> unsigned, 4 -> uint2, 8 -> uint4."""
    t = {2: "unsigned", 4: "uint2", 8: "uint4"}.get(lanes)
    if t is None:
        raise CompileError(f"the CUDA target has no vectors of {lanes} x {dtype} (2, 4 or 8 lanes)")
    return t


def generate_cuda(funcs: Sequence[PrimFunc], target: Any = None, fast_math: bool = False) -> str:
    """One CUDA translation unit with every kernel of the lowered ``funcs`` (see the module docstring)."""
    printer = CudaPrinter(target, fast_math)
    texts: list[str] = []
    seen: set[str] = set()
    for f in funcs:
        for name, text, _ in printer.kernels(f):
            if name in seen:
                raise CompileError(f"two kernels are named {name!r}")
            seen.add(name)
            texts.append(text)
    return "\n".join([f"// generated by kiln ({CODEGEN_VERSION})", printer.prelude_text(), *texts])


# ====================================================================== helpers
def _buffers(func: PrimFunc) -> list[Buffer]:
    """The parameters and allocations of a kernel."""
    return [*func.params, *(s.buffer for s in walk_stmts(func.body) if isinstance(s, Allocate))]
