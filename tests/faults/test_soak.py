"""The soak (full fault suite only): 200k streamed steps per backend with 1% injected
faults; nothing lost, every fault recovered, no growth beyond noise."""

from __future__ import annotations

import os

import pytest

from .conftest import report
from .soak import soak

STEPS = int(os.environ.get("AENV_SOAK_STEPS", "200000"))
# noise bounds per 100k steps: memory a few MB (allocator, torch caches); the rest none
RSS_MB_PER_100K = 32.0


@pytest.mark.full
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("backend", ["coroutine", "thread", "process"])
async def test_soak(backend: str):
    out = await soak(backend, STEPS, fault_rate=0.01)
    samples = out.pop("samples")
    report("soak", out)
    assert out["lost"] == 0
    assert out["faults_injected"] > 0
    assert out["recovered"] >= out["faults_injected"]
    growth = out["growth_per_100k"]
    assert growth["rss_mb"] < RSS_MB_PER_100K, samples
    for key in ("fds", "threads", "children", "tasks"):
        assert growth[key] <= 0, (key, samples)
