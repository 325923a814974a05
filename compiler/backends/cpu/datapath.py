"""How many float32 lanes the host CPU's vector FMA units process per instruction, measured.

The width of a CPU's vector registers is not the width of its arithmetic: Zen 4 executes a 512-bit FMA as
two 256-bit halves (so 16-lane code has the FMA throughput of 8-lane code there), Zen 5 server cores and
Intel's AVX-512 server cores execute it whole (twice the flops of 8 lanes), and Zen 1 split 256-bit
operations the same way. The model name alone does not say which (this project's VMs report "AMD EPYC"
for both Zen 4 and Zen 5), so :func:`host_datapath_lanes` measures it: a small C probe runs
:data:`CHAINS` independent FMA chains of 4, 8 and 16 lanes (GCC vector types, up to the target's width;
enough chains to cover the FMA latency of two pipes), in interleaved rounds, and keeps each width's best
rate. The datapath is the widest width whose rate is at least :data:`WIDER_GAIN` times the rate of half
that width (:func:`datapath_from_rates`: a full-width unit gives ~2x, a split one ~1x).

The answer is measured once per host and kept in the kernel cache (``$KILN_CACHE_DIR/probe/``, keyed like a
kernel: the probe's source, gcc and the host CPU), first writer wins, so every process of a tuning run (and
every later one) uses the same value. The analytic cost model reads it
(:meth:`cost_model.store_features.Machine.of`) for a target that is this host's CPU; any other CPU target
is taken at its register width.
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
from pathlib import Path

from compiler.backends.cpu import gcc
from compiler.errors import KilnError
from compiler.runtime import module_cache
from compiler.target import Target

log = logging.getLogger(__name__)

CHAINS = 12  # independent accumulators: >= FMA latency (4-5 cycles) x 2 pipes, and fits in 16 registers
WIDTHS = (4, 8, 16)  # float32 lanes probed (SSE, AVX2, AVX-512), up to the target's width
WIDER_GAIN = 1.4  # a width counts as executed whole when its rate is >= this x half its width's (~2 or ~1)
ROUNDS = 7
ITERATIONS = 400_000  # per call: 12 x 400k FMA instructions, a few milliseconds
# gcc's own vectorizers off: SLP would merge two 8-lane chains into one 16-lane instruction
PROBE_FLAGS = (*gcc.FLAGS, "-fno-tree-vectorize", "-fno-tree-slp-vectorize")

PROBE_C = r"""/* kiln FMA datapath probe (compiler/backends/cpu/datapath.py) */
#include <stdint.h>
#include <time.h>

static double kiln_probe_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define KILN_PROBE(LANES)                                                                   \
  typedef float kiln_v##LANES __attribute__((vector_size(4 * LANES)));                      \
  double kiln_fma_probe_##LANES(int64_t iters, float seed, float* sink) {                   \
    kiln_v##LANES acc[@CHAINS@];                                                            \
    kiln_v##LANES x = (kiln_v##LANES){} + 0.999999f, y = (kiln_v##LANES){} + 1e-7f;         \
    for (int c = 0; c < @CHAINS@; c++) acc[c] = (kiln_v##LANES){} + (seed + (float)c);      \
    double t0 = kiln_probe_now();                                                           \
    for (int64_t i = 0; i < iters; i++) {                                                   \
      _Pragma("GCC unroll 64") for (int c = 0; c < @CHAINS@; c++) acc[c] = acc[c] * x + y;  \
    }                                                                                       \
    double t1 = kiln_probe_now();                                                           \
    float s = 0.0f;                                                                         \
    for (int c = 0; c < @CHAINS@; c++) s += acc[c][0] + acc[c][LANES - 1];                  \
    *sink = s;                                                                              \
    return t1 - t0;                                                                         \
  }

