from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from aenv import acheck_env_specs, step_mdp
from aenv.exceptions import BackendUnavailableError, BatchSizeError
from aenv.libs.gym import (
    DefaultInfoDictReader,
    GymEnv,
    GymWrapper,
    gym_backend,
    set_gym_backend,
)
from aenv.specs import Bounded, Categorical, Composite, OneHot, Unbounded


def _raw_replay(env_id: str, seed: int, actions: list, **make_kwargs):
    """Replay actions in a raw gymnasium env; returns per-step (obs, r, term, trunc)."""
    raw = gym.make(env_id, **make_kwargs)
    raw.reset(seed=seed)
    out = []
    for a in actions:
        obs, r, term, trunc, _ = raw.step(a)
        out.append((obs, r, term, trunc))
        if term or trunc:
            break
    raw.close()
    return out


async def test_cartpole_specs_and_step():
    env = GymEnv("CartPole-v1")
    assert isinstance(env.action_spec, OneHot) and env.action_spec.n == 2
    assert isinstance(env.observation_spec["observation"], Bounded)
    assert set(env.done_keys) == {"done", "terminated", "truncated"}
    td = await env.reset(seed=0)
    raw = gym.make("CartPole-v1")
    raw_obs, _ = raw.reset(seed=0)
    assert np.array_equal(td["observation"].numpy(), raw_obs)
    for a in [0, 1, 1, 0, 1]:
        td["action"] = torch.nn.functional.one_hot(torch.tensor(a), 2)
        td = await env.step(td)
        obs, r, term, _trunc, _ = raw.step(a)
        assert np.array_equal(td["next", "observation"].numpy(), obs)
        assert td["next", "reward"].item() == r
        assert td["next", "terminated"].item() == term
        td = env._step_mdp(td)
    await acheck_env_specs(env)
    await env.aclose()


async def test_rollout_matches_raw_loop():
    env = GymEnv("CartPole-v1")
    await env.set_seed(3)
    r = await env.rollout(200)
    actions = r["action"].argmax(-1).tolist()
    ref = _raw_replay("CartPole-v1", 3, actions)
    assert len(ref) == r.shape[0]
    assert bool(r["next", "done"][-1])
    for t, (obs, rew, term, _trunc) in enumerate(ref):
        assert np.array_equal(r["next", "observation"][t].numpy(), obs)
        assert r["next", "reward"][t].item() == rew
        assert r["next", "terminated"][t].item() == term
    # root obs at t+1 is next obs at t within an episode
    assert torch.equal(r["observation"][1:], r["next", "observation"][:-1])


async def test_rollout_is_reproducible_with_seeds():
    """Same env seed and torch seed: the same random-action rollout, with and without resets."""
    for break_when_any_done in (True, False):
        runs = []
        for _ in range(2):
            env = GymEnv("CartPole-v1")
            await env.set_seed(1)
            torch.manual_seed(0)
            runs.append(await env.rollout(300, break_when_any_done=break_when_any_done))
        a, b = runs
        assert a.batch_size == b.batch_size
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
        if not break_when_any_done:
            assert a["next", "done"].sum() >= 1


async def test_pendulum_and_make_kwargs():
    env = GymEnv("Pendulum-v1", g=9.81)
    assert env._env.unwrapped.g == 9.81
    assert isinstance(env.action_spec, Bounded)
    r = await env.rollout(10)
    assert r["next", "reward"].shape == (10, 1)
    assert r["action"].dtype == torch.float32
    await acheck_env_specs(env)


async def test_mountaincar_continuous():
    env = GymEnv("MountainCarContinuous-v0")
    await env.set_seed(0)
    r = await env.rollout(20)
    assert r["next", "observation"].shape == (20, 2)
    ref = _raw_replay("MountainCarContinuous-v0", 0, [a.numpy() for a in r["action"]])
    assert np.allclose(r["next", "observation"][-1].numpy(), ref[-1][0])


async def test_frozenlake_discrete_obs():
    env = GymEnv("FrozenLake-v1", categorical_action_encoding=True)
    assert isinstance(env.observation_spec["observation"], Categorical)
    assert isinstance(env.action_spec, Categorical)
    td = await env.reset(seed=0)
    assert td["observation"].dtype == torch.int64 and td["observation"].shape == ()
    r = await env.rollout(50)
    assert ((r["next", "observation"] >= 0) & (r["next", "observation"] < 16)).all()
    oh = GymEnv("FrozenLake-v1")
    assert isinstance(oh.observation_spec["observation"], OneHot)
    td = await oh.reset(seed=0)
    assert td["observation"].sum() == 1 and td["observation"][0] == 1
    await acheck_env_specs(oh)


