"""GymWrapper's plain path (``_plain_step``) gives what the generic reader path gives.

The fast path (one CPU env, one observation key, no pixels / frame skip / auto reset, readers
not overridden) builds the step's tensordict without validation: these tests pin that its
values, dtypes and shapes are the generic path's, that every step gets fresh tensors, and
that it steps aside whenever a subclass or an option needs the generic path.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from aenv import acheck_env_specs
from aenv.envs._gymlike import GymLikeEnv
from aenv.libs.gym import GymEnv, GymWrapper
from aenv.specs import Categorical, Composite, Unbounded


async def _rollout(env: GymWrapper, seed: int, steps: int):
    await env.set_seed(seed)
    torch.manual_seed(seed)
    return await env.rollout(steps, break_when_any_done=False)


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"categorical_action_encoding": True}),
        ("Pendulum-v1", {}),
        ("FrozenLake-v1", {}),
        ("FrozenLake-v1", {"categorical_action_encoding": True}),
    ],
)
async def test_fast_path_matches_generic_path(env_id, kwargs):
    fast = GymEnv(env_id, **kwargs)
    slow = GymEnv(env_id, **kwargs)
    assert fast._fast
    slow._fast = False
    a = await _rollout(fast, 5, 120)
    b = await _rollout(slow, 5, 120)
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        va, vb = a.get(key), b.get(key)
        assert va.dtype == vb.dtype and va.shape == vb.shape, key
        assert torch.equal(va, vb), key
    await acheck_env_specs(fast)
    await fast.aclose()
    await slow.aclose()


async def test_fast_steps_give_fresh_tensors():
    env = GymEnv("CartPole-v1")
    td = await env.reset(seed=0)
    env.rand_action(td)
    first = (await env.step(td))["next"]
    td = env._step_mdp(td)
    env.rand_action(td)
    second = (await env.step(td))["next"]
    keys = ["observation", "reward", "terminated", "truncated", "done"]
    before = {k: second.get(k).clone() for k in keys}
    for k in keys:
        assert first.get(k).data_ptr() != second.get(k).data_ptr(), k
        assert first.get(k).untyped_storage().data_ptr() != second.get(k).data_ptr(), k
        first.get(k).fill_(1)
    for k in keys:
        assert torch.equal(second.get(k), before[k]), k
    # the three flags do not share memory either
    second.get("terminated").fill_(True)
    assert not second.get("truncated").item() and not second.get("done").item()
    for k, spec in env.full_observation_spec.items():
        assert second.get(k).dtype == spec.dtype and second.get(k).shape == spec.shape
    assert second.get("reward").dtype == env.full_reward_spec["reward"].dtype
    assert second.get("done").dtype == torch.bool and second.get("done").shape == (1,)
    await env.aclose()


class OddOutputsEnv(gym.Env):
    """Returns a read-only observation (a float64 copy, or with ``view`` a float32 view of its
    own state) and int (not bool) done flags."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, view: bool = False) -> None:
        self.observation_space = spaces.Box(-10, 10, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.state = np.zeros(2, dtype=np.float32)
        self.view = view

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.state = np.zeros(2, dtype=np.float32)
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        out = self.state.view() if self.view else self.state.astype(np.float64)
        out.flags.writeable = False
        return out

    def step(self, action: Any):
        self.state = self.state + 1
        return self._obs(), 1, int(self.state[0] >= 3), 0, {}


async def test_fast_path_converts_odd_backend_values():
    env = GymWrapper(OddOutputsEnv())
    assert env._fast
    r = await env.rollout(5)
    assert r["next", "observation"].dtype == torch.float32
    assert r["next", "observation"][:, 0].tolist() == [1.0, 2.0, 3.0]
    assert r["next", "done"].dtype == torch.bool
    assert r["next", "done"].squeeze(-1).tolist() == [False, False, True]
    assert r["next", "reward"].dtype == torch.float32
    await acheck_env_specs(env)


async def test_fast_path_copies_read_only_observations():
    env = GymWrapper(OddOutputsEnv(view=True))
    assert env._fast
    td = await env.reset()
    td["observation"].fill_(5.0)  # a read-only backend array is copied, never written
    env.rand_action(td)
    td = await env.step(td)
    td["next", "observation"].fill_(7.0)
    assert env._env.state.tolist() == [1.0, 1.0]


async def test_subclass_overriding_a_reader_gets_the_generic_path():
    class Doubled(GymWrapper):
        def read_reward(self, reward: Any) -> torch.Tensor:
            return super().read_reward(reward) * 2

    env = Doubled(gym.make("CartPole-v1"))
    assert not Doubled._plain_ok and not env._fast and not env._plain_now()
    r = await env.rollout(3)
    assert r["next", "reward"].squeeze(-1).tolist() == [2.0, 2.0, 2.0]
    await env.aclose()


async def test_fast_path_off_for_options_that_need_the_generic_path():
    assert not GymEnv("CartPole-v1", frame_skip=2)._fast
    assert not GymEnv("CartPole-v1", num_envs=2)._fast
    assert GymEnv("CartPole-v1", device="cpu")._fast


def test_done_outputs_complete_flag():
    assert GymLikeEnv._done_outputs_complete
    assert GymWrapper._done_outputs_complete

    class OwnStep(GymLikeEnv):
        def _step(self, tensordict):  # may not write every done key
            raise NotImplementedError

    class OwnStepDeclared(GymLikeEnv):
        _done_outputs_complete = True

        def _step(self, tensordict):
            raise NotImplementedError

    class ReaderOnly(GymLikeEnv):
        def read_obs(self, observations):
            return super().read_obs(observations)

    assert not OwnStep._done_outputs_complete
    assert OwnStepDeclared._done_outputs_complete
    assert ReaderOnly._done_outputs_complete


class _Backend:
    def reset(self, **kwargs: Any):
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action: Any):
        return np.ones(2, dtype=np.float32), 0.5, False, False, {}


class Float64Reward(GymLikeEnv):
    def __init__(self) -> None:
        super().__init__()
        self._env = _Backend()
        self._init_gym_specs(
            Composite(observation=Unbounded((2,))),
            Categorical(2),
            reward_spec=Unbounded((1,), dtype=torch.float64),
        )

    def _set_seed(self, seed: int | None) -> None:
        pass


async def test_reward_follows_the_reward_spec_dtype():
    env = Float64Reward()
    r = await env.rollout(3)
    assert r["next", "reward"].dtype == torch.float64
    assert r["next", "reward"].squeeze(-1).tolist() == [0.5, 0.5, 0.5]
    await acheck_env_specs(env)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32])
def test_scalar_one_hot_converter(dtype):
    from aenv.specs import OneHot, from_gym_space
    from aenv.specs._numpy import from_numpy_fn

    spec = from_gym_space(spaces.Discrete(4, start=2))
    assert isinstance(spec, OneHot)
    spec = OneHot(4, dtype=dtype)
    spec._meta.update(gym_start=2)
    conv = from_numpy_fn(spec)
    for value in (2, np.int64(3), np.array(5), np.int32(4)):
        out = conv(value)
        want = torch.nn.functional.one_hot(torch.tensor(int(value) - 2), 4).to(dtype)
        assert out.dtype == dtype and out.shape == (4,) and torch.equal(out, want)
    a, b = conv(3), conv(3)
    a.fill_(1)
    assert torch.equal(b, torch.nn.functional.one_hot(torch.tensor(1), 4).to(dtype))
    for bad in (1, 6):
        with pytest.raises(RuntimeError, match="out of"):
            conv(bad)
