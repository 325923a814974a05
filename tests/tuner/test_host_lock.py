"""The machine-wide timing lock: a second process waits while the first holds it; ``off`` disables it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tuner.measure.host_lock import LOCK_ENV, host_timing_lock, lock_path

HOLD = """
import sys, time
from tuner.measure.host_lock import host_timing_lock
with host_timing_lock():
    print("held", flush=True)
    sys.stdin.readline()
"""
ROOT = Path(__file__).resolve().parents[2]


def test_another_process_waits_for_the_lock(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "timing.lock"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        import fcntl
        import os

        fd = os.open(tmp_path / "timing.lock", os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
            except BlockingIOError:
                taken = False
            assert not taken  # the holder has it
        finally:
            os.close(fd)
        holder.stdin.write("\n")  # type: ignore[union-attr]
        holder.stdin.flush()  # type: ignore[union-attr]
        holder.wait(timeout=30)
        with host_timing_lock():  # free again once the holder let go
            pass
    finally:
        if holder.poll() is None:
            holder.kill()


def test_lock_can_be_turned_off(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(LOCK_ENV, "off")
    assert lock_path() is None
    with host_timing_lock():
        time.sleep(0)
