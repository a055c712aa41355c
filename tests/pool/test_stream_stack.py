"""What a streamed receive returns: the sent inputs stacked with their "next", in the
order results came, whatever the inputs carried."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from aenv.pool import AsyncEnvPool
from aenv.testing import CountingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(30)


def counting_pool(n: int = 4) -> AsyncEnvPool:
    # start values 0, 10, 20...: each env's observation says which env stepped
    return AsyncEnvPool(
        [partial(CountingEnv, max_steps=100, start_val=10 * i) for i in range(n)],
        backend="coroutine",
    )


async def test_inputs_and_next_line_up_by_env_index():
    async with counting_pool() as pool:
        td = pool.rand_action(await pool.reset())
        td["note"] = torch.arange(4, dtype=torch.float32).unsqueeze(-1) * 100
        pool.async_step_send(td[torch.tensor([3, 1, 2])], env_index=[3, 1, 2])
        out = await pool.async_step_recv(min_get=3)
        envs = out["env_index"].tolist()
        assert sorted(envs) == [1, 2, 3]
        # each row: that env's own input (its note, its reset observation) and its step
        assert out["note"].squeeze(-1).tolist() == [100.0 * i for i in envs]
        assert out["observation"].squeeze(-1).tolist() == [10.0 * i for i in envs]
        assert out["next", "observation"].squeeze(-1).tolist() == [10.0 * i + 1 for i in envs]
        assert out["action"].shape == (3, 1)
        assert "next" not in td.keys()  # the caller's batch is left as it was


async def test_input_that_carries_an_old_next_gets_the_new_one():
    # sending a received stack straight back (no step_mdp): its stale "next" is replaced
    async with counting_pool(3) as pool:
        pool.async_step_send(pool.rand_action(await pool.reset()), env_index=[0, 1, 2])
        first = await pool.async_step_recv(min_get=3)
        idx = first["env_index"]
        pool.async_step_send(first.exclude("env_index"), env_index=idx)
        second = await pool.async_step_recv(min_get=3)
        envs = second["env_index"].tolist()
        assert second["next", "observation"].squeeze(-1).tolist() == [10.0 * i + 2 for i in envs]
        assert second["observation"].squeeze(-1).tolist() == [10.0 * i for i in envs]


async def test_thousands_ready_at_once_come_back_in_one_stack():
    n = 2048
    async with AsyncEnvPool(
        [partial(LatencyEnv, latency=0.0, seed=i) for i in range(n)], backend="coroutine"
    ) as pool:
        actions = pool.rand_action(await pool.reset())
        pool.async_step_send(actions, env_index=list(range(n)))
        seen: list[int] = []
        while len(seen) < n:
            out = await pool.async_step_recv(min_get=1)
            seen += out["env_index"].tolist()
            assert out["next", "observation"].shape == (len(out), 4)
            # every env had stepped once: its count, in every entry
            assert bool((out["next", "observation"] == 1.0).all())
            assert torch.equal(out["action"], actions["action"][out["env_index"]])
        assert sorted(seen) == list(range(n))
