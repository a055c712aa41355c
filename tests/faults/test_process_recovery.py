"""Process backend recovery: a restart after a blocking hang, a factory that keeps failing
after a crash, and workers forked from a thread that must die with their parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import cloudpickle
import psutil
import pytest
from _support.process import HANG_BLOCKING, NORMAL, ControlledEnv, actions

from aenv import EnvStepError, PoolError, StepTimeoutError, WorkerRestartError
from aenv.pool import ProcessorAsyncEnvPool
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(90)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


async def test_restart_after_a_blocking_hang_gives_one_truncated_step():
    # envs 0 and 1 share one worker; env 0 blocks its loop in time.sleep. The replace
    # timeout is far away: only a worker killed at once (its watchdog saw env 0 still
    # running) lets the restart's reset finish within the step timeout.
    pool = ProcessorAsyncEnvPool(
        (2, ControlledEnv),
        num_workers=1,
        step_timeout=2.0,
        on_error="restart",
        backend_options={"replace_timeout": 60.0},
    )
    try:
        await pool.reset()
        pid = pool.worker_pids[0]
        out = await pool.step(actions(HANG_BLOCKING, NORMAL))
        # one truncated step per env, fresh observations, no error raised
        assert out["next", "done"].view(-1).tolist() == [True, True]
        assert out["next", "observation"].view(-1).tolist() == [0.0, 0.0]
        assert isinstance(pool.last_errors[0], StepTimeoutError)
        assert pool.worker_pids != [pid] and _zombie(pid)
        out = await pool.step(actions(NORMAL, NORMAL))
        assert out["next", "observation"].view(-1).tolist() == [1.0, 1.0]
    finally:
        await pool.aclose()


async def test_an_async_hang_keeps_its_worker_and_cohosted_env():
    # the loop is free (the hang awaits): the worker rebuilds env 0 itself, env 1 keeps
    # its state in the same process
    pool = ProcessorAsyncEnvPool(
        (2, ControlledEnv), num_workers=1, step_timeout=1.0, on_error="restart"
    )
    try:
        await pool.reset()
        pid = pool.worker_pids[0]
        await pool.step(actions(NORMAL, NORMAL))
        from _support.process import HANG_ASYNC

        out = await pool.step(actions(HANG_ASYNC, NORMAL))
        assert out["next", "observation"].view(-1).tolist() == [0.0, 2.0]
        assert pool.worker_pids == [pid]
    finally:
        await pool.aclose()


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class FlakyFactory:
    """Builds a counting env unless ``path`` exists (then raises, as a factory whose
    remote resource went away)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> CountingEnv:
        if os.path.exists(self.path):
            raise RuntimeError("resource down")
        return CountingEnv(max_steps=100)


async def _reset_until(pool: ProcessorAsyncEnvPool, kind: type[BaseException]) -> BaseException:
    """Reset until env 0's error is a ``kind`` naming the factory's failure (the worker's
    restarts run meanwhile)."""
    with anyio.fail_after(30):
        while True:
            try:
                await pool.reset()
            except PoolError as exc:
                err = exc.errors[0]
                if isinstance(err, kind) and "resource down" in str(err):
                    return err
                assert isinstance(err, EnvStepError)
            await anyio.sleep(0.02)


async def test_a_factory_failing_after_a_crash_is_given_up_with_a_typed_error(tmp_path: Path):
    flag = tmp_path / "down"
    pool = ProcessorAsyncEnvPool(
        (1, FlakyFactory(str(flag))),
        num_workers=1,
        backend_options={"restart_attempts": 3, "restart_backoff": 0.01},
    )
    try:
        await pool.reset()
        flag.touch()
        os.kill(pool.worker_pids[0], signal.SIGKILL)
        err = await _reset_until(pool, WorkerRestartError)
        assert err.attempts == 3 and "resource down" in str(err)
        assert isinstance(err.__cause__, RuntimeError)
        # given up: no further respawns, every later call fails the same way at once
        backend = pool._backend
        spawned = backend._workers[0].proc.pid  # type: ignore[attr-defined]
        with pytest.raises(PoolError) as info:
            await pool.reset()
        assert isinstance(info.value.errors[0], WorkerRestartError)
        assert backend._workers[0].proc.pid == spawned  # type: ignore[attr-defined]
        assert _zombie(spawned)
    finally:
        await pool.aclose()


async def test_a_factory_that_recovers_brings_its_worker_back(tmp_path: Path):
    flag = tmp_path / "down"
    pool = ProcessorAsyncEnvPool(
        (1, FlakyFactory(str(flag))),
        num_workers=1,
        backend_options={"restart_attempts": 50, "restart_backoff": 0.01},
    )
    try:
        await pool.reset()
        flag.touch()
        os.kill(pool.worker_pids[0], signal.SIGKILL)
        err = await _reset_until(pool, EnvStepError)
        assert "resource down" in str(err)
        flag.unlink()
        with anyio.fail_after(30):
            while True:
                try:
                    td = await pool.reset()
                    break
                except PoolError:
                    await anyio.sleep(0.02)
        assert td["observation"].sum() == 0
    finally:
        await pool.aclose()


_THREAD_OWNER = textwrap.dedent(
    """
    import asyncio, threading, time
    from aenv.pool import ProcessorAsyncEnvPool
    from aenv.testing import CountingEnv

    async def build():
        pool = ProcessorAsyncEnvPool((2, CountingEnv), num_workers=2, start_method="fork")
        await pool.reset()
        print(*pool.worker_pids, flush=True)
        await asyncio.sleep(600)

    if __name__ == "__main__":
        threading.Thread(target=asyncio.run, args=(build(),), daemon=True).start()
        time.sleep(600)
    """
)


def test_workers_forked_from_a_thread_die_with_their_parent(tmp_path: Path):
    script = tmp_path / "owner.py"
    script.write_text(_THREAD_OWNER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    owner = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    procs = []
    try:
        assert owner.stdout is not None
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2
        procs = [psutil.Process(p) for p in pids]
        owner.kill()
        owner.wait(10)
        _, alive = psutil.wait_procs(procs, timeout=15)
        assert all(_zombie(p.pid) for p in alive), [p.pid for p in alive]
    finally:
        if owner.poll() is None:
            owner.kill()
        for p in procs:
            if p.is_running():
                p.kill()
