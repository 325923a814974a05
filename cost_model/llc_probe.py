"""How much of the last-level cache the host CPU's kernels really get, measured.

The analytic prior prices a store by whether the nest's data stays cached (streaming stores pay only when
it does not) and counts DRAM traffic past the last-level cache (:class:`cost_model.store_features.Machine`).
The size sysfs reports is the wrong figure in a VM: an AMD host reports one CCD's L3 (32 MiB, all of it a
core reaches), while an Intel VM of 2 vCPUs reports the whole socket's L3 (480 MiB on the development Xeon)
that the host's other tenants share. :func:`host_llc_bytes` measures it instead: a small C kernel sweeps a
float32 buffer in place (read, FMA, write), for buffer sizes doubling from :data:`FIRST_OVER_L2` x the L2
up to where the rate has fallen onto the DRAM plateau (:func:`on_plateau`, at most :data:`MAX_BYTES`), best
of :data:`ROUNDS` timings each. The effective LLC is where the rate crosses the geometric mean of the first
size's rate (in cache) and the last size's (DRAM), interpolated in log-log between the two sizes around the
crossing (:func:`llc_from_rates`). A curve with no such fall (at least :data:`MIN_DROP` x) has no cache edge
in the range: the prior then keeps its guess (:func:`guessed_llc_bytes`).

On the development Xeon the rate holds ~59 GB/s to 32 MiB, 51-56 at 64 MiB, 26-37 at 128 MiB and 32-34
beyond: 82-92 MiB over six probes, between sysfs's 480 MiB and the 32 MiB guess. The answer is measured once
per host (about a second and a half; one buffer at a time, up to 256 MiB where the plateau starts by 128 MiB,
at most :data:`MAX_BYTES`) and kept beside the FMA datapath probe's
(``$KILN_CACHE_DIR/probe/``, keyed by the probe's source, gcc and the host CPU; first writer wins, so every
process of a tuning run uses one value). A target that is not this host's CPU gets the guess.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import logging
import math
import os
from pathlib import Path

import numpy as np

from compiler.backends.cpu import gcc
from compiler.backends.cpu.datapath import is_host_cpu
from compiler.errors import KilnError
from compiler.runtime import module_cache
from compiler.target import Target

log = logging.getLogger(__name__)

FIRST_OVER_L2 = 4  # the first buffer is this many times the per-core L2 (clear of it, in the LLC if any)
MAX_BYTES = 1 << 30  # the largest buffer swept (also at most an eighth of the memory)
SWEEP_BYTES = 256 << 20  # bytes one timing sweeps at least (several passes over a small buffer)
ROUNDS = 3  # timings per size, the best kept
MIN_DROP = 1.5  # a curve whose last rate is not this much below its first has no cache edge in range
PLATEAU = 0.8  # two sizes MIN_DROP x below the first rate, the second within this of the first: DRAM reached

PROBE_C = r"""/* kiln effective-LLC probe (cost_model/llc_probe.py) */
#include <stdint.h>
#include <time.h>

