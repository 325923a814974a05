"""Run the `kiln` command line from tests: in process (fast) or, where a test needs a real process, as one.

``kiln(*args)`` calls :func:`tuner.cli.main` with ``args`` in this process, capturing what it writes to
stdout and stderr and its exit status (``SystemExit`` from argparse's ``--help`` and usage errors included),
and returns a :class:`subprocess.CompletedProcess`-like :class:`Result`. ``kiln_process(*args)`` runs
``python -m tuner.cli`` in a subprocess, for the few end-to-end tests that need one (a console entry
point, environment variables read at start-up, kill -9 in the middle of a run).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sqlite3
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    """What a `kiln` invocation did: exit status and captured output (like subprocess.CompletedProcess)."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def kiln(*args: str) -> Result:
    """Run ``kiln ARGS`` in this process; an unexpected exception becomes exit status 1 with its traceback
    on stderr, as the console script would show it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except Exception:
            traceback.print_exc()
            code = 1
    return Result(list(args), int(code or 0), out.getvalue(), err.getvalue())


def kiln_process(
    *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tuner.cli ARGS`` as a real process (from the repository root)."""
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def kiln_command(*args: str) -> list[str]:
    """The argv of ``python -m tuner.cli ARGS``, for tests that start the process themselves."""
    return [sys.executable, "-m", "tuner.cli", *args]


def kill_after_records(path: Path, *args: str, records: int = 8, limit_s: float = 120.0) -> int:
    """Run ``kiln ARGS`` as a real process writing the SQLite database at ``path``, SIGKILL its whole
    process group once ``records`` records are stored (or the process ended, or ``limit_s`` passed), and
    return how many records the database holds after the kill."""
    proc = subprocess.Popen(
        kiln_command(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            with contextlib.suppress(sqlite3.Error), sqlite3.connect(path) as c:
                if c.execute("select count(*) from kiln_records").fetchone()[0] >= records:
                    break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with sqlite3.connect(path) as c:
        return c.execute("select count(*) from kiln_records").fetchone()[0]
