"""Confirmed speed-ups: at the end of tuning, each task's best candidate and its default are measured again,
interleaved, and the confirmation is stored beside the records (see :mod:`db.confirmations`).

Why: a record's median comes from one measurement taken whenever the search reached it, and the default is
measured once, first. Under load one default measured 11,944 us instead of 269 us and gave a stored
"16.96x over default"; tuned kernels slower than their default reached compiled models. A confirmation runs
``rounds`` rounds; each is one full measurement (check and timing) of the best candidate and the default
through the same measurer, back to back, the order alternating between rounds (best first in even rounds);
both are compiled once, before the first round. The speed-up is the median of the per-round ratios, its
spread half their range. The candidate is confirmed better when that median AND the ratio of the two
configs' fastest rounds are both above 1 (:attr:`db.records.Confirmation.better`: load only slows a kernel
down, so a config's fastest round is its least disturbed one). When the rounds leave the side of 1 open
(the median within the spread of 1, or the two ratios on different sides, as on a loaded machine), up to
``rounds`` more rounds are measured and the decision is taken on all of them.

What depends on it:

- ``kiln tune`` prints every "x over default" from the confirmation, with its spread (``1.42x (±3%)``),
  and says ``unconfirmed`` where there is none yet (the live display during the search, an interrupted run);
- compile (:func:`tuner.records.database_config_source`) applies records by the selection rule of
  :mod:`db.selection`, over every confirmation of the workload (each config's latest one against the
  current default is its verdict): a record confirmed faster beats any unconfirmed one, a record confirmed
  not faster keeps the default schedule (and says so in the compile report) unless another is confirmed
  faster, and records without a confirmation (older databases, interrupted runs) are applied by their
  lowest median and reported as unconfirmed;
- what the end of a run confirms is that rule's choice (:attr:`db.selection.Selection.to_confirm`): the
  lowest-median record of the task without a verdict when it beats what compile would apply, else the
  applied record (its confirmation is reused); when the former would displace a record confirmed faster,
  that record is measured in the same rounds and confirmed again (:func:`measure_with_rival`). A round
  that fails is committed as a record of its status, and a config with a failed measurement is never
  applied.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from compiler.backends.sketch import Config
from db.canonical import canonical_json
from db.records import Confirmation, ConfirmationIn, RecordIn
from db.selection import CONFIRMED, KEPT_DEFAULT, UNCONFIRMED, Selection, verdicts
from db.status import Status
from tuner.space import config_json
from tuner.task import Task

DEFAULT_ROUNDS = 5


def speedup_text(conf: Confirmation | None, is_default: bool = False) -> str:
    """``1.42x (±3%)`` from a confirmation, ``default`` when the best config is the default itself, or
    ``unconfirmed``; a paired median above 1 that the fastest rounds contradict (not confirmed better, see
    :class:`~db.records.Confirmation`) says so: ``1.36x (±73%; fastest rounds 0.91x)``."""
    if is_default:
        return "default"
    if conf is None:
        return "unconfirmed"
    if conf.speedup > 1.0 and not conf.better:
        return f"{conf.speedup:.2f}x (±{100 * conf.spread:.0f}%; fastest rounds {conf.fastest_ratio:.2f}x)"
    return f"{conf.speedup:.2f}x (±{100 * conf.spread:.0f}%)"


def selection(db: Any, task: Task) -> Selection:
    """What compile applies to ``task``'s group (:meth:`~db.database.TuningDatabase.select_record`)."""
    from tuner.records import validator_for

    return db.select_record(
        task.workload_key, task.target.key, task.default(), validate=validator_for(task.group, task.target)
    )


def applied_text(sel: Selection) -> str:
    """What compile does with a task after its confirmation, for ``kiln tune``'s confirmation lines."""
    if sel.standing == CONFIRMED and sel.confirmation is not None:
        return f"compile applies the record confirmed {speedup_text(sel.confirmation)}"
    if sel.standing == KEPT_DEFAULT:
        return "compile keeps the default"
    if sel.standing == UNCONFIRMED:
        return "compile applies the lowest unconfirmed median"
    return "compile applies the default config (it measured best)"