static double kiln_probe_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double kiln_llc_sweep(float* restrict a, int64_t n, int64_t passes) {
  double t0 = kiln_probe_now();
  for (int64_t p = 0; p < passes; p++) {
    for (int64_t i = 0; i < n; i++) a[i] = a[i] * 0.999f + 1e-3f;
    __asm__ volatile("" : : "r"(a) : "memory");  /* every pass reads and writes the buffer again */
  }
  return kiln_probe_now() - t0;
}
"""


def guessed_llc_bytes(target: Target) -> int:
    """The prior's LLC when none is measured: one AMD CCD's L3, ``max(16 x L2, 32 MiB)``."""
    return max(16 * target.l2_bytes, 32 << 20)


def on_plateau(rates: dict[int, float]) -> bool:
    """True when the last two sizes of ``rates`` (bytes -> bytes per second, in sweep order) both run
    :data:`MIN_DROP` x below the first size's rate and the last within :data:`PLATEAU` of the one before:
    past the cache."""
    values = list(rates.values())
    if len(values) < 3:
        return False
    first, before, last = values[0], values[-2], values[-1]
    return MIN_DROP * max(before, last) < first and last >= PLATEAU * before


def llc_from_rates(rates: dict[int, float]) -> int | None:
    """The effective LLC in bytes from sweep rates (buffer bytes -> bytes per second, increasing sizes):
    where the rate crosses the geometric mean of the first (cached) and the last (DRAM) rates, interpolated
    in log-log between the last size above it and the first below; None when the last rate is not
    :data:`MIN_DROP` x below the first (no cache edge in the range)."""
    sizes = sorted(rates)
    if len(sizes) < 2:
        return None
    cached, dram = rates[sizes[0]], rates[sizes[-1]]
    if not (cached > 0 and dram > 0) or cached < MIN_DROP * dram:
        return None
    edge = math.sqrt(cached * dram)
    for small, big in itertools.pairwise(sizes):
        r_small, r_big = rates[small], rates[big]
        if r_big < edge <= r_small:
            frac = math.log(r_small / edge) / math.log(r_small / r_big)
            return int(2 ** (math.log2(small) + frac * math.log2(big / small)))
    return None


def sweep_sizes(l2_bytes: int, limit: int) -> list[int]:
    """The buffer sizes swept: doubling from :data:`FIRST_OVER_L2` x the L2 (rounded up to a power of two)
    to ``limit``."""
    size = 1 << max(20, (FIRST_OVER_L2 * max(1, l2_bytes) - 1).bit_length())
    out = []
    while size <= limit:
        out.append(size)
        size *= 2
    return out


def measure_rates(sweep, sizes: list[int]) -> dict[int, float]:
    """Bytes per second (read + written) of ``sweep(buffer, passes) -> seconds`` over each size, best of
    :data:`ROUNDS` after one untimed pass, stopping once :func:`on_plateau`."""
    rates: dict[int, float] = {}
    for size in sizes:
        buf = np.ones(size // 4, dtype=np.float32)
        passes = max(1, -(-SWEEP_BYTES // size))
        sweep(buf, 1)
        best = min(sweep(buf, passes) for _ in range(ROUNDS))
        rates[size] = 2.0 * size * passes / max(best, 1e-12)
        del buf
        if on_plateau(rates):
            break
    return rates


def probe_path() -> Path:
    key = gcc.cache_key(PROBE_C, gcc.FLAGS)
    return module_cache.cache_root() / "probe" / f"llc-{key[:32]}.json"


def _memory_limit() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return MAX_BYTES
    return min(MAX_BYTES, max(64 << 20, total // 8))


def _measure() -> dict:
    lib = ctypes.CDLL(str(gcc.compile_source(PROBE_C, gcc.FLAGS)))
    fn = lib.kiln_llc_sweep
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_double

    def sweep(buf: np.ndarray, passes: int) -> float:
        return fn(buf.ctypes.data, buf.size, passes)

    host = Target.host()
    rates = measure_rates(sweep, sweep_sizes(host.l2_bytes, _memory_limit()))
    return {
        "llc_bytes": llc_from_rates(rates),
        "rates": {str(s): r for s, r in rates.items()},
        "host": host.key,
    }


@functools.cache
def _host_result() -> dict:
    path = probe_path()
    if not path.exists():  # first writer wins: every process uses one answer
        module_cache.write_first(path, json.dumps(_measure(), indent=1))
    try:
        result = json.loads(path.read_text())
        llc = result["llc_bytes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KilnError(f"the LLC probe's result {path} cannot be read ({exc}): delete it") from exc
    if llc is not None and (not isinstance(llc, int) or llc <= 0):
        raise KilnError(f"the LLC probe's result {path} says {llc!r} bytes: delete it")
    return result


def host_llc_bytes(target: Target) -> int:
    """The last-level cache the analytic prior prices ``target`` with: measured for this host's CPU (the
    guess when the sweep found no cache edge), :func:`guessed_llc_bytes` for any other CPU. A probe that
    cannot run (no C compiler) is logged and the guess used."""
    guess = guessed_llc_bytes(target)
    if not is_host_cpu(target):
        return guess
    try:
        llc = _host_result()["llc_bytes"]
    except (KilnError, OSError) as exc:
        log.warning("LLC probe failed, assuming %d MiB: %s", guess >> 20, exc)
        return guess
    return guess if llc is None else int(llc)
