"""The status of a measured candidate, shared by the tuner, the measurer and the database."""

from __future__ import annotations

import enum


class Status(enum.StrEnum):
    """Outcome of measuring one candidate config. Only ``ok`` records carry a usable latency."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    WRONG_RESULT = "wrong_result"
    INVALID_CONFIG = "invalid_config"

    @classmethod
    def parse(cls, value: Status | str) -> Status:
        """Return the Status for ``value``; raise ``ValueError`` naming the allowed values otherwise."""
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown record status {value!r} (expected one of: {allowed})") from None