@dataclass(frozen=True)
class RoundsFailed:
    """Confirmation rounds that stopped: ``result`` is the first measurement that was not ok (of
    ``config``, the candidate's or the default's), ``error`` says which round and why."""

    error: str
    config: Config
    result: Any  # tuner.measure.MeasureResult


@dataclass(frozen=True)
class ConfirmFailure:
    """A confirmation that could not be made: a round's measurement of either config was not ok (it is
    committed as a record, so the failed config is never applied: :mod:`db.selection`)."""

    task: Task
    error: str


def measure_rounds(
    task: Task,
    config: Config,
    measurer: Any,
    rounds: int = DEFAULT_ROUNDS,
    max_rounds: int | None = None,
) -> tuple[list[float], list[float]] | RoundsFailed:
    """Measure ``config`` and the task's default in ``rounds`` interleaved rounds through ``measurer``;
    return (best medians, default medians) per round, or the first round's measurement that failed.

    Through :func:`tuner.measure.measure_in_rounds`: a :class:`~tuner.measure.Measurer` builds both once
    and times them round after round; any other measurer is called once per round. When the rounds leave the
    answer open (the median ratio is within the rounds' spread of 1: a loaded machine), ``rounds`` more are
    measured, up to ``max_rounds`` in all (default ``2 * rounds``), and the decision is taken on all of
    them."""
    got = measure_with_rival(task, config, None, measurer, rounds, max_rounds)
    return got if isinstance(got, RoundsFailed) else (got[0], got[1])


def measure_with_rival(
    task: Task,
    config: Config,
    rival: Config | None,
    measurer: Any,
    rounds: int = DEFAULT_ROUNDS,
    max_rounds: int | None = None,
) -> tuple[list[float], list[float], list[float]] | RoundsFailed:
    """:func:`measure_rounds`, with ``rival`` (the record compile applies now, which ``config`` would
    displace) measured in the same rounds, so both speed-ups over the default come from the same moments
    of the machine: (best, default, rival) medians per round (rival empty without one). Two configs
    alternate which runs first; three rotate which starts (round r starts at the r-th)."""
    limit = max(rounds, max_rounds if max_rounds is not None else 2 * rounds)
    configs = [config, task.default()] if rival is None else [config, rival, task.default()]
    names = ["the best candidate", "the default"] if rival is None else [
        "the best candidate", "the record it would displace", "the default"
    ]  # fmt: skip
    got: list[list[float]] = [[] for _ in configs]
    while len(got[0]) < limit:
        n = rounds if not got[0] else min(rounds, limit - len(got[0]))
        more = _rounds(task, configs, names, measurer, n, start=len(got[0]))
        if isinstance(more, RoundsFailed):
            return more
        for mine, new in zip(got, more):
            mine += new
        if _decided(got[0], got[-1]):
            break
    return got[0], got[-1], got[1] if rival is not None else []


def _decided(best_rounds: list[float], default_rounds: list[float]) -> bool:
    """Whether the rounds say on which side of 1 the speed-up is: the median of the per-round ratios
    (default / best) is farther from 1 than half their range, and the ratio of the two configs' fastest
    rounds is on the same side (see :attr:`~db.records.Confirmation.better`)."""
    ratios = sorted(d / b for b, d in zip(best_rounds, default_rounds))
    median = statistics.median(ratios)
    fastest = min(default_rounds) / min(best_rounds)
    return abs(median - 1.0) > (ratios[-1] - ratios[0]) / 2 and (median > 1.0) == (fastest > 1.0)


def _rounds(
    task: Task, configs: list[Config], names: list[str], measurer: Any, rounds: int, start: int = 0
) -> list[list[float]] | RoundsFailed:
    """``rounds`` interleaved rounds of ``configs`` (numbered from ``start``, which keeps the alternation
    or rotation going across calls: the measurer starts its own from its first round); the per-round
    medians of each config, in ``configs`` order."""
    from tuner.measure import MeasureInput, measure_in_rounds

    inputs = [MeasureInput(task, dict(c)) for c in configs]
    n = len(inputs)
    shift = start % n  # the measurer's round 0 is round ``start``: rotated so (for two, reversed when odd)
    ordered = inputs[shift:] + inputs[:shift]
    per_round = [  # ordered[k] is inputs[(k + shift) % n]: back to input order
        r[n - shift :] + r[: n - shift] for r in measure_in_rounds(measurer, ordered, rounds, rotate=n > 2)
    ]
    out: list[list[float]] = [[] for _ in inputs]
    for i, results in enumerate(per_round):
        for name, inp, r in zip(names, inputs, results):
            if r.status != Status.OK or r.median_us is None or r.median_us <= 0:
                error = f"round {start + i + 1}: {name} measured {r.status}: {r.error or 'no latency'}"
                return RoundsFailed(error, inp.config, r)
        for mine, r in zip(out, results):
            mine.append(float(r.median_us))
    return out


