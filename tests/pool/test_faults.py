"""Faults and time: raising envs, deadlines, restarts, concurrency caps, cancellation, closing."""

from __future__ import annotations

import asyncio
import threading
from functools import partial

import pytest
import torch

from aenv import EnvStepError, PoolError, StepTimeoutError
from aenv.pool import AsyncEnvPool
from aenv.testing import CountingEnv, FailingEnv, HangingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(30)


def failing_pool(backend: str, **kw) -> AsyncEnvPool:
    fns = [partial(CountingEnv, max_steps=100), partial(FailingEnv, fail_after=1, message="kaboom")]
    fns.append(partial(CountingEnv, max_steps=100))
    return AsyncEnvPool(fns, backend=backend, **kw)


async def test_raising_env_gives_typed_error_and_keeps_others(backend):
    async with failing_pool(backend) as pool:
        td = await pool.reset()
        td = pool.step_mdp(await pool.rand_step(td))
        with pytest.raises(PoolError) as info:
            await pool.rand_step(td)
        err = info.value.errors[1]
        assert isinstance(err, EnvStepError) and err.env_index == 1
        assert err.remote_type == "RuntimeError" and "kaboom" in err.remote_traceback
        assert "_step" in err.remote_traceback  # the env's own frame is in the traceback
        assert sorted(info.value.results) == [0, 2]
        assert info.value.results[0]["observation"].item() == 2
        # the pool is still usable: reset and step the healthy envs
        td = await pool.reset()
        td["_step"] = torch.tensor([True, False, True])
        out = await pool.rand_step(td)
        assert out["next", "observation"].squeeze(-1).tolist() == [1, 0, 1]


async def test_streamed_failure_raised_by_recv_nothing_lost(backend):
    async with failing_pool(backend) as pool:
        td = await pool.reset()
        td = pool.step_mdp(await pool.rand_step(td))
        td["env_index"] = torch.arange(3)
        pool.async_step_send(pool.rand_action(td))
        got = []
        with pytest.raises(EnvStepError) as info:
            while len(got) < 3:
                out = await pool.async_step_recv(min_get=1)
                got.extend(out["env_index"].tolist())
        assert info.value.env_index == 1
        while len(got) < 2:
            got.extend((await pool.async_step_recv())["env_index"].tolist())
        assert sorted(got) == [0, 2]


async def test_restart_policy_reports_truncated(backend):
    async with failing_pool(backend, on_error="restart") as pool:
        pool.add_truncated_keys()
        td = await pool.reset()
        td = pool.step_mdp(await pool.rand_step(td))
        out = await pool.rand_step(td)
        nxt = out["next"]
        assert nxt["truncated"].squeeze(-1).tolist() == [False, True, False]
        assert nxt["done"].squeeze(-1).tolist() == [False, True, False]
        assert nxt["terminated"].squeeze(-1).tolist() == [False, False, False]
        assert nxt["observation"].squeeze(-1).tolist() == [2, 0, 2]  # env 1: fresh reset
        assert isinstance(pool.last_errors[1], EnvStepError)
        assert "kaboom" in str(pool.last_errors[1])
        assert (await pool.get_attr("total_steps", env_indices=[1])) == [0]  # a rebuilt env


async def test_step_timeout_abandons_and_goes_on(backend):
    fns = [partial(CountingEnv, max_steps=100), partial(HangingEnv, hang_after=1, mode="async")]
    async with AsyncEnvPool(fns, backend=backend, step_timeout=0.2) as pool:
        td = await pool.reset()
        td = pool.step_mdp(await pool.rand_step(td))
        with pytest.raises(PoolError) as info:
            await pool.rand_step(td)
        err = info.value.errors[1]
        assert isinstance(err, StepTimeoutError) and err.env_index == 1
        assert info.value.results[0]["observation"].item() == 2
        # env 1 was rebuilt; the pool goes on
        td = await pool.reset()
        out = await pool.rand_step(td)
        assert out["next", "observation"].squeeze(-1).tolist() == [1, 1]


