"""The gymnasium bridges checked as gymnasium checks its own vector envs.

What gymnasium's ``tests/vector`` and ``tests/wrappers/vector`` ask of ``SyncVectorEnv`` /
``AsyncVectorEnv``, asked here of :func:`make_gymnasium_vector` (an aenv pool of each backend)
and :func:`to_gymnasium_vector` (a pool, a wrapped gymnasium vector env, a sync facade): step
for step the same data as gymnasium's ``SyncVectorEnv`` with the same seeds and actions, in
the three autoreset modes; spaces, seeds, partial resets, infos, attribute access and errors.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_differing_spaces

from aenv.exceptions import SpaceMismatchError
from aenv.libs.gym import (
    GymEnv,
    GymWrapper,
    InfoAsEntry,
    make_gymnasium_vector,
    to_gymnasium,
    to_gymnasium_vector,
)
from aenv.pool import AsyncEnvPool
from aenv.sync import ParallelEnv, SerialEnv, SyncEnv

BACKENDS = ["coroutine", "thread", "process"]
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


class CountdownEnv(gym.Env):  # type: ignore[type-arg]
    """Counts down from a random start; the action (0..3) is added to the reward. Infos on
    reset and step, of types gymnasium aggregates differently (bool, int, float, str)."""

    def __init__(self, obs_space: spaces.Space | None = None) -> None:  # type: ignore[type-arg]
        self.observation_space = obs_space or spaces.Box(0.0, 10.0, (2,), np.float32)
        self.action_space = spaces.Discrete(4)

    def _obs(self) -> Any:
        if isinstance(self.observation_space, spaces.Box):
            return np.array([self.left, self.left / 2], dtype=np.float32)
        return self.observation_space.sample()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.left = int(self.np_random.integers(1, 6))
        if options and "start" in options:
            self.left = int(options["start"])
        return self._obs(), {"start": self.left, "fresh": True}

    def step(self, action: Any):
        assert self.action_space.contains(action), action
        self.left -= 1
        info: dict[str, Any] = {"left": self.left, "tag": f"t{self.left}"}
        if self.left % 2:
            info["odd"] = 1.5
        return self._obs(), float(action), self.left == 0, False, info


def _countdown() -> CountdownEnv:
    return CountdownEnv()


def _cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


def _drive(venv: Any, seed: Any, actions: np.ndarray, disabled: bool) -> list[Any]:
    """Everything a vector env returns over a reset and ``actions`` (finished sub-envs are
    reset with a mask when autoreset is disabled)."""
    trace: list[Any] = [venv.reset(seed=seed)]
    for a in actions:
        out = venv.step(a)
        trace.append(out)
        done = out[2] | out[3]
        if disabled and done.any():
            trace.append(venv.reset(options={"reset_mask": done}))
    return trace


def _assert_same(expected: list[Any], got: list[Any]) -> None:
    assert len(expected) == len(got)
    for t, (e, g) in enumerate(zip(expected, got)):
        assert data_equivalence(e, g, exact=True), f"item {t}: {e} != {g}"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_pool_bridge_matches_sync_vector_env(backend, mode):
    """Observations, rewards, flags and infos (reset infos of autoreset sub-envs, final_obs
    and final_info in SAME_STEP) equal gymnasium's, step for step."""
    fns = [_countdown] * 3
    actions = np.random.default_rng(0).integers(0, 4, size=(14, 3))
    reference = SyncVectorEnv(fns, autoreset_mode=mode)
    expected = _drive(reference, 7, actions, mode == AutoresetMode.DISABLED)
    bridged = make_gymnasium_vector(fns, backend=backend, autoreset_mode=mode)
    assert bridged.metadata["autoreset_mode"] == mode
    got = _drive(bridged, 7, actions, mode == AutoresetMode.DISABLED)
    bridged.close()
    assert any(step[2].any() for step in expected[1:] if len(step) == 5)
    _assert_same(expected, got)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_tensor_only_pool_matches_sync_vector_env(backend, mode):
    """Without kept infos (tensors only), a pool restarts a finished sub-env within the step
    that ends its episode: the same data as gymnasium's (CartPole's infos are empty)."""
    actions = np.random.default_rng(2).integers(0, 2, size=(50, 3))
    reference = SyncVectorEnv([_cartpole] * 3, autoreset_mode=mode)
    expected = _drive(reference, 5, actions, mode == AutoresetMode.DISABLED)
    bridged = make_gymnasium_vector(
        [_cartpole] * 3, backend=backend, autoreset_mode=mode, keep_infos=False
    )
    assert bridged._eager
    got = _drive(bridged, 5, actions, mode == AutoresetMode.DISABLED)
    bridged.close()
    assert sum(step[2].sum() for step in expected[1:] if len(step) == 5) >= 2
    _assert_same(expected, got)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_wrapped_vector_env_bridge_matches(mode):
    """A gymnasium vector env wrapped as one aenv env (it cannot leave sub-envs out of a
    step) and bridged back gives gymnasium's data in each mode."""
    actions = np.random.default_rng(1).integers(0, 2, size=(60, 3))
    reference = SyncVectorEnv([_cartpole] * 3, autoreset_mode=mode)
    expected = _drive(reference, 3, actions, mode == AutoresetMode.DISABLED)
    bridged = to_gymnasium_vector(GymEnv("CartPole-v1", num_envs=3), autoreset_mode=mode)
    got = _drive(bridged, 3, actions, mode == AutoresetMode.DISABLED)
    bridged.close()
    _assert_same(expected, got)


