"""Leases (db/leases.py) on every backend: one live holder per key, takeover after expiry, config claims
that respect records and a run's budget, a mutex, and the cleanup of what dead workers left."""

from __future__ import annotations

import time

import pytest

from db.database import TuningDatabase
from db.leases import CONFIG, MUTEX, TASK, WORKER, Leases, lease_key, records_since
from tests.db.helpers import CPU, add_basics, rec


def _ident(db: TuningDatabase) -> tuple[str, str, str, int]:
    (wk,) = add_basics(db, 1)
    return (wk, CPU, "pointwise", 1)


def test_one_live_holder_and_takeover_after_expiry(db: TuningDatabase) -> None:
    a, b = Leases(db, "a", ttl_s=0.3), Leases(db, "b", ttl_s=30)
    key = lease_key(TASK, "x")
    assert a.claim(key, TASK) and a.claim(key, TASK)  # taken, then renewed by its holder
    assert not b.claim(key, TASK)
    assert b.held_by_others([key]) == {key} and a.held_by_others([key]) == set()
    assert a.renew() == 1
    time.sleep(0.4)  # a died: no heartbeat
    assert b.held_by_others([key]) == set()
    assert b.claim(key, TASK) and not a.claim(key, TASK)
    b.release([key])
    assert a.claim(key, TASK)


def test_config_claims_skip_recorded_and_held_configs(db: TuningDatabase) -> None:
    ident = _ident(db)
    a, b = Leases(db, "a"), Leases(db, "b")
    db.commit_record(rec(ident[0], config={"t": 1}))
    configs = ['{"t":1}', '{"t":2}', '{"t":3}']
    assert a.claim_configs(ident, configs[1:2]) == (['{"t":2}'], set())
    claimed, recorded = b.claim_configs(ident, configs)
    assert claimed == ['{"t":3}'] and recorded == {'{"t":1}'}
    a.release_configs(ident, ['{"t":2}'])
    assert b.claim_configs(ident, ['{"t":2}']) == (['{"t":2}'], set())


def test_config_claims_respect_the_run_budget(db: TuningDatabase) -> None:
    ident = _ident(db)
    run = db.begin_run("m", "h", CPU, {}, "test")
    a, b = Leases(db, "a"), Leases(db, "b")
    db.commit_record(rec(ident[0], config={"t": 0}, run_id=run))
    mine, _ = a.claim_configs(ident, [f'{{"t":{i}}}' for i in range(1, 4)], run, budget=5)
    assert len(mine) == 3
    theirs, _ = b.claim_configs(ident, [f'{{"t":{i}}}' for i in range(4, 8)], run, budget=5)
    assert theirs == ['{"t":4}']  # 1 record + 3 in flight with a + 1 = the budget of 5
    assert a.in_flight(run) == 1 and b.in_flight(run) == 3


def test_the_end_of_a_budget_is_shared_among_the_live_workers(db: TuningDatabase) -> None:
    ident = _ident(db)
    run = db.begin_run("m", "h", CPU, {}, "test")
    a, b = Leases(db, "a"), Leases(db, "b")
    for w in (a, b):
        assert w.claim(lease_key(WORKER, run, w.owner), WORKER, run)
    configs = [f'{{"t":{i}}}' for i in range(8)]
    mine, _ = a.claim_configs(ident, configs, run, budget=100)
    assert len(mine) == 8  # far from the end: a whole batch
    a.release_configs(ident, mine)
    mine, _ = a.claim_configs(ident, configs, run, budget=9)
    assert len(mine) == 5  # 9 left for 2 workers: ceil(9 / 2)


def test_mutex_purge_and_new_records(db: TuningDatabase) -> None:
    ident = _ident(db)
    a, b = Leases(db, "a", ttl_s=0.2), Leases(db, "b")
    with a.mutex("open a run"):
        assert not b.claim(lease_key(MUTEX, "open a run"), MUTEX)
    assert b.claim(lease_key(MUTEX, "open a run"), MUTEX)
    a.claim(lease_key(WORKER, 1, "a"), WORKER, None)
    a.claim_configs(ident, ['{"t":9}'])
    time.sleep(0.3)
    assert b.purge_expired() == 2  # a's worker lease and its claim
    first = db.commit_record(rec(ident[0], config={"t": 1}))
    second = db.commit_record(rec(ident[0], config={"t": 2}))
    assert [r.id for r in records_since(db, ident, 0)] == [first, second]
    assert [r.config for r in records_since(db, ident, first)] == [{"t": 2}]
    assert records_since(db, (ident[0], CPU, "other", 1), 0) == []


def test_ttl_from_environment(db: TuningDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_LEASE_TTL", "4.5")
    assert Leases(db).ttl_s == 4.5
    monkeypatch.setenv("KILN_LEASE_TTL", "soon")
    with pytest.raises(Exception, match="KILN_LEASE_TTL must be a positive number"):
        Leases(db)
    assert CONFIG == "config"
