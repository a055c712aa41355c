"""Agent-loop tests run over each pool backend."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("AENV_START_METHOD", "forkserver")


@pytest.fixture(params=["coroutine", "thread", "process"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param