KILN_PROBE(4)
KILN_PROBE(8)
KILN_PROBE(16)
""".replace("@CHAINS@", str(CHAINS))


def datapath_from_rates(rates: dict[int, float], lanes: int) -> int:
    """The datapath in float32 lanes from measured FMA rates (lanes x instructions per second) by width:
    the widest width up to ``lanes`` reached by doubling from 4 while each doubling gains at least
    :data:`WIDER_GAIN`."""
    width = min(WIDTHS[0], lanes)
    for wide in WIDTHS[1:]:
        if wide > lanes or wide // 2 not in rates or wide not in rates:
            break
        if rates[wide] < WIDER_GAIN * rates[wide // 2]:
            break
        width = wide
    return width


def measure_rates(lib: ctypes.CDLL, widths: tuple[int, ...], rounds: int = ROUNDS) -> dict[int, float]:
    """Best FMA rate (lanes x instructions per second) of each width over ``rounds`` interleaved rounds
    (the order rotates each round); one call of each width first, untimed, to wake the vector units."""
    fns = {}
    for w in widths:
        fn = getattr(lib, f"kiln_fma_probe_{w}")
        fn.argtypes = [ctypes.c_int64, ctypes.c_float, ctypes.POINTER(ctypes.c_float)]
        fn.restype = ctypes.c_double
        fns[w] = fn
    sink = ctypes.c_float()
    for w in widths:
        fns[w](ITERATIONS // 4, 1.0, ctypes.byref(sink))
    best = {w: float("inf") for w in widths}
    for r in range(rounds):
        for i in range(len(widths)):
            w = widths[(i + r) % len(widths)]
            best[w] = min(best[w], fns[w](ITERATIONS, 1.0 + r, ctypes.byref(sink)))
    return {w: w * CHAINS * ITERATIONS / max(best[w], 1e-12) for w in widths}


def is_host_cpu(target: Target) -> bool:
    """True when ``target`` names this host's CPU (any thread count, the host's ISA level or a narrower
    one): the probe's answer applies to it."""
    if target.kind != "cpu":
        return False
    host = Target.host()
    return (
        target.arch == host.arch
        and target.device == host.device
        and target.vector_bytes <= host.vector_bytes
        and set(target.features) <= set(host.features)
    )


def probe_path() -> Path:
    key = gcc.cache_key(PROBE_C, PROBE_FLAGS)
    return module_cache.cache_root() / "probe" / f"datapath-{key[:32]}.json"


def _measure() -> dict:
    lib = ctypes.CDLL(str(gcc.compile_source(PROBE_C, PROBE_FLAGS)))
    widths = tuple(w for w in WIDTHS if w <= Target.host().vector_lanes_f32)
    rates = measure_rates(lib, widths)
    return {
        "datapath_lanes": datapath_from_rates(rates, Target.host().vector_lanes_f32),
        "rates": {str(w): r for w, r in rates.items()},
        "host": Target.host().key,
    }


@functools.cache
def _host_result() -> dict:
    path = probe_path()
    if not path.exists():  # first writer wins: every process uses one answer
        module_cache.write_first(path, json.dumps(_measure(), indent=1))
    try:
        result = json.loads(path.read_text())
        lanes = int(result["datapath_lanes"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KilnError(f"the FMA datapath probe's result {path} cannot be read ({exc}): delete it") from exc
    if lanes not in WIDTHS:
        raise KilnError(f"the FMA datapath probe's result {path} says {lanes} lanes: delete it")
    return result


def host_datapath_lanes(target: Target) -> int:
    """Float32 lanes one vector FMA of ``target`` processes per issue: measured for this host's CPU (at
    most the target's width), the register width for any other CPU target. A probe that cannot run (no C
    compiler) is logged and the register width used."""
    lanes = target.vector_lanes_f32
    if not is_host_cpu(target):
        return lanes
    try:
        return min(lanes, int(_host_result()["datapath_lanes"]))
    except (KilnError, OSError) as exc:
        log.warning("FMA datapath probe failed, assuming %d lanes: %s", lanes, exc)
        return lanes
