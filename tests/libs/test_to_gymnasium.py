from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from aenv import PendulumEnv
from aenv.exceptions import BatchSizeError
from aenv.libs.gym import GymEnv, GymWrapper, to_gymnasium, to_gymnasium_vector
from aenv.testing import CountingEnv, TextEnv


def _roundtrip_matches(env_id: str, seed: int, n_steps: int, **kwargs) -> int:
    """Step a raw env and its gymnasium -> aenv -> gymnasium twin side by side."""
    raw = gym.make(env_id)
    twin = to_gymnasium(GymEnv(env_id, **kwargs))
    assert twin.observation_space == raw.observation_space
    assert twin.action_space == raw.action_space
    o1, _ = raw.reset(seed=seed)
    o2, _ = twin.reset(seed=seed)
    assert np.array_equal(o1, o2)
    raw.action_space.seed(seed)
    episodes = 0
    for _ in range(n_steps):
        a = raw.action_space.sample()
        s1, s2 = raw.step(a), twin.step(a)
        assert np.array_equal(s1[0], s2[0])
        assert np.float32(s1[1]) == np.float32(s2[1])  # aenv rewards are float32
        assert s1[2:4] == s2[2:4]
        if s1[2] or s1[3]:
            episodes += 1
            o1, _ = raw.reset()
            o2, _ = twin.reset()
            assert np.array_equal(o1, o2)
    twin.close()
    return episodes


@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("CartPole-v1", {}),
        ("Pendulum-v1", {}),
        ("MountainCarContinuous-v0", {}),
        ("FrozenLake-v1", {}),
        ("FrozenLake-v1", {"categorical_action_encoding": True}),
    ],
)
def test_roundtrip_step_for_step(env_id, kwargs):
    episodes = _roundtrip_matches(env_id, 3, 150, **kwargs)
    if env_id in ("CartPole-v1", "FrozenLake-v1"):
        assert episodes >= 1


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1"])
def test_check_env_gym_envs(env_id):
    check_env(to_gymnasium(GymEnv(env_id)), skip_render_check=True)


def test_check_env_native_envs(dict_env, tuple_env):
    check_env(to_gymnasium(PendulumEnv()), skip_render_check=True)
    check_env(to_gymnasium(CountingEnv(max_steps=5)), skip_render_check=True)
    g = to_gymnasium(GymWrapper(dict_env))
    assert isinstance(g.observation_space, gym.spaces.Dict)
    assert g.observation_space == dict_env.observation_space
    check_env(g, skip_render_check=True)
    t = to_gymnasium(GymWrapper(tuple_env))
    assert t.observation_space == tuple_env.observation_space
    check_env(t, skip_render_check=True)


def test_text_observations():
    env = TextEnv()
    g = to_gymnasium(env)
    text_keys = [k for k, v in env.observation_spec.items() if type(v).__name__ == "NonTensor"]
    assert text_keys
    obs, _ = g.reset(seed=0)
    space = g.observation_space
    sub = space[text_keys[0]] if isinstance(space, gym.spaces.Dict) else space
    assert isinstance(sub, gym.spaces.Text)
    value = obs[text_keys[0]] if isinstance(obs, dict) else obs
    assert isinstance(value, str)


def test_render_pixels():
    g = to_gymnasium(GymEnv("CartPole-v1", from_pixels=True))
    g.reset(seed=0)
    frame = g.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3
    assert g.render_mode == "rgb_array"


def test_batched_env_rejected():
    with pytest.raises(BatchSizeError):
        to_gymnasium(CountingEnv(batch_size=(2,)))
    with pytest.raises(BatchSizeError):
        to_gymnasium_vector(CountingEnv())


def test_vector_next_step_autoreset_counting():
    venv = to_gymnasium_vector(CountingEnv(max_steps=[2, 3], batch_size=(2,)))
    assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    obs, _ = venv.reset(seed=0)
    assert obs.tolist() == [[0.0], [0.0]]
    rows = []
    for _ in range(5):
        obs, rew, term, _trunc, _ = venv.step(venv.action_space.sample())
        rows.append((obs[:, 0].tolist(), rew.tolist(), term.tolist()))
    assert rows == [
        ([1, 1], [1, 1], [False, False]),
        ([2, 2], [1, 1], [True, False]),
        ([0, 3], [0, 1], [False, True]),  # env 0 reset (action ignored), env 1 ends
        ([1, 0], [1, 0], [False, False]),
        ([2, 1], [1, 1], [True, False]),
    ]


def test_vector_roundtrip_matches_gymnasium_vector():
    """gymnasium vector (next-step) -> aenv -> gymnasium vector matches the original."""
    n = 3
    raw = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync")
    twin = to_gymnasium_vector(GymEnv("CartPole-v1", num_envs=n))
    assert twin.single_observation_space == raw.single_observation_space
    o1, _ = raw.reset(seed=11)
    o2, _ = twin.reset(seed=11)
    assert np.array_equal(o1, o2)
    rng = np.random.default_rng(0)
    dones = 0
    for _ in range(80):
        a = rng.integers(0, 2, size=n)
        s1, s2 = raw.step(a), twin.step(a)
        assert np.array_equal(s1[0], s2[0])
        assert np.array_equal(s1[1].astype(np.float32), s2[1].astype(np.float32))
        assert np.array_equal(s1[2], s2[2]) and np.array_equal(s1[3], s2[3])
        dones += int(s1[2].sum() + s1[3].sum())
    assert dones >= 1
    twin.close()
    raw.close()
