"""FrameSkipTransform and NoopResetEnv: transforms that step the env behind them."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import aenv
from aenv.testing import CountingEnv
from aenv.transforms import FrameSkipTransform, NoopResetEnv, TrajCounter, TransformedEnv


async def test_frame_skip_sums_rewards():
    env = TransformedEnv(CountingEnv(max_steps=10), FrameSkipTransform(3))
    td = await env.rand_step(await env.reset())
    assert td["next", "observation"].item() == 3.0
    assert td["next", "reward"].item() == 3.0
    r = await env.rollout(10)
    # 10 steps: 3, 6, 9, then done at 10 after one frame
    assert r["next", "observation"].squeeze(-1).tolist() == [3.0, 6.0, 9.0, 10.0]
    assert r["next", "reward"].squeeze(-1).tolist() == [3.0, 3.0, 3.0, 1.0]
    await aenv.acheck_env_specs(env)


async def test_frame_skip_batched_stops_done_elements():
    env = TransformedEnv(CountingEnv(max_steps=[2, 10], batch_size=(2,)), FrameSkipTransform(4))
    td = await env.rand_step(await env.reset())
    assert td["next", "observation"].squeeze(-1).tolist() == [2.0, 4.0]
    assert td["next", "reward"].squeeze(-1).tolist() == [2.0, 4.0]
    assert td["next", "done"].squeeze(-1).tolist() == [True, False]


async def test_frame_skip_stateless_env():
    # PendulumEnv keeps no state: each repeat must start from the previous repeat's output
    base = aenv.PendulumEnv(seed=0)
    td0 = await base.reset()
    td0["action"] = torch.full((1,), 0.5)
    manual = td0.clone()
    total = torch.zeros(1)
    for _ in range(3):
        manual = await base.step(manual)
        total = total + manual["next", "reward"]
        manual = base._step_mdp(manual)
        manual["action"] = torch.full((1,), 0.5)
    env = TransformedEnv(aenv.PendulumEnv(), FrameSkipTransform(3))
    td = await env.step(td0.clone())
    torch.testing.assert_close(td["next", "th"], manual["th"])
    torch.testing.assert_close(td["next", "reward"], total)


async def test_frame_skip_needs_parent_and_positive():
    with pytest.raises(ValueError):
        FrameSkipTransform(0)


async def test_noop_reset_fixed_count():
    env = TransformedEnv(CountingEnv(max_steps=100), NoopResetEnv(3, random=False))
    td = await env.reset()
    assert td["observation"].item() == 3.0
    assert not td["done"].any()
    assert "reward" not in td.keys() and "action" not in td.keys()
    await aenv.acheck_env_specs(env)


async def test_noop_reset_random_count_in_range():
    torch.manual_seed(0)
    env = TransformedEnv(CountingEnv(max_steps=100), NoopResetEnv(4))
    counts = {(await env.reset())["observation"].item() for _ in range(30)}
    assert counts <= {1.0, 2.0, 3.0, 4.0} and len(counts) > 1


async def test_noop_reset_partial():
    env = TransformedEnv(CountingEnv(max_steps=100, batch_size=(3,)), NoopResetEnv(2, random=False))
    td = await env.reset()
    assert td["observation"].squeeze(-1).tolist() == [2.0, 2.0, 2.0]
    for _ in range(3):
        td = env._step_mdp(await env.rand_step(td))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    td = await env.reset(td)
    # only the reset element was reset and moved by the noops
    assert td["observation"].squeeze(-1).tolist() == [5.0, 2.0, 5.0]
    assert env.base_env.count.squeeze(-1).tolist() == [5.0, 2.0, 5.0]


async def test_noop_reset_done_during_noops_raises():
    env = TransformedEnv(CountingEnv(max_steps=2), NoopResetEnv(3, random=False))
    with pytest.raises(RuntimeError, match="noop"):
        await env.reset()


async def test_noop_reset_with_traj_counter_after_it():
    env = TransformedEnv(CountingEnv(max_steps=5), NoopResetEnv(2, random=False))
    env.append_transform(TrajCounter())
    r = await env.rollout(6, break_when_any_done=False)
    assert r["observation"].squeeze(-1).tolist() == [2.0, 3.0, 4.0, 2.0, 3.0, 4.0]
    assert r["traj_count"].squeeze(-1).tolist() == [0, 0, 0, 1, 1, 1]


async def test_noop_reset_batch_unlocked():
    env = TransformedEnv(aenv.PendulumEnv(seed=0), NoopResetEnv(2, random=False))
    td = await env.reset(TensorDict({}, batch_size=[4]))
    assert td["th"].shape == (4,)
    await aenv.acheck_env_specs(env)
