"""The conformance suite: TorchRL's own env, spec, transform and collector checks,
re-expressed against aenv's API (async methods and sync facades)."""

from __future__ import annotations

import os

import pytest

# forkserver: the first process pool pays the interpreter start, later ones ~30 ms
os.environ.setdefault("AENV_START_METHOD", "forkserver")


@pytest.fixture(params=["coroutine", "thread", "process"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param
