"""Importing a JSON Lines export (see :mod:`db.exchange` for the format and the rules) and merging one
database into another. Every line is parsed with ``json.loads`` and checked field by field; a malformed line
is skipped and reported with its file and line number (``ImportStats.skipped_bad`` and ``problems``), or,
with ``strict``, aborts the whole import (one transaction)."""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import insert, select

from db.canonical import (
    canonical_json,
    check_latencies,
    clean_text,
    config_problem,
    median,
    parse_time,
    record_fingerprint,
)
from db.confirmations import confirmation_values
from db.engine import WRITE_OPTION, display_url, resolve_url, sqlite_path, translate_errors
from db.errors import ConflictError, DatabaseError, InvalidRecordError
from db.exchange import FORMAT_NAME, FORMAT_VERSION, iter_export
from db.models import ConfirmationRow, FusionPlanRow, ModelTaskRow, RecordRow, RunRow, TargetRow, WorkloadRow
from db.records import ConfirmationIn, ImportStats
from db.status import Status

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from db.database import TuningDatabase

_BATCH = 1000  # records checked for duplicates and inserted per round trip


MAX_PROBLEMS = 20  # bad lines named in ImportStats.problems (all of them are counted)


class _NotJSON:
    """A line that ``json.loads`` refused, and why."""

    def __init__(self, error: str) -> None:
        self.error = error


