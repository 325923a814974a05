"""The tensor-core contraction sketch (``compiler/backends/cuda/sketches/tensorcore.py``) and the SIMT
interpreter's tensor-core semantics (``compiler/loopir/interp_simt_tc.py``): every legal config computes
the numpy reference (hypothesis), deliberately wrong lane mappings, a missing barrier or a missing
``cp.async`` wait are caught, TF32 is opt-in and keyed, the shape rule, and nvcc ``-cubin`` for sm_80 and
sm_90 (``-s`` prints the ptxas figures)."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.backends import sketch_for
from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.lower import lower_gpu_func
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.backends.cuda.sketches.tensorcore import CudaTensorCoreSketch, gemm_form
from compiler.builder import GraphBuilder
from compiler.errors import KilnError, ScheduleError
from compiler.fusion import fuse
from compiler.loopir import evaluate
from compiler.loopir.expr import Call, Var, const, substitute
from compiler.loopir.interp import InterpError
from compiler.loopir.interp_simt_tc import tf32_round
from compiler.loopir.stmt import Barrier, Intrinsic, PrimFunc, SeqStmt, Stmt, walk_stmts
from compiler.loopir.visitor import post_order
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.target import Target
from tests.compiler.backends.cuda.test_cuda_executor import fake_gpu, register  # noqa: F401
from tests.compiler.backends.cuda.util import CUDA, need_nvcc
from tests.compiler.property_graphs import inputs_for
from tuner.measure.check import RTOL, TF32_RTOL, compare

F16 = "float16"
BF16 = "bfloat16"
TF32 = CUDA.with_tf32()
RNG = np.random.RandomState(0)


def _group(graph):
    (group,) = [g for g in fuse(optimize(graph)).groups if not g.is_view]
    return group


def matmul(m: int, n: int, k: int, dtype: str = F16, ta: bool = False, tb: bool = False, epi: bool = True):
    b = GraphBuilder(f"mm_{m}_{n}_{k}_{dtype}_{int(ta)}{int(tb)}")
    a = b.input("a", (k, m) if ta else (m, k), dtype)
    w = b.input("w", (n, k) if tb else (k, n), dtype)
    y = b.matmul(a, w, transpose_a=ta, transpose_b=tb)
    if epi:
        y = b.relu(b.add(y, b.param("bias", np.linspace(-1, 1, n).astype(dtype))))
    return _group(b.build([y]))


def dense(m: int, n: int, k: int):
    b = GraphBuilder(f"dense_{m}_{n}_{k}")
    w = b.param("w", (RNG.randn(n, k) / 8).astype(np.float16))
    y = b.linear(b.input("x", (m, k), F16), w, b.param("bias", np.linspace(-1, 1, n).astype(np.float16)))
    return _group(b.build([y]))


def batch_matmul(bs: int, m: int, n: int, k: int, tb: bool = False):
    b = GraphBuilder(f"bmm_{bs}_{m}_{n}_{k}_{int(tb)}")
    w = b.input("w", (bs, n, k) if tb else (bs, k, n), F16)
    y = b.batch_matmul(b.input("a", (bs, m, k), F16), w, transpose_b=tb)
    return _group(b.build([b.relu(y)]))


GROUPS = {
    "matmul_tail": lambda: matmul(40, 48, 24),  # M, N, K tails: zero-filled chunks, guarded stores
    "matmul_ta": lambda: matmul(72, 40, 48, ta=True),  # A stored [k][m]: ldmatrix.trans
    "matmul_multi_k": lambda: matmul(32, 32, 136, epi=False),  # several K tiles through the pipeline
    "dense_bias": lambda: dense(72, 40, 64),  # B stored [n][k]: ldmatrix without .trans
    "batch_matmul": lambda: batch_matmul(3, 40, 32, 56),
    "batch_matmul_tb": lambda: batch_matmul(2, 32, 48, 40, tb=True),
    "matmul_large_tiles": lambda: matmul(256, 160, 32, epi=False),  # 256-wide tiles, grouped block order
}
_CACHE: dict = {}


def group(name: str):
    if name not in _CACHE:
        _CACHE[name] = GROUPS[name]()
    return _CACHE[name]


def run(func: PrimFunc, grp, target: Target = CUDA) -> str | None:
    """None when the interpreted kernel computes the reference within the tuner's check, else why not."""
    ins = inputs_for(grp)
    out = evaluate(func, ins)[0]
    ref = np.asarray(run_reference(grp.subgraph, ins)[0])
    return compare(out, ref, "out", target.tf32)


