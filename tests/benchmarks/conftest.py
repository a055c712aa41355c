"""Fixtures and markers for the benchmark-harness tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    # `benchmarks` is a plain folder at the repo root, not an installed package.
    sys.path.insert(0, str(REPO))

PEERS_ENABLED = os.environ.get("AENV_BENCH_PEERS") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: runs peer benchmarks in their own venv (needs AENV_BENCH_PEERS=1)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if PEERS_ENABLED:
        return
    skip = pytest.mark.skip(reason="peer benchmark: set AENV_BENCH_PEERS=1 to run")
    for item in items:
        if "slow" in item.keywords and "tests/benchmarks" in str(item.path).replace("\\", "/"):
            item.add_marker(skip)
