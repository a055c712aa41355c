"""Ctrl-C during sync facade calls: the call raises KeyboardInterrupt (never an exception
group), the next call works and no stale result reaches it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import FULL, report

pytestmark = pytest.mark.timeout(600)
DRIVER = Path(__file__).with_name("interrupt_driver.py")


def _drive(backend: str, iterations: int, seed: int, loop: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(DRIVER), backend, str(iterations), str(seed), loop],
        capture_output=True,
        text=True,
        timeout=500 if FULL else 240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


CASES = [("coroutine", "uvloop")]
if FULL:
    CASES += [("thread", "uvloop"), ("coroutine", "asyncio"), ("thread", "asyncio")]
    CASES += [("process", "uvloop")]


@pytest.mark.parametrize(("backend", "loop"), CASES)
def test_ctrl_c_at_random_moments(backend: str, loop: str):
    # (the old runner failed within ~800 calls: EnvBusyError, "Event loop stopped")
    iterations = 800 if FULL else 150
    stats = _drive(backend, iterations, seed=22, loop=loop)
    assert stats["calls"] == iterations
    assert stats["interrupted"] > 0
    assert stats["groups"] == 0 and stats["other"] == [], stats
    assert stats["stale"] == 0, stats
    report("interrupts", {"backend": backend, "loop": loop, **stats})