class _Line:
    """Typed access to one parsed line, raising InvalidRecordError that names the source and line."""

    def __init__(self, item: Any, where: str) -> None:
        if isinstance(item, _NotJSON):
            raise InvalidRecordError(f"{where}: not valid JSON ({item.error})")
        if not isinstance(item, dict):
            raise InvalidRecordError(f"{where}: expected a JSON object, got {type(item).__name__}")
        self.item = item
        self.where = where

    def fail(self, problem: str) -> InvalidRecordError:
        return InvalidRecordError(f"{self.where}: {problem}")

    def get(self, name: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if name not in self.item:
            if optional:
                return None
            raise self.fail(f"missing field {name!r}")
        value = self.item[name]
        if value is None and optional:
            return None
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(f"field {name!r} must be {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(f"field {name!r} must be {_kind_name(kind)}, got {type(value).__name__}")
        return value

    def text(self, name: str, *, optional: bool = False) -> str:
        value = self.get(name, str, optional=optional)
        if value is not None and not optional and not value:
            raise self.fail(f"field {name!r} must not be empty")
        return value

    def number(self, name: str) -> float:
        value = float(self.get(name, (int, float)))
        if not math.isfinite(value):
            raise self.fail(f"field {name!r} must be finite")
        return value

    def time(self, name: str, *, optional: bool = False) -> Any:
        value = self.get(name, str, optional=optional)
        if value is None:
            return None
        try:
            return parse_time(value)
        except ValueError as exc:
            raise self.fail(f"field {name!r}: {exc}") from None

    def json_text(self, name: str, kind: type = dict) -> str:
        value = self.get(name, kind)
        try:
            return canonical_json(value)
        except (TypeError, ValueError) as exc:
            raise self.fail(f"field {name!r} is not plain JSON ({exc})") from None


def _clean(text: str | None) -> str | None:
    return clean_text(text) if text is not None else None


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a number", float: "a number", str: "a string", dict: "an object", list: "a list"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


class _Importer:
    """Applies export items to a database inside one write transaction."""

    def __init__(self, db: TuningDatabase, conn: Connection, source: str, strict: bool = False) -> None:
        self.db = db
        self.conn = conn
        self.source = source
        self.strict = strict
        self.seen_header = False
        self.problems: list[str] = []
        self.workloads: dict[str, int] = {}
        self.targets: dict[str, int] = {}
        self.runs: dict[int, int] = {}  # run id in the source -> local run id
        self.pending: list[tuple[str, dict[str, Any]]] = []  # (fingerprint, row) of records to insert
        self.pending_fps: set[str] = set()
        self.counts = dict.fromkeys(
            (
                "added",
                "skipped_duplicates",
                "workloads_added",
                "targets_added",
                "runs_added",
                "model_tasks_added",
                "fusion_plans_added",
                "skipped_bad",
                "confirmations_added",
            ),
            0,
        )

    # lookups ----------------------------------------------------------------------------------------

    def _lookup(self, row_type: type, key: str, cache: dict[str, int]) -> int | None:
        if key not in cache:
            found = self.conn.execute(select(row_type.id).where(row_type.key == key)).scalar()
            if found is None:
                return None
            cache[key] = found
        return cache[key]

    def workload_id(self, line: _Line, key: str) -> int:
        wid = self._lookup(WorkloadRow, key, self.workloads)
        if wid is None:
            raise line.fail(f"workload {key!r} is neither in the file before this line nor in the database")
        return wid

    def target_id(self, line: _Line, key: str) -> int:
        tid = self._lookup(TargetRow, key, self.targets)
        if tid is None:
            raise line.fail(f"target {key!r} is neither in the file before this line nor in the database")
        return tid

    # items ------------------------------------------------------------------------------------------

    def apply(self, item: Any, where: str) -> None:
        """Apply one item; a bad one is skipped and reported (or, with ``strict``, raised). The first item
        must be the export's header (a file that is not an export is refused whole)."""
        if not self.seen_header:
            self.seen_header = True
            line = _Line(item, where)
            if line.item.get("type") != "header":
                raise line.fail("not a Kiln tuning-database export (the first line is not its header)")
            self._on_header(line)
            return
        try:
            line = _Line(item, where)
            kind = line.get("type", str)
            handler = getattr(self, f"_on_{kind}", None)
            if handler is None:
                raise line.fail(f"unknown line type {kind!r}")
            handler(line)
        except InvalidRecordError as exc:
            if self.strict:
                raise
            self.counts["skipped_bad"] += 1
            if len(self.problems) < MAX_PROBLEMS:
                self.problems.append(str(exc))

    def skip(self, problem: str) -> None:
        """Count and name a row the source could not even give (a malformed row of a merged database)."""
        if self.strict:
            raise InvalidRecordError(f"{self.source}: {problem}")
        self.counts["skipped_bad"] += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{self.source}: {problem}")

    def _on_header(self, line: _Line) -> None:
        if line.get("format", str) != FORMAT_NAME:
            raise line.fail(f"not a Kiln tuning-database export (format is not {FORMAT_NAME!r})")
        version = line.get("version", int)
        if version > FORMAT_VERSION:
            raise line.fail(
                f"export format version {version} is newer than this Kiln reads ({FORMAT_VERSION}); "
                "upgrade Kiln"
            )

    def _on_target(self, line: _Line) -> None:
        key = line.text("key")
        info = line.json_text("info")
        created = line.time("created_at")
        if self._lookup(TargetRow, key, self.targets) is None:
            values = dict(key=key, info=info, created_at=created)
            self.targets[key] = self.conn.execute(insert(TargetRow).values(**values)).inserted_primary_key[0]
            self.counts["targets_added"] += 1

    def _on_workload(self, line: _Line) -> None:
        key = line.text("key")
        canonical = line.json_text("canonical", (dict, list))
        values = dict(
            key=key,
            canonical=canonical,
            kind=line.text("kind"),
            flops=line.number("flops"),
            bytes=line.number("bytes"),
            created_at=line.time("created_at"),
        )
        wid = self._lookup(WorkloadRow, key, self.workloads)
        if wid is None:
            self.workloads[key] = self.conn.execute(
                insert(WorkloadRow).values(**values)
            ).inserted_primary_key[0]
            self.counts["workloads_added"] += 1
            return
        stored = self.conn.execute(select(WorkloadRow.canonical).where(WorkloadRow.id == wid)).scalar()
        if stored != canonical:
            raise ConflictError(
                f"{line.where}: workload {key!r} has a different canonical group than the one stored in "
                f"{self.db.url}; nothing was imported"
            )

    def _on_run(self, line: _Line) -> None:
        source_id = line.get("id", int)
        target = line.text("target")
        values = dict(
            model_name=line.text("model_name"),
            model_hash=line.get("model_hash", str),
            target_id=self.target_id(line, target),
            budget=line.json_text("budget"),
            command_line=line.get("command_line", str),
            host=line.get("host", str),
            kiln_version=line.get("kiln_version", str),
            started_at=line.time("started_at"),
            finished_at=line.time("finished_at", optional=True),
        )
        match = (
            select(RunRow.id)
            .where(
                RunRow.model_name == values["model_name"],
                RunRow.model_hash == values["model_hash"],
                RunRow.target_id == values["target_id"],
                RunRow.host == values["host"],
                RunRow.started_at == values["started_at"],
            )
            .limit(1)
        )
        local = self.conn.execute(match).scalar()
        if local is None:
            local = self.conn.execute(insert(RunRow).values(**values)).inserted_primary_key[0]
            self.counts["runs_added"] += 1
        self.runs[source_id] = local

    def _on_model_task(self, line: _Line) -> None:
        name = line.text("model_name")
        mhash = line.get("model_hash", str)
        wid = self.workload_id(line, line.text("workload"))
        weight = line.number("weight")
        created = line.time("created_at")
        exists = self.conn.execute(
            select(ModelTaskRow.id).where(
                ModelTaskRow.model_name == name,
                ModelTaskRow.model_hash == mhash,
                ModelTaskRow.workload_id == wid,
            )
        ).scalar()
        if exists is None:
            values = dict(
                model_name=name, model_hash=mhash, workload_id=wid, weight=weight, created_at=created
            )
            self.conn.execute(insert(ModelTaskRow).values(**values))
            self.counts["model_tasks_added"] += 1

    def _on_record(self, line: _Line) -> None:
        wk = line.text("workload")
        tk = line.text("target")
        sketch = line.text("sketch")
        version = line.get("sketch_version", int)
        config = line.get("config", dict)
        problem = config_problem(config)
        if problem:
            raise line.fail(problem)
        try:
            status = Status.parse(line.get("status", str)).value
            latencies = check_latencies(line.get("latencies_us", list, optional=True))
        except ValueError as exc:
            raise line.fail(str(exc)) from None
        if status == "ok" and not latencies:
            raise line.fail("an ok record needs at least one latency")
        med = median(latencies)
        stated = line.get("median_us", (int, float), optional=True)
        if stated is not None and (med is None or float(stated) != med):
            raise line.fail(f"median_us {stated!r} is not the median of latencies_us ({med!r})")
        source_run = line.get("run", int, optional=True)
        run_id = None
        if source_run is not None:
            if source_run not in self.runs:
                raise line.fail(f"record names run {source_run}, which is not earlier in the file")
            run_id = self.runs[source_run]
        created = line.time("created_at")
        config_json = canonical_json(config)
        latencies_json = canonical_json(latencies) if latencies is not None else None
        fp = record_fingerprint(wk, tk, sketch, version, config_json, latencies_json, status, created)
        if fp in self.pending_fps:
            self.counts["skipped_duplicates"] += 1
            return
        row = dict(
            workload_id=self.workload_id(line, wk),
            target_id=self.target_id(line, tk),
            sketch=sketch,
            sketch_version=version,
            config=config_json,
            latencies=latencies_json,
            median_us=med,
            status=status,
            error=_clean(line.get("error", str, optional=True)),
            kiln_version=line.get("kiln_version", str),
            host=line.get("host", str),
            run_id=run_id,
            created_at=created,
            fingerprint=fp,
        )
        self.pending.append((fp, row))
        self.pending_fps.add(fp)
        if len(self.pending) >= _BATCH:
            self.flush()

    def _on_confirmation(self, line: _Line) -> None:
        wk, tk = line.text("workload"), line.text("target")
        source_run = line.get("run", int, optional=True)
        if source_run is not None and source_run not in self.runs:
            raise line.fail(f"confirmation names run {source_run}, which is not earlier in the file")
        conf = ConfirmationIn(
            wk,
            tk,
            line.text("sketch"),
            line.get("sketch_version", int),
            line.get("config", dict),
            line.get("default_config", dict),
            line.get("best_rounds", list),
            line.get("default_rounds", list),
            self.runs.get(source_run) if source_run is not None else None,
        )
        try:
            values = confirmation_values(
                conf,
                self.workload_id(line, wk),
                self.target_id(line, tk),
                created_at=line.time("created_at"),
                kiln=line.get("kiln_version", str),
                host_name=line.get("host", str),
            )
        except ValueError as exc:
            raise line.fail(str(exc)) from None
        stored = select(ConfirmationRow.id).where(ConfirmationRow.fingerprint == values["fingerprint"])
        if self.conn.execute(stored.limit(1)).scalar() is None:
            self.conn.execute(insert(ConfirmationRow).values(**values))
            self.counts["confirmations_added"] += 1

    def _on_fusion_plan(self, line: _Line) -> None:
        tid = self.target_id(line, line.text("target"))
        values = dict(
            region_key=line.text("region_key"),
            target_id=tid,
            plan=line.json_text("plan"),
            latency_us=line.number("latency_us"),
            **{
                key: None if line.get(key, (int, float), optional=True) is None else line.number(key)
                for key in ("rule_latency_us", "whole_us", "rule_whole_us")
            },
            kiln_version=line.get("kiln_version", str),
            host=line.get("host", str),
            created_at=line.time("created_at"),
        )
        same = select(FusionPlanRow.id).where(
            *(
                getattr(FusionPlanRow, k).is_(None) if v is None else getattr(FusionPlanRow, k) == v
                for k, v in values.items()
                if k not in ("kiln_version", "host")
            )
        )
        if self.conn.execute(same.limit(1)).scalar() is None:
            self.conn.execute(insert(FusionPlanRow).values(**values))
            self.counts["fusion_plans_added"] += 1

    def flush(self) -> None:
        """Insert the pending records that are not already stored."""
        if not self.pending:
            return
        fps = [fp for fp, _ in self.pending]
        stored = set(
            self.conn.execute(select(RecordRow.fingerprint).where(RecordRow.fingerprint.in_(fps))).scalars()
        )
        rows = [row for fp, row in self.pending if fp not in stored]
        if rows:
            self.conn.execute(insert(RecordRow.__table__), rows)
        self.counts["added"] += len(rows)
        self.counts["skipped_duplicates"] += len(self.pending) - len(rows)
        self.pending.clear()
        self.pending_fps.clear()

    def stats(self) -> ImportStats:
        return ImportStats(**self.counts, problems=tuple(self.problems))


def import_items(
    db: TuningDatabase,
    items: Iterable[tuple[Any, str]],
    source: str,
    *,
    strict: bool = False,
    importer_hook: list[_Importer] | None = None,
) -> ImportStats:
    """Apply ``(item, where)`` pairs (parsed export lines and their location) in one write transaction;
    bad items are skipped and reported unless ``strict``."""
    options = {WRITE_OPTION: True}
    with (
        translate_errors(db._url, f"import {source}"),
        db.engine.connect().execution_options(**options) as conn,
        conn.begin(),
    ):
        importer = _Importer(db, conn, source, strict)
        if importer_hook is not None:
            importer_hook.append(importer)
        for item, where in items:
            importer.apply(item, where)
        importer.flush()
    db._workload_ids.clear()  # a rolled-back import may have cached ids that do not exist
    db._target_ids.clear()
    return importer.stats()


def _parsed_lines(stream: IO[str], source: str) -> Iterator[tuple[Any, str]]:
    for number, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        where = f"{source}:{number}"
        try:
            item = json.loads(text)
        except ValueError as exc:
            item = _NotJSON(str(exc))
        yield item, where


def import_jsonl(db: TuningDatabase, src: str | Path | IO[str], *, strict: bool = False) -> ImportStats:
    """Import a JSON Lines export (path, ``.gz`` path, or text file) into ``db``; see the module docstring."""
    if not isinstance(src, str | Path):
        lines = _parsed_lines(src, getattr(src, "name", "<stream>"))
        return import_items(db, lines, "<stream>", strict=strict)
    path = Path(src)
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise DatabaseError(f"cannot read import file {str(path)!r}: {exc.strerror or exc}") from None
    with raw:
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw
        try:
            with io.TextIOWrapper(stream, encoding="utf-8") as text:
                return import_items(db, _parsed_lines(text, str(path)), str(path), strict=strict)
        except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as exc:
            raise InvalidRecordError(f"{path}: not a UTF-8 JSON Lines export ({exc})") from None


def merge_from(db: TuningDatabase, other_url: str, *, strict: bool = False) -> ImportStats:
    """Import everything of the database at ``other_url`` into ``db`` (the other one is only read); rows
    of either side that are malformed are skipped and reported, unless ``strict``."""
    from db.database import TuningDatabase

    resolved = resolve_url(other_url)
    mine, theirs = sqlite_path(db._url), sqlite_path(resolved)
    same_file = mine is not None and theirs is not None and mine.resolve() == theirs.resolve()
    if resolved == db._url or same_file:
        raise DatabaseError(f"cannot merge {display_url(resolved)} into itself")
    with TuningDatabase.open(resolved, create=False) as other:
        shown = other.url
        hook: list[_Importer] = []

        def on_skip(problem: str) -> None:
            hook[0].skip(problem)

        exported = iter_export(other, on_skip=on_skip)
        items = ((item, f"{shown} ({item['type']})") for item in exported)
        return import_items(db, items, shown, strict=strict, importer_hook=hook)
