"""The demo (`python -m aenv demo`) runs end to end with small sizes and prints its table."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(180)
def test_demo_runs_and_prints_table():
    cmd = [sys.executable, "-m", "aenv", "demo", "--seconds", "0.5", "--envs", "16"]
    cmd += ["--cpu-envs", "2", "--cpu-steps", "5", "--cpu-ms", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for row in ("lockstep (coroutine)", "streaming (coroutine)", "SerialEnv", "ParallelEnv"):
        assert row in out
    assert "streaming / lockstep:" in out


def test_demo_rejects_unknown_backend():
    proc = subprocess.run(
        [sys.executable, "-m", "aenv", "demo", "--backend", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "invalid choice" in proc.stderr
