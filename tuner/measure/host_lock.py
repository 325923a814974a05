"""A host-wide lock around the timing of CPU candidates, so workers on one machine never time at once.

Several tuning workers on one machine share its cores: two kernels timed at the same moment slow each
other down (and each other's OpenMP threads), and both records would be wrong. The CPU runner holds an
exclusive ``fcntl`` lock on one file per machine while it runs (verifies and times) a batch; building is
not locked, so one worker compiles while another times. The lock is released by the kernel when its
holder dies, even by SIGKILL.

``$KILN_TIMING_LOCK`` names the lock file (default ``<tempdir>/kiln-cpu-timing.lock``, shared by every
user of the machine); ``off`` disables the lock (``scripts/bench_distributed.py`` uses it to show what
the lock prevents).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK_ENV = "KILN_TIMING_LOCK"


def lock_path() -> Path | None:
    """The lock file of this machine, or None when ``$KILN_TIMING_LOCK`` is ``off``."""
    value = os.environ.get(LOCK_ENV, "")
    if value.lower() == "off":
        return None
    return Path(value) if value else Path(tempfile.gettempdir()) / "kiln-cpu-timing.lock"


@contextlib.contextmanager
def host_timing_lock() -> Iterator[None]:
    """Hold the machine's timing lock for the block (waits while another process holds it)."""
    path = lock_path()
    if path is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        with contextlib.suppress(OSError):  # let other users' workers open it too
            os.fchmod(fd, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