def build(grp, config: dict, target: Target = CUDA) -> PrimFunc:
    return lower_gpu_func(CudaTensorCoreSketch().build(grp, config, target).func)


def legal_configs(grp, target: Target = CUDA) -> list[dict]:
    """Every config of the sketch's space that its check accepts for ``grp`` on ``target``."""
    key = (grp.workload_key, target.key)
    if key not in _LEGAL:
        sketch = CudaTensorCoreSketch()
        knobs = sketch.space(grp, target)
        out = []
        for values in itertools.product(*(k.values for k in knobs)):
            config = dict(zip((k.name for k in knobs), values))
            try:
                sketch.check(grp, config, target)
            except ScheduleError:
                continue
            out.append(config)
        _LEGAL[key] = out
    return _LEGAL[key]


_LEGAL: dict = {}


# ----------------------------------------------------------------------------- selection and the rule
def test_the_sketch_takes_float16_gemms_and_leaves_the_rest():
    for name in GROUPS:
        assert sketch_for(group(name), CUDA).name == "tensorcore", name
    assert sketch_for(matmul(40, 36, 24), CUDA).name == "contraction"  # B rows of 36 halves: no 16 B chunks
    assert sketch_for(matmul(40, 48, 20), CUDA).name == "contraction"  # A rows of 20 halves
    assert sketch_for(matmul(32, 32, 32, "float32"), CUDA).name == "contraction"  # exact fp32 by default
    assert sketch_for(group("matmul_tail"), Target.cuda("sm_75", "Tesla T4")).name == "contraction"
    with pytest.raises(ScheduleError, match="sm_80 or newer"):
        sketch = CudaTensorCoreSketch()
        grp = group("matmul_tail")
        sketch.check(grp, sketch.default(grp, CUDA), Target.cuda("sm_75", "Tesla T4"))
    with pytest.raises(ScheduleError, match="multiple of 8"):
        gemm_form(matmul(40, 36, 24))


def test_tf32_is_opt_in_and_part_of_the_target_key():
    grp = matmul(48, 40, 64, "float32")
    assert sketch_for(grp, CUDA).name == "contraction"
    assert sketch_for(grp, TF32).name == "tensorcore"
    assert TF32.key == CUDA.key + "/tf32" and Target.parse(TF32.key) == TF32
    assert not CUDA.tf32 and Target.parse(CUDA.key) == CUDA
    text = generate_cuda([build(grp, CudaTensorCoreSketch().default(grp, TF32), TF32)], TF32)
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in text and "cvt.rna.tf32.f32" in text
    with pytest.raises(ScheduleError, match="TF32"):
        CudaTensorCoreSketch().check(grp, CudaTensorCoreSketch().default(grp, TF32), CUDA)


def test_tf32_round_is_round_to_nearest_ties_away():
    one = np.float32(1.0)
    ulp = np.float32(2.0**-10)  # TF32 spacing at 1
    x = np.array([one + ulp / 2, -(one + ulp / 2), one + ulp / 4, one + 3 * ulp / 4, np.inf], np.float32)
    assert list(tf32_round(x)) == [one + ulp, -(one + ulp), one, one + ulp, np.inf]


# ----------------------------------------------------------------------------- every config is right
@pytest.mark.parametrize("name", list(GROUPS))
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_legal_config_computes_the_reference(name, data):
    """Hypothesis draws from the legal configs (every combination the check accepts)."""
    grp = group(name)
    config = data.draw(st.sampled_from(legal_configs(grp)))
    assert run(build(grp, config), grp) is None, config


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_legal_tf32_config_computes_the_reference_within_the_tf32_tolerance(data):
    grp = group_tf32()
    config = data.draw(st.sampled_from(legal_configs(grp, TF32)))
    assert run(build(grp, config, TF32), grp, TF32) is None, config


def test_the_legal_spaces_are_large_and_cover_every_knob_value():
    seen: dict[str, set] = {}
    for name in GROUPS:
        legal = legal_configs(group(name))
        assert len(legal) >= 100, (name, len(legal))
        for c in legal:
            for k, v in c.items():
                seen.setdefault(k, set()).add(v)
    space = CudaTensorCoreSketch().space(group("dense_bias"), CUDA)
    assert seen == {k.name: set(k.values) for k in space}


