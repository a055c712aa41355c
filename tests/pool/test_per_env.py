"""Per-env use of a pool: many tasks each awaiting their own env, cancel, deadlines, observe."""

from __future__ import annotations

import asyncio
import math
from functools import partial

import anyio
import numpy as np
import pytest
import torch

from aenv import EnvCancelledError, PoolError, StepTimeoutError
from aenv.pool import ERROR_KEYS, AsyncEnvPool
from aenv.testing import FailingEnv, HangingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(90)  # includes a process pool's start on a loaded machine

N_ENVS, N_STEPS = 64, 20


def _expected_latencies(seed: int, n: int) -> list[float]:
    """What LatencyEnv(median=m, sigma=1, seed=seed) draws, replayed (see draw_latency)."""
    rng = np.random.default_rng(seed)
    return [0.002 * math.exp(rng.standard_normal()) for _ in range(n)]


def _latency_pool(backend: str, **kw) -> AsyncEnvPool:
    fns = [partial(LatencyEnv, median=0.002, sigma=1.0, seed=i) for i in range(N_ENVS)]
    return AsyncEnvPool(fns, backend=backend, **kw)


async def test_64_tasks_step_their_own_env(backend):
    async with _latency_pool(backend) as pool:
        seen: dict[int, list[float]] = {}

        async def episode(i: int) -> None:
            td = await pool.reset_one(i)
            lats = []
            for step in range(N_STEPS):
                td = await pool.step_one(i, pool.rand_action_one(i, td))
                assert td["next", "observation"][0].item() == step + 1
                lats.append(td["next", "latency"].item())
                td = pool.step_mdp(td)
            seen[i] = lats

        async with anyio.create_task_group() as tg:
            for i in range(N_ENVS):
                tg.start_soon(episode, i)
        for i in range(N_ENVS):
            # each env draws its own latencies from its own seed: env i's results, no other's
            assert seen[i] == pytest.approx(_expected_latencies(i, N_STEPS), rel=1e-5)


async def test_64_tasks_receive_their_own_streamed_results(backend):
    async with _latency_pool(backend) as pool:
        td = await pool.reset()
        counts: dict[int, int] = {}

        async def loop(i: int) -> None:
            for _ in range(N_STEPS):
                pool.async_step_send(pool.rand_action_one(i, td[i].clone()), env_index=i)
                out = await pool.async_step_recv(env_index=i)
                assert out["env_index"].tolist() == [i]
            counts[i] = N_STEPS

        async with anyio.create_task_group() as tg:
            for i in range(N_ENVS):
                tg.start_soon(loop, i)
        assert counts == dict.fromkeys(range(N_ENVS), N_STEPS)
        assert await pool.get_attr("steps_taken") == [N_STEPS] * N_ENVS


async def test_step_and_maybe_reset_one(backend):
    fns = [partial(LatencyEnv, 0.0, max_steps=2)] * 2
    async with AsyncEnvPool(fns, backend=backend) as pool:
        td = await pool.reset_one(1)
        stepped, td = await pool.step_and_maybe_reset_one(1, pool.rand_action_one(1, td))
        assert not stepped["next", "done"].item() and td["observation"][0].item() == 1
        stepped, td = await pool.step_and_maybe_reset_one(1, pool.rand_action_one(1, td))
        assert stepped["next", "done"].item()
        assert td["observation"][0].item() == 0  # reset, as the episode ended


async def test_cancel_frees_the_env_at_once(backend):
    fns = [partial(LatencyEnv, 30.0), partial(LatencyEnv, 0.0)]
    async with AsyncEnvPool(fns, backend=backend) as pool:
        td = await pool.reset_one(0)
        task = asyncio.ensure_future(pool.step_one(0, pool.rand_action_one(0, td.clone())))
        while pool._tickets[0] is None or not pool._tickets[0].launched:
            await asyncio.sleep(0)
        assert pool.cancel(0)
        with pytest.raises(EnvCancelledError):
            await task
        assert not pool.cancel(0)  # nothing left to cancel
        with anyio.fail_after(10):
            fresh = await pool.reset_one(0)  # a send to env 0 works at once
        assert fresh["observation"][0].item() == 0

        # a streamed step: cancelled, its waiting receiver told, the env free again
        pool.async_step_send(pool.rand_action_one(0, fresh.clone()), env_index=0)
        waiter = asyncio.ensure_future(pool.async_step_recv(env_index=0))
        await asyncio.sleep(0)
        assert pool.cancel(0)
        with pytest.raises(RuntimeError, match="cancelled"):
            await waiter
        pool.async_reset_send(env_index=0)
        assert (await pool.async_reset_recv(env_index=0))["env_index"].tolist() == [0]