@pytest.mark.timeout(60)
def test_sync_facades_bridge():
    """A SerialEnv / ParallelEnv / SyncEnv facade bridges: its env is awaited on its runner,
    not its sync methods from inside the loop."""
    ref = SyncVectorEnv([_cartpole] * 2)
    expected = ref.reset(seed=0)[0]
    serial = to_gymnasium_vector(SerialEnv(2, lambda: GymEnv("CartPole-v1")))
    assert np.array_equal(serial.reset(seed=0)[0], expected)
    serial.step(np.array([0, 1]))
    serial.close()
    parallel = to_gymnasium_vector(ParallelEnv(2, lambda: GymEnv("CartPole-v1")))
    assert np.array_equal(parallel.reset(seed=0)[0], expected)
    parallel.close()
    single = to_gymnasium(SyncEnv(GymEnv("CartPole-v1")))
    obs, _ = single.reset(seed=0)
    assert np.array_equal(obs, gym.make("CartPole-v1").reset(seed=0)[0])
    single.close()


SPACES = [
    spaces.MultiDiscrete([2, 3], dtype=np.int8),
    spaces.Discrete(4, start=1, dtype=np.int32),
    spaces.MultiDiscrete([[2, 3], [3, 2]], start=[[1, 0], [0, 5]]),
    spaces.Box(np.array([0, 0, 1]), np.array([1, 0, 1]), dtype=np.bool_),
    spaces.Box(0, 255, (2, 2), np.uint8),
    spaces.Sequence(spaces.Discrete(4)),
    spaces.Sequence(spaces.Box(0, 1, (2,)), stack=True),
    spaces.Graph(spaces.Box(-1, 1, (2,)), spaces.Discrete(3)),
    spaces.OneOf([spaces.Discrete(2), spaces.Box(0, 1, (2,))]),
    spaces.Tuple([spaces.Discrete(3), spaces.Box(0, 1, (2,))]),
    spaces.Dict(a=spaces.Discrete(2), b=spaces.Sequence(spaces.Discrete(3))),
    spaces.Text(5),
]


class _SpaceEnv(gym.Env):  # type: ignore[type-arg]
    """Observations and actions of one space, both sampled."""

    def __init__(self, space: spaces.Space) -> None:  # type: ignore[type-arg]
        self.observation_space = space
        self.action_space = space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any):
        assert self.action_space.contains(action), action
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("space", SPACES, ids=str)
def test_every_space_both_ways(space):
    """Every space comes in (observations and actions) and goes out equal, its values in it
    with gymnasium's dtypes (an int8 MultiDiscrete stays int8)."""
    single = to_gymnasium(GymWrapper(_SpaceEnv(space), categorical_action_encoding=True))
    assert single.observation_space == space and single.action_space == space
    obs, _ = single.reset(seed=0)
    assert obs in space
    obs, *_ = single.step(space.sample())
    assert obs in space
    check_env(single, skip_render_check=True)

    fns = [lambda: _SpaceEnv(space)] * 3
    reference = SyncVectorEnv(fns)
    venv = make_gymnasium_vector(fns)
    assert venv.single_observation_space == space
    assert venv.observation_space == reference.observation_space
    assert venv.action_space == reference.action_space
    ref_obs, _ = reference.reset(seed=0)
    obs, _ = venv.reset(seed=0)
    assert obs in venv.observation_space
    if isinstance(ref_obs, np.ndarray):
        assert obs.dtype == ref_obs.dtype
        assert np.array_equal(obs, ref_obs)
    obs, *_ = venv.step(venv.action_space.sample())
    assert obs in venv.observation_space
    venv.close()


