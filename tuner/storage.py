"""Optuna storage in the tuning database's own URL (so studies resume and optuna-dashboard opens them)."""

from __future__ import annotations

from typing import Any


def optuna_storage(url: str) -> Any:
    import optuna

    if url in ("sqlite://", "sqlite:///:memory:") or url.endswith(":memory:"):
        return optuna.storages.InMemoryStorage()  # a private in-memory database cannot be shared
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": 60}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, skip_compatibility_check=False)
