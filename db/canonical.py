"""Canonical JSON, timestamps, medians and record fingerprints: the exact-equality rules of the database.

``canonical_json`` is :func:`compiler.canonical.canonical_json` (one definition for every package),
re-exported here beside the rules built on it.

Everything here is pure and deterministic. JSON is parsed with ``json.loads`` only; nothing read from a
database or a file is ever unpickled or evaluated.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from compiler.canonical import canonical_hash
from compiler.canonical import canonical_json as canonical_json  # re-exported for the db modules

# Serialization of timestamps in export files and fingerprints: UTC, always with microseconds.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def utc_now() -> datetime:
    """The current time as a naive UTC datetime (how the database stores time on every backend)."""
    return datetime.now(UTC).replace(tzinfo=None)


def to_naive_utc(value: datetime) -> datetime:
    """Convert an aware datetime to naive UTC; a naive one is taken to be UTC already."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def format_time(value: datetime) -> str:
    """Format a (naive or aware) UTC datetime as ``2026-11-21T12:00:00.000000Z``."""
    return to_naive_utc(value).strftime(TIME_FORMAT)


def parse_time(text: str) -> datetime:
    """Parse :func:`format_time` output (or any ISO 8601 time) into a naive UTC datetime."""
    if not isinstance(text, str):
        raise ValueError(f"expected an ISO 8601 time string, got {type(text).__name__}")
    return to_naive_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


def clean_text(text: str, limit: int = 65536) -> str:
    """Free text (error messages) made storable everywhere: no NUL, no lone surrogates, at most ``limit``
    characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    marker = "\n[... truncated by kiln]"
    if len(text) > limit:  # the result is at most `limit` long, so cleaning twice changes nothing
        text = text[: limit - len(marker)] + marker
    return text


def check_latencies(latencies: Sequence[float] | None) -> list[float] | None:
    """Return latencies as a list of floats; raise ``ValueError`` unless each is finite and >= 0."""
    if latencies is None:
        return None
    if isinstance(latencies, str | bytes) or not isinstance(latencies, Sequence):
        raise ValueError(f"latencies must be a list of numbers, got {type(latencies).__name__}")
    out: list[float] = []
    for x in latencies:
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise ValueError(f"latency {x!r} is not a number")
        x = float(x)
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"latency {x!r} is not a finite, non-negative number of microseconds")
        out.append(x)
    return out


def median(latencies: Sequence[float] | None) -> float | None:
    """Median of the latencies, or None for none."""
    if not latencies:
        return None
    return float(statistics.median(latencies))


def canonical_config_text(text: str) -> str:
    """A stored config's JSON text in canonical form, to compare configs as stored (the text itself when it
    does not parse: such a config matches no valid one)."""
    try:
        return canonical_json(json.loads(text))
    except ValueError:
        return text


def config_problem(config: Any) -> str | None:
    """Why ``config`` is not a structurally valid knob config (a dict of str -> int/float/str/bool/None).

    Returns None when it is fine. This is the check every config passes before it is stored or returned;
    the sketch's own knob-space check comes on top (the ``validate`` hook of ``TuningDatabase.best``).
    """
    if not isinstance(config, dict):
        return f"config must be a JSON object, got {type(config).__name__}"
    for name, value in config.items():
        if not isinstance(name, str) or not name:
            return f"config knob name {name!r} is not a non-empty string"
        if value is not None and not isinstance(value, bool | int | float | str):
            return f"config knob {name!r} has a non-scalar value of type {type(value).__name__}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"config knob {name!r} has a non-finite value {value!r}"
    return None


def record_fingerprint(
    workload_key: str,
    target_key: str,
    sketch: str,
    sketch_version: int,
    config_json: str,
    latencies_json: str | None,
    status: str,
    created_at: datetime,
) -> str:
    """sha256 of a record's identity; two records with the same fingerprint are duplicates.

    The identity is: workload key, target key, sketch name and version, canonical config JSON, canonical
    latencies JSON, status and creation time (to the microsecond). Host, Kiln version, run and error text
    are not part of it. Migration 0002 carries a frozen copy of this function: change both or neither.
    """
    identity = [
        workload_key,
        target_key,
        sketch,
        int(sketch_version),
        config_json,
        latencies_json,
        status,
        format_time(created_at),
    ]
    return canonical_hash(identity)
