"""The C timing harness of the CPU runner: calls a kernel N times between two ``clock_gettime`` calls.

Timing in C keeps the ctypes call overhead (about a microsecond) out of small kernels. The harness calls
the kernel through a function pointer (every kernel argument is a pointer, so a kernel with ``n``
arguments is called as ``void (*)(void*, ..., void*)``), so one harness serves every generated library.
It is built once with the kernel flags and cached on disk like any kernel (``compiler.backends.cpu.gcc``).
Threads are each kernel library's own count (its ``kiln_set_num_threads``, called by the worker), run on
the worker's one thread pool (the pool runtime, loaded before any kernel library).

Exported functions:

``double kiln_harness_warmup(void* fn, int nargs, void** args, double min_us, long max_calls)``
    Calls the kernel until ``min_us`` microseconds have passed (at least once, at most ``max_calls``
    calls) and returns the mean time of one call in microseconds.
``int kiln_harness_time(void* fn, int nargs, void** args, long number, int min_repeats, int max_repeats,
double min_total_us, double max_sample_us, double* out_us)``
    Takes samples, each the mean time of up to ``number`` back-to-back calls in microseconds, until at
    least ``min_repeats`` samples and ``min_total_us`` microseconds of measured time (or ``max_repeats``
    samples); returns the number of samples written to ``out_us``. A sample ends early once it has run
    for ``max_sample_us`` (the clock is read every ``number / 64`` calls), so a kernel that becomes much
    slower than its warm-up suggested (a loaded machine) cannot stretch the measurement to a timeout.
"""

from __future__ import annotations

from pathlib import Path

from compiler.backends.cpu.gcc import compile_source

MAX_ARGS = 64  # kernels with more buffer arguments than this cannot be timed


def _call_switch() -> str:
    cases = []
    for n in range(1, MAX_ARGS + 1):
        proto = ", ".join(["void*"] * n)
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"    case {n}: ((void (*)({proto}))fn)({args}); return 0;")
    return "\n".join(cases)


def harness_source() -> str:
    """The C source of the harness."""
    return f"""/* kiln timing harness */
#include <time.h>

static double kiln_now_us(void) {{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}}

static int kiln_call(void* fn, int n, void** a) {{
  switch (n) {{
{_call_switch()}
    default: return -1;
  }}
}}

double kiln_harness_warmup(void* fn, int nargs, void** args, double min_us, long max_calls) {{
  double start = kiln_now_us(), now = start;
  long calls = 0;
  while (calls < 1 || (now - start < min_us && calls < max_calls)) {{
    if (kiln_call(fn, nargs, args) != 0) return -1.0;
    now = kiln_now_us();
    calls++;
  }}
  return (now - start) / (double)calls;
}}

int kiln_harness_time(void* fn, int nargs, void** args, long number, int min_repeats, int max_repeats,
                      double min_total_us, double max_sample_us, double* out_us) {{
  double total = 0.0;
  int r = 0;
  long stride = number / 64 > 0 ? number / 64 : 1;
  if (nargs < 1 || nargs > {MAX_ARGS}) return -1;
  while (r < max_repeats && (r < min_repeats || total < min_total_us)) {{
    double t0 = kiln_now_us(), dt = 0.0;
    long calls = 0, until_check = stride;
    for (;;) {{
      kiln_call(fn, nargs, args);
      calls++;
      if (calls >= number) {{ dt = kiln_now_us() - t0; break; }}
      if (--until_check == 0) {{
        until_check = stride;
        dt = kiln_now_us() - t0;
        if (dt > max_sample_us) break;
      }}
    }}
    out_us[r++] = dt / (double)calls;
    total += dt;
  }}
  return r;
}}
"""


def harness_library() -> Path:
    """Path of the built harness shared object (built once, then taken from the kernel cache)."""
    return compile_source(harness_source())
