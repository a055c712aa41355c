"""The conformance suite: TorchRL's own env, spec, transform and collector checks,
re-expressed against aenv's API (async methods and sync facades)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# forkserver: the first process pool pays the interpreter start, later ones ~30 ms
os.environ.setdefault("AENV_START_METHOD", "forkserver")


@pytest.fixture(params=["coroutine", "thread", "process"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


_HERE = Path(__file__).parent
_BEHAVIOURS: set[tuple[str, str]] = set()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).parents:
            _BEHAVIOURS.add((item.path.name, getattr(item, "originalname", item.name)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line in every run that includes the suite: behaviours checked, and how."""
    if not _BEHAVIOURS:
        return
    counts = {
        outcome: sum(
            1
            for report in terminalreporter.stats.get(outcome, [])
            if getattr(report, "when", "call") == "call"
            and str(getattr(report, "nodeid", "")).startswith("tests/conformance/")
        )
        for outcome in ("passed", "failed", "xfailed", "skipped")
    }
    detail = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    terminalreporter.write_line(
        f"TorchRL conformance: {len(_BEHAVIOURS)} behaviours checked ({detail})"
    )
