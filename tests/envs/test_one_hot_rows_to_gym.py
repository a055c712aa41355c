"""Rows of one-hot actions become gymnasium's indices: numpy's argmax where numpy can view
the tensor, torch's where it cannot (a gradient, a dtype numpy lacks), the same values."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from aenv import step_mdp
from aenv.libs.gym import GymWrapper
from aenv.specs import OneHot
from aenv.specs._numpy import to_numpy_fn


def _rows(idx: list[int], n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(idx), n).to(dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float32, torch.bfloat16])
def test_one_hot_rows_give_the_spaces_indices_and_dtype(dtype):
    space = gym.spaces.MultiDiscrete([5, 5, 5], dtype=np.int8, start=[2, 2, 2])
    spec = OneHot(5, shape=(3, 5), dtype=dtype)
    spec._meta["gym_start"] = 2
    convert = to_numpy_fn(spec, space)
    out = convert(_rows([4, 0, 2], 5, dtype))
    assert out.dtype == np.int8
    assert out.tolist() == [6, 2, 4]
    assert space.contains(out)


def test_one_hot_rows_keeping_a_gradient_take_torch():
    convert = to_numpy_fn(OneHot(3, shape=(2, 3), dtype=torch.float32))
    value = _rows([2, 1], 3, torch.float32).requires_grad_()
    with pytest.raises(RuntimeError):
        value.numpy()  # (what sends this one down torch's path)
    assert convert(value).tolist() == [2, 1]


async def test_a_vector_env_steps_with_the_actions_drawn():
    # a gymnasium vector env of Discrete actions: each step's (num_envs, n) one-hot action
    # rows go to gymnasium as one array of indices; a reference vector env stepped with
    # those indices gives the same observations
    make = [lambda: gym.make("CartPole-v1")] * 3
    env, reference = GymWrapper(gym.vector.SyncVectorEnv(make)), gym.vector.SyncVectorEnv(make)
    try:
        td = await env.reset(seed=0)
        reference.reset(seed=0)
        for _ in range(6):
            td = await env.step(env.rand_action(td))
            expected, *_ = reference.step(td["action"].argmax(-1).numpy())
            np.testing.assert_array_equal(td["next", "observation"].numpy(), expected)
            td = step_mdp(td)
    finally:
        await env.aclose()
        reference.close()
