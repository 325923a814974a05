"""The throwaway PostgreSQL of the tests (tests/postgres.py) leaves no server behind when the test run is
stopped with SIGTERM in the middle of a test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOLD = """
import os, time
from pathlib import Path
from tests import postgres

postgres_server = postgres.postgres_server


def test_hold(postgres_server):
    base = Path(postgres_server.executor.datadir).parent
    info = Path(os.environ["KILN_PG_INFO"])
    tmp = info.with_name(info.name + ".tmp")
    tmp.write_text(f"{postgres_server.port} {base}")
    os.replace(tmp, info)  # whole or absent: the waiting test reads it as soon as it exists
    time.sleep(120)
"""


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_leaves_no_server(tmp_path: Path) -> None:
    (tmp_path / "test_hold.py").write_text(HOLD)
    info = tmp_path / "info"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILN_PG_INFO": str(info)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_hold.py")]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not info.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert info.exists(), proc.communicate(timeout=30)[0]
        port_text, base = info.read_text().split()
        port = int(port_text)
        assert _listening(port) and Path(base).is_dir()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while (_listening(port) or Path(base).exists()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _listening(port), "the PostgreSQL server outlived the SIGTERMed test run"
        assert not Path(base).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
