"""Kiln tuner: tasks, search, measurement, scheduling, the library API and the `kiln` command line.

``tuner.tune(model, target, db, budget, ...)`` tunes a model into a tuning database and returns a
:class:`~tuner.api.TuneSummary`; ``tuner.compile(model, target, db)`` compiles it with the best records
(both from :mod:`tuner.api`). They are loaded on first use, so that importing ``tuner`` (as ``kiln --help``
does) does not import optuna or SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.api import Budget, TuneSummary, compile, tune

__version__ = "0.1.0"  # the distribution's version (pyproject.toml reads it from here)

__all__ = ["Budget", "TuneSummary", "compile", "tune"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("tuner.api"), name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
