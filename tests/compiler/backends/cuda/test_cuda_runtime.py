"""The cuda target without a GPU: Target.parse falls back to sm_90, models compile and save, running
says what is missing; kiln show/compile/run; compiler error messages name the kernel."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backends.cuda.device import CudaUnavailable, current_cuda_target, require_cupy
from compiler.backends.cuda.executor import CudaCompiledModel
from compiler.backends.cuda.nvrtc import error_message, kernel_spans
from compiler.build import compile as kiln_compile
from compiler.builder import GraphBuilder
from compiler.errors import KilnError
from compiler.runtime import CompiledModel
from compiler.target import Target
from tuner.cli import main


@pytest.fixture
def no_gpu(monkeypatch):
    """Behave as on a machine without CuPy (whatever this one has)."""
    monkeypatch.setenv("KILN_DISABLE_CUPY", "1")
    current_cuda_target.cache_clear()
    yield
    current_cuda_target.cache_clear()


def test_target_parse_falls_back_to_an_h100(no_gpu):
    t = Target.parse("cuda")
    assert t.key == "cuda/sm_90/NVIDIA H100 80GB HBM3" and t.max_shared_bytes_optin == 227 * 1024


def test_missing_cupy_says_how_to_install(no_gpu):
    with pytest.raises(
        CudaUnavailable,
        match=r'needs CuPy and an NVIDIA GPU: CuPy is not installed: pip install -e "\.\[cuda\]"',
    ):
        require_cupy()


def test_compile_for_cuda_saves_and_loads_without_a_gpu(no_gpu, tmp_path):
    model = kiln_compile("mlp", "cuda")
    assert isinstance(model, CudaCompiledModel)
    assert model.source.count('extern "C" __global__') == 3
    # the first GEMM (256x128x784: 2 tiles on 132 SMs) split in two along K by the rules (split-K edge)
    assert [launch.kernel for launch in model.launches] == ["g0_batch_matmul", "g1_reduce_sum", "g2_matmul"]
    assert model.kernel_launches["g0_batch_matmul"][0]["block"] == [16, 16, 1]
    model.save(tmp_path / "m")
    again = CompiledModel.load(tmp_path / "m")
    assert isinstance(again, CudaCompiledModel)
    assert again.source == model.source and again.kernel_launches == model.kernel_launches
    assert [b.to_json() for b in again.buffers] == [b.to_json() for b in model.buffers]
    with pytest.raises(CudaUnavailable, match=r'pip install -e "\.\[cuda\]"'):
        again.run({"x": np.zeros((256, 784), np.float32)})


def test_param_shapes_are_checked_as_on_the_cpu(no_gpu):
    model = kiln_compile("mlp", "cuda")
    fields = {
        "name": model.name,
        "target": model.target,
        "source": model.source,
        "kernels": model.kernels,
        "buffers": model.buffers,
        "launches": model.launches,
        "inputs": model.inputs,
        "input_names": model.input_names,
        "outputs": model.outputs,
        "kernel_launches": model.kernel_launches,
    }
    pid, arr = next(iter(model.params.items()))
    bad = {**model.params, pid: arr.reshape(-1)}
    with pytest.raises(KilnError, match=rf"param '{model.by_id[pid].name}': expected shape"):
        CudaCompiledModel(params=bad, **fields)


def test_output_that_is_an_input_gets_a_gpu_copy_kernel(no_gpu):
    b = GraphBuilder("passthrough")
    x = b.input("x", (3, 40))
    model = kiln_compile(b.build([b.relu(x), x]), "cuda")
    assert "copy_out1(" in model.source and "threadIdx.x" in model.source.split("copy_out1(")[1]


def test_kiln_show_code_for_cuda(capsys):
    assert main(["show", "--model", "softmax", "--stage", "code", "--target", "cuda"]) == 0
    out = capsys.readouterr().out
    assert 'extern "C" __global__ void __launch_bounds__(32) g0_reduce_max(' in out
    assert "__shfl_xor_sync" in out


def test_kiln_compile_then_run_without_gpu(no_gpu, tmp_path, capsys):
    assert main(["compile", "--model", "softmax", "--target", "cuda", "-o", str(tmp_path / "sm")]) == 0
    assert "cuda/sm_90" in capsys.readouterr().out
    assert (tmp_path / "sm" / "model.cu").exists()
    assert main(["run", str(tmp_path / "sm")]) == 2
    err = capsys.readouterr().err
    assert "CuPy is not installed" in err and 'pip install -e ".[cuda]"' in err
    assert len(err.strip().splitlines()) == 1, err


def test_compiler_errors_name_the_kernel():
    source = "\n".join(
        [
            "// prelude",
            'extern "C" __global__ void __launch_bounds__(32) first(float* x) {',
            "  x[0] = 1.0f;",
            "}",
            'extern "C" __global__ void __launch_bounds__(64) second(float* x) {',
            "  x[0] = undefined_thing;",
            "}",
        ]
    )
    assert kernel_spans(source) == [(2, "first"), (5, "second")]
    log = 'kiln.cu(6): error: identifier "undefined_thing" is undefined\n1 error detected'
    msg = error_message("NVRTC", source, log, "sm_90")
    assert msg.startswith("NVRTC failed to compile kernel(s) second (sm_90):")
    assert 'identifier "undefined_thing" is undefined' in msg
