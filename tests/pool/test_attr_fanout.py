"""Attribute fan-out of pools: envs elsewhere are read with an awaited operation, all envs at
once, so a read never blocks the pool's loop, not even on a stuck worker."""

from __future__ import annotations

import asyncio
import sys

import cloudpickle
import pytest
from _support.process import HANG_BLOCKING, NORMAL, ControlledEnv, actions

from aenv import PoolError, StepTimeoutError, WorkerCrashedError
from aenv.pool import AsyncEnvPool, ProcessorAsyncEnvPool

pytestmark = pytest.mark.timeout(60)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


async def test_reading_after_a_stuck_worker_timed_out_keeps_the_loop_running():
    # env 0 blocks its worker's thread in a sync call; the step times out; reading an
    # attribute of every env then waits for the replaced env without blocking the loop
    async with ProcessorAsyncEnvPool(
        (2, ControlledEnv),
        num_workers=2,
        step_timeout=0.5,
        backend_options={"replace_timeout": 0.3},
    ) as pool:
        await pool.reset()
        with pytest.raises(PoolError) as info:
            await pool.step(actions(HANG_BLOCKING, NORMAL))
        assert isinstance(info.value.errors[0], StepTimeoutError)
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.create_task(heartbeat())
        try:
            counts = await asyncio.wait_for(pool.get_attr("count"), 20)
        except PoolError as err:
            # the read reached the stuck worker as it was killed: a typed error, no hang
            assert sorted(err.errors) == [0]
            assert isinstance(err.errors[0], WorkerCrashedError)
            assert err.results == {1: 1}
        else:
            # or the fresh env from env 0's factory answered; env 1 kept its step
            assert counts == [0, 1]
        finally:
            beat.cancel()
        assert ticks > 0
        await pool.reset()
        assert await pool.get_attr("count") == [0, 0]
        # the plain attribute form costs no I/O: it says how to read
        with pytest.raises(AttributeError, match="get_attr"):
            _ = pool.count


async def test_in_process_envs_are_read_in_place():
    async with AsyncEnvPool((3, ControlledEnv)) as pool:
        await pool.reset()
        await pool.step(actions(NORMAL, NORMAL, NORMAL))
        assert pool.count == [1, 1, 1]
        assert await pool.get_attr("count", env_indices=[2]) == [1]
        with pytest.raises(AttributeError):
            _ = pool.no_such_attribute
