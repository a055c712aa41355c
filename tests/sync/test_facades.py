"""Sync facades: SyncEnv, SerialEnv, rollout; and equivalence across pools and facades."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
import torch

from aenv.pool import AsyncEnvPool
from aenv.sync import ParallelEnv, SerialEnv, SyncEnv, get_runner, rollout
from aenv.testing import CountingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(30)


def test_syncenv_methods_and_attributes():
    with SyncEnv(CountingEnv(max_steps=3)) as env:
        assert env.batch_size == torch.Size([])
        assert env.action_keys == ["action"]
        td = env.reset()
        td = env.rand_step(td)
        assert td["next", "observation"].item() == 1
        stepped, nxt = env.step_and_maybe_reset(env.rand_action(env._step_mdp(td)))
        assert stepped["next", "observation"].item() == 2 and nxt["observation"].item() == 2
        assert env.set_seed(3) == 4 and env.seed == 3
        assert env.rollout(10)["next", "observation"].squeeze(-1).tolist() == [1, 2, 3]
    assert env.env.is_closed


def test_serialenv_batch_attributes_and_partial_reset():
    with SerialEnv(4, CountingEnv, [{"max_steps": 2 + i} for i in range(4)]) as env:
        assert env.batch_size == torch.Size([4]) and env.num_workers == 4
        a, b, c, d = env.max_steps
        assert [a.item(), b.item(), c.item(), d.item()] == [2, 3, 4, 5]
        td = env.reset()
        for _ in range(2):
            td = env._step_mdp(env.rand_step(td))
        td["_reset"] = torch.tensor([[True], [False], [True], [False]])
        out = env.reset(td)
        assert out["observation"].squeeze(-1).tolist() == [0, 2, 0, 2]
        assert "_reset" not in out.keys()
        assert env.call("_set_seed", 9, env_indices=[2]) == [None]
        assert env.seed == [None, None, 9, None]


def test_rollout_function_on_async_and_sync_envs():
    assert rollout(CountingEnv(max_steps=2), 5).batch_size == torch.Size([2])
    with SerialEnv(2, partial(CountingEnv, max_steps=100)) as env:
        td = rollout(env, 4)
        assert td.batch_size == torch.Size([2, 4])


def test_one_runner_hop_per_batched_call(monkeypatch):
    runner = get_runner()
    calls = []
    original = runner.run

    def counting_run(fn, *args, **kwargs):
        calls.append(fn)
        return original(fn, *args, **kwargs)

    monkeypatch.setattr(runner, "run", counting_run)
    env = SerialEnv(8, partial(CountingEnv, max_steps=100))
    calls.clear()
    td = env.reset()
    env.step(env.rand_action(td))
    env.rollout(5, break_when_any_done=False)
    assert len(calls) == 3
    env.close()


def test_sync_facade_inside_running_loop_uses_background_thread():
    async def main():
        with SerialEnv(2, partial(CountingEnv, max_steps=100)) as env:
            return env.rollout(3).batch_size

    assert asyncio.run(main()) == torch.Size([2, 3])


async def _sequential(seed: int, n: int, steps: int) -> torch.Tensor:
    envs = [LatencyEnv(median=1e-4, sigma=1.0) for _ in range(n)]
    out = []
    for i, env in enumerate(envs):
        await env.set_seed(seed + i)
        td = await env.reset()
        lat = []
        for _ in range(steps):
            td = await env.step(td.set("action", torch.zeros(1)))
            lat.append(td["next", "latency"])
            td = env._step_mdp(td)
        out.append(torch.cat(lat))
    return torch.stack(out)


async def _pool_latencies(backend: str, seed: int, n: int, steps: int) -> torch.Tensor:
    async with AsyncEnvPool(
        (n, partial(LatencyEnv, median=1e-4, sigma=1.0)), backend=backend
    ) as pool:
        await pool.set_seed(seed)
        td = await pool.rollout(
            steps, policy=lambda t: t.set("action", torch.zeros(n, 1)), break_when_any_done=False
        )
    return td["next", "latency"].squeeze(-1)


def test_equivalence_across_pools_serial_and_sequential():
    n, steps, seed = 3, 4, 11
    expected = asyncio.run(_sequential(seed, n, steps))
    for backend in ("coroutine", "thread", "process"):
        got = asyncio.run(_pool_latencies(backend, seed, n, steps))
        torch.testing.assert_close(got, expected)
    for facade in (SerialEnv, ParallelEnv):
        with facade(n, partial(LatencyEnv, median=1e-4, sigma=1.0)) as env:
            env.set_seed(seed)
            td = env.rollout(
                steps,
                policy=lambda t: t.set("action", torch.zeros(n, 1)),
                break_when_any_done=False,
            )
        torch.testing.assert_close(td["next", "latency"].squeeze(-1), expected)


def test_check_env_specs_through_the_sync_facade():
    with SerialEnv(2, CountingEnv) as env:
        env.check_env_specs()
    env = SyncEnv(CountingEnv())
    env.check_env_specs(seed=0)
    env.close()
