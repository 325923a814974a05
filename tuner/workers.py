"""Sharing a tuning between workers: which task to tune next, which candidates to measure, when to stop.

A *worker* is one tuning process (``kiln tune``). Any number of them, on one machine or many, pointed at
one database, share a run: they tune different tasks while there are enough, never measure a config
twice for the same (workload, target, sketch, sketch version), and stop together when the run's trial
budget is spent. :class:`WorkShare` is that role; :class:`DatabaseShare` plays it through leases with
heartbeats in the tuning database (:mod:`db.leases`), :class:`LocalShare` for a worker alone (an
in-memory database, tests of the search).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from db.database import TuningDatabase
    from db.leases import Ident, Leases

GO, WAIT, STOP = "go", "wait", "stop"


class WorkShare(ABC):
    """How one worker shares a tuning with the others.

    Contract:

    - ``choose(idents)`` gets the tasks the scheduler would like to tune next, best first, and returns the
      index of the one this worker takes: the first that no other live worker is tuning (which it then
      holds), else 0 (several workers on one task still measure different configs).
    - ``claim(ident, configs)`` gets candidate configs (canonical JSON) of a task and returns (the configs
      this worker may measure now, the configs that already have a record). No config is ever handed to
      two live workers at once, nor one with a record; no more are handed out than the run's trial budget
      has left (counting other workers' configs in flight).
    - ``release(ident, configs)`` ends the claims (after the records were committed, or when measuring
      failed), so nobody waits for them.
    - ``gate()`` says whether to go on: ``go``; ``wait`` (the budget is all in flight with other workers,
      whose claims come back if they die); ``stop`` (the run's budget is spent).
    - ``pause()`` waits a moment before asking again; ``close()`` gives every claim back.
    """

    @abstractmethod
    def choose(self, idents: Sequence[Ident]) -> int: ...

    @abstractmethod
    def claim(self, ident: Ident, configs: Sequence[str]) -> tuple[list[str], set[str]]: ...

    @abstractmethod
    def release(self, ident: Ident, configs: Sequence[str]) -> None: ...

    @abstractmethod
    def gate(self) -> str: ...

    def pause(self) -> None:
        """Wait before asking again (a worker with nothing to claim)."""
        time.sleep(0.2)

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Give back every claim and lease."""


class LocalShare(WorkShare):
    """A worker alone: every task and config is its own (the scheduler's budget is the only limit)."""

    def __init__(self) -> None:
        self.held: set[tuple[Ident, str]] = set()

    def choose(self, idents: Sequence[Ident]) -> int:
        return 0

    def claim(self, ident: Ident, configs: Sequence[str]) -> tuple[list[str], set[str]]:
        mine = [c for c in dict.fromkeys(configs) if (ident, c) not in self.held]
        self.held.update((ident, c) for c in mine)
        return mine, set()

    def release(self, ident: Ident, configs: Sequence[str]) -> None:
        self.held.difference_update((ident, c) for c in configs)

    def gate(self) -> str:
        return GO

    def close(self) -> None:
        self.held.clear()


class DatabaseShare(WorkShare):
    """Work sharing through leases in the tuning database (see :mod:`db.leases`).

    ``run_id`` is the run this worker tunes under, ``budget`` its trials in total (None: a time budget
    only). The worker's place in the run is a lease too; a heartbeat thread (``heartbeat``; off only for a
    private in-memory database) renews every lease while the worker lives, so a worker killed with
    SIGKILL loses at most the batch it was measuring: its claims expire after the leases' TTL and the
    others measure those configs.
    """

    def __init__(
        self,
        db: TuningDatabase,
        run_id: int | None = None,
        budget: int | None = None,
        leases: Leases | None = None,
        poll_s: float = 0.2,
        heartbeat: bool = True,
    ) -> None:
        from db.leases import Heartbeat, Leases  # SQLAlchemy: only once a worker shares a database

        self.leases = leases or Leases(db)
        self.run_id, self.budget, self.poll_s = run_id, budget, poll_s
        self._heartbeat = Heartbeat(self.leases).start() if heartbeat else None

    @property
    def owner(self) -> str:
        return self.leases.owner

    def choose(self, idents: Sequence[Ident]) -> int:
        from db.leases import task_lease_key

        keys = [task_lease_key(i) for i in idents]
        busy = self.leases.held_by_others(keys)
        for index, (ident, key) in enumerate(zip(idents, keys)):
            if key not in busy and self.leases.hold_task(ident):
                return index
        return 0

    def claim(self, ident: Ident, configs: Sequence[str]) -> tuple[list[str], set[str]]:
        return self.leases.claim_configs(ident, list(dict.fromkeys(configs)), self.run_id, self.budget)

    def release(self, ident: Ident, configs: Sequence[str]) -> None:
        self.leases.release_configs(ident, configs)

    def gate(self) -> str:
        if self.budget is None or self.run_id is None:
            return GO
        stored = self.leases.db.run_record_counts(self.run_id)
        flying = self.leases.in_flight(self.run_id)
        left = self.budget - sum(stored.values()) - flying
        if left > 0:
            return GO
        return WAIT if flying else STOP

    def pause(self) -> None:
        time.sleep(self.poll_s)

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self.leases.release_all()
