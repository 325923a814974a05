"""The C target on hand-lowered loop IR: generated code compiled with gcc, run, compared with numpy.

Tests whose text depends on the vector width generate code for each pinned target (``pinned_target``:
AVX-512, AVX2, NEON) and check the lanes that width gets; the code runs on the host only under the pinned
target of the host's width (so each such test runs its kernel once, with ``KILN_HOST_ISA=avx2`` under the
AVX2 target).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy import special

from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.codegen import MAX_SCALAR_VARS, generate_c
from compiler.errors import CompileError
from compiler.loopir.expr import Load, Var, call, cast, const, logical_and, maximum, select
from compiler.loopir.stmt import Allocate, Barrier, Block, Buffer, BufferStore, For, IfThenElse, PrimFunc, seq
from compiler.target import Target
from tests.compiler.backends.cpu.util import build, kernel_text, run
from tests.targets import same_width_as_host

RNG = np.random.default_rng(0)
F32 = "float32"


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def lanes(target: Target) -> int:
    """float32 lanes of the widest vector code generated for ``target``."""
    return max(4, min(16, target.vector_bytes // 4))


def build_for(funcs: list[PrimFunc], target: Target) -> tuple[str, cbuild.KernelLibrary | None]:
    """The source generated for ``target`` and, when the host has the same vector width, that source built
    for the host (None otherwise: only the text is checked)."""
    src = generate_c(funcs, target)
    return src, cbuild.build(src) if same_width_as_host(target) else None


def vector_accumulators(text: str, width: int) -> list[str]:
    """Names of the ``kiln_f32x<width>`` variables a kernel declares."""
    return [n.strip() for d in re.findall(rf"kiln_f32x{width} ([\w, ]+);", text) for n in d.split(",")]


def gelu_like(x):
    return (
        call("erf", call("exp", x * 0.25))
        + call("tanh", x)
        + call("sigmoid", x)
        + call("log", call("abs", x))
    )


def test_vectorized_chain_with_scalar_tail(pinned_target: Target):
    n = 16 * 9 + 5
    x, y = Buffer("x", (n,), F32), Buffer("out", (n,), F32)
    i, v, t = Var("i"), Var("v"), Var("t")
    main = For(
        i, n // 16, For(v, 16, BufferStore(y, (i * 16 + v,), gelu_like(Load(x, (i * 16 + v,)))), "vectorized")
    )
    tail_idx = t + (n // 16) * 16
    tail = For(t, n % 16, BufferStore(y, (tail_idx,), gelu_like(Load(x, (tail_idx,)))))
    f = PrimFunc("chain", [x, y], seq(main, tail), 1)
    src, lib = build_for([f], pinned_target)
    text, w = kernel_text(src, "chain"), lanes(pinned_target)
    assert "void chain(const float* restrict x, float* restrict out)" in text
    assert (
        f"kiln_exp_f32x{w}(" in text
        and f"kiln_load_f32x{w}(&x[" in text
        and f"kiln_store_f32x{w}(&out[" in text
    )
    assert "kiln_erff(" in text  # the tail is scalar
    if lib is None:
        return
    xa = f32(n)
    (out,) = run(f, xa, lib=lib)
    x64 = xa.astype(np.float64)
    ref = special.erf(np.exp(x64 * 0.25)) + np.tanh(x64) + special.expit(x64) + np.log(np.abs(x64))
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_wide_vector_loop_is_split_into_chunks_and_guarded_tail(pinned_target: Target):
    n = 100
    x, y = Buffer("x", (n,), F32), Buffer("y", (n,), F32)
    io, v = Var("io"), Var("v")
    idx = io * 32 + v
    body = IfThenElse(idx.lt(n), BufferStore(y, (idx,), call("exp", Load(x, (idx,)))))
    f = PrimFunc("tailed", [x, y], For(io, 4, For(v, 32, body, "vectorized")), 1)
    src, lib = build_for([f], pinned_target)
    text = kernel_text(src, "tailed")
    assert (
        f"kiln_exp_f32x{lanes(pinned_target)}(" in text and "else {" in text and "#pragma GCC ivdep" in text
    )
    assert "kiln_exp_f32x32" not in text  # 32 lanes are split into chunks the target has
    if lib is None:
        return
    xa = f32(n)
    np.testing.assert_allclose(run(f, xa, lib=lib)[0], np.exp(xa.astype(np.float64)), rtol=3e-7)


def test_broadcast_and_gather_loads(pinned_target: Target):
    m, n = 8, 16
    x, s, y = Buffer("x", (m, n), F32), Buffer("scale", (m,), F32), Buffer("y", (n, m), F32)
    z = Buffer("z", (m, n), F32)
    i, j, v = Var("i"), Var("j"), Var("v")
    bcast = For(i, m, For(v, n, BufferStore(z, (i, v), Load(x, (i, v)) * Load(s, (i,))), "vectorized"))
    # transpose: y[j, v] = x[v, j]: the load's lane stride is n -> gather
    gather = For(j, n, For(v, 8, BufferStore(y, (j, v), Load(x, (v, j)) + 1.0), "vectorized"))
    f = PrimFunc("bg", [x, s, y, z], seq(bcast, gather), 2)
    src, lib = build_for([f], pinned_target)
    text, w = kernel_text(src, "bg"), lanes(pinned_target)
    assert f"kiln_load_f32x{w}(&x[" in text  # the broadcast loop is vector code ...
    assert not re.search(r"kiln_load_f32x\d+\(&scale", text) and "scale[i]" in text  # ... scale a scalar
    assert f"(kiln_f32x{min(8, w)}){{x[" in text  # the 8-lane gather, in chunks the target has
    if lib is None:
        return
    xa, sa = f32(m, n), f32(m)
    yo, zo = run(f, xa, sa, lib=lib)
    np.testing.assert_array_equal(zo, xa * sa[:, None])
    np.testing.assert_array_equal(yo, xa.T[:, :8] + 1)


def test_reduction_with_promoted_vector_accumulator(pinned_target: Target):
    rows, cols = 7, 256
    x, out = Buffer("x", (rows, cols), F32), Buffer("out", (rows,), F32)
    acc = Buffer("acc", (16,), F32, "local")
    r, ko, v, v0, lane = Var("r"), Var("ko"), Var("v"), Var("v"), Var("l")
    body = Allocate(
        acc,
        seq(
            For(v0, 16, BufferStore(acc, (v0,), const(0.0, F32)), "vectorized"),
            For(
                ko,
                cols // 16,
                For(v, 16, BufferStore(acc, (v,), Load(acc, (v,)) + Load(x, (r, ko * 16 + v))), "vectorized"),
            ),
            BufferStore(out, (r,), const(0.0, F32)),
            For(lane, 16, BufferStore(out, (r,), Load(out, (r,)) + Load(acc, (lane,))), "unrolled"),
        ),
    )
    f = PrimFunc("rowsum", [x, out], For(r, rows, body, "parallel"), 1)
    src, lib = build_for([f], pinned_target)
    text, w = kernel_text(src, "rowsum"), lanes(pinned_target)
    # the 16 accumulators live in 16 / w vector variables (no array), and their lanes are summed at the end
    accs = vector_accumulators(text, w)
    assert len(accs) == 16 // w and "acc[" not in text and f"{accs[-1]}[{w - 1}]" in text
    assert "v_1" not in text  # two sibling loops named v keep their name
    if lib is None:
        return
    xa = f32(rows, cols)
    np.testing.assert_allclose(run(f, xa, lib=lib)[0], xa.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def _matmul(m: int, n: int, k: int) -> PrimFunc:
    a, b, c = Buffer("A", (m, k), F32), Buffer("B", (k, n), F32), Buffer("C", (m, n), F32)
    acc = Buffer("acc", (6, 32), F32, "local")
    io, jo, kk = Var("io"), Var("jo"), Var("k")

    def tile(fn):
        ii, jj = Var("ii"), Var("jj")
        return For(ii, 6, For(jj, 32, fn(ii, jj), "vectorized"), "unrolled")

    init = tile(lambda ii, jj: BufferStore(acc, (ii, jj), const(0.0, F32)))
    update = For(
        kk,
        k,
        tile(
            lambda ii, jj: BufferStore(
                acc, (ii, jj), Load(acc, (ii, jj)) + Load(a, (io * 6 + ii, kk)) * Load(b, (kk, jo * 32 + jj))
            )
        ),
    )
    write = tile(lambda ii, jj: BufferStore(c, (io * 6 + ii, jo * 32 + jj), Load(acc, (ii, jj))))
    body = For(io, m // 6, For(jo, n // 32, Allocate(acc, seq(init, update, write))), "parallel")
    return PrimFunc("matmul_6x32", [a, b, c], body, 2)


def test_register_tiled_matmul_keeps_accumulators_in_registers(pinned_target: Target):
    f = _matmul(48, 64, 40)
    src, lib = build_for([f], pinned_target)
    text, w = kernel_text(src, "matmul_6x32"), lanes(pinned_target)
    assert len(vector_accumulators(text, w)) == 6 * 32 // w and "acc[" not in text
    if lib is None:
        return
    a, b = f32(48, 40), f32(40, 64)
    np.testing.assert_allclose(run(f, a, b, lib=lib)[0], a @ b, rtol=1e-4, atol=1e-4)
    if pinned_target.vector_bytes != 64:
        return  # 6 x 32 floats fill 12 of AVX-512's 32 registers, but more than AVX2's or NEON's 16
    asm = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(lib.path)], capture_output=True, text=True
    )
    if asm.returncode != 0:
        pytest.skip("objdump is not available")
    lines = asm.stdout.splitlines()
    fmas = [i for i, line in enumerate(lines) if "vfmadd" in line and "zmm" in line]
    if not fmas:
        pytest.skip("gcc emitted no AVX-512 FMA (not an x86 host with AVX-512 FMA)")
    inner = lines[fmas[0] : fmas[-1] + 1]
    assert len(fmas) == 12
    stores = [line for line in inner if ("vmovups %zmm" in line or "vmovaps %zmm" in line) and "(%" in line]
    assert not stores, inner


def test_parallel_only_outermost_and_unroll_pragmas():
    x, y = Buffer("x", (4, 8, 100), F32), Buffer("y", (4, 8, 100), F32)
    i, j, k = Var("i"), Var("j"), Var("k")
    inner = For(k, 100, BufferStore(y, (i, j, k), Load(x, (i, j, k)) * 2.0), "unrolled")
    f = PrimFunc("par", [x, y], For(i, 4, For(j, 8, inner, "unrolled"), "parallel"), 1)
    nested = PrimFunc(
        "par2", [x, y], For(i, 4, For(j, 8, For(k, 100, inner.body), "parallel"), "parallel"), 1
    )
    src, lib = build([f, nested])
    assert kernel_text(src, "par").count("kiln_parallel_for(") == 1 and "#pragma omp" not in src
    assert "#pragma GCC unroll 8" in kernel_text(src, "par")
    assert "#pragma GCC unroll 100" not in kernel_text(src, "par")  # too big: a plain loop
    assert kernel_text(src, "par2").count("kiln_parallel_for(") == 1  # the nested loop runs serially
    xa = f32(4, 8, 100)
    for name in ("par", "par2"):
        np.testing.assert_array_equal(run(f if name == "par" else nested, xa, lib=lib)[0], xa * 2)


def _reverse_through_scratch(n: int, name: str, parallel: bool) -> PrimFunc:
    """y = (x + 1) reversed, through a scratch buffer of ``n`` floats (inside a parallel loop of 2 when
    ``parallel``: y then has 2 rows)."""
    x, y = Buffer("x", (n,), F32), Buffer("y", (2 * n,) if parallel else (n,), F32)
    tmp = Buffer("tmp", (n,), F32, "global")
    i, j = Var("i"), Var("j")
    p = Var("p")
    row = p * n if parallel else 0
    body = Allocate(
        tmp,
        seq(
            For(i, n, BufferStore(tmp, (i,), Load(x, (i,)) + 1.0)),
            For(j, n, BufferStore(y, (row + j,), Load(tmp, (n - 1 - j,)))),
        ),
    )
    if parallel:
        body = For(p, 2, body, kind="parallel")
    small = Buffer("small", (64,), F32, "shared")
    k = Var("k")
    body2 = Allocate(small, seq(For(k, 64, BufferStore(small, (k,), Load(x, (k,)))), Barrier()))
    return PrimFunc(name, [x, y], seq(body, body2), 1)


def test_big_allocate_is_a_per_thread_array_kept_across_calls():
    n = 1 << 20  # 4 MiB of float32: long enough calls for threads to overlap
    f = _reverse_through_scratch(n, "big", parallel=False)
    g = _reverse_through_scratch(40000, "big2", parallel=False)  # shares the array (kernels run in turn)
    src, lib = build([f, g])
    assert src.count("kiln_scratch[") == 1 and kernel_text(src, "big2").count("kiln_scratch + 0") == 1
    xg = f32(40000)
    np.testing.assert_array_equal(run(g, xg, lib=lib)[0], (xg + 1)[::-1])
    text = kernel_text(src, "big")
    assert "static __thread unsigned char kiln_scratch[4194304] __attribute__((aligned(64)));" in src
    assert "float* restrict tmp = (float*)(kiln_scratch + 0);" in text
    assert "aligned_alloc" not in text and "free(" not in text
    assert "float small[64] __attribute__((aligned(64)));" in text
    fn = lib.function("big", 2)
    inputs = [np.random.default_rng(seed).standard_normal(n).astype(np.float32) for seed in range(8)]

    def call(xa: np.ndarray) -> np.ndarray:
        y = np.full(n, np.nan, np.float32)
        fn(xa.ctypes.data, y.ctypes.data)
        return y

    for xa in inputs[:3]:  # the scratch of the previous call is overwritten, never read
        np.testing.assert_array_equal(call(xa), (xa + 1)[::-1])
    # threads calling at once each have their own scratch (ctypes releases the GIL during the call)
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            results = list(pool.map(call, inputs))
            for xa, y in zip(inputs, results):
                np.testing.assert_array_equal(y, (xa + 1)[::-1])


def test_big_allocate_in_a_parallel_loop_uses_the_heap():
    n = 40000
    f = _reverse_through_scratch(n, "heap", parallel=True)
    src, lib = build([f])
    text = kernel_text(src, "heap")
    assert "aligned_alloc(64, 160000)" in text and "free(tmp);" in text and "__thread" not in text
    xa = f32(n)
    np.testing.assert_array_equal(run(f, xa, lib=lib)[0], np.tile((xa + 1)[::-1], 2))


def _pad_func(n: int, vector: bool) -> PrimFunc:
    x, y = Buffer("x", (n,), F32), Buffer("y", (n + 32,), F32)
    io, v = Var("io"), Var("v")
    i = io * 16 + v
    value = select(logical_and(i.ge(16), i.lt(n + 16)), Load(x, (i - 16,)), const(0.0, F32))
    kind = "vectorized" if vector else "serial"
    return PrimFunc("pad", [x, y], For(io, (n + 32) // 16, For(v, 16, BufferStore(y, (i,), value), kind)), 1)


def test_select_with_out_of_bounds_branch_falls_back_to_scalar(pinned_target: Target):
    f = _pad_func(1024, vector=True)
    src, lib = build_for([f], pinned_target)
    text = kernel_text(src, "pad")
    assert "#pragma GCC ivdep" in text and "kiln_load_f32x" not in text
    if lib is None:
        return
    xa = f32(1024)
    np.testing.assert_array_equal(run(f, xa, lib=lib)[0], np.pad(xa, 16))


PAD_GUARD_SCRIPT = """
import ctypes, mmap, sys
import numpy as np
from tests.compiler.backends.cpu.test_codegen import _pad_func
from tests.compiler.backends.cpu.util import build
page = mmap.PAGESIZE
m = mmap.mmap(-1, 3 * page)
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert libc.mprotect(base, page, 0) == 0 and libc.mprotect(base + 2 * page, page, 0) == 0
n = page // 4
x = np.frombuffer(m, dtype=np.float32, count=n, offset=page)
x[:] = np.arange(n, dtype=np.float32)
f = _pad_func(n, vector=True)
_, lib = build([f])
y = np.empty(n + 32, np.float32)
lib.function("pad", 2)(base + page, y.ctypes.data)
assert (y == np.pad(x, 16)).all()
print("ok")
"""


def test_pad_select_never_reads_out_of_bounds():
    """x sits between two PROT_NONE pages: any out-of-bounds read in the pad kernel would crash."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    proc = subprocess.run([sys.executable, "-c", PAD_GUARD_SCRIPT], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_select_with_in_bounds_loads_is_vectorized(pinned_target: Target):
    n = 64
    x, y = Buffer("x", (n,), F32), Buffer("y", (n,), F32)
    io, v = Var("io"), Var("v")
    i = io * 16 + v
    xv = Load(x, (i,))
    f = PrimFunc(
        "relu",
        [x, y],
        For(io, 4, For(v, 16, BufferStore(y, (i,), select(xv.gt(0.0), xv, 0.0)), "vectorized")),
        1,
    )
    src, lib = build_for([f], pinned_target)
    assert f"kiln_sel_f32x{lanes(pinned_target)}(" in kernel_text(src, "relu")
    if lib is None:
        return
    xa = f32(n)
    np.testing.assert_array_equal(run(f, xa, lib=lib)[0], np.maximum(xa, 0))


