"""The selection rule (db.selection, ``TuningDatabase.select_record``) on every backend: confirmed faster
beats unconfirmed, confirmed not faster keeps the default, each config's latest verdict counts, a config
with a failed measurement is left out, and a workload with hundreds of records costs two queries."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from db.database import TuningDatabase
from db.records import ConfirmationIn
from db.selection import CONFIRMED, DEFAULT_IS_BEST, KEPT_DEFAULT, NO_RECORD, UNCONFIRMED
from tests.db.helpers import CPU, add_basics, rec

DEFAULT = {"vector": 1}


def v(n: int) -> dict:
    return {"vector": n}


def confirm(db: TuningDatabase, workload: str, config: dict, best: float, default: float, **over) -> None:
    fields = dict(sketch="pointwise", sketch_version=1, default_config=DEFAULT)
    fields.update(over)
    db.commit_confirmation(
        ConfirmationIn(
            workload, CPU, config=config, best_rounds=[best] * 3, default_rounds=[default] * 3, **fields
        )
    )


def test_no_confirmation_gives_the_lowest_median(db: TuningDatabase) -> None:
    keys = add_basics(db)
    assert db.select_record(keys[0], CPU, DEFAULT).standing == NO_RECORD
    db.commit_records(
        [rec(keys[0], latencies=[100.0], config=v(2)), rec(keys[0], latencies=[90.0], config=v(4))]
    )
    sel = db.select_record(keys[0], CPU, DEFAULT)
    assert sel.standing == UNCONFIRMED and sel.record is not None and sel.record.config == v(4)
    assert sel.to_confirm == v(4)
    db.commit_record(rec(keys[0], latencies=[80.0], config=DEFAULT))
    assert db.select_record(keys[0], CPU, DEFAULT).standing == DEFAULT_IS_BEST


def test_confirmed_faster_beats_unconfirmed_and_not_faster_blocks(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_records(
        [rec(keys[0], latencies=[100.0], config=v(2)), rec(keys[0], latencies=[90.0], config=v(4))]
    )
    confirm(db, keys[0], v(4), 300.0, 200.0)  # the lowest median: not faster
    sel = db.select_record(keys[0], CPU, DEFAULT)
    assert sel.standing == KEPT_DEFAULT and sel.record is None and sel.confirmation.config == v(4)
    assert sel.challenger is not None and sel.challenger.config == v(2)  # what the next run confirms
    confirm(db, keys[0], v(2), 100.0, 200.0)
    sel = db.select_record(keys[0], CPU, DEFAULT)
    assert sel.standing == CONFIRMED and sel.record.config == v(2) and sel.challenger is None
    db.commit_record(rec(keys[0], latencies=[50.0], config=v(8)))  # a lucky median, never confirmed
    sel = db.select_record(keys[0], CPU, DEFAULT)
    assert sel.record.config == v(2) and sel.challenger.config == v(8) and sel.to_confirm == v(8)


def test_each_configs_latest_verdict_against_the_current_default_counts(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_record(rec(keys[0], latencies=[100.0], config=v(2)))
    confirm(db, keys[0], v(2), 100.0, 200.0)
    confirm(db, keys[0], v(2), 300.0, 200.0)  # measured again: not faster after all
    assert db.select_record(keys[0], CPU, DEFAULT).standing == KEPT_DEFAULT
    # against another default (the sketch changed it) the verdicts do not count
    assert db.select_record(keys[0], CPU, v(16)).standing == UNCONFIRMED

    # nor ones of another sketch version (the validator rejects them)
    def newer(r):
        return None if r.sketch_version == 2 else "old version"

    with pytest.warns(Warning, match="old version"):
        assert db.select_record(keys[0], CPU, DEFAULT, validate=newer).standing == NO_RECORD


def test_a_config_with_a_failed_measurement_is_left_out(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_records(
        [rec(keys[0], latencies=[50.0], config=v(8)), rec(keys[0], latencies=[90.0], config=v(4))]
    )
    confirm(db, keys[0], v(8), 100.0, 200.0)  # even a confirmed one
    db.commit_record(rec(keys[0], status="wrong_result", config=v(8), error="max abs err 3.2"))
    sel = db.select_record(keys[0], CPU, DEFAULT)
    assert sel.standing == UNCONFIRMED and sel.record.config == v(4) and sel.failed == 1
    db.commit_record(rec(keys[0], status="timeout", config=v(4)))
    sel = db.select_record(keys[0], CPU, DEFAULT)
    assert sel.standing == KEPT_DEFAULT and sel.record is None and sel.failed == 2


def test_hundreds_of_records_cost_two_queries(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_records(
        [rec(keys[0], latencies=[100.0 + i], config={"vector": 2, "i": i}) for i in range(300)]
        + [rec(keys[0], status="compile_error", config={"vector": 4, "i": i}) for i in range(100)]
    )
    confirm(db, keys[0], {"vector": 2, "i": 250}, 100.0, 200.0)
    confirm(db, keys[0], {"vector": 2, "i": 0}, 300.0, 200.0)
    statements: list[str] = []

    def count(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        sel = db.select_record(keys[0], CPU, DEFAULT)
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    assert sel.standing == CONFIRMED and sel.record.config == {"vector": 2, "i": 250}
    assert sel.challenger is not None and sel.challenger.config == {"vector": 2, "i": 1}
    assert len(statements) == 2


def test_prune_keeps_what_the_selection_rests_on(db: TuningDatabase) -> None:
    """``prune --keep-top 1 --drop-errors`` keeps the records of a confirmed config (beside the K best) and
    the failed measurement of a kept config (without it that config would be applied again)."""
    keys = add_basics(db)
    db.commit_records(
        [
            rec(keys[0], latencies=[100.0], config=v(2)),
            rec(keys[0], latencies=[50.0], config=v(4)),
            rec(keys[0], latencies=[60.0], config=v(8)),
            rec(keys[0], status="runtime_error", config=v(4)),
            rec(keys[0], status="compile_error", config=v(16)),
        ]
    )
    confirm(db, keys[0], v(2), 100.0, 200.0)
    before = db.select_record(keys[0], CPU, DEFAULT)
    assert before.standing == CONFIRMED and before.record.config == v(2)
    assert db.prune(1, keep_errors=False) == 2  # v(8) and v(16)'s compile error
    left = {(r.status.value, r.config["vector"]) for r in db.find_records(keys[0], CPU)}
    assert left == {("ok", 2), ("ok", 4), ("runtime_error", 4)}
    after = db.select_record(keys[0], CPU, DEFAULT)
    assert after.standing == CONFIRMED and after.record.id == before.record.id
