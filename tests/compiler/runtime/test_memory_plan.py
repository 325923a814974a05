"""Static memory planning: reuse after a lifetime ends, aliases, roles that are never planned."""

from __future__ import annotations

import pytest

from compiler.errors import KilnError
from compiler.runtime.memory_plan import BufferSpec, Launch, plan_memory


def chain(n: int, size: int = 1024) -> tuple[list[BufferSpec], list[Launch]]:
    """x -> t0 -> t1 -> ... -> t{n-1} -> y, one launch per arrow."""
    bufs = [BufferSpec(0, "x", (size,), "float32", "input")]
    bufs += [BufferSpec(i + 1, f"t{i}", (size,), "float32", "intermediate") for i in range(n)]
    bufs.append(BufferSpec(n + 1, "y", (size,), "float32", "output"))
    launches = [Launch(f"k{i}", [i, i + 1]) for i in range(n + 1)]
    return bufs, launches


def test_chain_reuses_storage():
    bufs, launches = chain(6)
    plan = plan_memory(bufs, launches)
    assert plan.naive_bytes == 6 * 4096
    assert plan.peak_bytes == 2 * 4096  # ping-pong between two storages
    assert len(plan.storage_sizes) == 2
    assert set(plan.offsets) == set(range(1, 7))
    # a buffer never shares storage with the one it is computed from (restrict parameters)
    for launch in launches:
        live = [a for a in launch.args if a in plan.offsets]
        assert len({plan.offsets[a] for a in live}) == len(live)
    assert plan.summary()["naive_bytes"] == 6 * 4096


def test_best_fit_and_growth():
    sizes = [4096, 256, 1024, 8192]
    bufs = [BufferSpec(0, "x", (16,), "float32", "input")]
    bufs += [BufferSpec(i + 1, f"t{i}", (s // 4,), "float32", "intermediate") for i, s in enumerate(sizes)]
    bufs.append(BufferSpec(9, "y", (16,), "float32", "output"))
    # t0 and t1 both die at launch 2; t2 (1 KiB) takes the smallest free storage that fits (t0's 4 KiB)
    launches = [
        Launch("a", [0, 1]),
        Launch("b", [0, 2]),
        Launch("c", [1, 2, 3]),
        Launch("d", [3, 4]),
        Launch("e", [4, 9]),
    ]
    plan = plan_memory(bufs, launches)
    assert plan.storage_of[3] not in (plan.storage_of[1], plan.storage_of[2])  # both still live at launch 2
    assert plan.storage_of[4] in (plan.storage_of[1], plan.storage_of[2])  # t3 grows a freed storage
    assert plan.peak_bytes < plan.naive_bytes


def test_alias_extends_lifetime_and_shares_storage():
    bufs = [
        BufferSpec(0, "x", (4, 8), "float32", "input"),
        BufferSpec(1, "t", (4, 8), "float32", "intermediate"),
        BufferSpec(2, "t_flat", (32,), "float32", "intermediate", alias_of=1),
        BufferSpec(3, "u", (32,), "float32", "intermediate"),
        BufferSpec(4, "v", (32,), "float32", "intermediate"),
        BufferSpec(5, "y", (32,), "float32", "output"),
    ]
    launches = [Launch("a", [0, 1]), Launch("b", [1, 3]), Launch("c", [3, 4]), Launch("d", [2, 4, 5])]
    plan = plan_memory(bufs, launches)
    assert plan.offsets[2] == plan.offsets[1]
    # t is live until launch d through its alias, so u and v may not take its storage
    assert plan.offsets[4] != plan.offsets[1] and plan.offsets[3] != plan.offsets[1]
    assert plan.naive_bytes == 3 * 128


def test_outputs_params_and_output_views_are_never_planned():
    bufs = [
        BufferSpec(0, "x", (8,), "float32", "input"),
        BufferSpec(1, "w", (8,), "float32", "param"),
        BufferSpec(2, "t", (8,), "float32", "intermediate"),
        BufferSpec(3, "y", (2, 4), "float32", "output", alias_of=2),
        BufferSpec(4, "z", (8,), "float32", "output"),
    ]
    plan = plan_memory(bufs, [Launch("a", [0, 1, 2]), Launch("b", [2, 4])])
    assert plan.offsets == {} and plan.peak_bytes == 0


def test_bad_specs_are_clear_errors():
    with pytest.raises(KilnError, match="alias"):
        plan_memory([BufferSpec(0, "a", (4,), "float32", "intermediate", alias_of=7)], [])
    with pytest.raises(KilnError, match="size"):
        plan_memory(
            [
                BufferSpec(0, "a", (4,), "float32", "intermediate"),
                BufferSpec(1, "b", (5,), "float32", "intermediate", alias_of=0),
            ],
            [],
        )
    with pytest.raises(KilnError, match="unknown buffer id 3"):
        plan_memory([BufferSpec(0, "a", (4,), "float32", "input")], [Launch("k", [0, 3])])