def _box_env(high: float) -> Any:
    return lambda: CountdownEnv(spaces.Box(0.0, high, (2,), np.float32))


def test_observation_modes():
    same = [_box_env(10.0)] * 3
    differing = [_box_env(float(h)) for h in (10, 20, 30)]
    venv = make_gymnasium_vector(same)
    assert venv.observation_space == SyncVectorEnv(same).observation_space
    venv.close()
    with pytest.raises(SpaceMismatchError, match="observation spaces are not equivalent"):
        make_gymnasium_vector(differing)
    venv = make_gymnasium_vector(differing, observation_mode="different")
    singles = [CountdownEnv(spaces.Box(0.0, h, (2,), np.float32)) for h in (10, 20, 30)]
    assert venv.observation_space == batch_differing_spaces([e.observation_space for e in singles])
    assert venv.reset(seed=0)[0] in venv.observation_space
    venv.close()
    with pytest.raises(ValueError, match="Invalid `observation_mode`"):
        make_gymnasium_vector(same, observation_mode="sideways")
    mixed = [_cartpole, lambda: gym.make("FrozenLake-v1")]
    with pytest.raises(SpaceMismatchError):
        make_gymnasium_vector(mixed)


@pytest.mark.parametrize("backend", ["coroutine", "process"])
def test_per_env_seeds_and_np_random_seed(backend):
    fns = [_cartpole] * 4
    reference = SyncVectorEnv(fns)
    venv = make_gymnasium_vector(fns, backend=backend)
    seeds = [5, 100, 7, 9]
    assert np.array_equal(venv.reset(seed=seeds)[0], reference.reset(seed=seeds)[0])
    assert venv.np_random_seed == tuple(seeds)
    assert np.array_equal(venv.reset(seed=42)[0], reference.reset(seed=42)[0])
    assert venv.np_random_seed == (42, 43, 44, 45)
    with pytest.raises(ValueError, match="4 sub-envs"):
        venv.reset(seed=[1, 2])
    venv.close()


def test_reset_mask_and_options():
    fns = [_countdown] * 3
    venv = make_gymnasium_vector(fns, autoreset_mode=AutoresetMode.DISABLED)
    first, _ = venv.reset(seed=[0, 1, 2])
    stepped, *_ = venv.step(np.array([0, 0, 0]))
    mask = np.array([True, False, True])
    obs, info = venv.reset(seed=[0, 9, 2], options={"reset_mask": mask})
    assert np.array_equal(obs[mask], first[mask])
    assert np.array_equal(obs[1], stepped[1])
    assert info["_start"].tolist() == [True, False, True]
    obs, _ = venv.reset(options={"reset_mask": np.array([False, True, False]), "start": 4})
    assert obs[1][0] == 4.0
    for bad, err, match in [
        (np.array([True]), ValueError, r"shape `\(3,\)`, got \(1,\)"),
        (np.array([[True, True, True]]), ValueError, r"got \(1, 3\)"),
        (np.array([False] * 3), ValueError, "at least one True"),
        (np.array([1, 0, 1]), TypeError, "dtype=np.bool_"),
        ([True, False, True], TypeError, "numpy array"),
    ]:
        with pytest.raises(err, match=match):
            venv.reset(options={"reset_mask": bad})
    venv.close()


