"""Heterogeneous (lazy-stacked) and dynamic-spec envs, as TorchRL's test_nested.py
(TestHeteroEnvs) and test_auto_reset.py (TestEnvWithDynamicSpec) check them, and the
seeds' heterogeneous pool: Pendulum and CartPole in one lazy pool on every backend."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import LazyStackedTensorDict

from aenv import GymEnv, step_mdp
from aenv.exceptions import SpecError, SpecViolationError
from aenv.pool import AsyncEnvPool
from aenv.sync import ParallelEnv, SerialEnv, SyncEnv
from aenv.testing import DynamicSpecEnv
from conformance._envs import HeteroAgentsEnv, WidthEnv

pytestmark = pytest.mark.timeout(60)


def widths_pool(backend: str, **kwargs) -> AsyncEnvPool:
    """Sub-envs whose actions and observations have widths 3 and 2 (issue 24 item 10)."""
    fns = [partial(WidthEnv, 3), partial(WidthEnv, 2, discrete=True)]
    return AsyncEnvPool(fns, backend=backend, stack="lazy", **kwargs)


async def test_rand_action_fits_each_env_and_steps(backend):
    async with widths_pool(backend) as pool:
        td = await pool.reset()
        assert isinstance(td, LazyStackedTensorDict)
        for action in (pool.rand_action(td), pool.rand_action()):
            assert isinstance(action, LazyStackedTensorDict)
            for i, sub in enumerate(action.tensordicts):
                assert pool.full_action_spec[i]["action"].is_in(sub["action"])
        out = await pool.step(pool.rand_action(td))
        obs = [t["next", "observation"] for t in out.tensordicts]
        assert [o.shape for o in obs] == [(3,), (2,)]
        assert obs[1].dtype == torch.float32 and (obs[1] == obs[1].round()).all()


async def test_an_action_drawn_from_the_stacked_spec_is_accepted(backend):
    async with widths_pool(backend) as pool:
        td = await pool.reset()
        action = pool.full_action_spec.rand()
        for i in range(2):
            td.tensordicts[i]["action"] = action[i]["action"]
        out = await pool.step(td)
        assert out.tensordicts[0]["next", "observation"].shape == (3,)


async def test_rollout_of_many_steps_and_step_and_maybe_reset(backend):
    async with widths_pool(backend) as pool:
        td = await pool.rollout(6, break_when_any_done=False)
        assert td.batch_size == (2, 6)
        # each env's observation adds its own actions up; WidthEnv is done after 4 steps
        first = td[0]
        torch.testing.assert_close(first["next", "observation"][:4], first["action"][:4].cumsum(0))
        _, nxt = await pool.step_and_maybe_reset(pool.rand_action(await pool.reset()))
        assert nxt.tensordicts[1]["observation"].shape == (2,)


async def test_bad_element_action_names_the_element(backend):
    async with widths_pool(backend) as pool:
        td = pool.rand_action(await pool.reset())
        td.tensordicts[1]["action"] = torch.full((2,), 0.5)
        with pytest.raises(SpecViolationError, match=r"does not fit dtype torch\.int64"):
            await pool.step(td)
        td.tensordicts[1]["action"] = torch.zeros(3, dtype=torch.int64)
        with pytest.raises(SpecViolationError, match="element 1 has shape"):
            await pool.step(td)


async def test_heterogeneous_envs_need_a_lazy_stack():
    with pytest.raises(SpecError, match="stack='lazy'"):
        AsyncEnvPool([partial(WidthEnv, 3), partial(WidthEnv, 2)])


@pytest.mark.timeout(120)
async def test_seeds_pendulum_and_cartpole_pool(backend):
    # issue 20's example, on every backend: reset, rand_step, step, streaming, rollout
    pool = AsyncEnvPool(
        [lambda: GymEnv("Pendulum-v1"), lambda: GymEnv("CartPole-v1")],
        stack="lazy",
        backend=backend,
    )
    async with pool:
        td = await pool.reset()
        assert [t["observation"].shape for t in td.tensordicts] == [(3,), (4,)]
        td = await pool.rand_step(td)
        td = await pool.step(pool.rand_action(pool.step_mdp(td)))
        assert td.tensordicts[1]["action"].shape == (2,)
        pool.async_step_send(pool.rand_action(pool.step_mdp(td)), env_index=[0, 1])
        seen, sent = [], 1
        async for out in pool.stream():
            seen += out["env_index"].tolist()
            if sent < 4:
                sent += 1
                pool.async_step_send(pool.rand_action(pool.step_mdp(out)))
        assert sorted(set(seen)) == [0, 1]
        rollout = await pool.rollout(20, break_when_any_done=False)
        assert rollout.batch_size == (2, 20)
        assert rollout.tensordicts[1]["observation"].shape == (20, 4)


def dynamic_fns() -> list:
    return [partial(DynamicSpecEnv, max_count=i + 4) for i in range(3)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("break_when_any_done", [False, True], ids=["reset", "break"])
@pytest.mark.parametrize(
    "facade, stack",
    [("serial", "lazy"), ("serial", "dense"), ("parallel", "dense")],
)
def test_batched_dynamic_specs_match_single_envs(facade, stack, break_when_any_done):
    # TorchRL's test_batched_dynamic (use_buffers=False): each env's steps as if alone
    singles = []
    for fn in dynamic_fns():
        with SyncEnv(fn()) as env:
            singles.append(
                env.rollout(7, return_contiguous=False, break_when_any_done=break_when_any_done)
            )
    steps = min(r.shape[0] for r in singles)
    cls = SerialEnv if facade == "serial" else ParallelEnv
    with cls(3, dynamic_fns(), stack=stack) as env:
        td = env.rollout(7, return_contiguous=False, break_when_any_done=break_when_any_done)
        assert isinstance(td, LazyStackedTensorDict) and td.shape == (3, steps)
        for i in range(3):
            for t in range(steps):
                got, want = td[i, t], singles[i][t]
                assert torch.equal(got["next", "observation"], want["next", "observation"])
                assert torch.equal(got["observation"], want["observation"])
        # reset, rand_step, step and step_and_maybe_reset take the growing shapes too
        state = env.reset()
        state = env.step_mdp(env.rand_step(state))
        stepped = env.step(env.rand_action(state))
        assert stepped[0]["next", "observation"].shape == (3, 3, 2)
        _, nxt = env.step_and_maybe_reset(env.rand_action(env.step_mdp(stepped)))
        assert nxt[0]["observation"].shape == (3, 4, 2)


def _agents_run(env) -> None:
    """reset, rand_step, step, step_and_maybe_reset and rollout of HeteroAgentsEnv(s)."""
    td = env.reset()
    agents = td[(0,) * len(env.batch_size)]["agents"]
    assert [agents[i]["observation"].shape for i in range(2)] == [(3,), (2,)]
    td = env.rand_step(td)
    td = env.step(env.rand_action(step_mdp(td)))
    _, nxt = env.step_and_maybe_reset(env.rand_action(step_mdp(td)))
    assert nxt.batch_size == env.batch_size
    rollout = env.rollout(5, break_when_any_done=False, return_contiguous=False)
    assert rollout.batch_size == (*env.batch_size, 5)
    env.check_env_specs(return_contiguous=False)
    # each agent's observation adds its own actions up (HeteroAgentsEnv: done after 3)
    first = rollout[(0,) * len(env.batch_size)]
    for agent, width in enumerate((3, 2)):
        actions = torch.stack([first[t]["agents"][agent]["action"] for t in range(3)])
        observed = torch.stack([first[t]["next", "agents"][agent]["observation"] for t in range(3)])
        assert observed.shape == (3, width)
        torch.testing.assert_close(observed, actions.cumsum(0))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("where", ["alone", "serial", "parallel"])
def test_heterogeneous_agents_env_alone_and_batched(where):
    # TorchRL's TestHeteroEnvs: agents whose entries differ in shape, lazy-stacked
    if where == "alone":
        env = SyncEnv(HeteroAgentsEnv())
    elif where == "serial":
        env = SerialEnv(2, HeteroAgentsEnv, stack="lazy")
    else:
        env = ParallelEnv(2, HeteroAgentsEnv, stack="lazy")
    with env:
        _agents_run(env)


def test_pool_of_envs_with_heterogeneous_insides_needs_a_lazy_stack():
    # aenv differs on purpose: TorchRL's batched envs pick lazy stacking themselves; an
    # aenv pool says which it does (stack="lazy"), and a dense one says why it cannot
    with pytest.raises(SpecError, match="stack='lazy'"):
        SerialEnv(2, HeteroAgentsEnv)