def group_tf32():
    if "tf32" not in _CACHE:
        _CACHE["tf32"] = matmul(40, 48, 36, "float32", ta=True)
    return _CACHE["tf32"]


def group_bf16(name: str):
    """bfloat16 forms: the f16 fragment layout with the bf16 mma (tails; A stored [k][m])."""
    key = f"bf16_{name}"
    if key not in _CACHE:
        _CACHE[key] = {
            "tail": lambda: matmul(40, 48, 24, BF16),
            "ta": lambda: matmul(72, 40, 48, BF16, ta=True),
        }[name]()
    return _CACHE[key]


@pytest.mark.parametrize("name", ["tail", "ta"])
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_legal_bfloat16_config_computes_the_reference(name, data):
    grp = group_bf16(name)
    assert sketch_for(grp, CUDA).name == "tensorcore"
    config = data.draw(st.sampled_from(legal_configs(grp)))
    func = build(grp, config)
    assert any(isinstance(x, Intrinsic) and x.name == "mma_m16n8k16_bf16" for x in walk_stmts(func.body))
    assert run(func, grp) is None, config


def test_defaults_compute_the_reference():
    for name in GROUPS:
        grp = group(name)
        assert run(build(grp, CudaTensorCoreSketch().default(grp, CUDA)), grp) is None, name
    assert RTOL[F16] == 1e-2 and TF32_RTOL == 5e-3


def test_grouped_order_and_a_deep_pipeline_over_many_tiles():
    grp = matmul(256, 64, 96, epi=False)
    config = {"bm": 32, "bn": 32, "bk": 16, "warps_m": 2, "warps_n": 1, "stages": 4}
    config |= {"smem_layout": "pad", "group_m": 4, "min_blocks": 2}
    func = build(grp, config)
    assert func.attrs["launch"]["grid"] == [16, 1, 1]  # 8 block rows x 2 columns on one axis
    assert func.attrs["min_blocks_per_sm"] == 2
    assert run(func, grp) is None


# ----------------------------------------------------------------------------- wrong schedules are caught
SMALL = {"bm": 32, "bn": 32, "bk": 32, "warps_m": 1, "warps_n": 2, "stages": 3}
SMALL |= {"smem_layout": "xor", "group_m": 1, "min_blocks": 1}


def _mutate(func: PrimFunc, fn) -> PrimFunc:
    return PrimFunc(func.name, func.params, post_order(func.body, fn), func.num_inputs, dict(func.attrs))


def _lane_var(func: PrimFunc) -> Var:
    from compiler.loopir.stmt import For, walk_stmts

    return next(s.var for s in walk_stmts(func.body) if isinstance(s, For) and s.thread == "threadIdx.x")


@pytest.mark.parametrize("name", ["matmul_ta", "dense_bias"])
def test_a_wrong_ldmatrix_lane_mapping_gives_a_wrong_result(name):
    """Lanes 0-7 and 8-15 swap their row addresses: matrices 0 and 1 of each ldmatrix.x4 trade places
    (for A the row halves, for B the K halves), as a wrong fragment index in a schedule would."""
    grp = group(name)
    func = build(grp, SMALL)
    assert run(func, grp) is None
    tx = _lane_var(func)
    swapped = Call("xor", (tx, const(8)), "int32")

    def swap(s: Stmt) -> Stmt | None:
        if isinstance(s, Intrinsic) and s.name == "ldmatrix":
            off = substitute(s.offsets[1], {tx: swapped})
            return Intrinsic(s.name, s.buffers, (s.offsets[0], off), s.args)
        return None

    problem = run(_mutate(func, swap), grp)
    assert problem is not None and "max |error|" in problem


def test_a_wrong_mma_fragment_offset_gives_a_wrong_result():
    grp = group("dense_bias")
    func = build(grp, SMALL)

    def shift(s: Stmt) -> Stmt | None:  # B fragments of the next n8 tile (wrapped): the wrong columns
        if isinstance(s, Intrinsic) and s.name.startswith("mma_"):
            nb = s.buffers[2].shape[0]
            ob = (s.offsets[2] + 4) % nb
            return Intrinsic(s.name, s.buffers, (s.offsets[0], s.offsets[1], ob, s.offsets[3]), s.args)
        return None

    assert run(_mutate(func, shift), grp) is not None