def test_action_checks_and_ignored_autoreset_action():
    venv = make_gymnasium_vector([_countdown] * 3)
    venv.reset(seed=0)
    with pytest.raises(ValueError, match="3 actions"):
        venv.step(np.array([0, 1]))
    with pytest.raises(ValueError, match="3 actions"):
        venv.step(np.array([0, 1, 2, 3]))
    with pytest.raises(TypeError, match="batch of 3 actions"):
        venv.step(0)
    # step every sub-env to its end, then give an out-of-range action to the ones restarting
    done = np.zeros(3, dtype=bool)
    while not done.any():
        *_, term, _, _ = venv.step(np.zeros(3, dtype=np.int64))
        done = term
    actions = np.where(done, 99, 0)
    _, reward, term, _, info = venv.step(actions)
    assert (reward[done] == 0).all() and not term[done].any()
    assert info["_fresh"].tolist() == done.tolist()
    venv.close()


def test_call_get_set_attr_render_and_close():
    venv = make_gymnasium_vector(
        [lambda: gym.make("CartPole-v1", render_mode="rgb_array")] * 2, backend="thread"
    )
    venv.reset(seed=0)
    assert venv.get_attr("gravity") == (9.8, 9.8)
    venv.set_attr("gravity", [1.0, 2.0])
    assert venv.get_attr("gravity") == (1.0, 2.0)
    venv.set_attr("gravity", 3.0)
    assert venv.call("get_wrapper_attr", "gravity") == (3.0, 3.0)
    assert venv.call("gravity") == (3.0, 3.0)  # not callable: read
    with pytest.raises(ValueError, match="2 values"):
        venv.set_attr("gravity", [1.0])
    with pytest.raises(AttributeError, match="no_such_thing"):
        venv.get_attr("no_such_thing")
    assert venv.render_mode == "rgb_array"
    frames = venv.render()
    assert len(frames) == 2 and frames[0].dtype == np.uint8 and frames[0].ndim == 3
    venv.close()
    with pytest.raises(gym.error.ClosedEnvironmentError):
        venv.reset()


def test_info_entry_on_a_wrapped_vector_env():
    """A gymnasium vector env's aggregated infos are kept per sub-env by InfoAsEntry, and
    come back aggregated the same."""
    inner = SyncVectorEnv([_countdown] * 2)
    env = GymWrapper(inner, categorical_action_encoding=True)
    env.set_info_dict_reader(InfoAsEntry(batch_size=(2,)))
    venv = to_gymnasium_vector(env)
    reference = SyncVectorEnv([_countdown] * 2)
    actions = np.random.default_rng(3).integers(0, 4, size=(10, 2))
    _assert_same(_drive(reference, 1, actions, False), _drive(venv, 1, actions, False))
    venv.close()


def test_pool_of_aenv_envs_keeps_working_without_infos():
    pool = AsyncEnvPool([lambda: GymEnv("CartPole-v1")] * 2)
    venv = to_gymnasium_vector(pool)
    obs, info = venv.reset(seed=0)
    assert info == {} and obs.shape == (2, 4)
    obs, *_, info = venv.step(np.array([0, 1]))
    assert info == {}
    venv.close()


def test_single_env_infos_and_reset_options():
    env = GymWrapper(CountdownEnv(), categorical_action_encoding=True)
    env.set_info_dict_reader(InfoAsEntry())
    single = to_gymnasium(env)
    raw = CountdownEnv()
    assert data_equivalence(single.reset(seed=4), raw.reset(seed=4), exact=True)
    assert data_equivalence(
        single.reset(options={"start": 2}), raw.reset(options={"start": 2}), exact=True
    )
    for action in (3, 1):
        got, expected = single.step(action), raw.step(action)
        assert data_equivalence(got[0], expected[0]) and got[1:] == expected[1:]
    single.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "make",
    [
        lambda: GymEnv("CartPole-v1"),
        lambda: GymEnv("Pendulum-v1"),
        lambda: GymWrapper(_SpaceEnv(spaces.Dict(a=spaces.Discrete(3), b=spaces.Box(0, 1, (2,))))),
        lambda: GymWrapper(_SpaceEnv(spaces.MultiDiscrete([2, 3], dtype=np.int8))),
    ],
    ids=["CartPole", "Pendulum", "Dict", "MultiDiscrete-int8"],
)
def test_stable_baselines3_env_checker(make):
    sb3_checker = pytest.importorskip("stable_baselines3.common.env_checker")
    env = to_gymnasium(make())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its advice (normalise Box spaces) is not a failure
        sb3_checker.check_env(env, warn=True)
    env.close()
