"""Auto-resetting envs (``auto_reset=True``) and the seeds' transform examples, async."""

from __future__ import annotations

import gymnasium
import pytest
import torch
from tensordict import TensorDict

from aenv import EnvBase, acheck_env_specs
from aenv.libs.gym import GymEnv
from aenv.specs import Bounded, Categorical, Composite, OneHot
from aenv.testing import CountingEnv
from aenv.transforms import (
    AutoResetEnv,
    AutoResetTransform,
    Compose,
    Resize,
    StepCounter,
    ToTensorImage,
    TransformedEnv,
)


class AutoResettingCartPole(EnvBase):
    """CartPole over gymnasium that resets itself on the step that ends an episode (as in the
    seeds' example): the step's observation is then the next episode's first one."""

    def __init__(self):
        super().__init__()
        self.gym = gymnasium.make("CartPole-v1")
        high = torch.tensor([4.8, torch.inf, 0.42, torch.inf])
        self.observation_spec = Composite(observation=Bounded(-high, high, shape=(4,)))
        self.action_spec = OneHot(2)
        self.full_done_spec = Composite(
            done=Categorical(2, (1,), dtype=torch.bool),
            terminated=Categorical(2, (1,), dtype=torch.bool),
            truncated=Categorical(2, (1,), dtype=torch.bool),
        )
        self._seed = None
        self.base_resets = 0

    def _set_seed(self, seed):
        self._seed = seed

    def _reset(self, td, **kw):
        self.base_resets += 1
        obs, _ = self.gym.reset(seed=self._seed)
        self._seed = None
        return TensorDict(observation=torch.as_tensor(obs))

    def _step(self, td):
        obs, rew, term, trunc, _ = self.gym.step(int(td["action"].long().argmax()))
        if term or trunc:
            obs, _ = self.gym.reset()
        return TensorDict(
            observation=torch.as_tensor(obs),
            reward=torch.tensor([rew], dtype=torch.float32),
            terminated=torch.tensor([term]),
            truncated=torch.tensor([trunc]),
        )


async def test_auto_reset_env_argument_cartpole_example():
    torch.manual_seed(0)
    env = AutoResettingCartPole(auto_reset=True, auto_reset_replace=True)
    assert isinstance(env, AutoResetEnv)
    assert isinstance(env.transform[0], AutoResetTransform)
    await env.set_seed(0)
    r = await env.rollout(60, break_when_any_done=False)
    done = r["next", "done"].squeeze(-1)
    assert done.sum() >= 2
    obs = r["next", "observation"]
    assert obs[done].isnan().all()  # observations after done are nan placeholders
    assert not obs[~done].isnan().any()
    # the step after a done starts from the saved first observation of the new episode
    idx = int(done.nonzero()[0])
    assert not r["observation"][idx + 1].isnan().any()
    assert env.base_env.base_resets == 1  # only the first reset reached the base env


async def test_auto_reset_without_replace_and_plain_envs():
    env = AutoResettingCartPole(auto_reset=True, auto_reset_replace=False)
    r = await env.rollout(60, break_when_any_done=False)
    assert not r["next", "observation"].isnan().any()
    plain = CountingEnv(max_steps=3)
    assert not isinstance(plain, AutoResetEnv)
    with pytest.raises(ValueError):
        AutoResetEnv(CountingEnv(), StepCounter())


class AutoResettingCounter(CountingEnv):
    """A batched counting env that restarts finished elements inside the step."""

    def _step(self, td):
        out = super()._step(td)
        done = out["done"]
        self.count = torch.where(done, torch.zeros_like(self.count), self.count)
        out["observation"] = torch.where(done, self.count, out["observation"])
        return out


async def test_auto_reset_batched_partial():
    env = AutoResettingCounter(max_steps=[2, 3], batch_size=(2,), auto_reset=True)
    env.append_transform(StepCounter())
    r = await env.rollout(6, break_when_any_done=False)
    obs = r["next", "observation"].squeeze(-1)
    done = r["next", "done"].squeeze(-1)
    assert obs[done].isnan().all()
    assert r["observation"][0].squeeze(-1).tolist()[:4] == [0.0, 1.0, 0.0, 1.0]
    assert r["next", "step_count"][0].squeeze(-1).tolist() == [1, 2, 1, 2, 1, 2]
    await acheck_env_specs(env)


async def test_seed_compose_example_pixel_cartpole():
    base_env = GymEnv("CartPole-v1", from_pixels=True, render_mode="rgb_array")
    transform = Compose(ToTensorImage(in_keys=["pixels"]), Resize(64, 64, in_keys=["pixels"]))
    env = TransformedEnv(base_env, transform)
    td = await env.reset()
    assert td["pixels"].shape == (3, 64, 64) and td["pixels"].dtype == torch.float32
    resize_parent = env.transform[-1].parent
    assert isinstance(resize_parent.transform[0], ToTensorImage)
    assert resize_parent.observation_spec["pixels"].shape[-2:] == (400, 600)
    await acheck_env_specs(env)
    await env.aclose()
