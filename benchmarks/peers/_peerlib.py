"""Plumbing shared by the peer workload scripts (runs inside the peer venv).

A peer script calls :func:`run_main` with its full-size defaults, its quick-mode overrides and
a function that takes the merged params and returns a dict of numbers. The params come as
one JSON object in ``argv[1]`` (or on stdin when argv has none); ``{"quick": true}`` selects
the quick set, and any explicit key overrides both. The script prints exactly one JSON line
on stdout: the result, plus ``"params"`` and ``"versions"``.

Only the standard library, numpy and the peer's own libraries are importable here; aenv is
not installed in the peer venv.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

_BENCH_DIR = Path(__file__).resolve().parents[1]
if str(_BENCH_DIR) not in sys.path:
    # Lets the peer scripts `import _common` without aenv or the repo on sys.path.
    sys.path.insert(0, str(_BENCH_DIR))

__all__ = ["library_versions", "parse_params", "run_main"]

_VERSIONED = ("torch", "torchrl", "tensordict", "gymnasium", "numpy")


def library_versions() -> dict[str, str]:
    """Returns the installed versions of the libraries the peers measure, plus Python's."""
    versions = {"python": sys.version.split()[0]}
    for dist in _VERSIONED:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


def parse_params(
    argv: list[str], defaults: dict[str, Any], quick: dict[str, Any]
) -> dict[str, Any]:
    """Merges defaults, quick overrides (when ``quick`` is true) and the given JSON params."""
    raw = argv[1] if len(argv) > 1 else (sys.stdin.read() if not sys.stdin.isatty() else "")
    given = json.loads(raw) if raw.strip() else {}
    if not isinstance(given, dict):
        raise SystemExit(f"params must be a JSON object, got {raw!r}")
    unknown = set(given) - set(defaults) - {"quick"}
    if unknown:
        raise SystemExit(f"unknown params {sorted(unknown)}; known: {sorted(defaults)}")
    params = dict(defaults)
    if given.get("quick"):
        params.update(quick)
    params.update({k: v for k, v in given.items() if k != "quick"})
    params["quick"] = bool(given.get("quick", False))
    return params


def run_main(
    workload: Callable[[dict[str, Any]], dict[str, Any]],
    defaults: dict[str, Any],
    quick: dict[str, Any],
) -> None:
    """Parses params, runs ``workload`` and prints its result as one JSON line."""
    params = parse_params(sys.argv, defaults, quick)
    try:
        result = workload(params)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    out = {**result, "params": params, "versions": library_versions()}
    sys.stdout.flush()
    print(json.dumps(out, default=float), flush=True)
