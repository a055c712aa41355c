"""Every LLM test leaves no live sandbox run registered in this process."""

from __future__ import annotations

import time

import pytest

from aenv.llm import live_sandboxes


@pytest.fixture(autouse=True)
def no_live_sandbox_left():
    yield
    deadline = time.monotonic() + 10
    while live_sandboxes() and time.monotonic() < deadline:
        time.sleep(0.01)  # an abandoned thread may still be finishing its run's clean-up
    assert live_sandboxes() == 0, "a sandbox run is still registered as live"
