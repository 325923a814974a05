"""Supervised worker processes for measurement: spawned, killed on a timeout, restarted after a crash.

A worker is a ``spawn`` process (never ``fork``: the parent may hold threads) that runs ``entry(conn,
*args)``; the entry calls :func:`serve` with a handler. The protocol over the pipe is one request, one
reply. The worker puts itself in its own process group, so killing it also kills what it started (gcc).
A worker that does not answer before its deadline is killed (:class:`WorkerTimeout`); one that dies
(segfault, abort, ``os._exit``) raises :class:`WorkerDied` naming the signal or exit status. Either way the
next request restarts it. A worker is killed when its parent dies (Linux ``PR_SET_PDEATHSIG``), so a hung
kernel never outlives the tuner. Only processes started here are ever signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

_CTX = mp.get_context("spawn")


class WorkerDied(Exception):
    """The worker process exited while handling a request."""


class WorkerTimeout(Exception):
    """The worker did not answer before the deadline (it has been killed)."""


def describe_exit(exitcode: int | None) -> str:
    """'killed by SIGSEGV' / 'exited with status 3' for a process exit code."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def serve(conn: Connection, handle: Callable[[Any], Any]) -> None:
    """The worker side: announce readiness, then answer each request with ``handle(request)`` until
    the parent sends ``None`` or goes away. An exception in ``handle`` is answered as
    ``("error", traceback text)`` and the worker keeps serving."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    _die_with_parent()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        try:
            reply = handle(request)
        except Exception:  # the handler's bug must not take the worker down
            reply = ("error", traceback.format_exc(limit=8))
        conn.send(reply)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies, so a hung kernel never outlives the tuner."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent is already gone
            os._exit(1)


class Worker:
    """One supervised worker process (see the module docstring)."""

    def __init__(
        self,
        entry: Callable[..., None],
        args: tuple[Any, ...] = (),
        name: str = "kiln-worker",
        start_timeout: float = 120.0,
    ) -> None:
        self.entry, self.args, self.name, self.start_timeout = entry, args, name, start_timeout
        self.process: Any = None
        self.conn: Connection | None = None
        self.restarts = -1  # number of starts after the first

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive() and self.conn is not None

    def spawn(self) -> None:
        """Start the process (does not wait for it to be ready)."""
        self.kill()
        parent, child = _CTX.Pipe()
        self.process = _CTX.Process(target=self.entry, args=(child, *self.args), name=self.name, daemon=True)
        self.process.start()
        child.close()
        self.conn = parent
        self.restarts += 1

    def wait_ready(self) -> None:
        """Wait for the worker's 'ready' message (raises WorkerDied if it fails to start)."""
        assert self.conn is not None
        try:
            reply = self.recv(self.start_timeout)
        except WorkerTimeout:
            raise WorkerDied(f"{self.name} did not start within {self.start_timeout:.0f} s") from None
        if not (isinstance(reply, tuple) and reply and reply[0] == "ready"):
            self.kill()
            raise WorkerDied(f"{self.name} sent {reply!r} instead of 'ready'")

    def ensure(self) -> None:
        """Make sure the worker is running and ready."""
        if not self.alive:
            self.spawn()
            self.wait_ready()

    def send(self, request: Any) -> None:
        assert self.conn is not None
        try:
            self.conn.send(request)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            self.process.join(1.0)
            code = self.process.exitcode
            self.kill()
            raise WorkerDied(f"{self.name} {describe_exit(code)}") from exc

    def recv(self, timeout: float | None) -> Any:
        """The next reply; kills the worker on timeout or when it has died."""
        assert self.conn is not None
        try:
            ready = self.conn.poll(timeout)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self.kill()
            raise WorkerTimeout(f"{self.name} did not answer within {timeout:.3g} s")
        try:
            return self.conn.recv()
        except (EOFError, OSError, ConnectionResetError):
            self.process.join(5.0)
            code = self.process.exitcode
            self.kill()
            raise WorkerDied(f"{self.name} {describe_exit(code)}") from None

    def call(self, request: Any, timeout: float | None) -> Any:
        """Send one request and wait for its reply (the worker is started or restarted if needed).
        If the wait is interrupted (Ctrl-C), the worker is killed so no stale reply is ever read."""
        self.ensure()
        try:
            self.send(request)
            return self.recv(timeout)
        except (WorkerDied, WorkerTimeout):
            raise
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """Kill the worker and everything in its process group (no-op when not running)."""
        p, self.process = self.process, None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if p is None:
            return
        if p.is_alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.kill()
        p.join(5.0)

    def close(self, timeout: float = 2.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive:
            try:
                self.conn.send(None)  # type: ignore[union-attr]
                self.process.join(timeout)
            except OSError:
                pass
        self.kill()


class WorkerPool:
    """Several workers serving a queue of jobs, each with its own deadline."""

    def __init__(
        self, size: int, entry: Callable[..., None], args: tuple[Any, ...] = (), name: str = "kiln-worker"
    ) -> None:
        self.workers = [Worker(entry, args, f"{name}-{i}") for i in range(max(1, size))]

    def start(self) -> None:
        """Start every worker that is not running, concurrently, and wait until all are ready."""
        starting = [w for w in self.workers if not w.alive]
        for w in starting:
            w.spawn()
        for w in starting:
            w.wait_ready()

    def run(
        self, jobs: Sequence[Any], prepare: Callable[[int, Any], Any], timeouts: Sequence[float]
    ) -> list[tuple[str, Any]]:
        """Run ``jobs`` on free workers; ``prepare(worker_index, job)`` makes the request sent for a job.

        Returns one outcome per job, in order: ``("ok", reply)``, ``("timeout", message)`` (the worker was
        killed), ``("died", message)`` or ``("error", message)`` (the job could not be sent). Dead workers
        are restarted before they get the next job."""
        outcomes: list[tuple[str, Any] | None] = [None] * len(jobs)
        busy: dict[int, tuple[int, float]] = {}  # worker -> (job, deadline)
        try:
            self._run(jobs, prepare, timeouts, outcomes, busy)
        except BaseException:  # interrupted (Ctrl-C): busy workers would answer late, so they go
            for w in busy:
                self.workers[w].kill()
            raise
        return [o if o is not None else ("died", "not run") for o in outcomes]

    def _run(
        self,
        jobs: Sequence[Any],
        prepare: Callable[[int, Any], Any],
        timeouts: Sequence[float],
        outcomes: list[tuple[str, Any] | None],
        busy: dict[int, tuple[int, float]],
    ) -> None:
        pending = deque(range(len(jobs)))
        while pending or busy:
            for w, worker in enumerate(self.workers):
                if w in busy or not pending:
                    continue
                j = pending.popleft()
                try:
                    worker.ensure()
                    worker.send(prepare(w, jobs[j]))
                except WorkerDied as exc:
                    outcomes[j] = ("died", str(exc))
                    continue
                except Exception as exc:  # e.g. a job that cannot be pickled: only this job fails
                    outcomes[j] = ("error", f"cannot send the job: {type(exc).__name__}: {exc}")
                    continue
                busy[w] = (j, time.monotonic() + timeouts[j])
            if not busy:
                continue
            now = time.monotonic()
            wait_for = max(0.0, min(d for _, d in busy.values()) - now)
            conns = {self.workers[w].conn: w for w in busy}
            ready = wait(list(conns), timeout=wait_for)
            for conn in ready:
                w = conns[conn]  # type: ignore[index]
                j, _ = busy.pop(w)
                try:
                    outcomes[j] = ("ok", self.workers[w].recv(0))
                except (WorkerDied, WorkerTimeout) as exc:
                    outcomes[j] = ("died", str(exc))
            now = time.monotonic()
            for w, (j, deadline) in list(busy.items()):
                if deadline <= now:
                    busy.pop(w)
                    self.workers[w].kill()
                    outcomes[j] = ("timeout", f"no answer within {timeouts[j]:.3g} s")

    def close(self) -> None:
        for w in self.workers:
            w.close()
