"""Every built-in model validates, decomposes and runs in the reference executor."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import ModelError
from compiler.frontend.models import MODELS, get_model
from compiler.passes import optimize
from compiler.reference import random_inputs, run_reference

EXPECTED = {
    "softmax",
    "softmax_large",
    "rmsnorm",
    "layernorm",
    "bias_gelu",
    "matmul",
    "mlp",
    "attention",
    "encoder_layer",
    "convnet",
    "resblock",
}


def test_zoo_has_every_model():
    assert set(MODELS) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_runs_and_decomposition_agrees(name):
    g = get_model(name).validate()
    d = optimize(g)
    inputs = random_inputs(g, seed=3)
    (ref,), (dec,) = run_reference(g, inputs), run_reference(d, inputs)
    assert np.isfinite(ref).all()
    assert float(ref.std()) > 1e-4 * max(1.0, float(np.abs(ref).max()))  # not collapsed to a constant
    assert float(np.abs(ref).max()) < 1e3  # params keep activations at a sane scale
    np.testing.assert_allclose(dec, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_models_are_deterministic():
    a = MODELS["mlp"].build()
    b = MODELS["mlp"].build()
    assert a.params_hash() == b.params_hash()


def test_unknown_model_lists_names():
    with pytest.raises(ModelError, match="softmax_large"):
        get_model("resnet9000")