def test_a_missing_barrier_is_a_data_race():
    grp = group("matmul_multi_k")
    func = build(grp, SMALL)

    def drop(s: Stmt) -> Stmt | None:
        if isinstance(s, SeqStmt) and any(isinstance(x, Barrier) for x in s.stmts):
            return SeqStmt([x for x in s.stmts if not isinstance(x, Barrier)])
        return None

    with pytest.raises(InterpError, match="data race"):
        run(_mutate(func, drop), grp)


def test_reading_a_tile_before_its_cp_async_wait_reads_stale_data():
    grp = group("matmul_multi_k")
    func = build(grp, SMALL)

    def no_wait(s: Stmt) -> Stmt | None:  # wait for nothing: the tile being computed has not landed
        if isinstance(s, Intrinsic) and s.name == "cp_async_wait":
            return Intrinsic(s.name, (), (), (const(SMALL["stages"]),))
        return None

    problem = run(_mutate(func, no_wait), grp)
    assert problem is not None


def test_tf32_inputs_not_rounded_are_truncated_by_the_tensor_core():
    """Dropping cvt.rna (the tensor core then truncates) still passes the TF32 check but differs from the
    rounded result: the interpreter models the truncation."""
    grp = group_tf32()
    config = CudaTensorCoreSketch().default(grp, TF32)
    func = build(grp, config, TF32)

    def unrounded(s: Stmt) -> Stmt | None:
        from compiler.loopir.stmt import BufferStore

        if isinstance(s, BufferStore) and isinstance(s.value, Call) and s.value.name == "tf32_round":
            return BufferStore(s.buffer, s.indices, s.value.args[0])
        return None

    ins = inputs_for(grp)
    a, b = evaluate(func, ins)[0], evaluate(_mutate(func, unrounded), ins)[0]
    assert not np.array_equal(a, b)


def test_the_printed_kernel_uses_the_ptx_instructions():
    grp = group("matmul_ta")
    func = build(grp, SMALL)
    func.name = "tc"
    text = generate_cuda([func], CUDA)
    for ptx in (
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        "cp.async.wait_group 1",
        "unsigned afrag[",
    ):
        assert ptx in text, ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in generate_cuda(
        [build(group("dense_bias"), SMALL)], CUDA
    )
    bf16 = generate_cuda([build(group_bf16("ta"), SMALL)], CUDA)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in bf16 and "unsigned afrag[" in bf16


# ----------------------------------------------------------------------------- nvcc
def _nvcc_groups():
    big = {
        "gemm_4096": matmul(4096, 4096, 4096, epi=False),
        "dense_bert": dense(128, 768, 768),
        "bmm_tb": batch_matmul(12, 128, 128, 64, tb=True),
    }
    configs = []
    for name, grp in big.items():
        configs.append((name, grp, CudaTensorCoreSketch().default(grp, CUDA), CUDA))
    grp = big["gemm_4096"]
    alt = {"bm": 128, "bn": 256, "bk": 32, "warps_m": 2, "warps_n": 4, "stages": 4}
    configs.append(
        ("gemm_4096_pad_256", grp, alt | {"smem_layout": "pad", "group_m": 8, "min_blocks": 1}, CUDA)
    )
    bf16 = matmul(4096, 4096, 4096, BF16, epi=False)
    configs.append(("bf16_gemm_4096", bf16, CudaTensorCoreSketch().default(bf16, CUDA), CUDA))
    f32 = matmul(4096, 4096, 4096, "float32", epi=False)
    configs.append(("sgemm_4096_tf32", f32, CudaTensorCoreSketch().default(f32, TF32), TF32))
    return configs


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_representative_configs_compile_with_nvcc(arch):
    need_nvcc()
    funcs, names = [], []
    for name, grp, config, target in _nvcc_groups():
        func = build(grp, config, target)
        func.name = name
        funcs.append(func)
        names.append((name, config))
    res = nvcc_check(generate_cuda(funcs, dataclasses.replace(CUDA, arch=arch)), arch)
    for name, config in names:
        r = res[name]
        print(
            f"{arch} {name} {config}: {r.registers} registers, {r.shared_bytes} B static smem, "
            f"spills {r.spill_stores}/{r.spill_loads} B"
        )
        assert r.registers <= 255
        if name in ("gemm_4096", "dense_bert", "bmm_tb", "bf16_gemm_4096"):  # defaults: no spills
            assert r.spill_stores == 0 and r.spill_loads == 0, (name, r)


