"""The CPU build of WiCore's kernel library, shared by the kernel tests."""

from __future__ import annotations

import os

import pytest

from wicore.kernels.library import find_compiler, library


@pytest.fixture(scope="session")
def cpu_library(tmp_path_factory) -> str:
    """The CPU build, kept under WICORE_TEST_CACHE between runs where set (keyed by the sources
    and the compiler, so an edit rebuilds it)."""
    if find_compiler(cuda=False) is None:
        pytest.skip("no C++ compiler here")
    base = os.environ.get("WICORE_TEST_CACHE")
    cache = os.path.join(base, "wicore-cache") if base else str(tmp_path_factory.mktemp("wicore-cache"))
    saved = os.environ.get("WICORE_CACHE")
    os.environ["WICORE_CACHE"] = cache
    try:
        return str(library(cuda=False))
    finally:
        if saved is None:
            del os.environ["WICORE_CACHE"]
        else:
            os.environ["WICORE_CACHE"] = saved