async def test_blocking_hang_times_out_on_thread_backend():
    fns = [partial(CountingEnv, max_steps=100), partial(HangingEnv, hang_after=0, mode="sync")]
    pool = AsyncEnvPool(fns, backend="thread", step_timeout=0.2)
    td = await pool.reset()
    stuck = pool._backend.getattr_sync(1, "release")  # the env about to be abandoned
    with pytest.raises(PoolError) as info:
        await pool.rand_step(td)
    assert isinstance(info.value.errors[1], StepTimeoutError)
    stuck()  # let the abandoned thread end
    await pool.aclose()


async def test_max_concurrency_caps_envs_at_work(in_process_backend):
    backend = in_process_backend
    n, cap = 6, 2
    async with AsyncEnvPool(
        (n, partial(LatencyEnv, 0.01)), backend=backend, max_concurrency=cap
    ) as pool:
        peak = 0
        running = 0
        lock = threading.Lock()
        original = LatencyEnv._step

        async def spy(self, td):
            nonlocal peak, running
            with lock:
                running += 1
                peak = max(peak, running)
            try:
                return await original(self, td)
            finally:
                with lock:
                    running -= 1

        LatencyEnv._step = spy  # type: ignore[method-assign]
        try:
            td = await pool.reset()
            out = await pool.rand_step(td)
        finally:
            LatencyEnv._step = original  # type: ignore[method-assign]
        assert out["next", "observation"][:, 0].tolist() == [1.0] * n
        assert 1 <= peak <= cap


async def _until_waiting(task: asyncio.Future) -> None:
    """Let ``task`` run up to its first real wait (sends happen before it), without guessing
    a duration: a few loop turns, then it must be pending."""
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()


async def test_cancelled_call_leaves_pool_usable(backend):
    fns = [partial(LatencyEnv, 0.0), partial(LatencyEnv, 0.3)]
    async with AsyncEnvPool(fns, backend=backend) as pool:
        td = await pool.reset()
        task = asyncio.ensure_future(pool.rand_step(td.clone()))
        await _until_waiting(task)  # both envs' steps are sent; env 1 takes 0.3 s
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        out = await pool.rand_step(td)
        assert out["next", "observation"].shape == torch.Size([2, 4])
        td["env_index"] = torch.arange(2)
        pool.async_step_send(pool.rand_action(td))
        assert (await pool.async_step_recv(min_get=2)).batch_size == torch.Size([2])


async def test_aclose_leaves_no_thread_or_task(backend):
    threads_before = set(threading.enumerate())
    tasks_before = asyncio.all_tasks()
    fns = [partial(LatencyEnv, 0.0), partial(LatencyEnv, 30.0), partial(LatencyEnv, 60.0)]
    pool = AsyncEnvPool(fns, backend=backend)
    td = await pool.reset()
    td["env_index"] = torch.arange(3)
    pool.async_step_send(pool.rand_action(td))
    await pool.async_step_recv()
    await pool.aclose()
    assert pool.is_closed
    assert set(threading.enumerate()) - threads_before == set()
    assert {t for t in asyncio.all_tasks() if not t.done()} - tasks_before == set()


async def test_recv_waiting_when_closed_raises(backend):
    pool = AsyncEnvPool([partial(LatencyEnv, 30.0)], backend=backend)
    td = await pool.reset()
    td["env_index"] = torch.arange(1)
    pool.async_step_send(pool.rand_action(td))
    waiter = asyncio.ensure_future(pool.async_step_recv())
    await _until_waiting(waiter)
    await pool.aclose()
    with pytest.raises(Exception, match="closed"):
        await waiter


async def test_the_thread_backend_keeps_no_replaced_env():
    # on_error="restart" rebuilds the failing env each step: the replaced envs (and their
    # threads) are released once their threads exit, not kept until the pool closes
    import gc
    import time
    import weakref

    async with AsyncEnvPool(
        [partial(FailingEnv, fail_after=0, message="kaboom")], backend="thread", on_error="restart"
    ) as pool:
        backend = pool._backend
        refs = []
        td = await pool.reset()
        for _ in range(20):
            refs.append(weakref.ref(backend._workers[0]))
            _, td = await pool.step_and_maybe_reset(pool.rand_action(td))
        deadline = time.monotonic() + 30
        while backend._retired and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # (bounded wait for the old threads to exit)
        assert backend._retired == []
        gc.collect()
        assert sum(r() is not None for r in refs[:-1]) == 0
