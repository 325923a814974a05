"""CompiledModel on the CPU (CompiledModel.from_funcs / load pick the CPU backend's CpuCompiledModel for a
host target): one ctypes call per run, buffer reuse, out=, input checks, save/load in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.backends.cpu.executor import STAGE_L2_FRACTION, CpuCompiledModel
from compiler.backends.cuda.executor import CudaCompiledModel
from compiler.errors import KilnError
from compiler.loopir.expr import Load, Var, call
from compiler.loopir.stmt import Buffer, BufferStore, For, PrimFunc
from compiler.runtime import BufferSpec, CompiledModel, KernelInfo, Launch

ROOT = Path(__file__).resolve().parents[3]
F32 = "float32"


def _ew(name: str, shapes: list[tuple[int, ...]], fn) -> PrimFunc:
    """out[i] = fn(*ins[i]) over flat buffers (all inputs have the output's element count)."""
    bufs = [Buffer(f"in{k}", s, F32) for k, s in enumerate(shapes[:-1])] + [Buffer("out", shapes[-1], F32)]
    n = int(np.prod(shapes[-1]))
    i = Var("i")
    flat = [Buffer(b.name, (n,), F32) for b in bufs]
    body = For(i, n, BufferStore(flat[-1], (i,), fn(*[Load(b, (i,)) for b in flat[:-1]])))
    return PrimFunc(name, flat, body, len(flat) - 1)


def make_model(w: np.ndarray | None = None) -> CompiledModel:
    funcs = [
        _ew("scale_bias", [(32,), (32,), (32,)], lambda x, w: x * 2.0 + w),
        _ew("expo", [(32,), (32,)], lambda t: call("exp", t)),
        _ew("plus_one", [(32,), (32,)], lambda u: u + 1.0),
        _ew("minus_one", [(32,), (32,)], lambda x: x - 1.0),
    ]
    buffers = [
        BufferSpec(0, "x", (4, 8), F32, "input"),
        BufferSpec(1, "w", (4, 8), F32, "param"),
        BufferSpec(2, "t", (4, 8), F32, "intermediate"),
        BufferSpec(3, "t_flat", (32,), F32, "intermediate", alias_of=2),
        BufferSpec(4, "u", (32,), F32, "intermediate"),
        BufferSpec(5, "y", (32,), F32, "output"),
        BufferSpec(6, "z", (4, 8), F32, "output"),
    ]
    launches = [
        Launch("scale_bias", [0, 1, 2]),
        Launch("expo", [3, 4]),
        Launch("plus_one", [4, 5]),
        Launch("minus_one", [0, 6]),
    ]
    if w is None:
        w = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    kernels = [
        KernelInfo(f.name, workload_key=f"wk-{f.name}", sketch="pointwise", config={"vector": 1})
        for f in funcs
    ]
    return CompiledModel.from_funcs(
        "toy", funcs, buffers, launches, {1: w}, [0], ["x"], [5, 6], kernels=kernels
    )


def reference(x: np.ndarray) -> list[np.ndarray]:
    w = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    return [(np.exp((x * 2 + w).astype(np.float64)) + 1).reshape(32), x - 1]


@pytest.fixture(scope="module")
def model() -> CompiledModel:
    return make_model()


def test_the_core_picks_the_cpu_model_and_checks_params(model: CompiledModel):
    assert type(model) is CpuCompiledModel
    with pytest.raises(TypeError, match="abstract"):
        CompiledModel(*[None] * 10)  # the core has no launch step of its own
    with pytest.raises(KilnError, match=r"param 'w': expected shape \(4, 8\), got \(32,\)"):
        make_model(np.zeros(32, np.float32))


def test_run_matches_numpy(model: CompiledModel):
    assert "void kiln_run(void** buffers)" in model.source
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    y, z = model.run([x])
    ry, rz = reference(x)
    np.testing.assert_allclose(y, ry, rtol=1e-6)
    np.testing.assert_array_equal(z, rz)
    y2, _ = model.run({"x": x})
    np.testing.assert_array_equal(y, y2)
    assert model.plan.summary()["naive_bytes"] == 256


def test_results_are_not_overwritten_unless_asked(model: CompiledModel):
    a, b = np.zeros((4, 8), np.float32), np.ones((4, 8), np.float32)
    ya, _ = model.run([a])
    model.run([b])
    np.testing.assert_allclose(ya, reference(a)[0], rtol=1e-6)
    fast1 = model.run([a], copy=False)
    fast2 = model.run([b], copy=False)
    assert fast1[0] is fast2[0]  # the model's own buffer, reused


def test_run_writes_into_fresh_arrays_and_recycles_only_dropped_ones(model: CompiledModel):
    a, b = np.zeros((4, 8), np.float32), np.ones((4, 8), np.float32)
    kept = model.run([a])
    view = model.run([a])[1][:2]  # only a view of the second call's output survives
    seen = set()
    for _ in range(6):
        y = model.run([b])
        assert not np.shares_memory(y[0], kept[0]) and not np.shares_memory(y[1], kept[1])
        assert not np.shares_memory(y[1], view) and y[0].ctypes.data % 64 == 0
        assert model._slots[model.outputs[0]] == y[0].ctypes.data  # the kernel wrote into the array returned
        seen.add(y[0].ctypes.data)
    assert len(seen) <= 2  # dropped results are reused: a loop allocates nothing after its first calls
    np.testing.assert_allclose(kept[0], reference(a)[0], rtol=1e-6)
    np.testing.assert_array_equal(view, reference(a)[1][:2])
    np.testing.assert_allclose(y[0], reference(b)[0], rtol=1e-6)


def test_an_input_changed_in_place_is_read_again(model: CompiledModel):
    x = np.zeros((4, 8), np.float32)
    out = [np.empty(32, np.float32), np.empty((4, 8), np.float32)]
    model.run([x], out=out)
    x[:] = 3.0
    np.testing.assert_array_equal(model.run([x], out=out)[1], x - 1)
    np.testing.assert_array_equal(model.run([x])[1], x - 1)
    y = x[:, ::-1]  # not contiguous: bound through a copy, whatever array was bound before
    np.testing.assert_array_equal(model.run([y])[1], y - 1)


def test_out_arrays(model: CompiledModel):
    x = np.full((4, 8), 0.5, np.float32)
    out = [np.empty(32, np.float32), np.empty((4, 8), np.float32)]
    res = model.run([x], out=out)
    assert res[0] is out[0] and res[1] is out[1]
    np.testing.assert_array_equal(out[1], x - 1)
    with pytest.raises(KilnError, match=r"out\[0\] \('y'\): expected float32\[32\], got float64\[32\]"):
        model.run([x], out=[np.empty(32), out[1]])
    with pytest.raises(KilnError, match="C-contiguous"):
        model.run([x], out=[np.empty(64, np.float32)[::2], out[1]])
    with pytest.raises(KilnError, match="overlaps an input"):
        model.run([out[1]], out=[out[0], out[1]])


def test_bad_inputs_are_clear_errors(model: CompiledModel):
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(KilnError, match=r"input 'x': expected float32\[4, 8\], got float64\[4, 8\]"):
        model.run([x.astype(np.float64)])
    with pytest.raises(KilnError, match=r"input 'x': expected float32\[4, 8\], got float32\[8, 4\]"):
        model.run([x.reshape(8, 4)])
    with pytest.raises(KilnError, match="missing input"):
        model.run({})
    with pytest.raises(KilnError, match="unknown input"):
        model.run({"x": x, "q": x})
    with pytest.raises(KilnError, match="expected 1 input"):
        model.run([x, x])
    # a non-contiguous input is accepted (copied)
    xt = np.asfortranarray(x + 1)
    np.testing.assert_array_equal(model.run([xt])[1], x)


def test_timeit(model: CompiledModel):
    stats = model.timeit([np.zeros((4, 8), np.float32)], repeats=5, warmup=1)
    assert len(stats["samples_us"]) == 5 and stats["median_us"] > 0


LOADER = """
import json, sys
import numpy as np
from compiler.runtime import CompiledModel
m = CompiledModel.load(sys.argv[1])
x = np.arange(32, dtype=np.float32).reshape(4, 8) / 32
y, z = m.run([x])
info = {"y": y.tolist(), "z": z.tolist(), "lib": str(m.library.path)}
info["kernels"] = [k.sketch for k in m.kernels]
print(json.dumps(info))
"""


def _load_in_fresh_process(directory: Path, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), KILN_CACHE_DIR=str(cache))
    proc = subprocess.run(
        [sys.executable, "-c", LOADER, str(directory)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_save_load_round_trip_in_a_fresh_process(model: CompiledModel, tmp_path: Path):
    d = tmp_path / "toy"
    model.save(d)
    assert sorted(p.name for p in d.iterdir()) == ["manifest.json", "model.c", "model.so", "params.npz"]
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["memory_plan"]["naive_bytes"] == 256
    assert manifest["kernels"][0] == {
        "name": "scale_bias",
        "workload_key": "wk-scale_bias",
        "sketch": "pointwise",
        "config": {"vector": 1},
    }
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 32
    want = model.run([x])
    got = _load_in_fresh_process(d, tmp_path / "cache1")
    assert got["lib"] == str(d / "model.so")  # the saved library was used
    assert got["kernels"] == ["pointwise"] * 4
    np.testing.assert_array_equal(np.float32(got["y"]), want[0])
    np.testing.assert_array_equal(np.float32(got["z"]), want[1])
    # a library built on another machine (intact, but its -march=native code may not run here) is not
    # loaded: the model is rebuilt from the saved source
    manifest["built_on"] = "another machine"
    (d / "manifest.json").write_text(json.dumps(manifest))
    got = _load_in_fresh_process(d, tmp_path / "cache2")
    assert got["lib"].startswith(str(tmp_path / "cache2"))
    np.testing.assert_array_equal(np.float32(got["y"]), want[0])


def test_load_refuses_unknown_format_version(model: CompiledModel, tmp_path: Path):
    d = tmp_path / "toy"
    model.save(d)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["format_version"] = 99
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(KilnError, match="format version 99"):
        CompiledModel.load(d)


def test_load_by_backend(model: CompiledModel, tmp_path: Path):
    d = tmp_path / "toy"
    model.save(d)
    assert type(CpuCompiledModel.load(d, num_threads=1)) is CpuCompiledModel
    with pytest.raises(KilnError, match="holds a cpu model, not a cuda one"):
        CudaCompiledModel.load(d)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["format"] = "kiln-tpu-model"
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(KilnError, match="no backend for target kind 'tpu'"):
        CompiledModel.load(d)
    (d / "manifest.json").write_text(json.dumps({**manifest, "format": "something else"}))
    with pytest.raises(KilnError, match="is not a Kiln compiled model"):
        CompiledModel.load(d)


def test_bind_runs_on_arrays_bound_once(model: CompiledModel):
    x = np.zeros((4, 8), np.float32)
    out = [np.empty(32, np.float32), np.empty((4, 8), np.float32)]
    call = model.bind([x], out=out)
    assert call()[1] is out[1]
    np.testing.assert_array_equal(out[1], x - 1)
    x[:] = 2.0  # the contents change, the binding stays
    other = model.run([np.ones((4, 8), np.float32)])  # another call binds other arrays in between
    np.testing.assert_array_equal(call()[1], np.full((4, 8), 1.0, np.float32))
    np.testing.assert_allclose(out[0], reference(x)[0], rtol=1e-6)
    np.testing.assert_array_equal(other[1], np.zeros((4, 8), np.float32))
    own = model.bind([np.arange(32, dtype=np.float32).reshape(4, 8)[:, ::-1]])  # not contiguous: copied
    np.testing.assert_array_equal(own()[1], np.arange(32, dtype=np.float32).reshape(4, 8)[:, ::-1] - 1)
    with pytest.raises(KilnError, match="input 'x'"):
        model.bind([np.zeros((4, 8))])


def test_out_overlapping_an_input_is_refused_after_any_earlier_call(model: CompiledModel):
    x = np.zeros((4, 8), np.float32)
    out = [np.empty(32, np.float32), np.empty((4, 8), np.float32)]
    model.run([x], out=out)  # out checked against x and remembered
    model.run([out[1]])  # out[1] becomes the input
    with pytest.raises(KilnError, match="overlaps an input"):
        model.run([out[1]], out=out)


def _misaligned(x: np.ndarray, offset: int) -> np.ndarray:
    """A C-contiguous copy of ``x`` starting ``offset`` bytes past a 64-byte boundary."""
    raw = np.empty(x.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    view = raw[start : start + x.nbytes].view(x.dtype).reshape(x.shape)
    view[...] = x
    assert view.flags.c_contiguous and view.ctypes.data % 64 == offset
    return view


@pytest.mark.parametrize("offset", [4, 16, 1])  # 1: not even float-aligned (numpy allows it)
def test_misaligned_inputs_are_read_through_an_aligned_copy_refreshed_every_call(offset: int):
    model = make_model()  # its own: the staging state starts empty
    x = _misaligned(np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32), offset)
    for _ in range(2):  # the same array again: the fast path must still copy it
        y, z = model.run([x])
        np.testing.assert_allclose(y, reference(x)[0], rtol=1e-6)
        np.testing.assert_array_equal(z, x - 1)
        assert model._slots[model.inputs[0]] % 64 == 0  # the kernels read an aligned copy
        x[:] += 1.0  # changed in place between calls
    out = [np.empty(32, np.float32), np.empty((4, 8), np.float32)]
    np.testing.assert_array_equal(model.run([x], out=out)[1], x - 1)
    call = model.bind([x])
    np.testing.assert_array_equal(call()[1], x - 1)
    x[:] = 5.0
    np.testing.assert_array_equal(call()[1], np.full((4, 8), 4.0, np.float32))
    model.run([np.zeros((4, 8), np.float32)])  # another call binds other arrays in between
    x[:] = -2.0
    np.testing.assert_array_equal(call()[1], np.full((4, 8), -3.0, np.float32))
    np.testing.assert_allclose(call()[0], reference(x)[0], rtol=1e-6)
    samples = model.timeit([x], repeats=2, warmup=1)["samples_us"]
    assert len(samples) == 2


def test_aligned_inputs_are_bound_in_place(model: CompiledModel):
    x = _misaligned(np.zeros((4, 8), np.float32), 0)
    model.run([x])
    assert model._slots[model.inputs[0]] == x.ctypes.data


def test_misaligned_inputs_over_the_staging_limit_are_read_in_place():
    model = make_model()
    model._stage_limit = 64  # below the input's 128 bytes
    x = _misaligned(np.arange(32, dtype=np.float32).reshape(4, 8), 16)
    np.testing.assert_array_equal(model.run([x])[1], x - 1)
    assert model._slots[model.inputs[0]] == x.ctypes.data
    assert make_model()._stage_limit == int(make_model().target.l2_bytes * STAGE_L2_FRACTION) >= 128