async def test_dict_observation(dict_env):
    env = GymWrapper(dict_env)
    assert set(env.observation_keys) == {"position", "steps"}
    td = await env.reset(seed=0)
    assert td["position"].shape == (2,)
    r = await env.rollout(10)
    assert r["next", "steps"].shape[-1] == 7  # one-hot of Discrete(7)
    assert bool(r["next", "done"][-1])
    await acheck_env_specs(env)


async def test_tuple_observation(tuple_env):
    env = GymWrapper(tuple_env, categorical_action_encoding=True)
    spec = env.observation_spec["observation"]
    assert isinstance(spec, Composite) and set(spec.keys()) == {"0", "1"}
    r = await env.rollout(10)
    assert r["next", "observation", "0"].shape == (5, 3)
    assert r["next", "observation", "1"].tolist() == [1, 2, 3, 0, 1]
    assert r["next", "truncated"].sum() == 0 and r["next", "terminated"][-1].item()


async def test_info_reader_default(dict_env):
    env = GymWrapper(dict_env).set_info_dict_reader()
    assert set(env.observation_keys) >= {"dist", "t", "start"}
    assert "name" not in env.observation_keys  # not numeric
    td = await env.reset(seed=0)
    assert td["dist"].item() == 0.0  # missing at reset: zeros
    assert td["start"].item() == pytest.approx(float(td["position"][0]))
    td = await env.rand_step(td)
    assert td["next", "t"].item() == 1
    expected = float(td["next", "position"].abs().sum())
    assert td["next", "dist"].item() == pytest.approx(expected)
    await acheck_env_specs(env)


async def test_info_reader_explicit_spec(dict_env):
    reader = DefaultInfoDictReader(["dist"], spec={"dist": Unbounded((), dtype=torch.float64)})
    env = GymWrapper(dict_env).set_info_dict_reader(reader)
    td = await env.rand_step(await env.reset(seed=1))
    assert td["next", "dist"].dtype == torch.float64
    assert "t" not in td["next"].keys()


async def test_pixels_cartpole():
    env = GymEnv("CartPole-v1", from_pixels=True)
    assert env._env.render_mode == "rgb_array"
    assert set(env.observation_keys) == {"observation", "pixels"}
    td = await env.reset(seed=0)
    h, w, c = td["pixels"].shape
    assert c == 3 and td["pixels"].dtype == torch.uint8
    r = await env.rollout(3)
    assert r["next", "pixels"].shape == (3, h, w, 3)
    assert not torch.equal(r["pixels"][0], r["next", "pixels"][0]) or r["action"].sum() == 0
    only = GymEnv("CartPole-v1", from_pixels=True, pixels_only=True)
    assert only.observation_keys == ["pixels"]
    await acheck_env_specs(only)
    with pytest.raises(ValueError, match="pixels_only"):
        GymEnv("CartPole-v1", pixels_only=True)


async def test_frame_skip():
    env1, env3 = GymEnv("Pendulum-v1"), GymEnv("Pendulum-v1", frame_skip=3)
    a = torch.tensor([0.5])
    td1 = await env1.reset(seed=0)
    rewards = 0.0
    for _ in range(3):
        td1["action"] = a.clone()
        td1 = await env1.step(td1)
        rewards += td1["next", "reward"].item()
        td1 = env1._step_mdp(td1)
    td3 = await env3.reset(seed=0)
    td3["action"] = a.clone()
    td3 = await env3.step(td3)
    assert torch.allclose(td3["next", "observation"], td1["observation"])
    assert td3["next", "reward"].item() == pytest.approx(rewards, rel=1e-5)


async def test_seeding_determinism():
    env = GymEnv("CartPole-v1")
    a = (await env.reset(seed=5))["observation"]
    b = (await env.reset(seed=5))["observation"]
    await env.set_seed(5)
    c = (await env.reset())["observation"]
    d = (await env.reset(seed=6))["observation"]
    assert torch.equal(a, b) and torch.equal(a, c) and not torch.equal(a, d)


async def test_blocking_runs_in_thread():
    import threading

    seen = []

    class Spy(gym.Wrapper):
        def step(self, action):
            seen.append(threading.current_thread())
            return self.env.step(action)

    env = GymWrapper(Spy(gym.make("CartPole-v1")), blocking=True)
    await env.rand_step(await env.reset(seed=0))
    assert seen and seen[0] is not threading.main_thread()
    inline = GymWrapper(Spy(gym.make("CartPole-v1")))
    await inline.rand_step(await inline.reset(seed=0))
    assert seen[-1] is threading.main_thread()