async def test_cancelling_the_awaiting_task_frees_the_env(backend):
    fns = [partial(LatencyEnv, 30.0)]
    async with AsyncEnvPool(fns, backend=backend) as pool:
        td = await pool.reset_one(0)
        with anyio.move_on_after(0.05):
            await pool.step_one(0, pool.rand_action_one(0, td.clone()))
        assert pool._tickets[0] is None
        with anyio.fail_after(10):
            assert (await pool.reset_one(0))["observation"][0].item() == 0


async def test_blocking_env_whole_batch_step_timeout(backend):
    fns = [partial(HangingEnv, hang_after=0, mode="sync")]
    pool = AsyncEnvPool(fns, backend=backend, step_timeout=0.5)
    td = await pool.reset()
    stuck = None if backend in ("process", "ray") else pool._backend.getattr_sync(0, "release")
    try:
        with pytest.raises(PoolError) as info:
            await pool.rand_step(td)
        assert isinstance(info.value.errors[0], StepTimeoutError)
        # the env was rebuilt: the pool goes on
        td = await pool.reset()
        assert td["observation"].tolist() == [[0.0]]
    finally:
        if stuck is not None:
            stuck()  # let the abandoned worker thread end
        await pool.aclose()


async def test_observe_keeps_the_error_in_the_trajectory(backend):
    fns = [partial(FailingEnv, fail_after=2, message="kaboom")]
    async with AsyncEnvPool(fns, backend=backend, on_error="observe") as pool:
        traj = await pool.rollout(10, break_when_any_done=True)
        assert traj.batch_size == torch.Size([1, 3])
        nxt = traj["next"]
        assert nxt["truncated"].squeeze(-1).tolist() == [[False, False, True]]
        assert nxt["done"].squeeze(-1).tolist() == [[False, False, True]]
        assert nxt["terminated"].squeeze(-1).tolist() == [[False, False, False]]
        kinds = nxt.get("error_type").tolist()
        assert kinds == [["", "", "RuntimeError"]]
        assert nxt.get("error_message").tolist()[0][2] == "kaboom"
        tb = nxt.get("error_traceback").tolist()[0][2]
        assert "Traceback" in tb and "kaboom" in tb and "_step" in tb
        # the env was rebuilt (its step counter starts again)
        assert (await pool.get_attr("total_steps")) == [0]


async def test_observe_per_env_step(backend):
    fns = [partial(FailingEnv, fail_after=0, exc_type=ValueError, message="bad move")] * 2
    async with AsyncEnvPool(fns, backend=backend, on_error="observe") as pool:
        td = await pool.reset_one(1)
        out = await pool.step_one(1, pool.rand_action_one(1, td))
        nxt = out["next"]
        assert nxt["truncated"].item() and nxt["done"].item()
        assert [nxt[k] for k in ERROR_KEYS[:2]] == ["ValueError", "bad move"]


async def test_observe_partial_step_never_copies_another_envs_error(backend):
    fns = [partial(FailingEnv, fail_after=1)] * 3
    async with AsyncEnvPool(fns, backend=backend, on_error="observe") as pool:
        td = await pool.reset()
        td["_step"] = torch.tensor([True, False, True])
        td = pool.step_mdp(await pool.rand_step(td))
        td["_step"] = torch.tensor([True, True, False])
        nxt = (await pool.rand_step(td))["next"]
        assert nxt.get("error_type").tolist() == ["RuntimeError", "", ""]
        assert nxt["truncated"].squeeze(-1).tolist() == [True, False, False]
