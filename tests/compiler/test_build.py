"""compile(): every built-in model on the CPU matches the reference; memory planning; save/load."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from compiler.build import compile as kiln_compile
from compiler.build import plan_model
from compiler.frontend.models import MODELS, get_model
from compiler.reference import random_inputs, run_reference


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_matches_reference_on_cpu(name):
    graph = get_model(name)
    model = kiln_compile(graph, "cpu")
    for seed in (0, 1):
        inputs = random_inputs(graph, seed)
        for out, ref in zip(model.run(inputs), run_reference(graph, inputs)):
            assert out.shape == ref.shape and out.dtype == ref.dtype
            assert float(np.abs(out - ref).max()) <= 1e-4 * float(np.abs(ref).max())


def test_memory_plan_reuses_intermediates_on_encoder_layer():
    model = kiln_compile("encoder_layer", "cpu")
    assert 0 < model.plan.peak_bytes < model.plan.naive_bytes


def test_kernel_provenance_recorded():
    model = kiln_compile("mlp", "cpu")
    assert all(k.extra["origin"] == "default" and k.workload_key for k in model.kernels)
    plan = plan_model("mlp", "cpu")
    assert plan.coverage == (0, len(plan.kernels))


def test_save_load_in_a_fresh_process(tmp_path):
    graph = get_model("attention")
    model = kiln_compile(graph, "cpu")
    model.save(tmp_path / "m")
    inputs = random_inputs(graph, 5)
    np.savez(tmp_path / "in.npz", x=inputs[0])
    expect = model.run(inputs)[0]
    code = (
        "import numpy as np; from compiler.runtime import CompiledModel\n"
        f"m = CompiledModel.load({str(tmp_path / 'm')!r})\n"
        f"x = np.load({str(tmp_path / 'in.npz')!r})['x']\n"
        f"np.save({str(tmp_path / 'out.npy')!r}, m.run({{'x': x}})[0])\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expect)


def test_graph_output_that_is_an_input_gets_copied():
    from compiler.builder import GraphBuilder

    b = GraphBuilder("passthrough")
    x = b.input("x", (3, 4))
    g = b.build([b.relu(x), x])
    outs = kiln_compile(g, "cpu").run([np.ones((3, 4), np.float32)])
    assert outs[1].shape == (3, 4) and (outs[1] == 1).all()
