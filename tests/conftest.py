"""Fixtures for every test: ``pinned_target`` (each pinned CPU target in turn) and a report header that
names the host target the tests run code on."""

from __future__ import annotations

import os

import pytest

from compiler.target import HOST_ISA_ENV, Target
from tests.targets import PINNED_TARGETS


def pytest_report_header(config: pytest.Config) -> str:
    host = Target.host()
    isa = os.environ.get(HOST_ISA_ENV)
    narrowed = f", narrowed by {HOST_ISA_ENV}={isa}" if isa else ""
    return f"kiln host target: {host.key} ({host.vector_bytes}-byte vectors{narrowed})"


@pytest.fixture(params=list(PINNED_TARGETS.values()), ids=list(PINNED_TARGETS))
def pinned_target(request: pytest.FixtureRequest) -> Target:
    """A pinned CPU target (AVX-512, AVX2, NEON): tests that check generated text run once per width."""
    return request.param
