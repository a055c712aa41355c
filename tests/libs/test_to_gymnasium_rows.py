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


def _writers(spec):
    from aenv.specs._numpy import from_numpy_fn, from_numpy_into_fn

    return from_numpy_fn(spec), from_numpy_into_fn(spec)


@pytest.mark.parametrize(
    "space",
    [gym.spaces.Discrete(3, start=-1), gym.spaces.Discrete(5)],
    ids=["discrete-start", "discrete"],
)
@pytest.mark.parametrize("categorical", [False, True], ids=["one-hot", "categorical"])
def test_actions_written_in_place_equal_converted(space, categorical):
    """The bridge writes an integer action into its reused action tensor; every value it
    takes gives the tensor the converter would make, and every value it refuses (out of
    range, not an integer) leaves the tensor as it was, for the converter to handle."""
    from aenv.specs import from_gym_space

    spec = from_gym_space(space, categorical_action_encoding=categorical)
    convert, into = _writers(spec)
    assert into is not None
    dst = torch.full(spec.shape, 7, dtype=spec.dtype)
    for value in range(space.start, space.start + space.n):
        for v in (value, np.int64(value), np.int32(value)):
            assert into(v, dst.numpy())
            assert torch.equal(dst, convert(v))
    before = dst.clone()
    lo, hi = int(space.start) - 1, int(space.start + space.n)
    for bad in (lo, hi, 1.0, np.float64(1.0), "1", [1]):
        if categorical and isinstance(bad, int) and not isinstance(bad, bool):
            continue  # (a categorical's domain is checked by the env, as the converter's is)
        assert not into(bad, dst.numpy())
        assert torch.equal(dst, before)


def test_box_actions_written_in_place_only_as_they_are():
    from aenv.specs import from_gym_space

    spec = from_gym_space(gym.spaces.Box(-2.0, 2.0, (3,), dtype=np.float32))
    convert, into = _writers(spec)
    dst = torch.zeros(3)
    a = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    assert into(a, dst.numpy()) and torch.equal(dst, convert(a))
    a[0] = 9.0  # (a copy: the caller's array is not aliased)
    assert dst[0] == 0.5
    for bad in (a.astype(np.float64), a[:2], a.reshape(3, 1), [0.5, 0.5, 0.5], 1.0):
        assert not into(bad, dst.numpy())
    assert dst.tolist() == [0.5, -1.0, 2.0]


def test_out_of_range_action_through_the_bridge():
    """A discrete action the in-place writer refuses takes the converter and its error;
    the env steps on as gymnasium's after it."""
    raw = gym.make("CartPole-v1")
    twin = to_gymnasium(GymEnv("CartPole-v1"))
    raw.reset(seed=4)
    twin.reset(seed=4)
    with pytest.raises((ValueError, RuntimeError, IndexError)):
        twin.step(2)
    with pytest.raises((ValueError, RuntimeError, IndexError)):
        twin.step(-1)
    for a in (1, np.int64(0), np.int8(1), 1.0):
        s1, s2 = raw.step(int(a)), twin.step(a)
        assert np.array_equal(s1[0], s2[0]) and s1[1:4] == s2[1:4]


def test_pendulum_in_place_actions_match_gymnasium():
    raw = gym.make("Pendulum-v1")
    twin = to_gymnasium(GymEnv("Pendulum-v1"))
    assert np.allclose(raw.reset(seed=3)[0], twin.reset(seed=3)[0])
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.uniform(-2, 2, size=(1,)).astype(np.float32)
        s1, s2 = raw.step(a), twin.step(a)
        a[0] = 100.0  # the caller reuses its array: the bridge kept no alias of it
        assert np.array_equal(s1[0], s2[0]) and s1[1] == pytest.approx(s2[1])