@pytest.mark.parametrize("report", [True, False])
async def test_auto_reset(self_resetting_cls, report):
    env = GymWrapper(self_resetting_cls(limit=3, report=report), auto_reset=True)
    r = await env.rollout(7, break_when_any_done=False)
    nobs = r["next", "observation"].squeeze(-1)
    obs = r["observation"].squeeze(-1)
    assert r["next", "done"].squeeze(-1).tolist() == [False, False, True] * 2 + [False]
    if report:
        assert nobs.tolist() == [101, 102, 103, 201, 202, 203, 301]
    else:  # the last observation is lost: a NaN placeholder, never the next start
        assert torch.isnan(nobs[2]) and torch.isnan(nobs[5])
    assert obs.tolist() == [100, 101, 102, 200, 201, 202, 300]


async def test_gymnasium_autoreset_wrapper_needs_no_flag():
    """A next-step self-resetting env (gymnasium's Autoreset) is reset by aenv's reset."""
    env = GymWrapper(gym.wrappers.Autoreset(gym.make("CartPole-v1")))
    r = await env.rollout(120, break_when_any_done=False)
    done = r["next", "done"].squeeze(-1)
    assert done.any()
    t = int(done.nonzero()[0])
    assert not torch.equal(r["observation"][t + 1], r["next", "observation"][t])
    assert r["next", "reward"][t + 1].item() == 1.0  # a real step, not a reset in disguise


def test_batch_size_and_wrapper_args():
    with pytest.raises(BatchSizeError):
        GymWrapper(gym.make("CartPole-v1"), batch_size=(2,))
    with pytest.raises(TypeError):
        GymWrapper()
    with pytest.raises(ValueError, match="frame_skip"):
        GymWrapper(gym.make("CartPole-v1"), frame_skip=0)
    assert "CartPole" in repr(GymEnv("CartPole-v1"))


def test_gym_backend_switch(monkeypatch):
    assert gym_backend() is gym
    assert gym_backend("wrappers") is gym.wrappers
    monkeypatch.setitem(sys.modules, "gym", None)
    with pytest.raises(BackendUnavailableError, match="gymnasium"):
        with set_gym_backend("gym"):
            pass
    monkeypatch.setitem(sys.modules, "gym", gym)  # a stand-in module named "gym"
    with set_gym_backend("gym") as mod:
        assert gym_backend() is mod
    assert gym_backend() is gym

    @set_gym_backend(gym)
    def inner():
        return gym_backend()

    assert inner() is gym


async def test_device_cpu():
    env = GymEnv("CartPole-v1", device="cpu")
    td = await env.rand_step(await env.reset(seed=0))
    assert td["next", "observation"].device == torch.device("cpu")


async def test_pixels_through_thread_pool():
    pool_mod = pytest.importorskip("aenv.pool")
    pool = pool_mod.AsyncEnvPool(
        [lambda: GymEnv("CartPole-v1", from_pixels=True, pixels_only=True)] * 2, backend="thread"
    )
    try:
        r = await pool.rollout(3)
        assert r["next", "pixels"].shape[:2] == (2, 3)
        assert r["next", "pixels"].dtype == torch.uint8
    finally:
        await pool.aclose()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
async def test_reward_dtype_keeps_gymnasium_rewards(dtype):
    """``reward_dtype`` sets the reward spec; float64 holds gymnasium's python-float rewards
    exactly (MountainCarContinuous's ``-0.1 * a**2`` is no float32 value), on the plain
    path and the general one alike."""
    import gymnasium

    raw = gymnasium.make("MountainCarContinuous-v0")
    env = GymEnv("MountainCarContinuous-v0", reward_dtype=dtype)
    assert env.full_reward_spec["reward"].dtype == dtype
    raw.reset(seed=0)
    td = await env.reset(seed=0)
    for a in (0.3, -0.7, 0.11):
        _, r, *_ = raw.step(np.array([a], dtype=np.float32))
        td["action"] = torch.tensor([a])
        td = await env.step(td)
        got = td["next", "reward"]
        assert got.dtype == dtype
        if dtype == torch.float64:
            assert got.item() == r
        else:
            assert got.item() == float(np.float32(r))
        td = step_mdp(td)
    rollout = await env.rollout(5)
    assert rollout["next", "reward"].dtype == dtype