def test_rank0_buffers():
    x, s, y = Buffer("x", (), F32), Buffer("s", (4,), F32), Buffer("y", (), F32)
    i = Var("i")
    body = seq(
        BufferStore(y, (), Load(x, ()) * 3.0), For(i, 4, BufferStore(y, (), Load(y, ()) + Load(s, (i,))))
    )
    f = PrimFunc("scalar", [x, s, y], body, 2)
    (out,) = run(f, np.float32(2.0), np.float32([1, 2, 3, 4]))
    assert out.shape == () and float(out) == 16.0


def test_int32_bool_and_float16_buffers(pinned_target: Target):
    n = 32
    a, b = Buffer("a", (n,), "int32"), Buffer("b", (n,), "int32")
    h = Buffer("h", (n,), "float16")
    s, gt, hy = Buffer("s", (n,), "int32"), Buffer("gt", (n,), "bool"), Buffer("hy", (n,), "float16")
    io, v, i = Var("io"), Var("v"), Var("i")
    k = io * 16 + v
    ints = For(
        io,
        2,
        For(
            v,
            16,
            BufferStore(s, (k,), maximum(Load(a, (k,)) * 3, Load(b, (k,))) - call("abs", Load(b, (k,)))),
            "vectorized",
        ),
    )
    bools = For(i, n, BufferStore(gt, (i,), Load(a, (i,)).gt(Load(b, (i,)))))
    halfs = For(i, n, BufferStore(hy, (i,), call("exp", Load(h, (i,))) + cast(Load(a, (i,)), "float16")))
    f = PrimFunc("mixed", [a, b, h, s, gt, hy], seq(ints, bools, halfs), 3)
    src, lib = build_for([f], pinned_target)
    assert f"kiln_load_i32x{lanes(pinned_target)}" in kernel_text(src, "mixed")
    if lib is None:
        return
    aa = RNG.integers(-50, 50, n).astype(np.int32)
    ba = RNG.integers(-50, 50, n).astype(np.int32)
    ha = RNG.standard_normal(n).astype(np.float16)
    so, go, hyo = run(f, aa, ba, ha, lib=lib)
    np.testing.assert_array_equal(so, np.maximum(aa * 3, ba) - np.abs(ba))
    np.testing.assert_array_equal(go, aa > ba)
    np.testing.assert_allclose(
        hyo.astype(np.float32), np.exp(ha.astype(np.float32)) + aa, rtol=2e-3, atol=2e-3
    )


