"""RenameTransform, ExcludeTransform, SelectTransform, RewardScaling, RewardClipping."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from aenv import PendulumEnv, acheck_env_specs
from aenv.libs.gym import GymEnv
from aenv.specs import Bounded, Unbounded
from aenv.testing import CountingEnv
from aenv.transforms import (
    ExcludeTransform,
    RenameTransform,
    RewardClipping,
    RewardScaling,
    SelectTransform,
    TransformedEnv,
)


async def test_rename_forward_and_inverse():
    env = TransformedEnv(
        CountingEnv(),
        RenameTransform(["observation"], ["count"], in_keys_inv=["action"], out_keys_inv=["act"]),
    )
    assert (
        "count" in env.observation_spec.keys() and "observation" not in env.observation_spec.keys()
    )
    assert "act" in env.full_action_spec.keys() and "action" not in env.full_action_spec.keys()
    td = await env.reset()
    assert "count" in td.keys() and "observation" not in td.keys()
    td["act"] = torch.ones(1, dtype=torch.int64)
    out = await env.step(td)
    assert out["next", "count"].item() == 1.0
    assert "action" not in out.keys()  # the user's td keeps the outer names
    await acheck_env_specs(env)


async def test_rename_state_of_pendulum_and_copy():
    env = TransformedEnv(
        PendulumEnv(),
        RenameTransform(["th"], ["angle"], in_keys_inv=["th"], out_keys_inv=["angle"]),
    )
    td = await env.reset(TensorDict({}, [3]))
    r = await env.rollout(3, tensordict=td, auto_reset=False)
    assert r["next", "angle"].shape == (3, 3)
    await acheck_env_specs(env, tensordict=TensorDict({}, [3]))
    copy = TransformedEnv(
        CountingEnv(), RenameTransform(["observation"], ["obs"], create_copy=True)
    )
    r = await copy.rollout(2)
    assert torch.equal(r["next", "obs"], r["next", "observation"])
    await acheck_env_specs(copy)


async def test_exclude_and_select():
    env = TransformedEnv(GymEnv("CartPole-v1"), ExcludeTransform("observation"))
    assert "observation" not in env.observation_spec.keys()
    r = await env.rollout(2)
    assert "observation" not in r["next"].keys()
    await acheck_env_specs(env)
    with pytest.raises(ValueError):
        TransformedEnv(CountingEnv(), ExcludeTransform("reward"))
    sel = TransformedEnv(PendulumEnv(), SelectTransform("th", "thdot", "params"))
    td = await sel.reset()
    assert set(td.keys()) >= {"th", "thdot"}
    await acheck_env_specs(sel)
    only = TransformedEnv(CountingEnv(), SelectTransform("nothing"))
    r = await only.rollout(2)
    assert set(r["next"].keys()) == {"reward", "done", "terminated"}
    await acheck_env_specs(only)
    inv = TransformedEnv(CountingEnv(), ExcludeTransform("extra", inverse=True))
    td = await inv.reset()
    td["extra"] = torch.zeros(1)
    td["action"] = torch.zeros(1, dtype=torch.int64)
    await inv.step(td)


async def test_reward_scaling_and_clipping():
    env = TransformedEnv(CountingEnv(), RewardScaling(loc=1.0, scale=0.5))
    r = await env.rollout(2)
    assert r["next", "reward"].squeeze(-1).tolist() == [1.5, 1.5]
    await acheck_env_specs(env)
    norm = TransformedEnv(CountingEnv(), RewardScaling(loc=1.0, scale=2.0, standard_normal=True))
    assert (await norm.rollout(1))["next", "reward"].item() == 0.0
    clip = TransformedEnv(PendulumEnv(), RewardClipping(-1.0, 0.0))
    assert isinstance(clip.reward_spec, Bounded)
    r = await clip.rollout(10)
    assert r["next", "reward"].min() >= -1.0 and r["next", "reward"].max() <= 0.0
    await acheck_env_specs(clip)
    half = TransformedEnv(CountingEnv(), RewardClipping(clamp_max=0.5))
    assert isinstance(half.reward_spec, Unbounded)
    assert (await half.rollout(1))["next", "reward"].item() == 0.5
