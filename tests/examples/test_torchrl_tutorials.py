"""TorchRL's tutorials (env and collection parts) run on aenv with only their imports
changed: each script under examples/torchrl_tutorials/ is TorchRL code whose import block
points at ``aenv.torchrl``; its TorchRL twin swaps that block for the ``# torchrl:`` lines.

Each script runs here (quick settings); the twin is checked to differ only in import
lines. Where a TorchRL install is named by ``AENV_TORCHRL_PYTHON`` (a python with torchrl),
the twin runs there too and both print the same numbers.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "examples" / "torchrl_tutorials").glob("*.py"))
TORCHRL_PYTHON = os.environ.get("AENV_TORCHRL_PYTHON")
MARK = "# torchrl: "


def torchrl_twin(text: str) -> str:
    """The script with TorchRL's imports: aenv import lines out, ``# torchrl:`` lines in."""
    out = []
    in_aenv_import = False
    for line in text.splitlines():
        if line.startswith(("from aenv", "import aenv")):
            in_aenv_import = line.endswith("(")  # a parenthesised import goes on
            continue
        if in_aenv_import:
            in_aenv_import = line != ")"
            continue
        out.append(line[len(MARK) :] if line.startswith(MARK) else line)
    return "\n".join(out) + "\n"


def run(python: str, script: Path, cwd: Path, extra_env: dict[str, str]) -> str:
    env = {**os.environ, "TUTORIAL_QUICK": "1", **extra_env}
    proc = subprocess.run(
        [python, str(script)], capture_output=True, text=True, timeout=420, cwd=cwd, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def numbers(stdout: str) -> list[str]:
    """The lines a script prints for comparison (its results, not its reprs)."""
    return [ln for ln in stdout.splitlines() if ln.startswith(("result", "returns", "last"))]


def test_there_are_tutorials():
    names = {p.stem for p in SCRIPTS}
    assert {"pendulum", "getting_started", "torchrl_envs", "collectors"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_twin_differs_only_in_imports(script):
    text = script.read_text()
    twin = torchrl_twin(text)
    changed = [
        ln[1:].strip()
        for ln in difflib.unified_diff(text.splitlines(), twin.splitlines(), lineterm="", n=0)
        if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
    ]
    assert changed, "the script has no aenv import block"
    # only import lines (and the names of a parenthesised aenv import, and the blank
    # line the formatter puts after it) differ
    aenv_names = {ln.strip().rstrip(",") for ln in text.splitlines() if ln.startswith("    ")}
    for ln in changed:
        assert (
            ln.startswith(("from ", "import ", "# torchrl: from", ")"))
            or ln.rstrip(",") in aenv_names
            or not ln
        ), ln
    assert not [ln for ln in twin.splitlines() if ln.startswith(("from aenv", "import aenv"))]
    assert "from torchrl" in twin


@pytest.mark.timeout(900)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_tutorial_runs_on_aenv(script, tmp_path):
    out = run(sys.executable, script, tmp_path, {"PYTHONPATH": str(ROOT)})
    assert numbers(out), out[-2000:]


@pytest.mark.skipif(not TORCHRL_PYTHON, reason="AENV_TORCHRL_PYTHON names no TorchRL python")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_same_numbers_as_torchrl(script, tmp_path):
    twin = tmp_path / script.name
    twin.write_text(torchrl_twin(script.read_text()))
    ours = run(sys.executable, script, tmp_path, {"PYTHONPATH": str(ROOT)})
    theirs = run(str(TORCHRL_PYTHON), twin, tmp_path, {})
    assert numbers(ours) == numbers(theirs)
