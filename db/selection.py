"""Which record of a workload compile applies: the selection rule over its records and confirmations.

One rule, used by every path that applies a record (``kiln compile`` and :func:`tuner.compile` through
:func:`tuner.records.database_config_source`, ``kiln bench``'s "kiln tuned", the torch backend), and by the
end of a tuning run to choose what to confirm. A *config* here is (sketch, sketch version, config); its
*verdict* is its latest confirmation (by ``created_at``, then id) measured against the group's current
default config (a confirmation against another default, e.g. from before a sketch changed its default,
does not count). A verdict is *faster* when :attr:`~db.records.Confirmation.better`, else *not faster*.

1. Candidates: the ok records that pass validation (the sketch's knob-space check), except those of a config
   that also has a record that is not ok (a failed re-measurement: a confirmation round or the plan search's
   re-measurement that crashed, timed out or gave a wrong result) -- a kernel is applied only when every
   measurement of it was ok.
2. A config confirmed faster beats every other: among several, the one with the highest *confirmed speed-up*
   (the smaller of the paired median and the fastest-rounds ratio, the two estimates ``better`` requires
   above 1), then the lowest record median. A lucky single median of an unconfirmed config (or of the
   default config itself, which the plan search re-measures) never displaces it.
3. Else, when a config of the workload was confirmed *not* faster, the default schedule is kept: none of the
   workload's records is applied, whatever their medians (the confirmation showed that the search's single
   medians of this workload could not be trusted to beat the default; a later run confirms the next
   candidate, see ``challenger``).
4. Else (no confirmation against this default: older databases, tuning with ``--confirm-rounds 0``, an
   interrupted run) the record with the lowest median, as before confirmations existed: ``unconfirmed``,
   or ``default_is_best`` when its config is the default itself.

``challenger``: the lowest-median candidate whose config has no verdict, is not the default, and is faster
by its median than the applied record (any, when the default is kept). It is what the end of a tuning run
confirms next (:attr:`Selection.to_confirm`), so a workload never stays stuck behind one confirmation; a
record confirmed faster that it would displace (:attr:`Selection.rival`) is re-measured in the same rounds
and gets a fresh confirmation too, so the two speed-ups compared in rule 2 come from the same moments of
the machine rather than from two runs under different load.

Cost: two indexed queries per workload (its confirmations; its records, ok ones streamed in best order and
read only until the rule is decided).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from db.canonical import canonical_json
from db.records import Confirmation, Record

CONFIRMED = "confirmed"  # a record confirmed faster than the default: applied
UNCONFIRMED = "unconfirmed"  # no confirmation against this default: the lowest median, applied
DEFAULT_IS_BEST = "default_is_best"  # the lowest-median record is the default config (nothing to confirm)
KEPT_DEFAULT = "kept_default"  # a record was confirmed not faster (or failed): the default schedule
NO_RECORD = "no_record"  # nothing to apply
STANDINGS = (CONFIRMED, UNCONFIRMED, DEFAULT_IS_BEST, KEPT_DEFAULT, NO_RECORD)

ConfigKey = tuple[str, int, str]  # (sketch, sketch version, canonical config JSON)


def config_key(item: Record | Confirmation) -> ConfigKey:
    return (item.sketch, int(item.sketch_version), canonical_json(item.config))


def confirmed_speedup(conf: Confirmation) -> float:
    """The speed-up a confirmation vouches for: the smaller of its paired median and its fastest-rounds ratio
    (both must be above 1 for :attr:`~db.records.Confirmation.better`)."""
    return min(conf.speedup, conf.fastest_ratio)


@dataclass(frozen=True)
class Selection:
    """What the rule chose for one workload on one target (see the module docstring).

    ``record``: the record to apply, None for the default schedule. ``standing``: one of ``confirmed``,
    ``unconfirmed``, ``default_is_best``, ``kept_default``, ``no_record``. ``confirmation``: the applied
    record's confirmation, or (``kept_default``) the not-faster one that keeps the default. ``failed``: the
    configs left out because one of their measurements was not ok. ``challenger``: what to confirm next."""

    record: Record | None
    standing: str
    confirmation: Confirmation | None = None
    challenger: Record | None = None
    failed: int = 0

    @property
    def rival(self) -> dict[str, Any] | None:
        """The config the challenger would displace (the record confirmed faster that is applied now), to be
        re-measured in the same rounds as the challenger so that the two speed-ups compare; None when there
        is no challenger or nothing confirmed is applied."""
        if self.challenger is None or self.standing != CONFIRMED or self.record is None:
            return None
        return dict(self.record.config)

    @property
    def to_confirm(self) -> dict[str, Any] | None:
        """The config the end of a tuning run confirms for this workload: the challenger, else the applied
        record's config (an existing confirmation of it is reused; the default config itself when it
        measured best: nothing to confirm), else the config whose not-faster confirmation keeps the default
        (reused); None without records."""
        if self.challenger is not None:
            return dict(self.challenger.config)
        if self.standing in (CONFIRMED, UNCONFIRMED, DEFAULT_IS_BEST) and self.record is not None:
            return dict(self.record.config)
        if self.standing == KEPT_DEFAULT and self.confirmation is not None:
            return dict(self.confirmation.config)
        return None


def verdicts(
    confirmations: Iterable[Confirmation], default_config: dict[str, Any]
) -> dict[ConfigKey, Confirmation]:
    """The latest confirmation (``created_at``, then id) of each config against ``default_config``."""
    default = canonical_json(default_config)
    out: dict[ConfigKey, Confirmation] = {}
    for conf in confirmations:
        if canonical_json(conf.default_config) != default:
            continue
        key = config_key(conf)
        known = out.get(key)
        if known is None or (conf.created_at, conf.id) > (known.created_at, known.id):
            out[key] = conf
    return out


def choose(
    candidates: Iterable[Record],
    failed: set[ConfigKey],
    confirmations: Sequence[Confirmation],
    default_config: dict[str, Any],
) -> Selection:
    """The rule over ``candidates`` (valid ok records, lowest median first; read only as far as needed),
    the ``failed`` configs and the workload's ``confirmations`` that passed validation."""
    judged = verdicts(confirmations, default_config)
    faster_keys = {k for k, c in judged.items() if c.better and k not in failed}
    slower = [c for c in judged.values() if not c.better]
    default = canonical_json(default_config)
    found: dict[ConfigKey, Record] = {}
    first_unjudged: Record | None = None
    challenger: Record | None = None
    left_out: set[ConfigKey] = set()
    for rec in candidates:
        key = config_key(rec)
        if key in failed:
            left_out.add(key)
            continue
        if key in judged:
            if key in faster_keys:
                found.setdefault(key, rec)
        else:
            if first_unjudged is None:
                first_unjudged = rec
            if challenger is None and key[2] != default:
                challenger = rec
        # the records after these are slower by their medians: they change nothing
        if faster_keys and faster_keys <= found.keys():
            break
        if not faster_keys and (challenger is not None if slower else first_unjudged is not None):
            break
    if found:
        key = max(found, key=lambda k: (confirmed_speedup(judged[k]), -(found[k].median_us or 0.0)))
        best = found[key]
        beats = challenger is not None and (challenger.median_us or 0.0) < (best.median_us or 0.0)
        return Selection(best, CONFIRMED, judged[key], challenger if beats else None, len(left_out))
    if slower:
        latest = max(slower, key=lambda c: (c.created_at, c.id))
        return Selection(None, KEPT_DEFAULT, latest, challenger, len(left_out))
    if first_unjudged is not None:
        standing = DEFAULT_IS_BEST if config_key(first_unjudged)[2] == default else UNCONFIRMED
        return Selection(first_unjudged, standing, None, None, len(left_out))
    return Selection(None, KEPT_DEFAULT if left_out else NO_RECORD, None, None, len(left_out))


__all__ = [
    "CONFIRMED",
    "DEFAULT_IS_BEST",
    "KEPT_DEFAULT",
    "NO_RECORD",
    "STANDINGS",
    "UNCONFIRMED",
    "Selection",
    "choose",
    "config_key",
    "confirmed_speedup",
    "verdicts",
]
