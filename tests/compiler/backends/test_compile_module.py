"""Backend.compile_module (source -> loaded module through the shared module cache) and gcc's build into a
given path with a timeout, whose errors are split by kernel the way the tuner's builder blames candidates."""

from __future__ import annotations

import pytest

from compiler.backends import get_backend
from compiler.backends.cpu import gcc
from compiler.backends.cuda.device import CudaUnavailable, current_cuda_target
from compiler.errors import CompileError
from compiler.target import Target

ADD_ONE = (
    "void add_one(const float* restrict x, float* restrict y) {\n"
    "  for (int i = 0; i < 4; ++i) y[i] = x[i] + 1;\n}\n"
)
BROKEN = "\n".join(
    ["/* prelude */", "void cand3(float* x) {", "  bad;", "}", "void cand7(float* x) {", "  worse;", "}", ""]
)


def test_cpu_compile_module_is_a_cached_kernel_library(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    lib = get_backend("cpu").compile_module(ADD_ONE + "// compile_module\n", Target.host())
    assert isinstance(lib, gcc.KernelLibrary) and lib.path.parent == tmp_path
    assert lib.function("add_one", 2) is not None
    with pytest.raises(CompileError, match=r"gcc failed to compile kernel\(s\) cand3, cand7"):
        get_backend("cpu").compile_module(BROKEN, Target.host())


def test_cuda_compile_module_needs_cupy(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CUPY", "1")
    current_cuda_target.cache_clear()
    try:
        with pytest.raises(CudaUnavailable, match="CuPy is not installed"):
            get_backend("cuda").compile_module('extern "C" __global__ void k() {}\n', Target.cuda())
    finally:
        current_cuda_target.cache_clear()


def test_compile_to_writes_the_library_and_its_source(tmp_path):
    so = gcc.compile_to(ADD_ONE, tmp_path / "k.so", timeout=60)
    assert so.exists() and (tmp_path / "k.c").read_text() == ADD_ONE


def test_compile_to_errors_are_split_by_kernel(tmp_path):
    with pytest.raises(CompileError) as info:
        gcc.compile_to(BROKEN, tmp_path / "bad.so", timeout=60)
    message = str(info.value)
    assert message.startswith("gcc failed to compile kernel(s) cand3, cand7:")
    assert str(tmp_path) not in message
    split = gcc.errors_by_kernel(BROKEN, message)
    assert set(split) == {"cand3", "cand7"}
    assert split["cand3"].startswith("gcc failed to compile kernel(s) cand3:")
    assert "bad" in split["cand3"] and "worse" not in split["cand3"] and "worse" in split["cand7"]
    assert not (tmp_path / "bad.so").exists()


def test_compile_to_times_out(tmp_path, monkeypatch):
    slow = tmp_path / "slow-gcc"  # a "compiler" that never finishes
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setattr(gcc, "CC", str(slow))
    with pytest.raises(CompileError, match=r"gcc timed out after 0\.5 s"):
        gcc.compile_to(ADD_ONE, tmp_path / "k.so", timeout=0.5)
