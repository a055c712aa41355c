"""Run gymnasium's own vector tests against aenv's gymnasium bridge.

Gymnasium's ``tests/vector`` and ``tests/wrappers/vector`` build their envs with
``SyncVectorEnv`` / ``AsyncVectorEnv`` / ``make_vec``; the plugin
``tools/_gymnasium_bridge_plugin.py`` makes those build aenv pools behind
:func:`aenv.libs.gym.to_gymnasium_vector` instead. Gymnasium's tests are not copied here:
pass the path of a Gymnasium checkout of the installed version (1.4.0).

Usage::

    python tools/gymnasium_vector_suite.py /path/to/Gymnasium [--backend thread] [-- -k reset]

It runs the suites twice, on gymnasium's own vector envs and on the bridge, and prints how
many of the cases that pass on gymnasium's envs pass on the bridge, then the others by name
(cases that fail on gymnasium's own envs here, for a missing optional dependency such as
Box2D or MuJoCo, are left out of the count).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
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
    with tempfile.TemporaryDirectory() as tmp:
        own = _run(root, None, args, Path(tmp) / "own.xml")
        used_file = Path(tmp) / "used.txt"
        bridged = _run(root, args.backend, args, Path(tmp) / "bridge.xml", used_file)
        used = set(used_file.read_text().split()) if used_file.exists() else set()
    base = {name for name, ok in own.items() if ok}
    passed = sorted(name for name in base if bridged.get(name))
    failed = sorted(name for name in base if not bridged.get(name))
    for name in failed:
        print(f"FAILS ON THE BRIDGE: {name}")
    built = {name for name in base if _nodeid(name) in used}
    print(
        f"{len(passed)} of {len(base)} cases that pass on gymnasium's own vector envs pass on "
        f"the bridge ({args.backend} backend); of the {len(built)} that build a bridge, "
        f"{len(built & set(passed))} pass. {len(own) - len(base)} cases fail on gymnasium's "
        "own envs here and are not counted"
    )
    return 0 if not failed else 1


def _nodeid(name: str) -> str:
    """The pytest node id of a junit case name (``tests.vector.test_x.Class::test_y[p]``)."""
    module, _, case = name.partition("::")
    parts = module.split(".")
    # the module path ends at the first part naming a test module
    idx = next(i for i, p in enumerate(parts) if p.startswith("test_"))
    path = "/".join(parts[: idx + 1]) + ".py"
    return "::".join([path, *parts[idx + 1 :], case])


def _run(
    root: Path,
    backend: str | None,
    args: argparse.Namespace,
    xml: Path,
    used: Path | None = None,
) -> dict[str, bool]:
    """Run the suites (on the bridge when ``backend`` is set); each case's outcome."""
    here = Path(__file__).resolve().parent
    env = dict(os.environ)
    # with no display, MuJoCo's default GLFW renderer aborts the whole pytest process; EGL
    # (or OSMesa) raises an ordinary error instead, so such a case just fails on both sides
    env.setdefault("MUJOCO_GL", "egl")
    paths = [str(root), str(here.parent), env.get("PYTHONPATH", "")]
    plugin: list[str] = []
    if backend is not None:
        env["AENV_BRIDGE_BACKEND"] = backend
        env["AENV_BRIDGE_USED"] = str(used)
        paths.insert(0, str(here))
        plugin = ["-p", "_gymnasium_bridge_plugin"]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *SUITES,
        *plugin,
        "-p",
        "no:cacheprovider",
        "-q",
        "--tb=line",
        "--timeout=120",
        f"--junitxml={xml}",
        *args.pytest_args,
    ]
    subprocess.call(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL)
    outcomes: dict[str, bool] = {}
    for case in ET.parse(xml).iter("testcase"):
        if case.find("skipped") is not None:
            continue
        name = f"{case.get('classname')}::{case.get('name')}"
        outcomes[name] = case.find("failure") is None and case.find("error") is None
    return outcomes


if __name__ == "__main__":
    sys.exit(main())
