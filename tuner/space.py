"""Knob spaces as Optuna distributions, config validity, and configs as canonical JSON."""

from __future__ import annotations

from typing import Any

from compiler.backends.sketch import Config, Knob
from compiler.canonical import canonical_json
from compiler.errors import ScheduleError


def distributions(space: list[Knob]) -> dict[str, Any]:
    """One categorical distribution per knob (over its legal values, in order)."""
    from optuna.distributions import CategoricalDistribution

    return {k.name: CategoricalDistribution(list(k.values)) for k in space}


def config_from_params(space: list[Knob], params: dict[str, Any]) -> Config:
    """A config from an Optuna trial's params, with values of the knobs' own types."""
    out: Config = {}
    for k in space:
        if k.name not in params:
            raise ScheduleError(f"trial has no value for knob '{k.name}'")
        value = params[k.name]
        match = [v for v in k.values if v == value and type(v) is type(value)] or [
            v for v in k.values if v == value
        ]
        if not match:
            raise ScheduleError(f"knob '{k.name}' = {value!r} is not one of {list(k.values)}")
        out[k.name] = match[0]
    return out


def config_json(config: Config) -> str:
    """Canonical JSON of a config: the identity of a candidate across processes and the database."""
    return canonical_json(config)
