"""Cost models: predict which candidates are fast from their features.

Contract (:class:`CostModel`): ``update(features, latencies, workloads)`` adds measured candidates
(latency in microseconds; ``nan`` or ``inf`` for a candidate that failed) and may retrain;
``predict(features)`` returns one score per row, **higher = faster**. Scores rank candidates of one
workload against each other; they are not latencies and are not comparable across workloads.
``save(path)`` writes a single ``.npz`` file of plain arrays and a JSON header (never pickle: it is read
back with ``numpy.load(allow_pickle=False)`` and ``json.loads``); :func:`load_model` reads any model back.

Implementations: :class:`~cost_model.gbdt.GBDTModel` (scikit-learn gradient boosting on labels normalized
per workload, with the analytic model as its prior while data is scarce), :class:`AnalyticModel` (a roofline
estimate computed from the loop IR, used before there is data and as ``--cost-model analytic``) and
:class:`RandomModel` (seeded random scores, for tests and as a baseline). :func:`create_model` makes one
by name.
"""

from __future__ import annotations

import json
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import KilnError
from cost_model.features import EST_INDEX, FEATURE_VERSION, N_FEATURES

MODEL_FORMAT = "kiln-cost-model"
MODEL_FORMAT_VERSION = 1


def normalized_labels(latencies: np.ndarray, workloads: np.ndarray) -> np.ndarray:
    """TVM's labels: ``best latency of the workload / latency`` in (0, 1]; 0 for failed candidates."""
    lat = np.asarray(latencies, dtype=np.float64)
    wl = np.asarray(workloads)
    ok = np.isfinite(lat) & (lat > 0)
    y = np.zeros(lat.shape, dtype=np.float64)
    for w in np.unique(wl):
        sel = (wl == w) & ok
        if sel.any():
            y[sel] = lat[sel].min() / lat[sel]
    return y


def check_features(features: Any) -> np.ndarray:
    """A 2-D float array of ``N_FEATURES`` columns (one row per candidate)."""
    x = np.asarray(features, dtype=np.float32)
    if x.ndim == 1:
        x = x.reshape(1, -1) if x.size else x.reshape(0, N_FEATURES)
    if x.ndim != 2 or x.shape[1] != N_FEATURES:
        raise KilnError(f"cost model features must have {N_FEATURES} columns, got shape {x.shape}")
    return x


