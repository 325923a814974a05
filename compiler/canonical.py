"""Canonical JSON: the one text form of plain data used for identities (workload keys, configs, records).

Sorted keys, no spaces, ASCII only (other characters escaped) and no NaN/Infinity, so the same value gives
the same text in every process, on every database backend and on every machine. It lives in the lowest
layer so that every package (compiler, db, cost_model, tuner) hashes and compares with the same rules.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of ``value``: sorted keys, compact separators, ASCII, no NaN.

    Raises ``ValueError`` (non-finite floats) or ``TypeError`` (values that are not plain JSON).
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def canonical_hash(value: Any) -> str:
    """sha256 hex digest of :func:`canonical_json` of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()
