"""`kiln compile/run --target cuda` with a (fake, in-process) CuPy: `kiln run --check` runs a CUDA model and
compares it with the numpy reference; an NVRTC that CuPy cannot load is one clear line, not a compile error
or a traceback."""

from __future__ import annotations

import pytest

from compiler.backends.cuda import nvrtc
from compiler.backends.cuda.codegen import kernel_names
from compiler.backends.cuda.device import CudaUnavailable, current_cuda_target, nvrtc_load_error
from compiler.backends.cuda.lower import kernel_parts
from compiler.build import plan_model
from compiler.errors import CompileError
from compiler.frontend.models import get_model
from compiler.loopir.stmt import PrimFunc
from compiler.target import Target
from tests.cli import kiln
from tests.compiler.backends.cuda import fake_cupy

LIBNVRTC_MISSING = (
    "CuPy failed to load libnvrtc.so.13: OSError: libnvrtc.so.13: cannot open shared object file: "
    "No such file or directory"
)


class DynamicLibNotFoundError(RuntimeError):
    """What cuda-pathfinder (CuPy 14) raises for a library it cannot find."""


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    fake_cupy.install(monkeypatch)
    monkeypatch.delenv("KILN_DISABLE_CUPY", raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(nvrtc, "_modules", {})
    current_cuda_target.cache_clear()
    fake_cupy.KERNELS.clear()
    fake_cupy.LAUNCHES.clear()
    yield fake_cupy
    current_cuda_target.cache_clear()


def _compile(tmp_path, model: str = "softmax") -> str:
    out = tmp_path / model
    result = kiln("compile", "--model", model, "--target", "cuda", "-o", str(out))
    assert result.returncode == 0, result.stderr
    target = Target.parse("cuda")
    for k in plan_model(get_model(model), target).kernels:  # the fake device learns the kernels' loop IR
        for name, part in zip(kernel_names(k.func), kernel_parts(k.func.body)):
            fake_cupy.KERNELS[name] = PrimFunc(name, k.func.params, part, k.func.num_inputs)
    return str(out)


def test_kiln_run_check_on_a_cuda_model(fake_gpu, tmp_path):
    path = _compile(tmp_path)
    result = kiln("run", path, "--check", "--repeats", "2")
    assert result.returncode == 0, result.stderr
    assert "on cuda/sm_90/Fake GPU" in result.stdout
    assert "max |err| / max |ref| vs the numpy reference" in result.stdout
    assert fake_gpu.LAUNCHES  # the kernels ran on the (fake) device


@pytest.mark.parametrize(
    "error",
    [RuntimeError(LIBNVRTC_MISSING), DynamicLibNotFoundError("Failure finding libnvrtc.so: not found")],
    ids=["cupy13", "cupy14-pathfinder"],
)
def test_nvrtc_that_cannot_load_is_one_clear_line(fake_gpu, tmp_path, monkeypatch, error):
    path = _compile(tmp_path)

    def fail(self):
        raise error

    monkeypatch.setattr(fake_cupy.RawModule, "compile", fail)
    expected = r'cannot load the NVRTC library libnvrtc .*pip install -e "\.\[cuda\]"'
    with pytest.raises(CudaUnavailable, match=expected):
        nvrtc.build('extern "C" __global__ void k() {}\n', "sm_90")
    result = kiln("run", path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "libnvrtc" in lines[0], result.stderr
    assert 'pip install -e ".[cuda]"' in lines[0]


def test_a_compile_error_is_not_mistaken_for_a_missing_library():
    assert nvrtc_load_error(RuntimeError('kiln.cu(3): error: identifier "x" is undefined')) is None
    assert nvrtc_load_error(OSError("libcublas.so.13: cannot open shared object file")) is None
    err = nvrtc_load_error(OSError("libnvrtc.so.13: cannot open shared object file"))
    assert isinstance(err, CudaUnavailable) and "\n" not in str(err)


def test_a_real_nvrtc_compile_error_stays_a_compile_error(fake_gpu, monkeypatch):
    def fail(self):
        raise RuntimeError('kiln.cu(1): error: identifier "oops" is undefined (NVRTC_ERROR_COMPILATION)')

    monkeypatch.setattr(fake_cupy.RawModule, "compile", fail)
    with pytest.raises(CompileError, match="k_bad"):
        nvrtc.build('extern "C" __global__ void k_bad() { oops; }\n', "sm_90")
