"""Static memory planning for a model's intermediate buffers (TVM GraphPlanMemory style).

Liveness is measured in launch indices: an intermediate is live from the first launch that touches it (or
any alias of it) to the last. Launches are walked in order; at each launch the buffers first used there get
storage (best fit: the smallest free storage that is large enough, else the largest free one grown, else a
new one), then the buffers last used there release theirs. A buffer is never given storage released at the
launch where it is first used, because kernel parameters are ``restrict``. Inputs, outputs and params are
never planned: they live in caller or model arrays. An alias (``alias_of``) is a view of another buffer with
as many elements (e.g. a reshape); it costs nothing and extends its root's lifetime.

All storages are laid out in one arena (64-byte aligned offsets): ``peak_bytes`` is its size, to compare with
``naive_bytes``, the sum of every intermediate's size.

``check_fits`` refuses a model whose buffers need more memory than this machine has available
(:class:`ModelTooLargeError`, naming the model, the bytes needed and the bytes available), so a huge shape
is a one-line error before any allocation rather than numpy's ``MemoryError``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.dtypes import to_numpy
from compiler.errors import KilnError

ROLES = ("input", "output", "param", "intermediate")
ALIGN = 64


class ModelTooLargeError(KilnError):
    """A model whose buffers need more memory than this machine has available."""


def format_bytes(n: float) -> str:
    """``n`` bytes for people: ``37.3 GiB``, ``512 B``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation on this machine: ``MemAvailable`` from
    /proc/meminfo (Linux), else the free physical pages; None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_fits(model: str, needed: int, what: str = "its buffers") -> None:
    """Raise :class:`ModelTooLargeError` when ``needed`` bytes exceed this machine's available memory."""
    available = available_memory()
    if available is not None and needed > available:
        raise ModelTooLargeError(
            f"model {model} does not fit in memory: {what} need {format_bytes(needed)} ({needed:,} bytes), "
            f"this machine has {format_bytes(available)} available; use smaller input shapes"
        )


@dataclass(frozen=True)
class BufferSpec:
    """One buffer of a compiled model. ``alias_of`` names the buffer this one is a view of."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str
    alias_of: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * to_numpy(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "role": self.role,
            "alias_of": self.alias_of,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> BufferSpec:
        return BufferSpec(
            int(d["id"]),
            str(d["name"]),
            tuple(int(x) for x in d["shape"]),
            str(d["dtype"]),
            str(d["role"]),
            None if d.get("alias_of") is None else int(d["alias_of"]),
        )


@dataclass(frozen=True)
class Launch:
    """A kernel call: ``args`` are buffer ids in the kernel's parameter order."""

    kernel: str
    args: tuple[int, ...]

    def __init__(self, kernel: str, args: list[int] | tuple[int, ...]) -> None:
        object.__setattr__(self, "kernel", kernel)
        object.__setattr__(self, "args", tuple(int(a) for a in args))

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "args": list(self.args)}


@dataclass
class MemoryPlan:
    """Where each planned buffer lives: ``offsets[id]`` in an arena of ``peak_bytes`` bytes."""

    offsets: dict[int, int]
    storage_of: dict[int, int]
    storage_sizes: list[int]
    peak_bytes: int
    naive_bytes: int
    roots: dict[int, int] = field(default_factory=dict)

    def total_bytes(self, buffers: list[BufferSpec]) -> int:
        """Bytes every buffer of the model occupies at once: the arena, plus each unplanned root buffer
        (inputs, outputs, params, pinned intermediates) once; aliases cost nothing."""
        by_id = {b.id: b for b in buffers}
        unplanned = {r for r in self.roots.values() if r not in self.offsets}
        return self.peak_bytes + sum(by_id[r].nbytes for r in unplanned if r in by_id)

    def summary(self) -> dict[str, Any]:
        return {
            "arena_bytes": self.peak_bytes,
            "peak_bytes": self.peak_bytes,
            "naive_bytes": self.naive_bytes,
            "storages": len(self.storage_sizes),
            "planned_buffers": len(self.storage_of),
        }


def resolve_roots(buffers: list[BufferSpec]) -> dict[int, int]:
    """buffer id -> id of the buffer it ultimately views (itself when not an alias)."""
    by_id = {b.id: b for b in buffers}
    if len(by_id) != len(buffers):
        raise KilnError("two buffers share an id")
    roots: dict[int, int] = {}
    for b in buffers:
        seen, cur = {b.id}, b
        while cur.alias_of is not None:
            nxt = by_id.get(cur.alias_of)
            if nxt is None:
                raise KilnError(f"buffer {b.name!r} is an alias of unknown buffer id {cur.alias_of}")
            if nxt.id in seen:
                raise KilnError(f"buffer {b.name!r} is part of an alias cycle")
            seen.add(nxt.id)
            cur = nxt
        if cur.numel != b.numel or np.dtype(to_numpy(cur.dtype)).itemsize != to_numpy(b.dtype).itemsize:
            raise KilnError(f"alias {b.name!r} {b.shape} does not have the size of {cur.name!r} {cur.shape}")
        roots[b.id] = cur.id
    return roots


def plan_memory(buffers: list[BufferSpec], launches: list[Launch]) -> MemoryPlan:
    """Assign arena offsets to intermediate buffers, reusing storage whose lifetime ended."""
    by_id = {b.id: b for b in buffers}
    roots = resolve_roots(buffers)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t, launch in enumerate(launches):
        for a in launch.args:
            if a not in by_id:
                raise KilnError(f"launch {t} ({launch.kernel}) uses unknown buffer id {a}")
            r = roots[a]
            first.setdefault(r, t)
            last[r] = t
    # an intermediate viewed by an output/param/input alias must outlive the model run: never planned
    pinned = {roots[b.id] for b in buffers if b.role != "intermediate"}
    planned = [r for r in first if by_id[r].role == "intermediate" and r not in pinned]
    naive = sum(by_id[r].nbytes for r in planned)
    sizes: list[int] = []
    free: list[int] = []
    storage_of: dict[int, int] = {}
    for t in range(len(launches)):
        for r in (r for r in planned if first[r] == t):
            need = _aligned(by_id[r].nbytes)
            fits = [s for s in free if sizes[s] >= need]
            if fits:
                s = min(fits, key=lambda k: sizes[k])
            elif free:
                s = max(free, key=lambda k: sizes[k])
                sizes[s] = need
            else:
                s = len(sizes)
                sizes.append(need)
                storage_of[r] = s
                continue
            free.remove(s)
            storage_of[r] = s
        free.extend(storage_of[r] for r in planned if last[r] == t)
    starts, pos = [], 0
    for size in sizes:
        starts.append(pos)
        pos += size
    offsets = {b.id: starts[storage_of[roots[b.id]]] for b in buffers if roots[b.id] in storage_of}
    return MemoryPlan(offsets, storage_of, sizes, pos, naive, roots)


def _aligned(n: int) -> int:
    return max(ALIGN, -(-n // ALIGN) * ALIGN)
