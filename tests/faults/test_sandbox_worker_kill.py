"""Issue 18 leftover: a process-pool worker killed hard takes its sandbox runs' children
along (they outlived it before: only a run's first process had the death signal)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import cloudpickle
import psutil
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv import WorkerCrashedError
from aenv.llm import SandboxLimits, SubprocessSandbox
from aenv.pool import AsyncEnvPool
from aenv.testing import CountingEnv

pytestmark = [
    pytest.mark.timeout(300),  # (pool, sandbox runs: ~2 min on the loaded 2-core VM)
    # full form only: in the merged tree it hung past its 300 s limit on a quiet machine (the
    # loop idle after the kill); open question in the closing note, not yet understood
    pytest.mark.full,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc"),
]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROGRAM = """
import os, signal, time
def note():
    open(os.path.join({pids!r}, str(os.getpid())), "w").close()
note()
if os.fork() == 0:  # a child that stays in the run's session
    note()
    while True:
        time.sleep(1)
if os.fork() == 0:  # one that leaves it (a daemonised helper)
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    note()
    while True:
        time.sleep(1)
while True:
    time.sleep(1)
"""


class SandboxEnv(CountingEnv):
    """Each step runs a program that starts two children and never ends."""

    def __init__(self, pids: str) -> None:
        super().__init__(max_steps=10**9)
        self.pids = pids
        self.box = SubprocessSandbox(SandboxLimits(wall_time_s=600))

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        await self.box.run_python(PROGRAM.format(pids=self.pids))
        return CountingEnv._step(self, tensordict)


async def test_a_killed_worker_takes_its_sandbox_runs_children_along(tmp_path: Path):
    pids = tmp_path / "pids"
    pids.mkdir()
    pool = AsyncEnvPool([lambda: SandboxEnv(str(pids))], backend="process")
    async with pool:
        await pool.reset()
        worker = pool.worker_pids[0]  # type: ignore[attr-defined]
        pool.async_step_send(
            TensorDict(action=torch.zeros(1, 1, dtype=torch.int64), batch_size=[1]), env_index=[0]
        )
        with anyio.fail_after(120):
            while len(os.listdir(pids)) < 3:
                await anyio.sleep(0.02)
        started = [psutil.Process(int(p)) for p in os.listdir(pids)]
        os.kill(worker, signal.SIGKILL)
        with pytest.raises(WorkerCrashedError):
            await pool.async_step_recv(min_get=1)
        _, alive = psutil.wait_procs(started, timeout=10)
        assert [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
