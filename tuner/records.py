"""Tuning records -> configs at compile time, validated against the sketch's knob space.

A record is only applied to the workload and target it was measured on, by the sketch and sketch
version that produced it, and only if its config still passes the sketch's check; anything else is
skipped with a warning naming the record (the database does the warning; we give the reason).

Which record a group gets is the selection rule of :mod:`db.selection` (``TuningDatabase.select_record``),
the one rule every path that applies a record goes through: a record confirmed faster than the default
beats every other (the highest confirmed speed-up among several); when a config of the workload was
confirmed *not* faster (and none faster) the default schedule is kept (``record.kept_default`` says why);
otherwise the lowest median, marked ``confirmed: false`` (``default_is_best`` when it is the default config
itself). A config with a failed measurement (a confirmation round or a re-measurement that was not ok) is
never applied. The info handed to compile carries ``standing`` (confirmed, unconfirmed, default_is_best,
kept_default)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compiler.backends import sketch_for
from compiler.errors import KilnError, ScheduleError
from compiler.fusion import Group, group_from_workload
from compiler.target import Target
from db.selection import CONFIRMED, DEFAULT_IS_BEST, KEPT_DEFAULT, Selection
from tuner.confirm import speedup_text


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
        default = sketch_for(group, target).default(group, target)
        sel = db.select_record(group.workload_key, target.key, default, validate=validator_for(group, target))
        return applied(sel)

    return source


def applied(sel: Selection) -> tuple[str, dict | None, str, dict[str, Any]] | None:
    """A :class:`db.selection.Selection` as a build.ConfigSource answer: (sketch, config or None for the
    default, origin, info), or None when there is no record."""
    conf = sel.confirmation
    if sel.standing == KEPT_DEFAULT:
        info: dict[str, Any] = {"standing": KEPT_DEFAULT, "confirmed": conf is not None}
        if conf is not None:
            info.update(speedup=conf.speedup, spread=conf.spread, rounds=conf.rounds)
            info["kept_default"] = f"confirmed {speedup_text(conf)} of the default: not faster"
            return conf.sketch, None, "default", info
        info["kept_default"] = f"its config had a measurement that was not ok ({sel.failed} left out)"
        return "", None, "default", info
    rec = sel.record
    if rec is None:
        return None
    info = {"id": rec.id, "median_us": rec.median_us, "standing": sel.standing, "confirmed": False}
    if sel.standing == DEFAULT_IS_BEST:
        info["default_is_best"] = True  # nothing to confirm: the record is the default config
    elif sel.standing == CONFIRMED and conf is not None:
        info.update(confirmed=True, speedup=conf.speedup, spread=conf.spread, rounds=conf.rounds)
    if sel.failed:
        info["left_out_failed"] = sel.failed  # configs with a measurement that was not ok
    return rec.sketch, dict(rec.config), "record", info


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


__all__ = ["applied", "database_config_source", "validator_for", "workload_validator"]
