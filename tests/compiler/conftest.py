"""Every compiler test builds kernels into one throwaway cache for the whole session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory: pytest.TempPathFactory):
    """Build kernels into a throwaway cache so tests never depend on (or fill) ~/.cache/kiln."""
    old = os.environ.get("KILN_CACHE_DIR")
    os.environ["KILN_CACHE_DIR"] = str(tmp_path_factory.mktemp("kiln-cache"))
    yield
    if old is None:
        os.environ.pop("KILN_CACHE_DIR", None)
    else:
        os.environ["KILN_CACHE_DIR"] = old
