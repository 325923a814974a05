"""Tuning records -> configs at compile time, validated against the sketch's knob space.

A record is only applied to the workload and target it was measured on, by the sketch and sketch
version that produced it, and only if its config still passes the sketch's check; anything else is
skipped with a warning naming the record (the database does the warning; we give the reason).

The apply rule for confirmations (:mod:`tuner.confirm`): when the best valid record's config has a
confirmation against the group's current default and it was *not* faster (median of the interleaved
per-round ratios, or the ratio of the fastest rounds, at most 1: ``Confirmation.better``), the default is
used and the kernel says so (``record.kept_default``); a confirmed faster record is applied with its
speed-up and spread; a record whose config is the default itself is applied (``default_is_best``); any
other record without a confirmation (an older database, an interrupted run) is applied as before and
marked ``confirmed: false``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compiler.backends import sketch_for
from compiler.errors import KilnError, ScheduleError
from compiler.fusion import Group, group_from_workload
from compiler.target import Target
from tuner.confirm import matches, speedup_text
from tuner.space import config_json


def validator_for(group: Group, target: Target) -> Callable[[Any], str | None]:
    sketch = sketch_for(group, target)

    def validate(record: Any) -> str | None:
        if record.sketch != sketch.name:
            return f"recorded by sketch '{record.sketch}', the group is scheduled by '{sketch.name}'"
        if record.sketch_version != sketch.version:
            return f"recorded by {record.sketch} v{record.sketch_version}, the code has v{sketch.version}"
        try:
            sketch.check(group, dict(record.config), target)
        except (ScheduleError, KilnError) as exc:
            return f"config no longer valid: {exc}"
        return None

    return validate


def database_config_source(db: Any):
    """A build.ConfigSource reading the best valid record of each group from ``db`` (a TuningDatabase
    or a URL)."""
    if isinstance(db, str):
        from db.database import TuningDatabase

        db = TuningDatabase.open(db, create=False)

    def source(group: Group, target: Target):
        rec = db.best(group.workload_key, target.key, validate=validator_for(group, target))
        if rec is None:
            return None
        info: dict[str, Any] = {"id": rec.id, "median_us": rec.median_us, "confirmed": False}
        conf = db.latest_confirmation(group.workload_key, target.key)
        default = sketch_for(group, target).default(group, target)
        if config_json(rec.config) == config_json(default):
            info["default_is_best"] = True  # nothing to confirm: the record is the default config
        elif matches(conf, rec.sketch, rec.sketch_version, rec.config, default):
            assert conf is not None
            info.update(confirmed=True, speedup=conf.speedup, spread=conf.spread, rounds=conf.rounds)
            if not conf.better:
                info["kept_default"] = f"confirmed {speedup_text(conf)} of the default: not faster"
                return rec.sketch, None, "default", info
        return rec.sketch, dict(rec.config), "record", info

    return source


def workload_validator(db: Any, target_key: str) -> Callable[[Any], str | None]:
    """Validate records of any workload stored in ``db`` (used by `kiln query best`)."""
    cache: dict[str, Any] = {}

    def validate(record: Any) -> str | None:
        key = record.workload_key
        if key not in cache:
            try:
                group = group_from_workload(db.workload_canonical(key))
                cache[key] = validator_for(group, Target.parse(target_key))
            except KilnError:
                # not a Kiln workload (imported from elsewhere): there is no knob space to check against,
                # and compile never applies it (no group has that key); the structural check still runs
                cache[key] = lambda _r: None
        return cache[key](record)

    return validate


__all__ = ["database_config_source", "validator_for", "workload_validator"]
