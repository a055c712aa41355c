"""Process backend faults: workers really killed mid-step, hangs, parent death, no leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import cloudpickle
import psutil
import pytest
import pytest_asyncio
import torch
from _support.process import (
    EXIT,
    HANG_ASYNC,
    HANG_BLOCKING,
    NORMAL,
    RAISE_ODD,
    ControlledEnv,
    actions,
)
from tensordict import TensorDictBase

from aenv import EnvStepError, PoolError, StepTimeoutError, WorkerCrashedError
from aenv.pool import ProcessorAsyncEnvPool

pytestmark = pytest.mark.timeout(60)
module_loop = pytest.mark.asyncio(loop_scope="module")
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pool():
    # envs 0, 1 in worker 0; envs 2, 3 in worker 1
    p = ProcessorAsyncEnvPool(
        (4, ControlledEnv),
        num_workers=2,
        start_method="forkserver",
        step_timeout=1.0,
        backend_options={"replace_timeout": 0.3},
    )
    yield p
    await p.aclose()


def worker_of(pool: ProcessorAsyncEnvPool, env: int) -> int:
    return pool._backend._of_env[env].pid  # type: ignore[attr-defined]


async def fresh(pool: ProcessorAsyncEnvPool) -> TensorDictBase:
    td = await pool.reset()
    assert td["observation"].sum() == 0
    return td


@module_loop
async def test_os_exit_mid_step_fails_pending_and_respawns(pool):
    await fresh(pool)
    old = worker_of(pool, 0)
    with pytest.raises(PoolError) as info:
        await pool.step(actions(EXIT, NORMAL, NORMAL, NORMAL))
    errors = info.value.errors
    assert isinstance(errors[0], WorkerCrashedError) and errors[0].exitcode == 3
    assert "exited with code 3" in str(errors[0])
    # env 1 shared the worker: its pending step failed the same way; envs 2, 3 are fine
    assert isinstance(errors[1], WorkerCrashedError) and sorted(errors) == [0, 1]
    assert sorted(info.value.results) == [2, 3]
    assert info.value.results[2]["observation"].item() == 1
    # the worker was respawned; its envs are fresh and take a reset
    await fresh(pool)
    assert worker_of(pool, 0) != old and _gone(old)
    out = await pool.step(actions(NORMAL, NORMAL, NORMAL, NORMAL))
    assert out["next", "observation"].squeeze(-1).tolist() == [1, 1, 1, 1]


@module_loop
async def test_sigkill_mid_step_streams_the_crash(pool):
    await fresh(pool)
    pid = worker_of(pool, 2)
    td = actions(NORMAL, HANG_ASYNC)
    td["env_index"] = torch.tensor([0, 2])
    pool.async_step_send(td)
    first = await pool.async_step_recv()
    assert first["env_index"].tolist() == [0]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerCrashedError) as info:
        await pool.async_step_recv()
    assert info.value.env_index == 2 and info.value.signal == signal.SIGKILL
    # env 3 lived in the same worker and was idle: it is lost until reset
    with pytest.raises(PoolError) as lost:
        await pool.step(actions(NORMAL, NORMAL, NORMAL, NORMAL))
    assert sorted(lost.value.errors) == [2, 3]
    assert "needs a reset" in str(lost.value.errors[3])
    await fresh(pool)
    out = await pool.step(actions(NORMAL, NORMAL, NORMAL, NORMAL))
    assert out["next", "observation"].squeeze(-1).tolist() == [1, 1, 1, 1]


@module_loop
async def test_raise_in_worker_keeps_type_name_and_traceback(pool):
    await fresh(pool)
    with pytest.raises(PoolError) as info:
        await pool.step(actions(NORMAL, RAISE_ODD, NORMAL, NORMAL))
    err = info.value.errors[1]
    assert isinstance(err, EnvStepError) and not isinstance(err, WorkerCrashedError)
    assert err.remote_type == "OddError" and "odd 1 2" in str(err)
    # the worker's frames, down to the env's own: the class is pickled by value, so its
    # source lines may not be at hand in the worker (cloudpickle >= 3.1.3 names the file
    # "<dynamic-code>"); the frame and the exception line are
    tb = err.remote_traceback
    assert "_process_worker.py" in tb and "in _step" in tb and "OddError: odd 1 2" in tb


@module_loop
async def test_async_hang_times_out_worker_kept(pool):
    await fresh(pool)
    pid = worker_of(pool, 1)
    with pytest.raises(PoolError) as info:
        await pool.step(actions(NORMAL, HANG_ASYNC, NORMAL, NORMAL))
    assert isinstance(info.value.errors[1], StepTimeoutError)
    # the worker answered the give-up: same process, env 1 rebuilt in it
    await fresh(pool)
    assert worker_of(pool, 1) == pid
    assert await pool.get_attr("count") == [0, 0, 0, 0]


@module_loop
async def test_blocking_hang_times_out_and_worker_is_killed(pool):
    await fresh(pool)
    pid = worker_of(pool, 3)
    with pytest.raises(PoolError) as info:
        await pool.step(actions(NORMAL, NORMAL, NORMAL, HANG_BLOCKING))
    assert isinstance(info.value.errors[3], StepTimeoutError)
    assert sorted(info.value.results) == [0, 1, 2]
    # the worker could not answer (its loop is stuck in time.sleep): killed and respawned
    td = await pool.reset()
    assert worker_of(pool, 3) != pid
    out = await pool.step(pool.rand_action(td).update(actions(NORMAL, NORMAL, NORMAL, NORMAL)))
    assert out["next", "observation"].squeeze(-1).tolist() == [1, 1, 1, 1]


@module_loop
async def test_close_leaves_no_process():
    pool = ProcessorAsyncEnvPool((2, ControlledEnv), num_workers=2, start_method="forkserver")
    pids = pool.worker_pids
    await pool.reset()
    os.kill(pids[0], signal.SIGKILL)  # one crashed (respawned) worker, one healthy
    with pytest.raises(PoolError):
        await pool.step(actions(NORMAL, NORMAL))
    pids += pool.worker_pids
    await pool.aclose()
    assert pool.worker_pids == []
    assert all(_gone(pid) for pid in pids)


def _gone(pid: int) -> bool:
    """Not in the process table (or only as a zombie some other parent has to reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


_OWNER = textwrap.dedent(
    """
    import sys, time
    from functools import partial
    from aenv.pool import ProcessorAsyncEnvPool
    from aenv.testing import CountingEnv

    if __name__ == "__main__":
        pool = ProcessorAsyncEnvPool((2, CountingEnv), num_workers=2)
        print(*pool.worker_pids, flush=True)
        time.sleep(600)
    """
)


def test_parent_death_takes_workers_down(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(_OWNER)
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        owner.kill()
        owner.wait(10)
        # polled, not psutil.wait_procs: the workers are no children of this process, and
        # its waitpid-based wait can raise ChildProcessError while they are reparented
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(pid) for pid in pids)
    finally:
        if owner.poll() is None:
            owner.kill()
