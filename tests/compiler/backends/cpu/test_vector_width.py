"""The C printer takes its vector width from the target: no silent default."""

from __future__ import annotations

import dataclasses

import pytest

from compiler.backends.cpu.codegen import generate_c
from compiler.errors import CompileError
from compiler.loopir.expr import Load, Var
from compiler.loopir.stmt import Buffer, BufferStore, For, PrimFunc
from compiler.target import Target


def _vector_copy() -> PrimFunc:
    x, y = Buffer("x", (64,), "float32"), Buffer("y", (64,), "float32")
    i = Var("i")
    return PrimFunc("vcopy", [x, y], For(i, 64, BufferStore(y, (i,), Load(x, (i,))), "vectorized"), 1)


def test_vectorized_loop_without_a_target_is_an_error() -> None:
    with pytest.raises(CompileError, match=r"kernel 'vcopy': loop 'i' is vectorized .* pass the Target"):
        generate_c([_vector_copy()])


@pytest.mark.parametrize(("vector_bytes", "lanes"), [(64, 16), (32, 8), (16, 4)])
def test_vector_width_follows_the_target(vector_bytes: int, lanes: int) -> None:
    target = dataclasses.replace(Target.host(), vector_bytes=vector_bytes)
    src = generate_c([_vector_copy()], target)
    assert f"kiln_load_f32x{lanes}(" in src and f"kiln_store_f32x{lanes}(" in src
