"""Closing a pool while calls wait on its envs: each of them raises ``EnvClosedError``.

Before, a ``step_one``, a whole-batch ``step`` / ``step_and_maybe_reset`` or a rollout in
flight when another task closed the pool waited forever, on every backend: the closed
backend never delivers the outcome they wait for.
"""

from __future__ import annotations

import asyncio
import threading
from functools import partial

import pytest

from aenv.exceptions import EnvClosedError
from aenv.pool import AsyncEnvPool
from aenv.testing import LatencyEnv, SyncLatencyEnv

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

_RELEASE = threading.Event()


class _GateEnv(SyncLatencyEnv):
    """Blocks its thread until the test releases it (the thread backend's stuck env)."""

    def draw_latency(self) -> float:
        _RELEASE.wait(30)
        return 0.0


def _pool(backend: str) -> AsyncEnvPool:
    if backend == "thread":
        fns = [partial(_GateEnv, 0.0)] * 2
    else:
        fns = [partial(LatencyEnv, 60.0)] * 2  # (cancellable: its step awaits a sleep)
    return AsyncEnvPool(fns, backend=backend, close_timeout=0.5)


async def _call(pool: AsyncEnvPool, td, shape: str):
    if shape == "step_one":
        return await pool.step_one(0, pool.rand_action_one(0, td[0].clone()))
    if shape == "step":
        return await pool.step(pool.rand_action(td.clone()))
    if shape == "step_and_maybe_reset":
        return await pool.step_and_maybe_reset(pool.rand_action(td.clone()))
    return await pool.rollout(5, auto_reset=False, tensordict=td.clone())


@pytest.mark.parametrize("shape", ["step_one", "step", "step_and_maybe_reset", "rollout"])
async def test_closing_the_pool_fails_the_calls_in_flight(backend: str, shape: str) -> None:
    _RELEASE.clear()
    pool = _pool(backend)
    try:
        td = await pool.reset()
        caller = asyncio.ensure_future(_call(pool, td, shape))
        for _ in range(100):  # until the call holds env 0 (the dispatcher's slot for it)
            await asyncio.sleep(0)
            if pool._tickets[0] is not None:
                break
        else:
            pytest.fail("the call never reached env 0")
        await pool.aclose()
        with pytest.raises(EnvClosedError, match="closed"):
            await asyncio.wait_for(caller, 10)
    finally:
        _RELEASE.set()
        await pool.aclose()


async def test_a_cancelled_caller_is_still_cancelled_when_the_pool_closes(backend: str) -> None:
    """The caller's own cancellation is not turned into the close's error."""
    _RELEASE.clear()
    pool = _pool(backend)
    try:
        td = await pool.reset()
        caller = asyncio.ensure_future(pool.step(pool.rand_action(td.clone())))
        for _ in range(5):
            await asyncio.sleep(0)
        caller.cancel()
        await pool.aclose()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, 10)
    finally:
        _RELEASE.set()
        await pool.aclose()
