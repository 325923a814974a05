"""The C thread pool that runs the CPU target's ``parallel`` loops: one pool per process.

Generated code outlines each parallel loop into ``static void F(void* ctx, int64_t lo, int64_t hi)`` (the
loop over ``[lo, hi)``) plus a context struct of what the body uses, and calls
``kiln_parallel_for(F, &ctx, extent)``. The pool itself is a small runtime library (:data:`POOL_C`, built
once into the kernel cache, keyed by its code like any library) that
:func:`compiler.backends.cpu.gcc.load_pool_runtime` loads ``RTLD_GLOBAL`` before any kernel library (the
tuner's measurement worker loads the same file first). A library with parallel loops carries only
:data:`CLIENT_C`: its ``kiln_set_num_threads`` and a ``kiln_parallel_for`` that calls the runtime's one
exported function (:data:`ENTRY`) with the library's thread count. So every model in a process shares one
set of workers, as every OpenMP region shares libgomp's. (Until issue 17's pool round each library carried
a pool of its own: a process calling two models in turn, A B A B, had the other model's worker spinning
its ``SPIN_US`` beside the caller and its own worker on 2 cores: mlp, rmsnorm, layernorm and resblock calls
took 1.86x, 2.13x, 1.35x and 1.61x as long as alone, 0.98-1.02x with one pool; benchmarks/cpu_pools.md.)

Semantics (a static schedule with stealing):

* the iterations are cut into ``min(extent, CHUNKS_PER_THREAD * threads, 31)`` balanced chunks; thread t of
  the loop (the caller is 0) owns a contiguous range of them and claims its own chunks lowest first, so
  back-to-back loops over the same rows give each core the rows it had last time (OpenMP's static schedule
  does the same, and on the development host a dynamic claim order made rmsnorm's chunks slower);
* a thread that has run its own chunks claims the highest unclaimed chunk of another thread's range;
* the calling thread publishes the loop, wakes the workers that sleep and runs its chunks; it then waits
  only for the chunks a worker has already claimed. A worker that is descheduled (a busy machine) when a
  loop starts claims nothing, so the caller runs its chunks instead of waiting at a barrier for that thread;
* after a loop, workers spin for ``KILN_POOL_SPIN_US`` microseconds (environment, default ``SPIN_US``) of
  their own running time (a gap while descheduled does not count), then sleep on a futex; the caller makes
  the ``futex_wake`` call only when some sleep. A futex wake-up costs tens of microseconds on a KVM guest:
  without the spin the caller ran most chunks of a loop before the worker arrived;
* a worker never spins nor takes chunks on the caller's CPU (the two would only take turns, and a spinning
  worker there halves the caller's speed): it moves itself to another CPU of its affinity mask (its mask
  without that CPU for a moment, then the whole mask again: a nudge, not a pin; at most once a
  millisecond), and while the loop has unclaimed chunks yields and looks again; it sleeps if it cannot
  move. On the loaded 2-core machine the scheduler otherwise kept a worker woken by the caller on the
  caller's CPU;
* ``threads`` of a loop = what the calling library's ``kiln_set_num_threads(n)`` last set (caller
  included; each library keeps its own), else the CPUs of the process's affinity mask; the loop uses
  ``threads - 1`` workers. The pool starts workers lazily (named ``kiln-pool``), as many as the largest
  ``threads - 1`` asked so far, and keeps them while the process lives (the runtime is never unloaded;
  its destructor joins them at exit). A kernel library may be ``dlclose``d once its calls have returned:
  a worker runs a library's code only inside one of its loops, and a loop returns only when every chunk
  has finished (a late worker's claim fails, below);
* fork-safe: a ``pthread_atfork`` child handler forgets the parent's workers, and the child starts its own
  on its first parallel loop (the tuner's measurement workers are spawned, not forked; `kiln bench` and
  the tests fork);
* a loop entered while another thread is running one on the pool (two Python threads calling models, the
  same or different ones) runs serially in its caller; nested parallel loops are printed serial (as with
  OpenMP);
* a worker's claim is one compare-and-swap on a 64-bit word ``generation << 32 | bitmask of claimed
  chunks``, so a worker that wakes up late can never run a chunk of a newer loop with an older loop's
  context.

Kernels with non-temporal stores call ``kiln_sfence()`` at the end of each chunk, before the chunk is
counted as finished, so the caller sees the stored data once it returns.
"""

