"""The fault suite: quick by default (part of the normal test run), full with
``AENV_FAULTS=full`` (more seeds, longer hangs and cancel storms, and the soak).

``AENV_FAULTS_REPORT=path.json`` makes the full form's measuring tests add their figures to
that file (``benchmarks/reliability.py`` runs the full suite and writes them into
``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("AENV_START_METHOD", "forkserver")

FULL = os.environ.get("AENV_FAULTS", "").lower() == "full"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "full: part of the full fault suite only (AENV_FAULTS=full)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FULL:
        return
    skip = pytest.mark.skip(reason="full fault suite only: run with AENV_FAULTS=full")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


def report(section: str, row: dict[str, Any]) -> None:
    """Add one row of figures to the report file, when one was asked for."""
    path = os.environ.get("AENV_FAULTS_REPORT")
    if not path:
        return
    p = Path(path)
    data = json.loads(p.read_text()) if p.exists() else {}
    data.setdefault(section, []).append(row)
    p.write_text(json.dumps(data, indent=1))
