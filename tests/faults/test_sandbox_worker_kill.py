"""Issue 18 leftover: a process-pool worker killed hard takes its sandbox runs' children
along (they outlived it before: only a run's first process had the death signal).

This test hung (past 300 s) while the children it left held the worker's socket to the
pool: the worker's event loop is uvloop's, whose spawn ignores ``close_fds`` and passed the
worker's inheritable descriptors (received through the forkserver) to every run, so the
pool saw no EOF, never learnt of the death and never swept the survivors. Now the worker
marks its descriptors non-inheritable and the sandbox closes every descriptor of a run on
exec; each test bounds the wait for the crash so a regression fails fast.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    pytest.mark.timeout(90),  # (a first forkserver start takes ~15 s on the loaded VM)
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc"),
]
#: how long the pool may take to report the killed worker (at once when it works)
DETECT_S = 20
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
        with anyio.fail_after(DETECT_S), pytest.raises(WorkerCrashedError):
            await pool.async_step_recv(min_get=1)
        _, alive = psutil.wait_procs(started, timeout=10)
        assert [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []


class SpawningEnv(CountingEnv):
    """Each step starts a long-lived program through the worker's own loop (no sandbox: no
    death signal, no sweep) and waits for it."""

    def __init__(self, pids: str) -> None:
        super().__init__(max_steps=10**9)
        self.pids = pids

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(120)", start_new_session=True
        )
        open(os.path.join(self.pids, str(proc.pid)), "w").close()
        await proc.wait()
        return CountingEnv._step(self, tensordict)


async def test_a_program_outliving_its_worker_does_not_hide_the_workers_death(tmp_path: Path):
    """The pool learns of a killed worker (EOF on its socket) even while a program that an
    env started through the worker's loop lives on: the program holds none of the worker's
    descriptors."""
    pids = tmp_path / "pids"
    pids.mkdir()
    pool = AsyncEnvPool([lambda: SpawningEnv(str(pids))], backend="process")
    started: list[psutil.Process] = []
    try:
        async with pool:
            await pool.reset()
            worker = pool.worker_pids[0]  # type: ignore[attr-defined]
            pool.async_step_send(
                TensorDict(action=torch.zeros(1, 1, dtype=torch.int64), batch_size=[1]),
                env_index=[0],
            )
            with anyio.fail_after(60):
                while not os.listdir(pids):
                    await anyio.sleep(0.02)
            started = [psutil.Process(int(p)) for p in os.listdir(pids)]
            os.kill(worker, signal.SIGKILL)
            with anyio.fail_after(DETECT_S), pytest.raises(WorkerCrashedError):
                await pool.async_step_recv(min_get=1)
            assert all(p.is_running() for p in started)  # it did outlive the worker
    finally:
        for p in started:  # not the pool's to sweep (not a sandbox run): ours
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
