"""Run gymnasium's own vector tests against aenv's gymnasium bridge.

Gymnasium's ``tests/vector`` and ``tests/wrappers/vector`` build their envs with
``SyncVectorEnv`` / ``AsyncVectorEnv`` / ``make_vec``; the plugin
``tools/_gymnasium_bridge_plugin.py`` makes those build aenv pools behind
:func:`aenv.libs.gym.to_gymnasium_vector` instead. Gymnasium's tests are not copied here:
pass the path of a Gymnasium checkout of the installed version (1.4.0).

Usage::

    python tools/gymnasium_vector_suite.py /path/to/Gymnasium [--backend thread] [-- -k reset]

It prints pytest's summary: the cases that pass against the bridge, and those that fail.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SUITES = ("tests/vector", "tests/wrappers/vector")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a Gymnasium checkout (its tests/ folder)")
    parser.add_argument(
        "--backend", default="coroutine", choices=("coroutine", "thread", "process")
    )
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    root = args.checkout.resolve()
    missing = [s for s in SUITES if not (root / s).is_dir()]
    if missing:
        parser.error(f"{root} has no {', '.join(missing)}: pass a Gymnasium checkout")
    here = Path(__file__).resolve().parent
    env = dict(os.environ)
    env["AENV_BRIDGE_BACKEND"] = args.backend
    paths = [str(here), str(root), str(here.parent), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *SUITES,
        "-p",
        "_gymnasium_bridge_plugin",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rf",
        "--timeout=120",
        *args.pytest_args,
    ]
    return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
