"""The thread pool of the C target's parallel loops (compiler/backends/cpu/pool.py): outlined loops compute
what the serial loops do at any thread count, workers take part, and the pool survives fork, concurrent
callers and dlclose (those run in a subprocess, so a crash fails one test instead of the session)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.codegen import generate_c
from compiler.backends.cpu.pool import CLIENT_C, ENTRY
from compiler.loopir.expr import Load, Var, cast
from compiler.loopir.stmt import Allocate, Buffer, BufferStore, For, PrimFunc, seq
from compiler.target import Target
from tests.compiler.backends.cpu.util import build, kernel_text, run

F32 = "float32"
ROWS, COLS = 37, 50


def _kernels() -> list[PrimFunc]:
    """Three kernels over x[37, 50]: a parallel row loop; a serial loop around a parallel one (the
    parallel body uses the serial loop's variable) with a scratch buffer allocated outside it; and two
    parallel loops in sequence, the second nested in another parallel loop (printed serial)."""
    x, y = Buffer("x", (ROWS, COLS), F32), Buffer("y", (ROWS, COLS), F32)
    i, j, t = Var("i"), Var("j"), Var("t")
    rows = PrimFunc(
        "rows",
        [x, y],
        For(i, ROWS, For(j, COLS, BufferStore(y, (i, j), Load(x, (i, j)) * 2.0 + cast(i, F32))), "parallel"),
        1,
    )
    x2, y2 = Buffer("x", (ROWS, COLS), F32), Buffer("y", (3, ROWS, COLS), F32)
    scratch = Buffer("scratch", (COLS,), F32)
    fill = For(j, COLS, BufferStore(scratch, (j,), cast(j, F32) + cast(t, F32)))
    use = For(
        i,
        ROWS,
        For(j, COLS, BufferStore(y2, (t, i, j), Load(x2, (i, j)) + Load(scratch, (j,)))),
        "parallel",
    )
    outer = PrimFunc("outer", [x2, y2], For(t, 3, Allocate(scratch, seq(fill, use))), 1)
    x3, y3 = Buffer("x", (ROWS, COLS), F32), Buffer("y", (ROWS, COLS), F32)
    i2, j2 = Var("i"), Var("j")
    first = For(i, ROWS, For(j, COLS, BufferStore(y3, (i, j), Load(x3, (i, j)))), "parallel")
    second = For(
        i2,
        ROWS,
        For(j2, COLS, BufferStore(y3, (i2, j2), Load(y3, (i2, j2)) * 3.0), "parallel"),
        "parallel",
    )
    two = PrimFunc("two", [x3, y3], seq(first, second), 1)
    return [rows, outer, two]


def _expected(name: str, x: np.ndarray) -> np.ndarray:
    if name == "rows":
        return x * 2 + np.arange(ROWS, dtype=np.float32)[:, None]
    if name == "outer":
        cols = np.arange(COLS, dtype=np.float32)
        return np.stack([x + (cols + t) for t in range(3)])
    return x * 3


@pytest.mark.parametrize("threads", [1, 2, 3, 7, 40])  # 40: more threads than chunks (31 at most)
def test_outlined_parallel_loops_compute_the_serial_result(threads):
    funcs = _kernels()
    src, lib = build(funcs)
    # the library calls the process's pool (the runtime library) instead of carrying one
    assert "#pragma omp" not in src and ENTRY in src and "kiln_pool_worker" not in src
    assert kernel_text(src, "rows").count("kiln_parallel_for(") == 1
    assert kernel_text(src, "outer").count("kiln_parallel_for(") == 1  # inside the serial t loop
    assert kernel_text(src, "two").count("kiln_parallel_for(") == 2  # the nested one is serial
    lib.set_num_threads(threads)
    x = np.random.default_rng(threads).standard_normal((ROWS, COLS)).astype(np.float32)
    for f in funcs:
        for _ in range(20):  # many loops back to back: workers sleep, wake and race for chunks
            np.testing.assert_array_equal(run(f, x, lib=lib)[0], _expected(f.name, x))


def test_a_library_without_parallel_loops_has_no_pool():
    x, y = Buffer("x", (4,), F32), Buffer("y", (4,), F32)
    i = Var("i")
    src, lib = build([PrimFunc("plain", [x, y], For(i, 4, BufferStore(y, (i,), Load(x, (i,)))), 1)])
    assert "kiln_pool" not in src and "kiln_set_num_threads" in src
    lib.set_num_threads(2)  # still callable


def test_openmp_runtime_is_still_available():
    funcs = _kernels()[:1]
    src = generate_c(funcs, Target.host(), parallel="openmp")
    assert "#pragma omp parallel for schedule(static)" in src and "kiln_pool" not in src
    assert "-fopenmp" in cbuild.flags_for(src) and "-fopenmp" not in cbuild.flags_for(generate_c(funcs))
    lib = cbuild.build(src)
    lib.set_num_threads(2)
    x = np.ones((ROWS, COLS), np.float32)
    np.testing.assert_array_equal(run(funcs[0], x, lib=lib)[0], _expected("rows", x))


# A chunk function whose first caller waits (up to 60 s) until another thread has entered it: meet_run()
# returns 1 only if a worker claimed a chunk while the caller was holding one.
_MEET = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <time.h>
static long kiln_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}
static unsigned long meet_first;
static int meet_met;
static void meet(void* ctx, int64_t lo, int64_t hi) {
  int* seen = (int*)ctx;
  unsigned long me = (unsigned long)pthread_self(), first = 0;
  if (__atomic_compare_exchange_n(&meet_first, &first, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    long until = kiln_now_ns() + 60000000000L;
    while (!__atomic_load_n(&meet_met, __ATOMIC_SEQ_CST) && kiln_now_ns() < until) sched_yield();
  } else if (first != me) {
    __atomic_store_n(&meet_met, 1, __ATOMIC_SEQ_CST);
  }
  for (int64_t i = lo; i < hi; i++) seen[i] += 1;
}
int meet_run(int* seen, int extent) {
  meet_first = 0;
  meet_met = 0;
  kiln_parallel_for(meet, seen, extent);
  return meet_met;
}

/* Which chunks each thread takes (2 threads): the caller holds its first chunk until a worker has entered
   one, and the worker holds its first chunk until every other iteration is done, so the caller must take
   the rest of the worker's range. order_run() returns the worker's first lo (-1: none within wait_ns) and
   writes the lo of each chunk the caller ran, in order, to caller_los (-1 after the last). */
static pthread_t order_caller;
static int64_t order_worker_lo, order_done, order_n, order_total;
static int64_t* order_caller_los;
static long order_wait_ns;
static void order(void* ctx, int64_t lo, int64_t hi) {
  int* seen = (int*)ctx;
  long until = kiln_now_ns() + order_wait_ns;
  if (pthread_equal(pthread_self(), order_caller)) {
    order_caller_los[order_n++] = lo;
    while (order_n == 1 && __atomic_load_n(&order_worker_lo, __ATOMIC_SEQ_CST) < 0 && kiln_now_ns() < until)
      sched_yield();
  } else if (__atomic_load_n(&order_worker_lo, __ATOMIC_SEQ_CST) < 0) {
    __atomic_store_n(&order_worker_lo, lo, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&order_done, __ATOMIC_SEQ_CST) < order_total - (hi - lo) &&
           kiln_now_ns() < until)
      sched_yield();
  }
  for (int64_t i = lo; i < hi; i++) seen[i] += 1;
  __atomic_fetch_add(&order_done, hi - lo, __ATOMIC_SEQ_CST);
}
int64_t order_run(int* seen, int extent, int64_t* caller_los, long wait_ns) {
  order_wait_ns = wait_ns;
  order_caller = pthread_self();
  order_worker_lo = -1;
  order_done = 0;
  order_n = 0;
  order_total = extent;
  order_caller_los = caller_los;
  kiln_parallel_for(order, seen, extent);
  caller_los[order_n] = -1;
  return order_worker_lo;
}
"""

_SCRIPT = r"""
import ctypes, os, sys, threading, time, _ctypes
import numpy as np
sys.path.insert(0, sys.argv[1])
from compiler.backends.cpu import gcc
from tests.compiler.backends.cpu.test_pool import _kernels, _expected, _meet_source
from compiler.backends.cpu.codegen import generate_c
from compiler.target import Target

def threads(want=None):
    # a joined thread's /proc entry can outlive pthread_join briefly: wait (up to 10 s) for ``want``
    for _ in range(1000):
        n = len(os.listdir("/proc/self/task"))
        if want is None or n == want:
            return n
        time.sleep(0.01)
    return n

base = threads()
gcc.load_pool_runtime()  # what every KernelLibrary does first: the libraries below call into it
meet = ctypes.CDLL(str(gcc.compile_source(_meet_source())))
meet.order_run.restype = ctypes.c_int64
meet.kiln_set_num_threads(2)
seen = np.zeros(64, np.int32)
assert meet.meet_run(ctypes.c_void_p(seen.ctypes.data), 64) == 1, "no worker took a chunk"
assert (seen == 1).all(), seen
assert threads(base + 1) == base + 1, (threads(), base)  # one worker for two threads

# 64 iterations, 8 chunks: the caller owns [0, 32), the worker [32, 64); each takes its own range lowest
# first, then steals from the other's end (the worker is held in its first chunk until the rest is done)
# A worker that finds itself on the caller's CPU lets the caller run (pool.py: kiln_crowded), so on a busy
# machine it may not arrive while the caller holds its chunk: each attempt waits 5 s, up to 12 attempts (a
# run without the worker still computes every chunk once; the order is checked on the first run it joined).
los = np.zeros(16, np.int64)
for attempt in range(12):
    seen[:] = 0
    worker_lo = meet.order_run(
        ctypes.c_void_p(seen.ctypes.data), 64, ctypes.c_void_p(los.ctypes.data), ctypes.c_long(5_000_000_000)
    )
    assert (seen == 1).all(), seen
    if worker_lo >= 0:
        break
assert worker_lo == 32, (worker_lo, attempt)
assert list(los[: list(los).index(-1)]) == [0, 8, 16, 24, 56, 48, 40], los

f = _kernels()[0]
path = str(gcc.compile_source(generate_c([f], Target.host())))
lib = ctypes.CDLL(path)
lib.kiln_set_num_threads(3)
x = np.random.default_rng(0).standard_normal((37, 50)).astype(np.float32)
want = _expected("rows", x)

def call(lib):
    y = np.full_like(x, np.nan)
    lib.rows(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data))
    return y

assert (call(lib) == want).all()
assert threads(base + 2) == base + 2  # one pool: 2 workers in all for 3 threads

# a second library (another kernel cache entry) shares the pool: no worker more
path2 = str(gcc.compile_source(generate_c([f], Target.host()) + "/* another library */\n"))
lib2 = ctypes.CDLL(path2)
lib2.kiln_set_num_threads(3)
assert path2 != path and (call(lib2) == want).all()
assert threads(base + 2) == base + 2, threads()

pid = os.fork()  # the child has none of the parent's workers: it starts its own
if pid == 0:
    ok = all((call(lib) == want).all() for _ in range(50))
    mine = np.zeros(8, np.int32)
    ok = ok and threads(3) == 3 and meet.meet_run(ctypes.c_void_p(mine.ctypes.data), 8) == 1
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.WEXITSTATUS(status) == 0 and not os.WIFSIGNALED(status), status

bad = []
def hammer():  # two callers on one pool: the second runs its loop serially
    for _ in range(200):
        if not (call(lib) == want).all():
            bad.append(1)
ts = [threading.Thread(target=hammer) for _ in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not bad

def hammer2():  # two libraries called at once from two threads: one pool, the second caller runs serially
    for _ in range(200):
        if not (call(lib2) == want).all():
            bad.append(2)
ts = [threading.Thread(target=hammer), threading.Thread(target=hammer2)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not bad

_ctypes.dlclose(lib._handle)  # its loops are done: the pool's workers never run its code again
assert threads(base + 2) == base + 2, threads()  # the workers are the runtime's: they stay
assert (call(lib2) == want).all()
lib = ctypes.CDLL(path)
lib.kiln_set_num_threads(2)
assert (call(lib) == want).all()
print("ok")
"""


def _meet_source() -> str:
    return CLIENT_C + _MEET


@pytest.mark.xdist_group("pool_subprocess")
def test_pool_workers_claim_chunks_and_survive_fork_concurrency_and_dlclose(tmp_path):
    """One pool per process: libraries share its workers; fork, two callers and dlclose of a library."""
    import os
    from pathlib import Path

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this process may run on one CPU only: a worker never takes chunks beside the caller")

    root = str(Path(__file__).resolve().parents[4])
    env = {**os.environ, "PYTHONPATH": root, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), root],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


