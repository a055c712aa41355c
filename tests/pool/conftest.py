"""The backend fixture: every pool test runs on each backend (ray joins when installed)."""

from __future__ import annotations

import os

import pytest

# forkserver: the first process pool pays the interpreter start, later ones ~30 ms
os.environ.setdefault("AENV_START_METHOD", "forkserver")

BACKENDS = ["coroutine", "thread", "process"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def in_process_backend(backend: str) -> str:
    """For tests that reach into sub-env objects directly (patching, gates): not processes."""
    if backend == "process":
        pytest.skip("reaches into sub-env objects, which live in another process")
    return backend
