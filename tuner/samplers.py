"""Optuna samplers by name, how each sees the knob space, and how a result is told to it.

TPE, random and GP sample categorical knobs directly. CMA-ES has no categorical support, so for it
every knob becomes an integer index into its list of legal values (the lists are ordered, so the index
is a meaningful coordinate for tile sizes and vector widths).

A candidate that failed (an invalid config screened by the sketch's ``check`` before measurement, a compile
or runtime error, a timeout, a wrong result) is told to TPE and random as a *complete, infeasible* trial:
value ``inf`` and the constraint ``kiln_failed = 1`` (Optuna's ``Trial.set_constraint``). TPE puts
infeasible trials in its "bad" group, so its sampler learns to avoid them; a ``FAIL`` state, which TPE
ignores, would let it propose the same region again. CMA-ES and GP fit the objective's values, which an
``inf`` would break, so for them a failure stays ``FAIL``.
"""

from __future__ import annotations

import math
from typing import Any

from compiler.backends.sketch import Config, Knob
from compiler.errors import KilnError, ScheduleError
from tuner.space import config_from_params

SAMPLERS = ("tpe", "cmaes", "random", "gp")
# samplers told a failed candidate as an infeasible trial (see the module docstring)
CONSTRAINED = ("tpe", "random")
FAILED_CONSTRAINT = "kiln_failed"


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


def screen(task: Any, configs: list[Config]) -> list[str | None]:
    """The sketch's ``check`` of each config before anything is built: ``None`` for a valid config, else
    the reason it is invalid. Every search method measures only what passes it."""
    out: list[str | None] = []
    for c in configs:
        try:
            task.check(c)
        except (ScheduleError, KilnError) as exc:
            out.append(str(exc) or type(exc).__name__)
        else:
            out.append(None)
    return out


def tell(study: Any, trial: Any, median_us: float | None, sampler: str) -> None:
    """Tell ``study`` the result of an asked ``trial``: its median latency, or a failure (``None``) told
    as an infeasible trial to the samplers in :data:`CONSTRAINED` and as ``FAIL`` to the others."""
    import optuna

    if median_us is not None:
        study.tell(trial, median_us)
    elif sampler in CONSTRAINED:
        trial.set_constraint(FAILED_CONSTRAINT, 1.0)
        study.tell(trial, math.inf)
    else:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)


def add_result(
    study: Any, dists: dict[str, Any], params: dict[str, Any], median_us: float | None, sampler: str
) -> None:
    """Add a candidate that was measured without being asked (a cost-model proposal) to ``study`` as a
    finished trial, told the same way as :func:`tell` (one storage write, no sampling)."""
    import optuna

    if median_us is not None:
        trial = optuna.trial.create_trial(params=params, distributions=dists, value=median_us)
    elif sampler in CONSTRAINED:
        trial = optuna.trial.create_trial(
            params=params, distributions=dists, value=math.inf, constraints={FAILED_CONSTRAINT: 1.0}
        )
    else:
        trial = optuna.trial.create_trial(
            params=params, distributions=dists, state=optuna.trial.TrialState.FAIL
        )
    study.add_trial(trial)