# ----------------------------------------------------------------------------- cost model
def test_tuning_a_float16_matmul_with_the_cost_filter_measures_valid_tensorcore_configs():
    """The cost model's features read the tensor-core kernels (mma work, cp.async and ldmatrix copies):
    a cost-filtered search over the tensor-core space runs and measures only legal configs."""
    from cost_model.features import extract, lower_candidate
    from db.database import TuningDatabase
    from tuner.cost_filter import make_candidate_filter
    from tuner.measure import Measurer
    from tuner.measure.sim import SimulatedRunner
    from tuner.search import TaskTuner
    from tuner.task import extract_tasks

    b = GraphBuilder("tc_tune")
    b.build([b.matmul(b.input("a", (256, 128), F16), b.input("w", (128, 192), F16))])
    (task,) = extract_tasks(
        b.build([b.matmul(b.input("a", (256, 128), F16), b.input("w", (128, 192), F16))]), CUDA
    )
    assert task.sketch.name == "tensorcore"
    default = task.default()
    feats = extract(lower_candidate(task.group, default, CUDA), task.group, CUDA)
    assert np.isfinite(feats).all()

    def latency(_task, config) -> float:  # simulated: bigger warp tiles and deeper pipelines are faster
        return 100.0 / (config["bm"] * config["bn"]) ** 0.5 + 4.0 / config["stages"] + config["bk"] / 64

    with TuningDatabase.open("sqlite://") as db:
        db.commit_target(CUDA.key, CUDA.to_json())
        db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
        runner = SimulatedRunner(latency)
        measurer = Measurer(builder="simulated", runner=runner, target=CUDA)
        flt, asks = make_candidate_filter("gbdt", db, CUDA, seed=0, epsilon=0.125, oversample=4)
        tuner = TaskTuner(task, db, measurer, "tpe", 0, None, None, flt, asks)
        for _ in range(2):
            assert tuner.step(6) <= 6
        records = db.find_records(task.workload_key, CUDA.key)
    assert records and all(r.status == "ok" for r in records), [r.error for r in records]
    assert len(runner.history) >= 6
    for _, config in runner.history:  # (task, canonical JSON of the config)
        CudaTensorCoreSketch().check(task.group, json.loads(config), CUDA)


def test_kiln_compile_tf32_keys_the_model_and_uses_tensor_cores(tmp_path, monkeypatch, capsys):
    from compiler.target import tf32_spec
    from tuner.cli import main

    monkeypatch.setenv("KILN_DISABLE_CUPY", "1")
    assert tf32_spec("cuda", True) == "cuda+tf32" and tf32_spec(CUDA.key, True) == TF32.key
    assert tf32_spec("cuda", False) == "cuda"
    with pytest.raises(KilnError, match="is not cuda"):
        tf32_spec("cpu", True)
    assert (
        main(["compile", "--model", "matmul", "--target", "cuda", "--tf32", "-o", str(tmp_path / "t")]) == 0
    )
    assert main(["compile", "--model", "matmul", "--target", "cuda", "-o", str(tmp_path / "f")]) == 0
    out = capsys.readouterr().out
    assert f"for {TF32.key}:" in out and f"for {CUDA.key}:" in out
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert manifest["target"]["key"] == TF32.key
    assert "mma.sync.aligned.m16n8k8" in (tmp_path / "t" / "model.cu").read_text()
    assert "mma.sync" not in (tmp_path / "f" / "model.cu").read_text()
    assert main(["show", "--model", "matmul", "--stage", "code", "--target", "cuda", "--tf32"]) == 0
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in capsys.readouterr().out


