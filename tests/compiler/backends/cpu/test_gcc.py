"""The gcc kernel cache: hits, concurrent builders, compile errors that name the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.pool import runtime_source
from compiler.errors import CompileError

ROOT = Path(__file__).resolve().parents[4]
SMALL = (
    "void add_one(const float* restrict x, float* restrict y) {\n"
    "  for (int i = 0; i < 64; ++i) y[i] = x[i] + 1;\n}\n"
)


def test_cache_hit_does_not_run_gcc(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    first = cbuild.compile_source(SMALL + "// hit\n")
    assert first.exists() and first.parent == tmp_path
    assert (tmp_path / (first.stem + ".c")).read_text() == SMALL + "// hit\n"

    def no_gcc(*args, **kwargs):
        raise AssertionError("gcc ran on a cache hit")

    monkeypatch.setattr(cbuild.subprocess, "Popen", no_gcc)
    assert cbuild.compile_source(SMALL + "// hit\n") == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_key_covers_flags_and_source():
    assert cbuild.cache_key(SMALL) != cbuild.cache_key(SMALL + " ")
    assert cbuild.cache_key(SMALL) != cbuild.cache_key(SMALL, (*cbuild.FLAGS, "-g"))


BUILDER = """
import sys
from compiler.backends.cpu import gcc as cbuild
lib = cbuild.build(sys.argv[1])
print(lib.path)
"""


def test_two_processes_build_the_same_kernel(tmp_path):
    source = (
        SMALL
        + "// concurrent\n"
        + "\n".join(f"static int pad{i}(int x) {{ return x + {i}; }}" for i in range(300))
    )
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen([sys.executable, "-c", BUILDER, source], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    runtime = cbuild.CACHE.path(cbuild.cache_key(runtime_source()), "").name  # the pool runtime
    assert sorted(p.suffix for p in tmp_path.iterdir() if p.stem != runtime) == [".c", ".so"]


def test_compile_error_names_the_kernel_and_quotes_gcc(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    bad = SMALL + "void broken_kernel(float* restrict y) {\n  y[0] = undefined_thing;\n}\n"
    with pytest.raises(CompileError) as info:
        cbuild.compile_source(bad)
    msg = str(info.value)
    assert "broken_kernel" in msg and "add_one" not in msg
    assert "undefined_thing" in msg and "error" in msg
    assert list(tmp_path.iterdir()) == []  # nothing half-written stays behind


def test_library_functions_and_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    import numpy as np

    src = SMALL + "static int threads;\nvoid kiln_set_num_threads(int n) { threads = n; }\n"
    src += "int threads_set(void) { return threads; }\n"
    lib = cbuild.build(src)
    lib.set_num_threads(3)
    assert lib.lib.threads_set() == 3
    x = np.arange(64, dtype=np.float32)
    y = np.empty_like(x)
    lib.function("add_one", 2)(x.ctypes.data, y.ctypes.data)
    assert (y == x + 1).all()
    with pytest.raises(CompileError, match="no_such_kernel"):
        lib.function("no_such_kernel")


def test_a_source_with_openmp_pragmas_is_built_with_openmp(tmp_path, monkeypatch):
    """The model.c of a model saved before the thread pool uses OpenMP: it still builds and loads."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    import numpy as np

    src = (
        "extern void omp_set_num_threads(int);\n"
        "void kiln_set_num_threads(int n) { if (n > 0) omp_set_num_threads(n); }\n"
        "void twice(const float* x, float* y) {\n"
        "#pragma omp parallel for schedule(static)\n"
        "  for (int i = 0; i < 64; ++i) y[i] = 2.0f * x[i];\n"
        "}\n"
    )
    assert "-fopenmp" in cbuild.flags_for(src) and "-fopenmp" not in cbuild.flags_for(SMALL)
    lib = cbuild.build(src)
    lib.set_num_threads(2)
    x = np.arange(64, dtype=np.float32)
    y = np.empty_like(x)
    lib.function("twice", 2)(x.ctypes.data, y.ctypes.data)
    assert (y == 2 * x).all()


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an orphan nobody reaped yet is dead)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the compiler's child")
def test_a_timed_out_compile_kills_what_gcc_started(tmp_path, monkeypatch):
    # a "compiler" whose real work happens in a child (as gcc's cc1 does) and never ends
    fake = tmp_path / "fake-gcc"
    pidfile = tmp_path / "child.pid"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cbuild, "CC", str(fake))
    with pytest.raises(CompileError, match="timed out"):
        cbuild.compile_to(SMALL, tmp_path / "k.so", timeout=1.0)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child), "the compiler's child process outlived the timeout"