def _pool_threads() -> int:
    """Threads of this process that are pool workers (the runtime names them ``kiln-pool``)."""
    import os

    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == "kiln-pool"
        except FileNotFoundError:  # a thread that just exited
            pass
    return count


def test_two_compiled_models_share_the_process_pool():
    """Two models whose kernels are two libraries start no second pool: the workers are the threads of
    the larger thread count, whichever model runs (another test may have started more already)."""
    from compiler.build import compile as kiln_compile

    a, b = kiln_compile("mlp", "cpu"), kiln_compile("mlp", "cpu")  # batch 256: parallel loops
    b.library = cbuild.build(b.source + "/* a second library of the same model */\n")
    x = np.random.default_rng(0).standard_normal(a.input_specs[0]["shape"]).astype(np.float32)
    a.num_threads = b.num_threads = 3
    want = a.run([x])[0]
    assert a.library.path != b.library.path and ENTRY in a.source
    workers = _pool_threads()
    assert workers >= 2
    np.testing.assert_array_equal(b.run([x])[0], want)
    assert _pool_threads() == workers  # b's library calls the same pool
    b.num_threads, b._run_fn = 4, None  # set again on the next call
    np.testing.assert_array_equal(b.run([x])[0], want)
    assert _pool_threads() == max(workers, 3)
    np.testing.assert_array_equal(a.run([x])[0], want)
    assert _pool_threads() == max(workers, 3)
