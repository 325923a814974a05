"""Edge guards unswitched out of inner loops (compiler.loopir.unswitch) and the C target's use of it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from compiler.backends import get_backend
from compiler.backends.cpu.codegen import generate_c, unswitched
from compiler.builder import GraphBuilder
from compiler.errors import CompileError, ScheduleError
from compiler.loopir.expr import Load, Var, const
from compiler.loopir.stmt import Buffer, BufferStore, For, IfThenElse, walk_stmts
from compiler.loopir.unswitch import unswitch_guards
from compiler.target import Target
from tests.compiler.backends.cpu.util import build, run
from tuner.task import extract_tasks


def gemm_func(m: int, k: int = 64, n: int = 64, **knobs):
    b = GraphBuilder(f"gemm{m}")
    task = extract_tasks(b.build([b.matmul(b.input("a", (m, k)), b.input("w", (k, n)))]), Target.host())[0]
    config = {**task.default(), **knobs}
    func = get_backend(task.target).lower(task.sketch.build(task.group, config, task.target).func)
    func.name = f"gemm{m}"
    return func


def test_a_guard_invariant_in_the_inner_loop_versions_the_outer_body():
    """for t { for k { if (t < 5) y[t] += x[k] } } -> for t { if (t < 5) { for k { y[t] += x[k] } } else
    { the guarded copy } }; a guard that depends on k stays where it is."""
    x, y = Buffer("x", (8,), "float32"), Buffer("y", (8,), "float32")
    t, k = Var("t"), Var("k")
    add = BufferStore(y, (t,), Load(y, (t,)) + Load(x, (k,)))
    inner = For(k, 8, IfThenElse(t.lt(5), add), "serial")
    out = unswitch_guards(For(t, 8, inner, "serial"))
    assert isinstance(out, For) and isinstance(out.body, IfThenElse) and out.body.else_ is not None
    fast = out.body.then
    assert isinstance(fast, For) and isinstance(fast.body, BufferStore)  # the guard is gone there
    assert out.body.else_ is inner  # the edge tiles run the code as lowered
    kept = For(t, 8, For(k, 8, IfThenElse(k.lt(5), add), "serial"), "serial")
    assert unswitch_guards(kept) is kept
    memory = For(t, 8, For(k, 8, IfThenElse(Load(x, (t,)).gt(const(0.0)), add), "serial"), "serial")
    assert unswitch_guards(memory) is memory  # a data-dependent guard is not invariant


def test_a_gemm_with_an_edge_panel_runs_its_whole_tiles_unguarded():
    """M 100 under 8-row tiles of 8-tile panels: the micro-kernel is versioned, the fast copy's k loop has
    no row guard, and the result is numpy's. M 96 (whole panels) has nothing to version."""
    func = gemm_func(100, mr=8, mc_tiles=8)
    versions = [x for x in walk_stmts(unswitched(func).body) if isinstance(x, IfThenElse) and x.else_]
    assert len(versions) == 1
    fast_k = next(x for x in walk_stmts(versions[0].then) if isinstance(x, For) and x.var.name == "k0")
    assert not any(isinstance(x, IfThenElse) for x in walk_stmts(fast_k.body))
    whole = gemm_func(96, mr=8, mc_tiles=4)
    assert unswitched(whole) is whole
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((100, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    src, lib = build([func])
    assert "else {" in src
    (out,) = run(func, a, w, lib=lib)
    np.testing.assert_allclose(out, a @ w, rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(m=st.integers(1, 70), mr=st.sampled_from([1, 2, 4, 6, 8]), mc=st.sampled_from([1, 2, 4]))
def test_every_edge_computes_numpys_product(m, mr, mc):
    try:
        func = gemm_func(m, k=24, n=40, mr=mr, mc_tiles=mc)
    except ScheduleError:
        assume(False)
    rng = np.random.default_rng(m)
    a, w = rng.standard_normal((m, 24)).astype(np.float32), rng.standard_normal((24, 40)).astype(np.float32)
    (out,) = run(func, a, w)
    np.testing.assert_allclose(out, a @ w, rtol=1e-4, atol=1e-4)


def test_the_switch_is_named_when_it_is_wrong(monkeypatch):
    func = gemm_func(100, mr=8, mc_tiles=8)
    monkeypatch.setenv("KILN_CPU_UNSWITCH", "0")
    assert unswitched(func) is func
    monkeypatch.setenv("KILN_CPU_UNSWITCH", "yes")
    with pytest.raises(CompileError, match=r"KILN_CPU_UNSWITCH='yes': expected 1 \(unswitch edge guards\)"):
        generate_c([func], Target.host())


def test_features_see_the_lowered_kernel_once():
    """Unswitching is code generation only: the lowered function the cost model reads has one copy."""
    func = gemm_func(100, mr=8, mc_tiles=8)
    assert not any(isinstance(x, IfThenElse) and x.else_ for x in walk_stmts(func.body))
