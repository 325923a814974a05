"""Training data from the tuning database: records of a target -> (features, latencies, workloads).

Features are computed from each record's workload (its canonical group JSON, rebuilt with
``compiler.fusion.group_from_workload``), sketch and config, and cached in the database
(``commit_features(record_id, FEATURE_VERSION, vector)``), so the next model, run or evaluation reads them
back instead of scheduling and lowering every record again. Records that can no longer be scheduled (the
sketch changed version, the config is no longer legal, the workload is not a Kiln group) are skipped, as
are ``invalid_config`` records (nothing was built). Other failures (compile or runtime errors, timeouts,
wrong results) are kept with latency ``nan``: the model learns that those candidates are bad.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.backends import get_sketch
from compiler.errors import KilnError
from compiler.fusion import group_from_workload
from compiler.target import Target
from cost_model.features import FEATURE_VERSION, N_FEATURES, FeatureExtractor
from db.status import Status

log = logging.getLogger("kiln.cost_model")


@dataclass
class Dataset:
    """Rows of measured candidates (one per record)."""

    x: np.ndarray
    latencies: np.ndarray  # microseconds; nan for a failed candidate
    workloads: list[str]
    record_ids: list[int]
    kinds: dict[str, str] = field(default_factory=dict)  # workload -> group kind
    computed: int = 0  # feature vectors computed (not read from the database cache)

    def __len__(self) -> int:
        return len(self.latencies)

    def only(self, workloads: Iterable[str]) -> Dataset:
        """The rows of ``workloads`` (in this dataset's order)."""
        keep = set(workloads)
        rows = [i for i, w in enumerate(self.workloads) if w in keep]
        return Dataset(
            self.x[rows],
            self.latencies[rows],
            [self.workloads[i] for i in rows],
            [self.record_ids[i] for i in rows],
            {w: k for w, k in self.kinds.items() if w in keep},
        )


def target_of(db: Any, target_key: str) -> Target:
    """The target a database's records were measured on (its stored description, else the key)."""
    try:
        return Target.from_json(db.target_info(target_key))
    except (KilnError, TypeError, ValueError):
        return Target.parse(target_key)


class GroupCache:
    """Groups rebuilt from the database's workload JSON, by workload key (None when not rebuildable)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self._groups: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        if key not in self._groups:
            try:
                self._groups[key] = group_from_workload(self.db.workload_canonical(key))
            except (KilnError, KeyError, TypeError, ValueError) as exc:
                log.info("workload %s cannot be rebuilt for features: %s", key[:12], exc)
                self._groups[key] = None
        return self._groups[key]

    def put(self, key: str, group: Any) -> None:
        self._groups[key] = group


def record_latency(record: Any) -> float:
    """The label source of a record: its median (us) when ok, else nan."""
    if Status(record.status) == Status.OK and record.median_us is not None:
        return float(record.median_us)
    return math.nan


def load_dataset(
    db: Any,
    target_key: str,
    extractor: FeatureExtractor | None = None,
    workloads: Iterable[str] | None = None,
    groups: GroupCache | None = None,
    records: list[Any] | None = None,
    cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
    registers: Callable[[Any], int | None] | None = None,
) -> Dataset:
    """Every usable record of ``target_key`` (of ``workloads`` if given) with its features; see the module
    docstring. ``records`` skips the database query; ``cache=False`` neither reads nor writes cached
    features. ``registers(record)``: the registers per thread a CUDA build reported for the record's config
    (None when unknown); the features are then computed with them, never read from or written to the
    cache (its vectors hold estimated counts)."""
    cache = cache and registers is None
    extractor = extractor or FeatureExtractor()
    groups = groups or GroupCache(db)
    target = target_of(db, target_key)
    if records is None:
        keys = list(workloads) if workloads is not None else [None]
        records = [r for k in keys for r in db.find_records(k, target_key)]
    records = [r for r in records if Status(r.status) != Status.INVALID_CONFIG]
    cached = db.features(FEATURE_VERSION, [r.id for r in records]) if cache and records else {}
    xs, lats, wls, ids = [], [], [], []
    kinds: dict[str, str] = {}
    computed = 0
    for n, r in enumerate(records):
        if progress is not None:
            progress(n, len(records))
        vec = cached.get(r.id)
        if vec is not None and len(vec) != N_FEATURES:
            vec = None
        group = groups.get(r.workload_key)
        if group is None:
            continue
        kinds[r.workload_key] = group.kind
        if vec is None:
            try:
                sketch = get_sketch(r.sketch, target)
            except KilnError:
                continue
            if sketch.version != r.sketch_version:
                continue
            n_regs = registers(r) if registers is not None else None
            vec = extractor.get(group, target, dict(r.config), r.sketch, registers=n_regs)
            if vec is None:
                continue
            computed += 1
            if cache:
                db.commit_features(r.id, FEATURE_VERSION, vec)
        xs.append(vec)
        lats.append(record_latency(r))
        wls.append(r.workload_key)
        ids.append(r.id)
    x = np.asarray(xs, dtype=np.float32).reshape(len(xs), N_FEATURES)
    return Dataset(x, np.asarray(lats, dtype=np.float64), wls, ids, kinds, computed)
