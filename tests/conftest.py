"""What every test shares: the ``pinned_target`` fixture (each pinned CPU target in turn), the
``fresh_probes`` fixture (the host probes measured anew, in a kernel cache of the test's own), a report header
that names the host target the tests run code on, and the grouping that lets the suite run in parallel.

Parallel runs (pytest-xdist, ``-n 2 --dist loadgroup`` in scripts/test): tests are independent, but a test
that uses a fixture wider than one test (module or session scope, defined in tests/: a tuned database, a
pool of measurement workers, a built library, the nvcc-compiled zoo) is grouped with the other tests of its
module, so the fixture is made once, on one worker, and the module's tests run in their order there.
Every worker has its own temporary directory, kernel cache and PostgreSQL server.
"""

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


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        shared = isinstance(item, pytest.Function) and _uses_a_shared_fixture(item)
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def _uses_a_shared_fixture(item: pytest.Function) -> bool:
    """Whether ``item`` asks (directly or through other fixtures) for a fixture of the test tree that
    lives longer than one test."""
    info = item._fixtureinfo
    seen: set[str] = set()
    todo = list(info.argnames)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        defs = info.name2fixturedefs.get(name)
        if not defs:
            continue
        fixture = defs[-1]
        if fixture.scope != "function" and fixture.has_location:
            return True
        todo.extend(fixture.argnames)
    return False


@pytest.fixture(params=list(PINNED_TARGETS.values()), ids=list(PINNED_TARGETS))
def pinned_target(request: pytest.FixtureRequest) -> Target:
    """A pinned CPU target (AVX-512, AVX2, NEON): tests that check generated text run once per width."""
    return request.param


@pytest.fixture
def fresh_probes(tmp_path, monkeypatch):
    """An empty kernel cache of the test's own and the host probes' memos (FMA datapath, last-level cache)
    cleared before and after, so a probe measures or reads its file again."""
    from compiler.backends.cpu import datapath
    from cost_model import llc_probe

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    memos = (datapath._host_result, llc_probe._host_result)
    for memo in memos:
        memo.cache_clear()
    yield tmp_path
    for memo in memos:
        memo.cache_clear()
