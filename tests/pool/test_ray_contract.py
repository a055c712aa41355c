"""The shared pool suite on the Ray backend: every test of the pool's contract modules that
runs over the ``backend`` fixture runs here again with ``backend="ray"``, on this session's
local Ray cluster (see ``_support/ray.py``). Skipped where Ray is not installed.

The tests are taken from their modules as they are (whatever those modules hold when the
suite runs); the fixtures below stand in for the conftest's, for this module only.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
from _support.ray import SKIP_REASON, ray_cluster

pytest.importorskip("ray", reason=SKIP_REASON)

#: the modules whose backend-parametrized tests make the pool's contract
CONTRACT_MODULES = (
    "pool.test_pool",
    "pool.test_streaming",
    "pool.test_per_env",
    "pool.test_faults",
)

# Ray actors take seconds to start on a loaded machine: each test here starts one or two
pytestmark = pytest.mark.timeout(180)


def _backend_tests(module_name: str) -> dict[str, object]:
    """The tests of ``module_name`` that take the ``backend`` (or ``in_process_backend``)
    fixture and do not pick their backends themselves."""
    module = importlib.import_module(module_name)
    found = {}
    for name, fn in vars(module).items():
        if not name.startswith("test_") or not callable(fn):
            continue
        params = inspect.signature(fn).parameters
        own = any(
            mark.name == "parametrize" and "backend" in str(mark.args[0])
            for mark in getattr(fn, "pytestmark", [])
        )
        if ("backend" in params or "in_process_backend" in params) and not own:
            found[name] = fn
    return found


for _module in CONTRACT_MODULES:
    globals().update(_backend_tests(_module))


@pytest.fixture
def backend() -> str:
    ray_cluster()
    return "ray"


@pytest.fixture
def in_process_backend() -> str:
    pytest.skip("reaches into sub-env objects, which live in Ray actors")
