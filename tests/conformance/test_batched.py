"""Batched envs (AsyncEnvPool on every backend, SerialEnv, ParallelEnv), as TorchRL's
test_parallel.py, test_nested.py and test_env_base.py check them."""

from __future__ import annotations

import os
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from aenv import GymEnv, acheck_env_specs
from aenv.exceptions import EnvClosedError, PoolError
from aenv.pool import AsyncEnvPool
from aenv.sync import ParallelEnv, SerialEnv, SyncEnv
from aenv.testing import CountingEnv, FailingEnv, NestedCountingEnv
from conformance._envs import MethodEnv, NothingEnv

pytestmark = pytest.mark.timeout(60)


def counting_pool(backend: str, n: int = 3, **kwargs):
    fns = [partial(CountingEnv, max_steps=3 + i) for i in range(n)]
    return AsyncEnvPool(fns, backend=backend, **kwargs)


async def test_batch_size_shape_and_stacked_specs(backend):
    # issue 24 item 3: the pool's shape is its batch size, read without the sub-envs
    async with counting_pool(backend) as pool:
        assert pool.batch_size == pool.shape == torch.Size([3])
        assert pool.observation_spec["observation"].shape == (3, 1)
        assert pool.full_action_spec["action"].shape == (3, 1)
        await acheck_env_specs(pool)


def test_facades_have_a_shape():
    with SerialEnv(2, partial(CountingEnv, batch_size=(4,))) as env:
        assert env.shape == torch.Size([2, 4])


async def test_partial_reset_touches_only_the_flagged_envs(backend):
    async with counting_pool(backend, n=4) as pool:
        td = await pool.reset()
        for _ in range(2):
            td = pool.step_mdp(await pool.rand_step(td))
        td["_reset"] = torch.tensor([[True], [False], [True], [False]])
        out = await pool.reset(td)
        assert "_reset" not in out.keys()
        assert out["observation"].squeeze(-1).tolist() == [0, 2, 0, 2]
        counts = await pool.get_attr("count")
        assert [c.item() for c in counts] == [0, 2, 0, 2]


async def test_partial_step_touches_only_the_flagged_envs(backend):
    async with counting_pool(backend) as pool:
        td = await pool.reset()
        td["_step"] = torch.tensor([True, False, True])
        out = await pool.rand_step(td)
        assert out["next", "observation"].squeeze(-1).tolist() == [1, 0, 1]
        assert [c.item() for c in await pool.get_attr("count")] == [1, 0, 1]


async def test_step_and_maybe_reset_resets_only_done_envs(backend):
    async with counting_pool(backend) as pool:  # max_steps 3, 4, 5
        td = await pool.reset()
        for _ in range(3):
            td, nxt = await pool.step_and_maybe_reset(pool.rand_action(td))
            td = nxt
        assert td["observation"].squeeze(-1).tolist() == [0, 3, 3]


async def test_rollout_without_break_keeps_envs_in_step(backend):
    async with counting_pool(backend) as pool:
        td = await pool.rollout(6, break_when_any_done=False)
        assert td.batch_size == (3, 6)
        assert td["next", "observation"][0].squeeze(-1).tolist() == [1, 2, 3, 1, 2, 3]
        assert td["next", "observation"][2].squeeze(-1).tolist() == [1, 2, 3, 4, 5, 1]


async def test_rollout_breaks_at_the_first_done_env(backend):
    async with counting_pool(backend) as pool:
        td = await pool.rollout(10)
        assert td.batch_size == (3, 3) and td["next", "done"][:, -1].squeeze(-1).tolist() == [
            True,
            False,
            False,
        ]


async def test_seeds_are_distinct_per_env_and_reproducible(backend):
    pool = AsyncEnvPool((3, partial(GymEnv, "Pendulum-v1")), backend=backend)
    async with pool:
        assert await pool.set_seed(7) == 10
        torch.manual_seed(0)
        first = await pool.rollout(3)
        assert len({tuple(r) for r in first["observation"][:, 0].tolist()}) == 3
        await pool.set_seed(7)
        torch.manual_seed(0)
        torch.testing.assert_close(first, await pool.rollout(3))


def test_serial_env_equals_single_envs_with_the_same_seeds():
    singles = []
    for seed in (3, 4):
        env = SyncEnv(GymEnv("Pendulum-v1"))
        env.set_seed(seed)
        torch.manual_seed(0)
        singles.append(env.rollout(4, lambda td: td.set("action", torch.zeros(td.shape + (1,)))))
        env.close()
    with SerialEnv(2, partial(GymEnv, "Pendulum-v1")) as env:
        env.set_seed(3)
        out = env.rollout(4, lambda td: td.set("action", torch.zeros(td.shape + (1,))))
    for i in range(2):
        torch.testing.assert_close(out["next", "observation"][i], singles[i]["next", "observation"])


