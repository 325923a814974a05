"""The module cache every backend builds into: keys, atomic writes, staged entries, compiler error text."""

from __future__ import annotations

import pytest

from compiler.runtime import module_cache
from compiler.runtime.module_cache import (
    ModuleCache,
    cache_key,
    compile_error_message,
    write_atomic,
    write_first,
)


def test_key_covers_source_options_extra_and_version(monkeypatch):
    base = cache_key("src", ("-O3",), "gcc 13", "c-2")
    assert base != cache_key("src ", ("-O3",), "gcc 13", "c-2")
    assert base != cache_key("src", ("-O2",), "gcc 13", "c-2")
    assert base != cache_key("src", ("-O3",), "gcc 14", "c-2")
    assert base == cache_key("src", ("-O3",), "gcc 13", "c-2")
    monkeypatch.setattr(module_cache, "CACHE_VERSION", "module-cache-next")
    assert base != cache_key("src", ("-O3",), "gcc 13", "c-2")


def test_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "a"))
    assert ModuleCache().directory == tmp_path / "a"
    assert ModuleCache("cuda").directory == tmp_path / "a" / "cuda"
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "b"))
    assert ModuleCache("cuda").path("0" * 64, ".cubin") == tmp_path / "b" / "cuda" / ("0" * 32 + ".cubin")


def test_put_get_and_atomic_write(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    cache = ModuleCache("x")
    key = cache_key("k")
    assert cache.get(key, ".bin") is None
    path = cache.put(key, ".bin", b"abc")
    assert cache.get(key, ".bin") == path and path.read_bytes() == b"abc"
    write_atomic(path, "replaced")
    assert path.read_text() == "replaced"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary files left


def test_the_first_written_file_stays_and_no_temporary_file_is_left(tmp_path):
    path = tmp_path / "probe" / "answer.json"
    write_first(path, "first")
    write_first(path, "second")  # a later writer (another process) does not replace it
    assert path.read_text() == "first"
    assert [p.name for p in path.parent.iterdir()] == ["answer.json"]


def test_stage_moves_every_file_or_none(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    cache = ModuleCache()
    key = cache_key("staged")
    with pytest.raises(RuntimeError, match="compiler failed"), cache.stage(key, ".c", ".so") as (c, _):
        c.write_text("source")
        raise RuntimeError("compiler failed")
    assert list(tmp_path.iterdir()) == []
    with cache.stage(key, ".c", ".so") as (c, so):
        c.write_text("source")
        so.write_bytes(b"lib")
    assert cache.get(key, ".c").read_text() == "source" and cache.get(key, ".so").read_bytes() == b"lib"
    assert len(list(tmp_path.iterdir())) == 2


def test_error_message_names_the_kernels_of_the_error_lines():
    source = "// prelude\nvoid first(float* x) {\n}\nvoid second(float* x) {\n  x[0] = nope;\n}\n"
    log = "kernel.c:5:10: error: 'nope' undeclared\nkernel.c:1:1: error: bad prelude\nsome note\n"
    patterns = {"kernel_pattern": r"^void (\w+)\(", "error_pattern": r"kernel\.c:(\d+):\d+: error"}
    msg = compile_error_message("gcc", source, log, **patterns)
    assert msg.splitlines()[0] == "gcc failed to compile kernel(s) second, prelude:"
    assert "'nope' undeclared" in msg and "some note" not in msg
    unknown = compile_error_message("nvcc", source, "it broke", **patterns, where=" (sm_90)")
    assert unknown == "nvcc failed to compile kernel(s) (unknown kernel) (sm_90):\nit broke"
