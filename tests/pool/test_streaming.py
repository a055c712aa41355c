"""Streaming: send to some envs, receive as each finishes, on every backend."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from aenv import EnvBusyError
from aenv.pool import AsyncEnvPool
from aenv.testing import CountingEnv, HangingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(30)


def gated_pool(backend: str, n_fast: int = 3) -> AsyncEnvPool:
    """n_fast counting envs, then one env whose first step waits until released."""
    fns = [partial(CountingEnv, max_steps=100)] * n_fast
    fns.append(partial(HangingEnv, hang_after=0, mode="sync", max_steps=100))
    return AsyncEnvPool(fns, backend=backend)


async def test_fast_results_arrive_while_slow_env_runs(in_process_backend):
    backend = in_process_backend
    pool = gated_pool(backend)
    try:
        td = await pool.reset()
        td["env_index"] = torch.arange(4)
        pool.async_step_send(pool.rand_action(td))
        first = await pool.async_step_recv(min_get=3)
        assert sorted(first["env_index"].tolist()) == [0, 1, 2]
        assert first["next", "observation"].squeeze(-1).tolist() == [1, 1, 1]
        with pytest.raises(EnvBusyError) as info:
            pool.async_step_send(td[3].clone(), env_index=3)
        assert info.value.env_index == 3
        # the fast envs go on while env 3 is stuck
        pool.async_step_send(pool.rand_action(pool.step_mdp(first)))
        second = await pool.async_step_recv(min_get=3)
        assert second["next", "observation"].squeeze(-1).tolist() == [2, 2, 2]
    finally:
        await _release_and_finish(pool)


async def _release_and_finish(pool: AsyncEnvPool) -> None:
    # the last env is the gated one; HangingEnv.release only sets a threading.Event
    hanging = pool.num_envs - 1
    pool._backend.getattr_sync(hanging, "release")()
    last = await pool.async_step_recv(timeout=10)
    assert last["env_index"].tolist() == [hanging]
    await pool.aclose()


async def test_recv_order_count_and_max_get(backend):
    async with AsyncEnvPool((4, partial(CountingEnv, max_steps=100)), backend=backend) as pool:
        td = await pool.reset()
        td["env_index"] = torch.arange(4)
        pool.async_step_send(pool.rand_action(td[1:3].clone()))
        got = await pool.async_step_recv(min_get=2, max_get=1)
        assert got.batch_size == torch.Size([1])
        rest = await pool.async_step_recv()
        assert sorted(got["env_index"].tolist() + rest["env_index"].tolist()) == [1, 2]
        with pytest.raises(RuntimeError, match="cannot wait"):
            await pool.async_step_recv()


async def test_recv_timeout_keeps_results(in_process_backend):
    backend = in_process_backend
    pool = gated_pool(backend, n_fast=1)
    try:
        td = await pool.reset()
        td["env_index"] = torch.arange(2)
        pool.async_step_send(pool.rand_action(td))
        with pytest.raises(TimeoutError):
            await pool.async_step_recv(min_get=2, timeout=0.05)
        got = await pool.async_step_recv(min_get=1)
        assert got["env_index"].tolist() == [0]
    finally:
        await _release_and_finish(pool)


async def test_reset_and_step_and_maybe_reset_streams(backend):
    async with AsyncEnvPool((3, partial(CountingEnv, max_steps=1)), backend=backend) as pool:
        pool.async_reset_send(env_index=[0, 2])
        reset = await pool.async_reset_recv(min_get=2)
        assert sorted(reset["env_index"].tolist()) == [0, 2]
        pool.async_step_and_maybe_reset_send(pool.rand_action(reset))
        stepped, nxt = await pool.async_step_and_maybe_reset_recv(min_get=2)
        assert stepped["next", "done"].all()
        assert not nxt["done"].any() and (nxt["observation"] == 0).all()
        assert nxt["env_index"].tolist() == stepped["env_index"].tolist()


async def test_stream_iterator_yields_each_env(backend):
    lat = [0.0, 0.0, 0.0]
    async with AsyncEnvPool([partial(LatencyEnv, t) for t in lat], backend=backend) as pool:
        td = await pool.reset()
        td["env_index"] = torch.arange(3)
        pool.async_step_send(pool.rand_action(td))
        steps = {0: 0, 1: 0, 2: 0}
        async for out in pool.stream(max_get=1):
            (i,) = out["env_index"].tolist()
            steps[i] += 1
            if steps[i] < 3:
                pool.async_step_send(pool.rand_action(pool.step_mdp(out)))
        assert steps == {0: 3, 1: 3, 2: 3}
        assert await pool.get_attr("steps_taken") == [3, 3, 3]


async def test_latency_envs_fast_before_slow():
    # coroutine backend: async latency envs of very different speeds
    fns = [partial(LatencyEnv, 0.0)] * 4 + [partial(LatencyEnv, 60.0)]
    pool = AsyncEnvPool(fns)
    td = await pool.reset()
    td["env_index"] = torch.arange(5)
    pool.async_step_send(pool.rand_action(td))
    done_fast = 0
    while done_fast < 12:
        out = await pool.async_step_recv()
        assert 4 not in out["env_index"].tolist()
        done_fast += out.batch_size[0]
        pool.async_step_send(pool.rand_action(pool.step_mdp(out)))
    # env 4 is still busy (get_attr waits for no env): read the envs in place
    steps_taken = [pool._backend.getattr_sync(i, "steps_taken") for i in range(5)]
    assert sum(steps_taken[:4]) == 12 and steps_taken[4] == 0
    await pool.aclose()


async def test_fast_envs_stream_past_a_stuck_env_on_every_backend(backend):
    """Env 3 never answers; the three others keep stepping and their results stream in."""
    fns = [partial(CountingEnv, max_steps=1000)] * 3
    fns.append(partial(HangingEnv, hang_after=0, mode="async", max_steps=1000))
    pool = AsyncEnvPool(fns, backend=backend, close_timeout=2.0)
    try:
        td = await pool.reset()
        actions = pool.rand_action(td)
        pool.async_step_send(actions, env_index=[0, 1, 2, 3])
        counts = {0: 0, 1: 0, 2: 0}
        for _ in range(5):
            out = await pool.async_step_recv(min_get=3, max_get=3, timeout=10)
            got = out["env_index"].reshape(-1).tolist()
            assert sorted(got) == [0, 1, 2]
            for i in got:
                counts[i] += 1
            pool.async_step_send(actions[torch.tensor(got)], env_index=got)
        assert counts == {0: 5, 1: 5, 2: 5}
        with pytest.raises(EnvBusyError):
            pool.async_step_send(actions[3], env_index=3)
    finally:
        await pool.aclose()


async def test_a_streaming_loop_of_inline_envs_lets_other_tasks_run():
    # cheap sync envs finish inline, so results are always ready when asked for: the
    # receive must still let the loop run (a heartbeat ticks, the loop is not starved)
    import asyncio

    async with AsyncEnvPool([partial(CountingEnv, max_steps=10**6)] * 4) as pool:
        ticks = 0
        stop = asyncio.Event()

        async def heartbeat() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(heartbeat())
        td = await pool.reset()
        pool.async_step_send(pool.rand_action(td), env_index=list(range(4)))
        for _ in range(200):
            out = await pool.async_step_recv(min_get=1)
            pool.async_step_send(pool.rand_action(pool.step_mdp(out)))
        stop.set()
        await task
        await pool.async_step_recv(min_get=4)
    assert ticks >= 100
