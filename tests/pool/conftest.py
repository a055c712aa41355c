"""The backend fixture: every pool test runs on each backend (process and ray join later)."""

from __future__ import annotations

import pytest

BACKENDS = ["coroutine", "thread"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param