# ----------------------------------------------------------------------------- layouts and banks
def test_fragment_layouts_match_the_ptx_isa_tables():
    """Spot checks copied from the PTX ISA's figures (mma.m16n8k16 .f16 and mma.m16n8k8 .tf32)."""
    from compiler.loopir.interp_simt_tc import a_coords, b_coords, c_coords

    lane = np.array([5])  # groupID 1, threadID_in_group 1
    assert [tuple(int(x[0]) for x in a_coords("m16n8k16", i, lane)) for i in range(8)] == [
        (1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)
    ]  # fmt: skip
    assert [tuple(int(x[0]) for x in b_coords("m16n8k16", i, lane)) for i in range(4)] == [
        (2, 1), (3, 1), (10, 1), (11, 1)
    ]  # fmt: skip
    assert [tuple(int(x[0]) for x in c_coords(i, lane)) for i in range(4)] == [(1, 2), (1, 3), (9, 2), (9, 3)]
    assert [tuple(int(x[0]) for x in a_coords("m16n8k8", i, lane)) for i in range(4)] == [
        (1, 1), (9, 1), (1, 5), (9, 5)
    ]  # fmt: skip
    assert [tuple(int(x[0]) for x in b_coords("m16n8k8", i, lane)) for i in range(2)] == [(1, 1), (5, 1)]


def _value(e, env: dict) -> int:
    from compiler.loopir.expr import Binary, Const

    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return env.get(e.name, 0)
    if isinstance(e, Call) and e.name == "xor":
        return _value(e.args[0], env) ^ _value(e.args[1], env)
    assert isinstance(e, Binary), e
    a, b = _value(e.a, env), _value(e.b, env)
    ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "//": int.__floordiv__, "%": int.__mod__}
    return ops[e.op](a, b)


def _phase_banks(func: PrimFunc, name: str, k: int, width_bytes: int, lanes: int) -> list[int]:
    """For each ``name`` intrinsic (operand ``k``, a float16 shared tile) and each group of ``lanes`` lanes:
    the most 4-byte words any bank serves (1 = conflict-free) for warp 0 of block 0."""
    from compiler.loopir.stmt import walk_stmts

    worst = []
    for s in walk_stmts(func.body):
        if isinstance(s, Intrinsic) and s.name == name:
            for first in range(0, 32, lanes):
                banks: dict[int, set[int]] = {}
                for lane in range(first, first + lanes):
                    byte = 2 * _value(s.offsets[k], {"tx": lane})
                    for w in range(width_bytes // 4):
                        word = byte // 4 + w
                        banks.setdefault(word % 32, set()).add(word)
                worst.append(max(len(v) for v in banks.values()))
    return worst


@pytest.mark.parametrize("layout", ["pad", "xor"])
@pytest.mark.parametrize("name", ["matmul_ta", "dense_bias", "matmul_large_tiles"])
def test_bank_conflicts_of_ldmatrix_phases_and_cp_async_stores(name, layout):
    """ldmatrix (8 lanes give the 8 rows of 16 bytes read in one phase) is conflict-free with both layouts;
    cp.async stores (a quarter warp writes 8 x 16 bytes) are conflict-free with the XOR layout and up to
    2-way with padded rows (a quarter warp's chunks span rows whose 16-byte pads shift the banks)."""
    grp = group(name)
    for bk in (16, 32, 64):
        config = {**SMALL, "bm": 64, "bn": 32, "bk": bk, "warps_m": 2, "warps_n": 1, "smem_layout": layout}
        func = build(grp, config)
        assert set(_phase_banks(func, "ldmatrix", 1, 16, 8)) == {1}, (config, "ldmatrix")
        ways = set(_phase_banks(func, "cp_async", 0, 16, 8))
        assert ways == {1} if layout == "xor" else max(ways) <= 2, (config, "cp.async", ways)


# ----------------------------------------------------------------------------- executor
def test_a_float16_model_runs_on_the_fake_gpu_through_the_tensor_cores(fake_gpu):  # noqa: F811
    """compile() -> CudaCompiledModel on the fake CuPy, whose kernels run in the SIMT interpreter: the
    tensor-core kernel (with its dynamic or static shared tiles) and a SIMT softmax after it."""
    from compiler.build import compile as kiln_compile
    from compiler.reference import random_inputs

    b = GraphBuilder("tc_model")
    w = b.param("w", (RNG.randn(64, 96) / 8).astype(np.float16))
    h = b.relu(b.add(b.matmul(b.input("x", (48, 64), F16), w), b.param("bias", np.zeros(96, np.float16))))
    graph = b.build([b.softmax(h, axis=-1)])
    model = kiln_compile(graph, "cuda")
    assert model.kernels[0].sketch == "tensorcore"
    register(graph, model.target)
    inputs = random_inputs(graph, seed=0)
    (out,) = model.run(inputs)
    (ref,) = run_reference(graph, inputs)
    assert compare(np.asarray(out), np.asarray(ref), "out") is None
