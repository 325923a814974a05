"""What a bench run produced, as plain data: :class:`BenchRun` holding one :class:`BenchResult` per
(workload, contender), with JSON and CSV export (``kiln bench export``, ``--json``, ``--csv``).

A result's ``status`` is ``ok`` (checked, then timed), ``wrong_result`` (its outputs differed from the
numpy reference: not timed), ``error`` (it could not prepare this workload: the reason is in ``error``) or
``unavailable`` (the contender cannot run here at all, e.g. a package is missing).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from compiler.errors import KilnError
from tuner.bench.stats import Summary, summarize

OK, WRONG, ERROR, UNAVAILABLE = "ok", "wrong_result", "error", "unavailable"


@dataclass
class BenchResult:
    workload: str
    contender: str
    status: str
    rounds_us: list[list[float]] = field(default_factory=list)  # every call's latency, by round
    max_rel_err: float | None = None
    flops: float = 0.0
    bytes: float = 0.0
    note: str = ""
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def round_medians(self) -> list[float]:
        import statistics

        return [statistics.median(r) for r in self.rounds_us if r]

    @property
    def summary(self) -> Summary | None:
        meds = self.round_medians
        return summarize(meds, sum(len(r) for r in self.rounds_us)) if meds else None

    @property
    def median_us(self) -> float | None:
        s = self.summary
        return s.median if s else None


@dataclass
class BenchRun:
    suite: str
    target_key: str
    command_line: str
    environment: dict[str, Any]
    settings: dict[str, Any]
    ceilings: dict[str, Any]
    started_at: datetime
    finished_at: datetime | None = None
    load_before: float | None = None
    load_after: float | None = None
    results: list[BenchResult] = field(default_factory=list)
    id: int | None = None

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.results))

    @property
    def contenders(self) -> list[str]:
        return list(dict.fromkeys(r.contender for r in self.results))

    def result(self, workload: str, contender: str) -> BenchResult | None:
        for r in self.results:
            if r.workload == workload and r.contender == contender:
                return r
        return None

    # ------------------------------------------------------------------------------------ export
    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["started_at"] = self.started_at.isoformat()
        data["finished_at"] = self.finished_at.isoformat() if self.finished_at else None
        for out, res in zip(data["results"], self.results):
            out["median_us"] = res.median_us
            s = res.summary
            out["spread"] = s.spread if s else None
        return {"format": "kiln-bench-run/1", **data}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "JSON") -> BenchRun:
        if not isinstance(data, dict) or data.get("format") != "kiln-bench-run/1":
            raise KilnError(f"{source} is not a kiln bench run export (format kiln-bench-run/1)")
        try:
            results = [
                BenchResult(**{k: v for k, v in r.items() if k not in ("median_us", "spread")})
                for r in data["results"]
            ]
            fields = {k: v for k, v in data.items() if k not in ("format", "results")}
            fields["started_at"] = datetime.fromisoformat(fields["started_at"])
            if fields.get("finished_at"):
                fields["finished_at"] = datetime.fromisoformat(fields["finished_at"])
            return cls(**fields, results=results)
        except (KeyError, TypeError, ValueError) as exc:
            raise KilnError(f"{source}: malformed kiln bench run export ({exc})") from None

    @classmethod
    def load_json(cls, path: Path) -> BenchRun:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise KilnError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise KilnError(f"{path} is not JSON: {exc}") from None
        return cls.from_json(data, str(path))

    def to_csv(self) -> str:
        """One row per result: run, workload, contender, status, median and spread, FLOPs, bytes, error."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(
            ["run", "suite", "target", "workload", "contender", "status", "median_us", "q1_us", "q3_us",
             "rounds", "calls", "max_rel_err", "flops", "bytes", "error"]
        )  # fmt: skip
        for r in self.results:
            s = r.summary
            w.writerow(
                [self.id, self.suite, self.target_key, r.workload, r.contender, r.status,
                 s.median if s else "", s.q1 if s else "", s.q3 if s else "", len(r.rounds_us),
                 s.calls if s else 0, "" if r.max_rel_err is None else r.max_rel_err, r.flops, r.bytes,
                 r.error or ""]
            )  # fmt: skip
        return buf.getvalue()
