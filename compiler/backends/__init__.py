"""Backends: one folder per compilation target (``cpu/``, ``cuda/``), each implementing
:class:`~compiler.backends.base.Backend`; the shared :class:`~compiler.backends.sketch.Sketch` base.

``get_backend(target)`` finds a backend by the target's kind: the folder ``compiler/backends/<kind>/``
whose ``backend.py`` names its class in ``BACKEND``. Adding a target means adding one folder."""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

from compiler.backends.base import Backend
from compiler.errors import KilnError

if TYPE_CHECKING:
    from compiler.backends.sketch import Sketch
    from compiler.fusion import Group
    from compiler.target import Target


@functools.cache
def _backend(kind: str) -> Backend:
    try:
        module = importlib.import_module(f"compiler.backends.{kind}.backend")
    except ModuleNotFoundError as exc:
        if exc.name != f"compiler.backends.{kind}" and exc.name != f"compiler.backends.{kind}.backend":
            raise
        raise KilnError(
            f"no backend for target kind {kind!r}: there is no compiler/backends/{kind}/"
        ) from None
    return module.BACKEND()


def get_backend(target: Target | str) -> Backend:
    """The backend of ``target`` (a Target, or a target kind such as ``"cpu"``)."""
    kind = target if isinstance(target, str) else target.kind
    return _backend(kind)


def sketch_for(group: Group, target: Target) -> Sketch:
    """The sketch that schedules ``group`` on ``target``."""
    return get_backend(target).sketch_for(group, target)


def get_sketch(name: str, target: Target) -> Sketch:
    """The sketch called ``name`` on ``target``'s backend."""
    return get_backend(target).get_sketch(name)


__all__ = ["Backend", "get_backend", "get_sketch", "sketch_for"]