def confirm_tasks(
    tasks: Sequence[tuple[Task, Config | None]],
    db: Any,
    measurer: Any,
    *,
    rounds: int = DEFAULT_ROUNDS,
    max_rounds: int | None = None,
    run_id: int | None = None,
    on_task: Callable[[Task, Confirmation | ConfirmFailure | None], None] | None = None,
    rivals: dict[str, Config] | None = None,
) -> tuple[dict[str, Confirmation], list[ConfirmFailure]]:
    """Confirm each task's given config (tasks given None are skipped; see
    :attr:`db.selection.Selection.to_confirm`) and commit the confirmations; a round that fails is committed
    as a record of its status.

    ``rivals`` (by workload key): the config compile applies now, which the task's config would displace
    (:attr:`db.selection.Selection.rival`); it is measured in the same rounds and confirmed again too.
    A config whose latest confirmation against the same default exists is not measured again;
    one whose best config is its default has nothing to confirm (``on_task`` gets None). Returns the
    confirmation of each confirmed task (by workload key) and the failures.
    """
    done: dict[str, Confirmation] = {}
    failures: list[ConfirmFailure] = []
    for task, config in tasks:
        if config is None:
            continue
        if config_json(config) == config_json(task.default()):
            if on_task is not None:
                on_task(task, None)
            continue
        judged = verdicts(db.find_confirmations(task.workload_key, task.target.key), task.default())
        known = judged.get((task.sketch.name, task.sketch.version, canonical_json(config)))
        if known is not None:  # this config's verdict against this default stands: not measured again
            done[task.workload_key] = known
            if on_task is not None:
                on_task(task, known)
            continue
        rival = (rivals or {}).get(task.workload_key)
        if rival is not None and config_json(rival) in (config_json(config), config_json(task.default())):
            rival = None
        measured = measure_with_rival(task, config, rival, measurer, rounds, max_rounds)
        if isinstance(measured, RoundsFailed):
            result = measured.result
            if result.status != Status.OK:  # a failed measurement is data: the config is never applied
                db.commit_record(
                    RecordIn(
                        task.workload_key,
                        task.target.key,
                        task.sketch.name,
                        task.sketch.version,
                        dict(measured.config),
                        result.latencies_us,
                        result.status,
                        result.error or None,
                        run_id,
                    )
                )
            failure = ConfirmFailure(task, measured.error)
            failures.append(failure)
            if on_task is not None:
                on_task(task, failure)
            continue
        best_rounds, default_rounds, rival_rounds = measured
        if rival is not None:  # the incumbent's fresh verdict, from the same rounds
            db.commit_confirmation(_confirmation_in(task, rival, rival_rounds, default_rounds, run_id))
        cid = db.commit_confirmation(_confirmation_in(task, config, best_rounds, default_rounds, run_id))
        conf = next(c for c in db.find_confirmations(task.workload_key, task.target.key) if c.id == cid)
        done[task.workload_key] = conf
        if on_task is not None:
            on_task(task, conf)
    return done, failures


def _confirmation_in(
    task: Task, config: Config, rounds: list[float], default_rounds: list[float], run_id: int | None
) -> ConfirmationIn:
    return ConfirmationIn(
        task.workload_key,
        task.target.key,
        task.sketch.name,
        task.sketch.version,
        dict(config),
        dict(task.default()),
        rounds,
        default_rounds,
        run_id,
    )


__all__ = [
    "DEFAULT_ROUNDS",
    "ConfirmFailure",
    "RoundsFailed",
    "applied_text",
    "confirm_tasks",
    "measure_rounds",
    "measure_with_rival",
    "selection",
    "speedup_text",
]
