"""Leaving without closing: a thread pool whose owner raised mid-run must not abort the
interpreter at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import FULL

pytestmark = pytest.mark.timeout(300)

_SCRIPT = textwrap.dedent(
    """
    import asyncio
    import torch
    from aenv.pool import AsyncEnvPool
    from aenv.testing import CountingEnv

    class MatrixEnv(CountingEnv):
        def _step(self, td):  # torch work: the thread is in C++ most of the time
            a = torch.randn(200, 200)
            for _ in range(50):
                a = torch.tanh(a @ a)
            return super()._step(td)

    async def main():
        pool = AsyncEnvPool([MatrixEnv] * 4, backend="thread")
        td = await pool.reset()
        pool.async_step_send(pool.rand_action(td), env_index=[0, 1, 2, 3])
        raise RuntimeError("user code failed mid-run")

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


def test_an_unclosed_thread_pool_exits_cleanly_when_user_code_raises(tmp_path: Path):
    script = tmp_path / "owner.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for _ in range(6 if FULL else 1):
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
        )
        # the user's error, reported as usual; no abort (-6 / 134)
        assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
        assert "user code failed mid-run" in proc.stderr
        assert "terminate called" not in proc.stderr
