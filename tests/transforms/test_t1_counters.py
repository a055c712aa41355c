"""StepCounter, RewardSum, InitTracker: values, specs, truncation and partial resets."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from aenv import PendulumEnv, acheck_env_specs
from aenv.libs.gym import GymEnv
from aenv.testing import CountingEnv, NestedCountingEnv
from aenv.transforms import Compose, InitTracker, RewardSum, StepCounter, TransformedEnv


async def test_step_counter_truncates_pendulum():
    env = TransformedEnv(PendulumEnv(), StepCounter(max_steps=5))
    assert "truncated" in env.full_done_spec.keys()
    r = await env.rollout(100)
    assert r.batch_size == (5,)
    assert r["next", "step_count"].squeeze(-1).tolist() == [1, 2, 3, 4, 5]
    assert r["next", "truncated"].squeeze(-1).tolist() == [False] * 4 + [True]
    assert r["next", "done"][-1].item() and not r["next", "terminated"][-1].item()
    await acheck_env_specs(env)


async def test_step_counter_on_cartpole_and_partial_reset():
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=3))
    r = await env.rollout(10, break_when_any_done=False)
    counts = r["next", "step_count"].squeeze(-1).tolist()
    assert counts[:3] == [1, 2, 3] and counts[3] == 1  # truncated then reset
    await acheck_env_specs(env)
    batched = TransformedEnv(CountingEnv(max_steps=10, batch_size=(3,)), StepCounter())
    td = await batched.reset()
    for _ in range(2):
        td = batched._step_mdp(await batched.rand_step(td))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    td = await batched.reset(td)
    assert td["step_count"].squeeze(-1).tolist() == [2, 0, 2]
    assert "_reset" not in td.keys()


async def test_reward_sum_partial_reset_and_nested():
    env = TransformedEnv(CountingEnv(max_steps=10, batch_size=(2,)), RewardSum())
    td = await env.reset()
    for _ in range(3):
        td = env._step_mdp(await env.rand_step(td))
    assert td["episode_reward"].squeeze(-1).tolist() == [3.0, 3.0]
    td["_reset"] = torch.tensor([[True], [False]])
    td = await env.reset(td)
    assert td["episode_reward"].squeeze(-1).tolist() == [0.0, 3.0]
    await acheck_env_specs(env)
    nested = TransformedEnv(NestedCountingEnv(max_steps=4, batch_size=(2,)), RewardSum())
    assert ("agents", "episode_reward") in nested.observation_spec.keys(True, True)
    r = await nested.rollout(3)
    assert r["next", "agents", "episode_reward"][0, :, 0, 0].tolist() == [1.0, 2.0, 3.0]
    await acheck_env_specs(nested)


async def test_init_tracker():
    env = TransformedEnv(CountingEnv(max_steps=2, batch_size=(2,)), InitTracker())
    r = await env.rollout(4, break_when_any_done=False)
    assert r["is_init"][0].squeeze(-1).tolist() == [True, False, True, False]
    assert not r["next", "is_init"].any()
    await acheck_env_specs(env)
    td = await env.reset()
    td = env._step_mdp(await env.rand_step(td))
    td["_reset"] = torch.tensor([[False], [True]])
    td = await env.reset(td)
    assert td["is_init"].squeeze(-1).tolist() == [False, True]


async def test_counters_batch_unlocked():
    env = TransformedEnv(PendulumEnv(), Compose(StepCounter(3), RewardSum(), InitTracker()))
    td = await env.reset(TensorDict({}, [4]))
    r = await env.rollout(5, tensordict=td, auto_reset=False)
    assert r.batch_size == (4, 3)
    assert torch.allclose(r["next", "episode_reward"][:, -1], r["next", "reward"].sum(1))
    await acheck_env_specs(env, tensordict=TensorDict({}, [4]))
