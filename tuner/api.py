"""Kiln for Python users: compile a model with the best records of a tuning database.

``compile(model, target, db)`` is :func:`compiler.build.compile` with the database's best valid record
for each group (``db`` is a TuningDatabase or a URL); groups without a record use their sketch's default.
"""

from __future__ import annotations

from typing import Any

from compiler.build import compile as build_model
from compiler.fusion import FusionPlan
from compiler.graph import Graph
from compiler.target import Target
from tuner.records import database_config_source


def compile(model: Graph | str, target: Target | str = "cpu", db: Any = None, plan: FusionPlan | None = None):
    """Compile ``model`` for ``target``; with ``db``, each group uses its best valid tuning record."""
    configs = database_config_source(db) if db is not None else None
    return build_model(model, target, plan=plan, configs=configs)
