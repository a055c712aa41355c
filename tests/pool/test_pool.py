"""AsyncEnvPool whole-batch API, on every backend."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import LazyStackedTensorDict

from aenv import BatchSizeError, PendulumEnv, SpecError, acheck_env_specs
from aenv.pool import AsyncEnvPool, CoroutineAsyncEnvPool, ThreadingAsyncEnvPool
from aenv.testing import CountingEnv, LatencyEnv, NestedCountingEnv

pytestmark = pytest.mark.timeout(30)


def counting_pool(backend: str, n: int = 3, **kw):
    return AsyncEnvPool(
        [partial(CountingEnv, max_steps=3 + i) for i in range(n)], backend=backend, **kw
    )


async def test_batch_size_specs_and_check(backend):
    async with counting_pool(backend) as pool:
        assert pool.batch_size == torch.Size([3])
        assert pool.observation_spec["observation"].shape == torch.Size([3, 1])
        await acheck_env_specs(pool)


async def test_backend_classes_and_names():
    pool = AsyncEnvPool((2, CountingEnv), backend="threading")
    assert type(pool) is ThreadingAsyncEnvPool and pool.backend == "thread"
    await pool.aclose()
    pool = AsyncEnvPool((2, CountingEnv))
    assert type(pool) is CoroutineAsyncEnvPool
    await pool.aclose()
    with pytest.raises(ValueError, match="unknown pool backend"):
        AsyncEnvPool((2, CountingEnv), backend="nope")


async def test_step_and_rollout_values(backend):
    async with counting_pool(backend) as pool:
        td = await pool.rollout(6, break_when_any_done=False)
        assert td.batch_size == torch.Size([3, 6])
        obs = td["next", "observation"].squeeze(-1)
        assert obs[0].tolist() == [1, 2, 3, 1, 2, 3]
        assert obs[2].tolist() == [1, 2, 3, 4, 5, 1]
        assert td["next", "done"].squeeze(-1)[1].tolist() == [
            False,
            False,
            False,
            True,
            False,
            False,
        ]


async def test_rollout_break_when_any_done(backend):
    async with counting_pool(backend) as pool:
        td = await pool.rollout(10)
        assert td.batch_size == torch.Size([3, 3])


async def test_partial_reset_touches_only_selected(backend):
    async with counting_pool(backend, n=4) as pool:
        td = await pool.reset()
        for _ in range(2):
            td = pool.step_mdp(await pool.rand_step(td))
        td["_reset"] = torch.tensor([[True], [False], [True], [False]])
        out = await pool.reset(td)
        assert "_reset" not in out.keys()
        assert out["observation"].squeeze(-1).tolist() == [0, 2, 0, 2]
        counts = [c.item() for c in await pool.get_attr("count")]
        assert counts == [0, 2, 0, 2]


async def test_partial_step_touches_only_selected(backend):
    async with counting_pool(backend, n=3) as pool:
        td = await pool.reset()
        td["_step"] = torch.tensor([True, False, True])
        out = await pool.rand_step(td)
        assert out["next", "observation"].squeeze(-1).tolist() == [1, 0, 1]
        assert out["next", "reward"].squeeze(-1).tolist() == [1, 0, 1]
        assert [c.item() for c in await pool.get_attr("count")] == [1, 0, 1]


async def test_nested_sub_batched_envs(backend):
    pool = AsyncEnvPool(
        (2, partial(NestedCountingEnv, max_steps=2, batch_size=(3,))), backend=backend
    )
    async with pool:
        assert pool.batch_size == torch.Size([2, 3])
        td = await pool.rollout(4, break_when_any_done=False)
        assert td["next", "agents", "observation"].shape == torch.Size([2, 3, 4, 2, 1])
        await acheck_env_specs(pool)


async def test_set_seed_distinct_and_reproducible(backend):
    async with AsyncEnvPool(
        (3, partial(LatencyEnv, median=0.0001, sigma=1.0)), backend=backend
    ) as pool:
        assert await pool.set_seed(7) == 10
        td = await pool.rollout(3, break_when_any_done=False)
        lat = td["next", "latency"].squeeze(-1)
        assert len({tuple(row.tolist()) for row in lat}) == 3  # distinct seeds
        await pool.set_seed(7)
        again = (await pool.rollout(3, break_when_any_done=False))["next", "latency"].squeeze(-1)
        torch.testing.assert_close(lat, again)
        assert await pool.set_seed(5, static_seed=True) == 5


async def test_attributes_and_calls(backend):
    async with counting_pool(backend) as pool:
        a, b, c = await pool.get_attr("max_steps")
        assert [a.item(), b.item(), c.item()] == [3, 4, 5]
        assert await pool.get_attr("start_val") == [0, 0, 0]
        seeds = await pool.call("_set_seed", 4, env_indices=[1])
        assert seeds == [None]
        assert await pool.get_attr("seed") == [None, 4, None]
        if backend in ("process", "ray"):  # no I/O behind a plain read
            with pytest.raises(AttributeError, match="get_attr"):
                pool.seed  # noqa: B018
        else:  # sub-envs in this process: read in place
            assert pool.seed == [None, 4, None]
        with pytest.raises(AttributeError):
            pool.no_such_attribute  # noqa: B018


async def test_heterogeneous_needs_lazy(backend):
    fns = [partial(PendulumEnv, seed=0), partial(CountingEnv, 5)]
    with pytest.raises(SpecError, match="stack='lazy'"):
        AsyncEnvPool(fns, backend=backend)
    async with AsyncEnvPool(fns, backend=backend, stack="lazy") as pool:
        # the seeds' example, with await added
        reset = await pool.reset()
        assert isinstance(reset, LazyStackedTensorDict)
        s = await pool.rand_step(reset)
        s0 = s[0]
        s0["action"] = torch.randn(1).clamp(-1, 1)
        s0["env_index"] = 0
        pool.async_step_send(s0)
        s0_result = await pool.async_step_recv()
        assert s0_result["env_index"].tolist() == [0]
        assert "th" in s0_result["next"].keys()
        await pool.aclose()


async def test_wrong_batch_shape(backend):
    async with counting_pool(backend) as pool:
        td = await pool.reset()
        with pytest.raises(BatchSizeError):
            await pool.step(pool.rand_action(td)[:2])


async def test_step_and_maybe_reset_resets_done_envs(backend):
    async with counting_pool(backend, n=2) as pool:
        td = await pool.reset()
        for _ in range(3):
            stepped, td = await pool.step_and_maybe_reset(pool.rand_action(td))
        assert stepped["next", "done"].squeeze(-1).tolist() == [True, False]
        assert td["observation"].squeeze(-1).tolist() == [0, 3]
        assert td["done"].squeeze(-1).tolist() == [False, False]


@pytest.mark.parametrize("backend", ["coroutine", "thread"])
async def test_a_sub_env_gets_what_a_bare_env_gets(backend):
    # the README's RemoteToolEnv reads td["obs"] in _step: a whole-batch call must hand
    # each sub-env its observation, not only its action (in-process backends)
    import asyncio as _asyncio

    from tensordict import TensorDict as _TD

    from aenv import Composite, EnvBase, Unbounded

    class ReadsObs(EnvBase):
        def __init__(self):
            super().__init__()
            self.observation_spec = Composite(obs=Unbounded((1,)))
            self.action_spec = Unbounded((1,))

        def _set_seed(self, seed):
            pass

        async def _reset(self, td, **kwargs):
            return _TD(obs=torch.zeros(1))

        async def _step(self, td):
            await _asyncio.sleep(0)
            return _TD(obs=td["obs"] + td["action"], reward=torch.ones(1))

    async with AsyncEnvPool([ReadsObs] * 3, backend=backend) as pool:
        td = await pool.reset()
        td["action"] = torch.ones(3, 1)
        out = await pool.step(td)
        assert out["next", "obs"].squeeze(-1).tolist() == [1, 1, 1]
        r = await pool.rollout(4)
        assert r["next", "obs"][:, -1].squeeze(-1).tolist() == [
            float(v) for v in r["action"].sum(1).squeeze(-1).tolist()
        ]
