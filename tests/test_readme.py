"""The README's quick start is what CI runs, and its code blocks run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_quick_start_has_exactly_two_commands():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [b.strip() for b in re.findall(r"```bash\n(.*?)```", quick, flags=re.S)]
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    assert commands[0].endswith("python -m aenv demo")
    assert commands[1].endswith("pytest")


def test_ci_runs_the_readme_test_command():
    test_command = next(b.strip() for b in _bash_blocks() if b.strip().endswith("pytest"))
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


@pytest.mark.timeout(600)  # every README block in turn, each a fresh interpreter
def test_python_blocks_run(tmp_path):
    blocks = _python_blocks()
    assert blocks
    for i, block in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(block)
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"README python block {i} failed:\n{proc.stderr[-2000:]}"
