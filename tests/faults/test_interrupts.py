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


def _drive(
    backend: str, iterations: int, seed: int, loop: str, max_delay: float, p_rollout: float
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [backend, str(iterations), str(seed), loop, str(max_delay), str(p_rollout)]
    proc = subprocess.run(
        [sys.executable, str(DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=500 if FULL else 240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# Quick: single steps and resets, each interrupted early (within 2 ms; 5 ms for the thread
# hop), so that most calls are cut somewhere inside the loop's machinery. Without the
# runner's per-call SIGINT handler (aenv.sync._runner._SigintGuard.install returning None)
# the coroutine case ended in "RuntimeError: this event loop is already running" in every
# run tried (12 of 12, within 120 calls), the thread case in most (its interrupts land in
# the selector more often, which the runner survived before too); the old quick case
# (rollouts, delays up to 25 ms) failed in about half the runs.
QUICK = [("coroutine", "uvloop", 200, 0.002, 0.0), ("thread", "uvloop", 200, 0.005, 0.0)]
CASES = list(QUICK)
if FULL:
    CASES += [
        (backend, loop, 800, 0.025, 0.5)
        for backend in ("coroutine", "thread")
        for loop in ("uvloop", "asyncio")
    ]
    CASES += [("process", "uvloop", 800, 0.025, 0.5)]


@pytest.mark.parametrize(("backend", "loop", "iterations", "max_delay", "p_rollout"), CASES)
def test_ctrl_c_at_random_moments(
    backend: str, loop: str, iterations: int, max_delay: float, p_rollout: float
):
    stats = _drive(backend, iterations, 22, loop, max_delay, p_rollout)
    assert stats["calls"] >= iterations
    assert stats["interrupted"] > 0
    assert stats["groups"] == 0 and stats["other"] == [], stats
    assert stats["stale"] == 0, stats
    report("interrupts", {"backend": backend, "loop": loop, **stats})
