"""Leases with heartbeats: how several workers (``kiln tune`` processes) share one tuning database's work.

A lease is a row of ``kiln_leases``: the sha256 ``key`` of what is claimed, its ``kind``, the ``owner`` (a
worker id, unique per process: ``host:pid:random``), the run a config claim counts against, and an expiry.
A worker renews all its leases while it lives (:class:`Heartbeat`, every third of the TTL); a lease past
its expiry belongs to a dead worker (killed, lost its machine) and anyone may take it over. Kinds:

- ``task``: the task a worker is tuning now (a worker holds at most one), so that workers spread over
  the tasks when there are enough of them;
- ``config``: one candidate config being measured, claimed before it is built. The key is the config's
  identity (workload, target, sketch, sketch version, canonical config), unique in the table, so two live
  workers never measure the same config; a config that already has a record is never claimed. Claims are
  released once their records are committed;
- ``worker``: a worker's place in a run (how many workers share it, who closes it);
- ``mutex``: a short critical section across processes and machines (opening or joining a run).

Times are the workers' clocks (naive UTC): the machines of a team must agree on the time to well within
the TTL (NTP does). Nothing read from this table is evaluated; keys are compared as text.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, or_, select, update

from db.canonical import canonical_json, utc_now
from db.core import host, records_select, to_record
from db.errors import DatabaseError, InvalidRecordError
from db.models import LeaseRow, RecordRow, RunRow, TargetRow, WorkloadRow
from db.records import Record

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from db.database import TuningDatabase

log = logging.getLogger("kiln.leases")

TASK, CONFIG, WORKER, MUTEX = "task", "config", "worker", "mutex"
DEFAULT_TTL_S = 30.0
TTL_ENV = "KILN_LEASE_TTL"

# (workload key, target key, sketch name, sketch version): what a config's identity is relative to
Ident = tuple[str, str, str, int]


def lease_key(*parts: Any) -> str:
    """The key of a lease: sha256 of the canonical JSON of ``parts`` (64 hex digits)."""
    return hashlib.sha256(canonical_json(list(parts)).encode("utf-8")).hexdigest()


def config_lease_key(ident: Ident, config_json: str) -> str:
    """The key of the claim on one candidate config (canonical JSON) of a task."""
    return lease_key(CONFIG, *ident, config_json)


def task_lease_key(ident: Ident) -> str:
    """The key of the lease on a task."""
    return lease_key(TASK, *ident)


def new_owner() -> str:
    """A worker id unique to this process: ``host:pid:random``."""
    return f"{host()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def default_ttl() -> float:
    """The lease TTL in seconds: ``$KILN_LEASE_TTL``, else 30."""
    text = os.environ.get(TTL_ENV)
    if not text:
        return DEFAULT_TTL_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise DatabaseError(f"${TTL_ENV} must be a positive number of seconds, got {text!r}")
    return value


class Leases:
    """The leases of one worker (``owner``) in a tuning database; every method is one transaction."""

    def __init__(self, db: TuningDatabase, owner: str | None = None, ttl_s: float | None = None) -> None:
        self.db = db
        self.owner = owner or new_owner()
        self.ttl_s = float(ttl_s) if ttl_s is not None else default_ttl()
        if not self.ttl_s > 0:
            raise DatabaseError(f"a lease TTL must be positive, got {ttl_s!r}")

    # ---------------------------------------------------------------- basics
    def _expiry(self) -> datetime:
        return utc_now() + timedelta(seconds=self.ttl_s)

    def _take(self, conn: Connection, key: str, kind: str, run_id: int | None) -> bool:
        """Insert the lease, or renew it when it is ours, or take it over when it expired."""
        now = utc_now()
        values = dict(
            key=key, kind=kind, owner=self.owner, run_id=run_id, expires_at=self._expiry(), created_at=now
        )
        if self.db._insert_ignore(conn, LeaseRow, values):
            return True
        stmt = (
            update(LeaseRow)
            .where(LeaseRow.key == key, or_(LeaseRow.owner == self.owner, LeaseRow.expires_at < now))
            .values(
                owner=self.owner, kind=kind, run_id=run_id, expires_at=values["expires_at"], created_at=now
            )
        )
        return conn.execute(stmt).rowcount == 1

    def claim(self, key: str, kind: str, run_id: int | None = None) -> bool:
        """Take the lease ``key`` (or renew it when this worker holds it); False while another live worker
        holds it."""
        with self.db._write("claim a lease") as conn:
            return self._take(conn, key, kind, run_id)

    def release(self, keys: Iterable[str]) -> None:
        """Drop this worker's leases among ``keys``."""
        keys = list(keys)
        if not keys:
            return
        with self.db._write("release leases") as conn:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                conn.execute(delete(LeaseRow).where(LeaseRow.owner == self.owner, LeaseRow.key.in_(chunk)))

    def release_all(self) -> None:
        """Drop every lease of this worker (it is leaving)."""
        with self.db._write("release leases") as conn:
            conn.execute(delete(LeaseRow).where(LeaseRow.owner == self.owner))

    def purge_expired(self) -> int:
        """Delete every expired lease (of dead workers: free to take anyway); returns how many."""
        with self.db._write("purge expired leases") as conn:
            return int(conn.execute(delete(LeaseRow).where(LeaseRow.expires_at < utc_now())).rowcount)

    def renew(self) -> int:
        """The heartbeat: push back the expiry of every lease of this worker; returns how many it holds."""
        with self.db._write("renew leases") as conn:
            done = conn.execute(
                update(LeaseRow).where(LeaseRow.owner == self.owner).values(expires_at=self._expiry())
            )
            return int(done.rowcount)

    def held_by_others(self, keys: Sequence[str]) -> set[str]:
        """Those of ``keys`` that another live worker holds now."""
        if not keys:
            return set()
        stmt = select(LeaseRow.key).where(
            LeaseRow.key.in_(list(keys)), LeaseRow.owner != self.owner, LeaseRow.expires_at >= utc_now()
        )
        with self.db._read("read leases") as conn:
            return set(conn.execute(stmt).scalars())

    def live(self, kind: str, run_id: int) -> int:
        """How many live leases of ``kind`` count against run ``run_id`` (this worker's included)."""
        stmt = select(func.count()).where(
            LeaseRow.kind == kind, LeaseRow.run_id == run_id, LeaseRow.expires_at >= utc_now()
        )
        with self.db._read("count leases") as conn:
            return int(conn.execute(stmt).scalar() or 0)

    @contextlib.contextmanager
    def mutex(self, name: str, timeout_s: float = 120.0) -> Iterator[None]:
        """Hold the cross-process mutex ``name`` for the block (a lease: a killed holder frees it when its
        lease expires). Raises :class:`DatabaseError` after ``timeout_s`` seconds of waiting."""
        key = lease_key(MUTEX, name)
        deadline = time.monotonic() + timeout_s
        while not self.claim(key, MUTEX):
            if time.monotonic() > deadline:
                raise DatabaseError(
                    f"waited {timeout_s:.0f} s for the lock {name!r} in {self.db.url}: "
                    "another worker holds it"
                )
            time.sleep(0.05)
        try:
            yield
        finally:
            self.release([key])

    # ------------------------------------------------------- tasks and configs
    def hold_task(self, ident: Ident) -> bool:
        """Take the lease on a task and drop this worker's other task leases (a worker tunes one task at a
        time); False (and nothing dropped) while another live worker holds it."""
        key = task_lease_key(ident)
        with self.db._write("claim a task") as conn:
            if not self._take(conn, key, TASK, None):
                return False
            conn.execute(
                delete(LeaseRow).where(
                    LeaseRow.owner == self.owner, LeaseRow.kind == TASK, LeaseRow.key != key
                )
            )
            return True

    def claim_configs(
        self, ident: Ident, configs: Sequence[str], run_id: int | None = None, budget: int | None = None
    ) -> tuple[list[str], set[str]]:
        """Claim candidate configs (canonical JSON) of a task for measurement, in order.

        Returns (the configs this worker now holds, the configs that already have a record). A config held
        by another live worker is skipped. With ``budget`` (the trials of run ``run_id``), no more are
        claimed than the budget minus the run's records and the other workers' live claims under it, and
        near its end no more than an even share among the run's live workers (so they finish together);
        the claims of a run are serialized (a lock on its row), so concurrent workers never overshoot it.
        """
        if not configs:
            return [], set()
        with self.db._write("claim configs") as conn:
            allowed = len(configs)
            if run_id is not None:
                conn.execute(select(RunRow.id).where(RunRow.id == run_id).with_for_update())
                if budget is not None:
                    left = max(0, budget - self._used(conn, run_id))
                    workers = self._workers(conn, run_id)
                    if left < allowed * workers:  # the end of the budget: share it, finish together
                        left = -(-left // workers)
                    allowed = min(allowed, left)
            recorded = self._recorded(conn, ident, configs)
            claimed: list[str] = []
            for c in configs:
                if len(claimed) >= allowed:
                    break
                if c not in recorded and self._take(conn, config_lease_key(ident, c), CONFIG, run_id):
                    claimed.append(c)
            # a record committed while we claimed (its worker released the claim just after): not ours
            late = self._recorded(conn, ident, claimed)
            if late:
                keys = [config_lease_key(ident, c) for c in late]
                conn.execute(delete(LeaseRow).where(LeaseRow.owner == self.owner, LeaseRow.key.in_(keys)))
                claimed = [c for c in claimed if c not in late]
                recorded |= late
        log.debug("%s claimed %d of %d configs of %s", self.owner, len(claimed), len(configs), ident[0][:10])
        return claimed, recorded

    def release_configs(self, ident: Ident, configs: Iterable[str]) -> None:
        """Drop this worker's claims on ``configs`` (after their records were committed, or abandoned)."""
        self.release([config_lease_key(ident, c) for c in configs])

    def _used(self, conn: Connection, run_id: int) -> int:
        """Records under the run plus other live workers' config claims under it."""
        stored = conn.execute(select(func.count()).where(RecordRow.run_id == run_id)).scalar() or 0
        flying = (
            conn.execute(
                select(func.count()).where(
                    LeaseRow.kind == CONFIG,
                    LeaseRow.run_id == run_id,
                    LeaseRow.owner != self.owner,
                    LeaseRow.expires_at >= utc_now(),
                )
            ).scalar()
            or 0
        )
        return int(stored) + int(flying)

    def _workers(self, conn: Connection, run_id: int) -> int:
        """Live workers of the run (at least 1: this one)."""
        stmt = select(func.count()).where(
            LeaseRow.kind == WORKER, LeaseRow.run_id == run_id, LeaseRow.expires_at >= utc_now()
        )
        return max(1, int(conn.execute(stmt).scalar() or 0))

    def _recorded(self, conn: Connection, ident: Ident, configs: Sequence[str]) -> set[str]:
        if not configs:
            return set()
        wk, tk, sketch, version = ident
        stmt = (
            select(RecordRow.config)
            .join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
            .join(TargetRow, TargetRow.id == RecordRow.target_id)
            .where(
                WorkloadRow.key == wk,
                TargetRow.key == tk,
                RecordRow.sketch == sketch,
                RecordRow.sketch_version == version,
                RecordRow.config.in_(list(configs)),
            )
        )
        return set(conn.execute(stmt).scalars())

    def in_flight(self, run_id: int) -> int:
        """Other live workers' config claims under run ``run_id``."""
        stmt = select(func.count()).where(
            LeaseRow.kind == CONFIG,
            LeaseRow.run_id == run_id,
            LeaseRow.owner != self.owner,
            LeaseRow.expires_at >= utc_now(),
        )
        with self.db._read("count claims") as conn:
            return int(conn.execute(stmt).scalar() or 0)


def records_since(db: TuningDatabase, ident: Ident, after_id: int) -> list[Record]:
    """The records of a task (its workload, target, sketch and version) with an id above ``after_id``,
    oldest first: what the other workers (and earlier runs) measured since a worker last looked.
    Malformed stored rows are skipped."""
    wk, tk, sketch, version = ident
    stmt = (
        records_select()
        .where(
            WorkloadRow.key == wk,
            TargetRow.key == tk,
            RecordRow.sketch == sketch,
            RecordRow.sketch_version == version,
            RecordRow.id > after_id,
        )
        .order_by(RecordRow.id)
    )
    out = []
    with db._read("read new records") as conn:
        for row in conn.execute(stmt):
            try:
                out.append(to_record(row))
            except InvalidRecordError as exc:
                log.warning("skipping a malformed record: %s", exc)
    return out


class Heartbeat:
    """A daemon thread renewing a worker's leases every third of their TTL until :meth:`stop`.

    A failed renewal (the database briefly unreachable) is logged and retried at the next beat; leases
    that expired meanwhile may have been taken over, which the worker notices when it commits (its claims
    are gone) — measurements are never lost, at worst measured twice.
    """

    def __init__(self, leases: Leases) -> None:
        self.leases = leases
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="kiln-lease-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _beat(self) -> None:
        period = self.leases.ttl_s / 3
        while not self._stop.wait(period):
            try:
                self.leases.renew()
            except Exception as exc:  # keep beating: the next renewal may reach the database
                log.warning("lease heartbeat of %s failed: %s", self.leases.owner, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.leases.ttl_s)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