def test_create_env_kwargs_per_env():
    kwargs = [{"max_steps": 2}, {"max_steps": 5}]
    with SerialEnv(2, CountingEnv, kwargs) as env:
        assert [m.item() for m in env.max_steps] == [2, 5]
        td = env.rollout(10, break_when_any_done=False)
        assert td["next", "done"][0].sum() == 5 and td["next", "done"][1].sum() == 2


@pytest.mark.timeout(90)
def test_parallel_env_custom_method_and_attributes():
    # issue 24 item 7: a method read gives a callable that runs in every worker
    with ParallelEnv(3, MethodEnv, num_processes=2) as env:
        assert env.custom_fun() == [0, 0, 0]
        assert env.calls == [1, 1, 1]  # the calls reached the envs in the workers
        assert env.custom_prop == [2, 2, 2]
        pids = set(env.where())
        assert pids == set(env.worker_pids) and os.getpid() not in pids
        with pytest.raises(AttributeError):
            env.no_such_thing  # noqa: B018


def test_serial_env_custom_method():
    with SerialEnv(2, MethodEnv) as env:
        assert env.custom_fun() == [0, 0]
        assert env.calls == [1, 1]


async def test_async_process_pool_reads_sub_envs_only_when_awaited():
    # issue 16: no I/O behind a plain attribute read on the async pool
    async with AsyncEnvPool((2, MethodEnv), backend="process") as pool:
        with pytest.raises(AttributeError, match="get_attr"):
            pool.calls  # noqa: B018
        assert await pool.call("custom_fun") == [0, 0]
        assert await pool.get_attr("calls") == [1, 1]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("facade", ["serial", "parallel"])
def test_env_with_no_entries_runs_batched(facade):
    # issue 24 item 8: nothing to copy through shared memory
    cls = SerialEnv if facade == "serial" else ParallelEnv
    with cls(2, NothingEnv) as env:
        env.check_env_specs()
        td = env.rollout(3)
        assert td.batch_size == (2, 3)
        rest = td.exclude("done", "terminated", ("next", "done"), ("next", "terminated"))
        assert set(rest.keys(True, True)) == {("next", "reward")}


async def test_nested_sub_batched_envs(backend):
    pool = AsyncEnvPool(
        (2, partial(NestedCountingEnv, max_steps=2, batch_size=(3,))), backend=backend
    )
    async with pool:
        assert pool.batch_size == (2, 3)
        td = await pool.rollout(4, break_when_any_done=False)
        assert td["next", "agents", "observation"].shape == (2, 3, 4, 2, 1)
        await acheck_env_specs(pool)


async def test_nested_partial_reset_at_the_agent_level(backend):
    pool = AsyncEnvPool((2, partial(NestedCountingEnv, max_steps=5)), backend=backend)
    async with pool:
        td = await pool.reset()
        for _ in range(2):
            td = pool.step_mdp(await pool.rand_step(td))
        td["_reset"] = torch.tensor([[True], [False]])
        out = await pool.reset(td)
        obs = out["agents", "observation"].squeeze(-1)
        assert obs[0].tolist() == [0, 0] and obs[1].tolist() == [2, 2]


async def test_closed_pool_refuses_work(backend):
    pool = counting_pool(backend)
    td = await pool.reset()
    await pool.aclose()
    assert pool.is_closed
    with pytest.raises(EnvClosedError):
        await pool.step(pool.rand_action(td))


async def test_failing_sub_env_is_that_envs_error(backend):
    # aenv differs on purpose: a pool reports every failed env in one PoolError and keeps
    # the others' results (TorchRL's batched envs raise the first error)
    fns = [partial(CountingEnv, max_steps=10), partial(FailingEnv, fail_after=1)]
    async with AsyncEnvPool(fns, backend=backend) as pool:
        td = pool.step_mdp(await pool.rand_step(await pool.reset()))
        with pytest.raises(PoolError) as info:
            await pool.rand_step(td)
        assert set(info.value.errors) == {1} and set(info.value.results) == {0}


async def test_auto_reset_with_a_reset_input_on_batched_rollouts():
    # a partial reset input to reset(): only flagged envs are touched (TorchRL's
    # test_parallel_env_reset_flag)
    async with counting_pool("coroutine", n=2) as pool:
        td = await pool.reset()
        td = pool.step_mdp(await pool.rand_step(td))
        reset = TensorDict({"_reset": torch.tensor([[False], [True]])}, [2])
        out = await pool.reset(reset.update(td))
        assert out["observation"].squeeze(-1).tolist() == [1, 0]


async def test_recv_with_max_get_below_min_get_waits_and_keeps_the_rest():
    # aenv differs on purpose (a smaller difference of issue 24): min_get says how many
    # results to wait for and max_get how many to take; the others stay for the next recv
    async with counting_pool("coroutine") as pool:
        td = await pool.reset()
        td["env_index"] = torch.arange(3)
        pool.async_step_send(pool.rand_action(td))
        first = await pool.async_step_recv(min_get=2, max_get=1)
        assert first.batch_size == (1,)
        rest = await pool.async_step_recv(min_get=2)
        got = first["env_index"].tolist() + rest["env_index"].tolist()
        assert sorted(got) == [0, 1, 2]