def test_floor_division_and_modulo_with_negative_operands():
    n = 40
    y1, y2 = Buffer("q", (n,), "int32"), Buffer("r", (n,), "int32")
    yf = Buffer("fq", (n,), F32)
    x = Buffer("x", (n,), F32)
    i = Var("i")
    d = i - 20
    body = For(
        i,
        n,
        seq(
            BufferStore(y1, (i,), d // 7),
            BufferStore(y2, (i,), d % -3),
            BufferStore(yf, (i,), Load(x, (i,)) % 1.5),
        ),
    )
    f = PrimFunc("floor", [x, y1, y2, yf], body, 1)
    src, lib = build([f])
    text = kernel_text(src, "floor")
    assert "kiln_floordiv_i32(" in text and "kiln_floormod_i32(" in text
    xa = (f32(n) * 4).astype(np.float32)
    q, r, fq = run(f, xa, lib=lib)
    dn = np.arange(n, dtype=np.int32) - 20
    np.testing.assert_array_equal(q, dn // 7)
    np.testing.assert_array_equal(r, dn % -3)
    np.testing.assert_allclose(fq, np.remainder(xa, np.float32(1.5)), atol=1e-6)


def test_nonnegative_index_math_uses_plain_division():
    x, y = Buffer("x", (12,), F32), Buffer("y", (12,), F32)
    i = Var("i")
    f = PrimFunc("perm", [x, y], For(i, 12, BufferStore(y, (i,), Load(x, ((i % 4) * 3 + i // 4,)))), 1)
    src = generate_c([f], Target.host())
    text = kernel_text(src, "perm")
    assert "kiln_floor" not in text and "/ 4" in text
    xa = f32(12)
    np.testing.assert_array_equal(run(f, xa)[0], xa.reshape(4, 3).T.reshape(-1))


def test_special_constants_and_shadowed_loop_names():
    x, y = Buffer("x", (3, 4), F32), Buffer("y", (3, 4), F32)
    i1, i2 = Var("i"), Var("i")
    v = Load(x, (i1, i2))
    val = select(v.gt(1.0), const(float("inf"), F32), select(v.lt(-1.0), const(float("nan"), F32), v * -0.5))
    f = PrimFunc("names", [x, y], For(i1, 3, For(i2, 4, BufferStore(y, (i1, i2), val))), 1)
    src = generate_c([f], Target.host())
    text = kernel_text(src, "names")
    assert "int32_t i = 0" in text and "int32_t i_1 = 0" in text and "__builtin_inff()" in text
    xa = f32(3, 4) * 2
    out = run(f, xa)[0]
    ref = np.where(xa > 1, np.inf, np.where(xa < -1, np.nan, xa * -0.5))
    np.testing.assert_array_equal(out, ref.astype(np.float32))


def test_unsupported_ir_is_a_clear_error():
    x, y = Buffer("x", (4,), F32), Buffer("y", (4,), F32)
    i = Var("i")
    thread = For(i, 4, BufferStore(y, (i,), Load(x, (i,))), "thread", thread="threadIdx.x")
    with pytest.raises(CompileError, match=r"loop 'i'.*threadIdx.x"):
        generate_c([PrimFunc("gpu", [x, y], thread, 1)])
    blk = Block("copy", [], [], BufferStore(y, (0,), Load(x, (0,))))
    with pytest.raises(CompileError, match="block 'copy'"):
        generate_c([PrimFunc("blk", [x, y], blk, 1)])
    with pytest.raises(CompileError, match="not a valid C identifier"):
        generate_c([PrimFunc("bad name", [x, y], BufferStore(y, (0,), const(1.0, F32)), 1)])


def _tile_kernel(tile: int) -> PrimFunc:
    """out[r, :] = 2 * x[r, :] through a local tile of ``tile`` elements written and read by unrolled
    loops (a scalar register tile, as the sketches write them)."""
    rows = 4
    x, out = Buffer("x", (rows, tile), F32), Buffer("out", (rows, tile), F32)
    acc = Buffer("acc", (tile,), F32, "local")
    r, a, j, b, k = Var("r"), Var("a"), Var("j"), Var("b"), Var("k")
    fill = For(
        a,
        tile // 64,
        For(j, 64, BufferStore(acc, (a * 64 + j,), Load(x, (r, a * 64 + j)) * 2.0), "unrolled"),
        "unrolled",
    )
    drain = For(
        b,
        tile // 64,
        For(k, 64, BufferStore(out, (r, b * 64 + k), Load(acc, (b * 64 + k,))), "unrolled"),
        "unrolled",
    )
    return PrimFunc(f"tile{tile}", [x, out], For(r, rows, Allocate(acc, seq(fill, drain))), 1)


def test_a_scalar_tile_too_large_for_registers_stays_an_array_without_unroll_pragmas():
    """A scalar register tile over MAX_SCALAR_VARS stays an array (``promote.MEMORY_TILE``) and its
    unrolled loops are left to gcc (no ``#pragma GCC unroll``: hundreds of scalar variables or thousands
    of forced-unrolled array stores cost gcc 6-30 s per kernel); a smaller one is promoted, one variable
    per element; both compute the same."""
    small = _tile_kernel(MAX_SCALAR_VARS)
    small_text = kernel_text(generate_c([small], Target.host()), small.name)
    assert f"acc_{MAX_SCALAR_VARS - 1}" in small_text  # promoted: one variable per element
    for tile in (MAX_SCALAR_VARS + 64, 2048):
        func = _tile_kernel(tile)
        text = kernel_text(generate_c([func], Target.host()), func.name)
        assert f"acc[{tile}]" in text and "#pragma GCC unroll" not in text, text
    for func in (small, _tile_kernel(2048)):
        xv = f32(*func.params[0].shape)
        (got,) = run(func, xv)
        np.testing.assert_array_equal(got, 2 * xv)
