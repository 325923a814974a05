"""Optuna samplers by name, and how each sees the knob space.

TPE, random and GP sample categorical knobs directly. CMA-ES has no categorical support, so for it
every knob becomes an integer index into its list of legal values (the lists are ordered, so the index
is a meaningful coordinate for tile sizes and vector widths)."""

from __future__ import annotations

from typing import Any

from compiler.backends.sketch import Config, Knob
from compiler.errors import KilnError
from tuner.space import config_from_params

SAMPLERS = ("tpe", "cmaes", "random", "gp")


def make_sampler(name: str, seed: int | None = None, n_startup: int = 8):
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=n_startup,
            multivariate=True,
            constant_liar=True,
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=n_startup)
    if name == "gp":
        try:
            import torch  # noqa: F401  (Optuna's GP sampler is built on torch)
        except ImportError:
            raise KilnError("the gp sampler needs torch: pip install torch (or use --sampler tpe)") from None
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup)
    raise KilnError(f"unknown sampler '{name}'; use one of {', '.join(SAMPLERS)}")


def encoding(sampler: str) -> str:
    return "index" if sampler == "cmaes" else "categorical"


def distributions(space: list[Knob], how: str) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if how == "index":
        return {k.name: IntDistribution(0, len(k.values) - 1) for k in space}
    return {k.name: CategoricalDistribution(list(k.values)) for k in space}


def to_params(space: list[Knob], config: Config, how: str) -> dict[str, Any]:
    if how == "index":
        return {k.name: list(k.values).index(config[k.name]) for k in space}
    return {k.name: config[k.name] for k in space}


def from_params(space: list[Knob], params: dict[str, Any], how: str) -> Config:
    if how == "index":
        return {k.name: k.values[int(params[k.name])] for k in space}

    return config_from_params(space, params)