from __future__ import annotations

CHUNKS_PER_THREAD = 4  # chunks per thread: small enough per-chunk overhead, a short tail under load
# default spin of an idle worker after a loop before it sleeps, in microseconds of its own running time
# (libgomp's workers spin too, GOMP_SPINCOUNT). With 0 every loop waited for a futex wake-up (tens of us on
# the KVM development host): rmsnorm ran at its 1-thread speed. Compare with
# KILN_POOL_SPIN_US=N python scripts/bench_cpu_kernels.py --runtimes
SPIN_US = 300
# the runtime's exported function; the suffix is the calling convention's version (change it when the
# signature changes, so a library never calls a runtime it was not printed for)
ENTRY = "kiln_pool_parallel_for_v1"

POOL_C = r"""/* kiln thread pool runtime (compiler/backends/cpu/pool.py): one per process */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

typedef void (*kiln_task_fn)(void*, int64_t, int64_t);

#define KILN_POOL_MAX 256
#define KILN_CHUNKS_PER_THREAD @CHUNKS@
#define KILN_CLOSED 0xFFFFFFFFu  /* being set up: never a loop's state, as bit 31 is no chunk's */
#define KILN_MAX_CHUNKS 31       /* one bit each in the claim word */
#define KILN_DESCHEDULED_NS 50000L

static struct {
  int cpus;                     /* threads of a loop that asks for 0: the process's CPUs (0: not read) */
  int started;                  /* workers running */
  int atfork;                   /* child handler registered */
  long spin_ns;
  uint32_t born;                /* generation of the last loop before the workers being created */
  pthread_t workers[KILN_POOL_MAX];
  pthread_mutex_t lock;         /* starting and stopping workers */
  /* shared words, accessed with __atomic builtins only */
  uint64_t claim;               /* generation << 32 | bit i set: chunk i claimed (all set while set up) */
  kiln_task_fn fn;
  void* ctx;
  int64_t extent;
  int chunks, finished;
  int team;                     /* threads that own a range of the current loop: caller + active workers */
  int active;                   /* workers that take part in the current loop: its threads - 1 */
  int caller_cpu;               /* the CPU of the thread that started the current loop */
  uint32_t wake;                /* futex word, bumped for every loop */
  int sleepers, stop, busy;
} kiln_pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .caller_cpu = -1};

static inline void kiln_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static long kiln_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* On the caller's CPU, move this worker to another CPU of its affinity mask (the mask without that CPU
   for a moment, then the whole mask again: a nudge, not a pin), at most once a millisecond; the scheduler
   otherwise keeps a worker woken by the caller on the caller's CPU on a busy machine. True when the worker
   is still beside the caller (it should not spin there nor take chunks). */
static int kiln_crowded(long* nudged) {
  int cpu = __atomic_load_n(&kiln_pool.caller_cpu, __ATOMIC_RELAXED);
  if (sched_getcpu() != cpu) return 0;
  long now = kiln_now_ns();
  if (now - *nudged < 1000000L) return 1;
  *nudged = now;
  cpu_set_t all, others;
  pthread_t self = pthread_self();
  if (cpu < 0 || cpu >= CPU_SETSIZE || pthread_getaffinity_np(self, sizeof all, &all) != 0) return 1;
  others = all;
  CPU_CLR(cpu, &others);
  if (CPU_COUNT(&others) == 0 || pthread_setaffinity_np(self, sizeof others, &others) != 0) return 1;
  pthread_setaffinity_np(self, sizeof all, &all);
  return sched_getcpu() == cpu;
}

/* claim and run chunks of loop generation g until none is left or another loop started: first the
   chunks of thread me's own range (lowest first: the same rows as in the last loop, still in this core's
   caches), then the highest unclaimed chunk of another thread's range (the end its owner reaches last) */
static void kiln_pool_work(uint32_t g, int me) {
  for (;;) {
    uint64_t w = __atomic_load_n(&kiln_pool.claim, __ATOMIC_ACQUIRE);
    if ((uint32_t)(w >> 32) != g) return;
    if ((uint32_t)w == KILN_CLOSED) {  /* the caller is still setting loop g up: wait, do not give up on
                                          it (a worker that returned here skipped the whole loop) */
      kiln_pause();
      continue;
    }
    int n = __atomic_load_n(&kiln_pool.chunks, __ATOMIC_ACQUIRE);
    int team = __atomic_load_n(&kiln_pool.team, __ATOMIC_ACQUIRE);
    uint32_t all = (1u << n) - 1u;
    uint32_t free = ~(uint32_t)w & all;
    if (free == 0) return;
    int lo = me < team ? me * n / team : n, hi = me < team ? (me + 1) * n / team : n;
    uint32_t mine = hi <= lo ? 0u : hi - lo >= 32 ? 0xFFFFFFFFu : ((1u << (hi - lo)) - 1u) << lo;
    uint32_t own = free & mine;
    int i = own ? __builtin_ctz(own) : 31 - __builtin_clz(free);
    kiln_task_fn fn = __atomic_load_n(&kiln_pool.fn, __ATOMIC_ACQUIRE);
    void* ctx = __atomic_load_n(&kiln_pool.ctx, __ATOMIC_ACQUIRE);
    int64_t extent = __atomic_load_n(&kiln_pool.extent, __ATOMIC_ACQUIRE);
    /* the word unchanged since it was read: these fields are loop g's */
    if (!__atomic_compare_exchange_n(&kiln_pool.claim, &w, w | (1u << i), 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
      continue;
    if (me == 0) __atomic_store_n(&kiln_pool.caller_cpu, sched_getcpu(), __ATOMIC_RELAXED);  /* it moved? */
    fn(ctx, (int64_t)i * extent / n, ((int64_t)i + 1) * extent / n);
    __atomic_fetch_add(&kiln_pool.finished, 1, __ATOMIC_RELEASE);
  }
}

/* loop generation g is running and has unclaimed chunks */
static int kiln_pool_open(uint32_t g) {
  uint64_t w = __atomic_load_n(&kiln_pool.claim, __ATOMIC_ACQUIRE);
  int n = __atomic_load_n(&kiln_pool.chunks, __ATOMIC_ACQUIRE);
  uint32_t all = (1u << n) - 1u;  /* closed: being set up, its chunks are all to come */
  return (uint32_t)(w >> 32) == g && ((uint32_t)w == KILN_CLOSED || (~(uint32_t)w & all) != 0);
}

static void* kiln_pool_worker(void* arg) {
  int id = (int)(intptr_t)arg;
  uint32_t seen = kiln_pool.born;  /* the loop being set up when this worker was created is new to it */
  long nudged = 0;
  for (;;) {
    long budget = kiln_pool.spin_ns, last = kiln_now_ns();
    int spins = 0;
    for (;;) {
      if (__atomic_load_n(&kiln_pool.stop, __ATOMIC_ACQUIRE)) return NULL;
      uint32_t g = (uint32_t)(__atomic_load_n(&kiln_pool.claim, __ATOMIC_ACQUIRE) >> 32);
      if (g != seen) {
        if (id < __atomic_load_n(&kiln_pool.active, __ATOMIC_ACQUIRE) && kiln_crowded(&nudged)) {
          /* beside the caller: let it run, and look again (a nudge a millisecond later may have moved
             this worker) while the loop still has unclaimed chunks */
          if (kiln_pool_open(g)) {
            sched_yield();
            continue;
          }
        } else if (id < __atomic_load_n(&kiln_pool.active, __ATOMIC_ACQUIRE)) {
          kiln_pool_work(g, id + 1);
        }
        seen = g;
        budget = kiln_pool.spin_ns;
        last = kiln_now_ns();
        continue;
      }
      kiln_pause();
      /* every microsecond or so: stop after spinning spin_ns, or at once on the caller's CPU (spinning
         there would take half of the caller's time). Only time this thread ran counts: a gap over
         KILN_DESCHEDULED_NS between two looks means it was descheduled (a busy machine), and a worker
         that slept through its spin on the run queue would otherwise miss the next loop and need a wake */
      if ((++spins & 63) == 0) {
        long t = kiln_now_ns();
        if (t - last < KILN_DESCHEDULED_NS) budget -= t - last;
        last = t;
        if (budget <= 0 || kiln_crowded(&nudged)) break;
      }
    }
    /* sleep until the next loop: read the futex word, announce, check again, wait */
    uint32_t s = __atomic_load_n(&kiln_pool.wake, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&kiln_pool.sleepers, 1, __ATOMIC_SEQ_CST);
    if ((uint32_t)(__atomic_load_n(&kiln_pool.claim, __ATOMIC_SEQ_CST) >> 32) == seen &&
        !__atomic_load_n(&kiln_pool.stop, __ATOMIC_SEQ_CST))
      syscall(SYS_futex, &kiln_pool.wake, FUTEX_WAIT_PRIVATE, s, NULL, NULL, 0);
    __atomic_fetch_sub(&kiln_pool.sleepers, 1, __ATOMIC_SEQ_CST);
  }
}

static void kiln_pool_forget(void) {  /* in a forked child: the parent's workers do not exist here */
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  kiln_pool.lock = fresh;
  kiln_pool.started = 0;
  __atomic_store_n(&kiln_pool.sleepers, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.busy, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.stop, 0, __ATOMIC_RELAXED);
}

static int kiln_pool_default_threads(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* threads of a loop that asks for ``threads`` (0: the process's CPUs); workers up to threads - 1 started
   (fewer if the system refuses threads). Called by the caller that holds the pool (busy). */
static int kiln_pool_ready(int threads) {
  if (threads <= 0) {
    threads = __atomic_load_n(&kiln_pool.cpus, __ATOMIC_RELAXED);
    if (threads <= 0) {
      threads = kiln_pool_default_threads();
      __atomic_store_n(&kiln_pool.cpus, threads, __ATOMIC_RELAXED);
    }
  }
  if (threads > KILN_POOL_MAX) threads = KILN_POOL_MAX;
  if (threads - 1 > kiln_pool.started) {
    pthread_mutex_lock(&kiln_pool.lock);
    if (!kiln_pool.atfork) {
      pthread_atfork(NULL, NULL, kiln_pool_forget);
      kiln_pool.atfork = 1;
      const char* spin = getenv("KILN_POOL_SPIN_US");
      kiln_pool.spin_ns = 1000L * (spin ? atol(spin) : @SPIN_US@);
      if (kiln_pool.spin_ns < 0) kiln_pool.spin_ns = 0;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* signals go to the process's own threads */
    kiln_pool.born = (uint32_t)(__atomic_load_n(&kiln_pool.claim, __ATOMIC_RELAXED) >> 32);
    while (kiln_pool.started < threads - 1) {
      pthread_t t;
      if (pthread_create(&t, NULL, kiln_pool_worker, (void*)(intptr_t)kiln_pool.started) != 0) break;
      pthread_setname_np(t, "kiln-pool");  /* what top -H and /proc/PID/task/TID/comm show */
      kiln_pool.workers[kiln_pool.started++] = t;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_mutex_unlock(&kiln_pool.lock);
  }
  int workers = threads - 1 < kiln_pool.started ? threads - 1 : kiln_pool.started;
  __atomic_store_n(&kiln_pool.active, workers, __ATOMIC_RELEASE);
  return workers + 1;
}

/* at process exit (or if the runtime were ever unloaded): stop and join the workers */
__attribute__((destructor)) static void kiln_pool_stop(void) {
  if (kiln_pool.started == 0) return;
  __atomic_store_n(&kiln_pool.stop, 1, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&kiln_pool.wake, 1, __ATOMIC_SEQ_CST);
  syscall(SYS_futex, &kiln_pool.wake, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
  for (int i = 0; i < kiln_pool.started; i++) pthread_join(kiln_pool.workers[i], NULL);
  kiln_pool.started = 0;
  __atomic_store_n(&kiln_pool.stop, 0, __ATOMIC_SEQ_CST);
}

/* the one entry point: run fn over [0, extent) with ``threads`` threads (caller included; 0: the process's
   CPUs), as the module docstring of compiler/backends/cpu/pool.py says */
__attribute__((visibility("default"))) void @ENTRY@(kiln_task_fn fn, void* ctx, int64_t extent, int threads) {
  if (extent <= 0) return;
  if (extent == 1 || threads == 1 || __atomic_exchange_n(&kiln_pool.busy, 1, __ATOMIC_ACQUIRE)) {
    fn(ctx, 0, extent);  /* one iteration, one thread, or another thread's loop is running on the pool */
    return;
  }
  threads = kiln_pool_ready(threads);
  if (threads <= 1) {
    fn(ctx, 0, extent);
    __atomic_store_n(&kiln_pool.busy, 0, __ATOMIC_RELEASE);
    return;
  }
  int64_t n = (int64_t)threads * KILN_CHUNKS_PER_THREAD;
  if (n > KILN_MAX_CHUNKS) n = KILN_MAX_CHUNKS;
  if (n > extent) n = extent;
  uint32_t g = (uint32_t)(__atomic_load_n(&kiln_pool.claim, __ATOMIC_RELAXED) >> 32) + 1;
  /* close the word first: a late worker of the last loop fails its claim before any field changes */
  __atomic_store_n(&kiln_pool.claim, ((uint64_t)g << 32) | KILN_CLOSED, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&kiln_pool.fn, fn, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.ctx, ctx, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.extent, extent, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.chunks, (int)n, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.team, threads, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.finished, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.caller_cpu, sched_getcpu(), __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.claim, (uint64_t)g << 32, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&kiln_pool.wake, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&kiln_pool.sleepers, __ATOMIC_SEQ_CST) > 0)
    syscall(SYS_futex, &kiln_pool.wake, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
  kiln_pool_work(g, 0);  /* every chunk is claimed when this returns: wait only for the workers' ones */
  for (int spins = 0; __atomic_load_n(&kiln_pool.finished, __ATOMIC_ACQUIRE) < n; spins++) {
    if (spins < 4096) kiln_pause(); else sched_yield();
  }
  __atomic_store_n(&kiln_pool.busy, 0, __ATOMIC_RELEASE);
}
"""


