"""How the single-env gymnasium bridge runs its env: inline (no loop runner) where the env
cannot suspend, through the runner where it can, and into reused rows where it writes
them, falling back to TensorDicts where it hands them back."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from aenv import EnvBase
from aenv.exceptions import EnvClosedError
from aenv.libs.gym import GymEnv, to_gymnasium
from aenv.specs import Categorical, Composite, Unbounded
from aenv.sync import Runner

pytestmark = pytest.mark.timeout(60)


class _AsyncCounter(EnvBase):
    """An env whose step is a coroutine (it may suspend): the bridge must use the runner."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Categorical(2, shape=())
        self.n = 0

    async def _reset(self, td, **kwargs):
        self.n = 0
        return TensorDict(observation=torch.zeros(1))

    async def _step(self, td):
        self.n += 1
        return TensorDict(
            observation=torch.full((1,), float(self.n)),
            reward=torch.ones(1),
            done=torch.tensor([self.n >= 3]),
        )

    def _set_seed(self, seed):
        pass


def _closed_runner() -> Runner:
    runner = Runner()
    runner.close()
    return runner


def test_sync_env_steps_without_the_runner():
    """A gymnasium env steps and resets inline: a closed runner is never used, and the
    steps are plain gymnasium's, episode after episode."""
    raw = gym.make("CartPole-v1")
    twin = to_gymnasium(GymEnv("CartPole-v1"), runner=_closed_runner())
    o1, _ = raw.reset(seed=5)
    o2, _ = twin.reset(seed=5)
    assert np.array_equal(o1, o2)
    episodes = 0
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = int(rng.integers(0, 2))
        s1, s2 = raw.step(a), twin.step(a)
        assert np.array_equal(s1[0], s2[0]) and s2[0].dtype == s1[0].dtype
        assert (float(s1[1]), s1[2], s1[3]) == (s2[1], s2[2], s2[3])
        assert s2[4] == {}
        if s1[2] or s1[3]:
            episodes += 1
            assert np.array_equal(raw.reset()[0], twin.reset()[0])
    assert episodes >= 5


def test_async_env_goes_through_the_runner():
    twin = to_gymnasium(_AsyncCounter(), runner=_closed_runner())
    with pytest.raises(RuntimeError, match="closed"):
        twin.reset()
    twin = to_gymnasium(_AsyncCounter())
    twin.reset()
    out = [twin.step(1) for _ in range(3)]
    assert [o[0].tolist() for o in out] == [[1.0], [2.0], [3.0]]
    assert [o[2] for o in out] == [False, False, True]
    twin.close()


def test_observations_are_fresh_arrays():
    """A returned observation is the caller's: later steps (written into the same rows)
    and the caller's own writes do not reach each other."""
    twin = to_gymnasium(GymEnv("CartPole-v1"))
    first, _ = twin.reset(seed=0)
    kept = first.copy()
    obs = [twin.step(1)[0] for _ in range(4)]
    assert np.array_equal(first, kept)
    assert all(not np.shares_memory(a, b) for a in obs for b in obs if a is not b)
    snapshot = [o.copy() for o in obs]
    obs[0][:] = 123.0
    nxt = twin.step(0)[0]
    assert not np.any(nxt == 123.0)
    assert all(np.array_equal(o, s) for o, s in zip(obs[1:], snapshot[1:], strict=True))


def test_env_handing_back_a_tensordict_falls_back():
    """An env whose step hook writes rows only on its plain path (not with pixels) hands a
    TensorDict back; the bridge goes on from it, with the same steps as gymnasium's."""
    raw = gym.make("CartPole-v1")
    twin = to_gymnasium(GymEnv("CartPole-v1", from_pixels=True))
    raw.reset(seed=1)
    twin.reset(seed=1)
    for i in range(40):
        a = i % 2
        s1, s2 = raw.step(a), twin.step(a)
        assert np.array_equal(s1[0], s2[0]["observation"])
        assert (s1[2], s1[3]) == (s2[2], s2[3])
        assert twin.render().shape[-1] == 3
        if s1[2] or s1[3]:
            raw.reset()
            twin.reset()
            assert twin.render().dtype == np.uint8


def test_bad_action_leaves_the_env_as_it_was():
    raw = gym.make("Pendulum-v1")
    twin = to_gymnasium(GymEnv("Pendulum-v1"))
    raw.reset(seed=2)
    twin.reset(seed=2)
    with pytest.raises((ValueError, RuntimeError)):
        twin.step(np.array([0.5, 0.5], dtype=np.float32))
    a = np.array([0.25], dtype=np.float32)
    assert np.allclose(raw.step(a)[0], twin.step(a)[0])


def test_step_before_reset_and_after_close():
    twin = to_gymnasium(GymEnv("CartPole-v1"))
    with pytest.raises(gym.error.ResetNeeded):
        twin.step(0)
    twin.reset(seed=0)
    twin.step(0)
    twin.close()
    with pytest.raises(EnvClosedError):
        twin.step(0)


def test_reset_mid_episode_and_after_the_end_match_gymnasium():
    """A reset after the step that ended an episode (the env's reset-after-done hook) and
    one in mid-episode (the env's reset) both give gymnasium's next episodes."""
    raw = gym.make("CartPole-v1")
    twin = to_gymnasium(GymEnv("CartPole-v1"))
    assert np.array_equal(raw.reset(seed=9)[0], twin.reset(seed=9)[0])
    for episode in range(6):
        for t in range(500):
            s1, s2 = raw.step(1), twin.step(1)
            assert np.array_equal(s1[0], s2[0])
            if s1[2] or s1[3] or (episode % 2 and t == 2):
                break
        o1, _ = raw.reset()
        o2, i2 = twin.reset()
        assert np.array_equal(o1, o2) and i2 == {}