class CostModel(ABC):
    """Predicts which candidates are fast; see the module docstring for the contract."""

    kind = "base"

    def __init__(self) -> None:
        self.n_updates = 0  # measured candidates seen

    @abstractmethod
    def update(
        self, features: Any, latencies: Sequence[float], workloads: Sequence[str], fit: bool = True
    ) -> None:
        """Add measured candidates (nan/inf latency = failed) and retrain if worthwhile; ``fit=False``: only
        add them (the caller retrains later with :meth:`fit_if_due`, e.g. while candidates are measured)."""

    def fit_if_due(self) -> bool:
        """Retrain if enough data arrived since the last fit; returns whether it did (no-op by default)."""
        return False

    def warm_up(self) -> None:
        """Load what a fit needs (e.g. import the learning library) so that a later fit in line does not pay
        for it; the search calls this in its background step. No-op by default."""
        return None

    @abstractmethod
    def predict(self, features: Any) -> np.ndarray:
        """One score per row of ``features``; higher means faster."""

    def meta(self) -> dict[str, Any]:
        """The JSON header written by :meth:`save` (subclasses add their settings)."""
        return {
            "format": MODEL_FORMAT,
            "format_version": MODEL_FORMAT_VERSION,
            "kind": self.kind,
            "feature_version": FEATURE_VERSION,
            "n_features": N_FEATURES,
            "n_updates": self.n_updates,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays written by :meth:`save` besides the header (subclasses add theirs)."""
        return {}

    def save(self, path: str | Path) -> Path:
        """Write the model to ``path`` (a ``.npz`` file: plain arrays and a JSON header; atomic)."""
        path = Path(path)
        header = json.dumps(self.meta(), sort_keys=True).encode()
        arrays = {"meta": np.frombuffer(header, dtype=np.uint8), **self.arrays()}
        for name, arr in arrays.items():
            if arr.dtype.hasobject:
                raise KilnError(f"cost model array {name!r} holds Python objects; refusing to save it")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez_compressed(f, **arrays)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def from_saved(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> CostModel:
        """Rebuild a model from :meth:`meta` and :meth:`arrays` (override when there is state)."""
        model = cls()
        model.n_updates = int(meta.get("n_updates", 0))
        return model


class RandomModel(CostModel):
    """Seeded random scores (TVM's RandomModel): a baseline and a test double."""

    kind = "random"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def update(
        self, features: Any, latencies: Sequence[float], workloads: Sequence[str], fit: bool = True
    ) -> None:
        self.n_updates += len(latencies)

    def predict(self, features: Any) -> np.ndarray:
        return self.rng.random(len(check_features(features)))

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "seed": self.seed}

    @classmethod
    def from_saved(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> CostModel:
        model = cls(int(meta.get("seed", 0)))
        model.n_updates = int(meta.get("n_updates", 0))
        return model


class AnalyticModel(CostModel):
    """The roofline estimate of the features (``est_log_cycles``: compute, dependency latency, load/store
    issue and cache/DRAM traffic of every store, parallel speedup, loop and fork overheads); no training."""

    kind = "analytic"

    def update(
        self, features: Any, latencies: Sequence[float], workloads: Sequence[str], fit: bool = True
    ) -> None:
        self.n_updates += len(latencies)

    def predict(self, features: Any) -> np.ndarray:
        return -check_features(features)[:, EST_INDEX].astype(np.float64)


MODELS = ("gbdt", "analytic", "random")


def create_model(name: str | CostModel, seed: int = 0, **options: Any) -> CostModel:
    """A model by name (``gbdt``, ``analytic``, ``random``), or ``name`` itself if it is a model."""
    if isinstance(name, CostModel):
        return name
    if name == "gbdt":
        from cost_model.gbdt import GBDTModel

        return GBDTModel(seed=seed, **options)
    if name == "analytic":
        return AnalyticModel()
    if name == "random":
        return RandomModel(seed)
    raise KilnError(f"unknown cost model {name!r}; known: {', '.join(MODELS)}")


def load_model(path: str | Path) -> CostModel:
    """Read a model written by :meth:`CostModel.save` (no pickle; the header is checked first)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise KilnError(f"cannot read cost model {path}: {exc}") from None
    if "meta" not in arrays:
        raise KilnError(f"{path} is not a Kiln cost model (no header)")
    try:
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KilnError(f"{path}: unreadable cost model header ({exc})") from None
    if meta.get("format") != MODEL_FORMAT or meta.get("format_version") != MODEL_FORMAT_VERSION:
        raise KilnError(f"{path}: not a Kiln cost model of format version {MODEL_FORMAT_VERSION}")
    if meta.get("feature_version") != FEATURE_VERSION or meta.get("n_features") != N_FEATURES:
        raise KilnError(
            f"{path}: made with features v{meta.get('feature_version')} ({meta.get('n_features')} values); "
            f"this Kiln computes v{FEATURE_VERSION} ({N_FEATURES}): retrain it from the database"
        )
    kinds: dict[str, type[CostModel]] = {"random": RandomModel, "analytic": AnalyticModel}
    if meta.get("kind") == "gbdt":
        from cost_model.gbdt import GBDTModel

        kinds["gbdt"] = GBDTModel
    cls = kinds.get(str(meta.get("kind")))
    if cls is None:
        raise KilnError(f"{path}: unknown cost model kind {meta.get('kind')!r}")
    return cls.from_saved(meta, arrays)