def runtime_source() -> str:
    """The C text of the pool's runtime library (built once per process by
    :func:`compiler.backends.cpu.gcc.load_pool_runtime`; its one exported function is :data:`ENTRY`)."""
    return (
        POOL_C.replace("@CHUNKS@", str(CHUNKS_PER_THREAD))
        .replace("@SPIN_US@", str(SPIN_US))
        .replace("@ENTRY@", ENTRY)
    )


# printed into each library that has a parallel loop: the library's thread count and the call into the
# process's one pool (a symbol that the runtime library, loaded RTLD_GLOBAL first, defines)
CLIENT_C = """\
/* kiln thread pool client (compiler/backends/cpu/pool.py): the pool is the process's runtime library */
#include <stdint.h>
typedef void (*kiln_task_fn)(void*, int64_t, int64_t);
extern void @ENTRY@(kiln_task_fn fn, void* ctx, int64_t extent, int threads);
static int kiln_threads;  /* threads of this library's loops, caller included; 0: the process's CPUs */
void kiln_set_num_threads(int n) {
  if (n > 0) __atomic_store_n(&kiln_threads, n, __ATOMIC_RELAXED);
}
static inline void kiln_parallel_for(kiln_task_fn fn, void* ctx, int64_t extent) {
  @ENTRY@(fn, ctx, extent, __atomic_load_n(&kiln_threads, __ATOMIC_RELAXED));
}
""".replace("@ENTRY@", ENTRY)

SERIAL_C = """\
/* no parallel loop in this library: kiln_set_num_threads has nothing to set */
void kiln_set_num_threads(int n) { (void)n; }
"""
