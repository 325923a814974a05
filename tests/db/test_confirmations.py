"""Confirmations in the database (every backend): what is derived from the rounds, the latest one wins,
malformed input is refused with a clear error, and a malformed stored row is skipped."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from db.database import TuningDatabase
from db.errors import InvalidRecordError, UnknownKeyError
from db.records import ConfirmationIn
from tests.db.helpers import CPU, GPU, add_basics, wkey


def conf(workload: str, best: list[float], default: list[float], target: str = CPU, **over) -> ConfirmationIn:
    fields = dict(
        workload_key=workload,
        target_key=target,
        sketch="pointwise",
        sketch_version=1,
        config={"vector": 8},
        default_config={"vector": 1},
        best_rounds=best,
        default_rounds=default,
    )
    return ConfirmationIn(**{**fields, **over})


def test_speedup_and_spread_come_from_paired_rounds(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_confirmation(conf(keys[0], [100.0, 110.0, 90.0], [150.0, 143.0, 135.0]))
    c = db.latest_confirmation(keys[0], CPU)
    assert c is not None and c.rounds == 3 and c.better
    assert c.best_us == 100.0 and c.default_us == 143.0
    assert c.speedup == pytest.approx(1.5)  # ratios 1.5, 1.3, 1.5
    assert c.spread == pytest.approx((1.5 - 1.3) / 2 / 1.5)
    assert db.latest_confirmation(keys[0], GPU) is None and db.latest_confirmation(keys[1], CPU) is None


def test_the_latest_confirmation_counts(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_confirmation(conf(keys[0], [100.0], [150.0]))
    db.commit_confirmation(conf(keys[0], [100.0], [90.0], config={"vector": 4}))
    db.commit_confirmation(conf(keys[1], [10.0], [20.0]))
    latest = db.latest_confirmations(keys, CPU)
    assert set(latest) == {keys[0], keys[1]}
    assert latest[keys[0]].config == {"vector": 4} and not latest[keys[0]].better
    assert len(db.find_confirmations(keys[0])) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"best_rounds": [1.0, 2.0], "default_rounds": [1.0]}, "same number"),
        ({"best_rounds": [], "default_rounds": []}, "same number"),
        ({"best_rounds": [0.0], "default_rounds": [1.0]}, "positive"),
        ({"best_rounds": [float("nan")], "default_rounds": [1.0]}, "finite"),
        ({"config": {"v": [1]}}, "non-scalar"),
        ({"sketch_version": "1"}, "sketch_version"),
    ],
)
def test_malformed_confirmations_are_refused(db: TuningDatabase, change: dict, message: str) -> None:
    keys = add_basics(db)
    change = dict(change)  # the parameter is shared by the backends
    base = dict(best=[1.0], default=[2.0])
    rounds = {k: change.pop(k) for k in ("best_rounds", "default_rounds") if k in change}
    c = conf(
        keys[0],
        rounds.get("best_rounds", base["best"]),
        rounds.get("default_rounds", base["default"]),
        **change,
    )
    with pytest.raises(InvalidRecordError, match=message):
        db.commit_confirmation(c)
    with pytest.raises(UnknownKeyError):
        db.commit_confirmation(conf(wkey("nope"), [1.0], [2.0]))


def test_a_malformed_stored_row_is_skipped(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_confirmation(conf(keys[0], [100.0], [150.0]))
    cid = db.commit_confirmation(conf(keys[0], [100.0], [90.0]))
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE kiln_confirmations SET best_rounds = 'oops' WHERE id = :i"), {"i": cid})
    assert db.latest_confirmation(keys[0], CPU) is None  # the latest is unreadable: nothing is claimed
    assert [c.id for c in db.find_confirmations(keys[0])] == [cid - 1]
