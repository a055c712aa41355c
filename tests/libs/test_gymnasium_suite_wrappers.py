"""Gymnasium's vector-wrapper tests, re-expressed against aenv's bridges.

From gymnasium 1.4's ``tests/wrappers/vector``: each vector wrapper on the bridge behaves as
on ``SyncVectorEnv`` (the same outputs and wrapper state, step for step, from the same seeds
and actions), and as the single-env wrapper applied inside each sub-env
(``RecordEpisodeStatistics``, ``FilterObservation``, ``FlattenObservation``,
``RescaleObservation``, ``ClipAction``, ``RescaleAction``, ``ClipReward``) in the
``NEXT_STEP`` and ``SAME_STEP`` modes, with one and three sub-envs; episode statistics of
fixed-length episodes in all three autoreset modes; ``NormalizeObservation`` (its statistics
converge, ``update_running_mean`` freezes them, its space is an unbounded float32 Box) and
``NormalizeReward`` (the vector wrapper on one sub-env keeps the statistics the per-env
wrapper keeps); ``TransformObservation`` / ``TransformAction`` (spaces from the single
space, the warning for a batched space that does not match); ``DictInfoToList``;
``NumpyToTorch`` / ``ArrayConversion`` (torch out, torch actions in);
``VectorizeTransformAction`` and per-env observation wrappers building a ``Dict``.

Not re-expressed: the ``CarRacing`` cases (``GrayscaleObservation``, ``ResizeObservation``,
``ReshapeObservation``, ``DtypeObservation``: Box2D is not installed; they are observation
maps of the same kind as ``RescaleObservation``, which is here), ``RecordVideo`` (moviepy)
and ``HumanRendering`` (a display), JAX conversions (JAX is not installed), and
``DictInfoToList``'s own conversion on a bare ``VectorEnv`` (it does not involve a vector
env: here it converts the bridge's infos instead).
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces, wrappers
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from libs import _gymnasium_suite as suite

pytestmark = pytest.mark.timeout(60)

TWO_MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def _make(env_id: str) -> gym.Env:  # type: ignore[type-arg]
    return gym.make(env_id, disable_env_checker=True)


def _dict_obs() -> gym.Env:  # type: ignore[type-arg]
    return suite.Sampler(spaces.Dict(a=spaces.Box(0, 1), b=spaces.Discrete(5)))


def _episode_without_time(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` less the episodes' wall-clock times (which no two runs share) and the masks
    a per-env wrapper's episode dict carries inside it."""
    info = dict(info)
    if "episode" in info:
        info["episode"] = {
            k: v for k, v in info["episode"].items() if k not in ("t", "_t", "_l", "_r")
        }
    return info


def _steps(venv: Any, seed: int, actions: list[Any]) -> list[Any]:
    out = suite.trace(venv, seed, actions)
    return [(*o[:-1], _episode_without_time(o[-1])) for o in out]


@pytest.mark.parametrize("how", suite.HOWS)
def test_record_episode_statistics_as_on_sync_vector_env(how):
    fns = [functools.partial(_make, "CartPole-v1")] * 3
    venv = wrappers.vector.RecordEpisodeStatistics(suite.build(fns, how))
    ref = wrappers.vector.RecordEpisodeStatistics(SyncVectorEnv(fns))
    ref.action_space.seed(5)
    actions = [ref.action_space.sample() for _ in range(100)]
    got = _steps(venv, 123, actions)
    suite.assert_same(_steps(ref, 123, actions), got)
    assert any("episode" in o[-1] for o in got)
    assert list(venv.return_queue) == list(ref.return_queue)
    assert list(venv.length_queue) == list(ref.length_queue)
    assert venv.episode_count == ref.episode_count > 0
    venv.close()


# (env factory, wrapper name, its arguments): gymnasium's equivalence cases with no
# optional dependency
CASES = [
    (_dict_obs, "FilterObservation", {"filter_keys": ["a"]}),
    (functools.partial(_make, "CartPole-v1"), "FlattenObservation", {}),
    (
        functools.partial(_make, "CartPole-v1"),
        "RescaleObservation",
        {
            "min_obs": np.array([0, -np.inf, 0, -np.inf]),
            "max_obs": np.array([1, np.inf, 1, np.inf]),
        },
    ),
    (functools.partial(_make, "MountainCarContinuous-v0"), "ClipAction", {}),
    (
        functools.partial(_make, "MountainCarContinuous-v0"),
        "RescaleAction",
        {"min_action": 1, "max_action": 2},
    ),
    (
        functools.partial(_make, "CartPole-v1"),
        "ClipReward",
        {"min_reward": -0.25, "max_reward": 0.75},
    ),
    (functools.partial(_make, "CartPole-v1"), "RecordEpisodeStatistics", {}),
]


# gymnasium's vector observation wrappers refuse SAME_STEP (they would leave final_obs
# untransformed): those run in NEXT_STEP only
_OBS_WRAPPERS = ("FilterObservation", "FlattenObservation", "RescaleObservation")
MODE_CASES = [
    (*case, mode)
    for case in CASES
    for mode in TWO_MODES
    if mode is AutoresetMode.NEXT_STEP or case[1] not in _OBS_WRAPPERS
]


@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize(
    "make, name, kwargs, mode", MODE_CASES, ids=[f"{c[1]}-{c[3].value}" for c in MODE_CASES]
)
def test_vector_wrapper_equals_per_env_wrapper(make, name, kwargs, mode, num_envs):
    """The vector wrapper on the bridge, the single-env wrapper inside each of the bridge's
    sub-envs, and the vector wrapper on ``SyncVectorEnv``: the same spaces and outputs."""
    vector_wrapper = getattr(wrappers.vector, name)
    inner = functools.partial(lambda make: getattr(wrappers, name)(make(), **kwargs), make)
    outer = vector_wrapper(
        suite.build([make] * num_envs, "coroutine", autoreset_mode=mode), **kwargs
    )
    per_env = suite.build([inner] * num_envs, "coroutine", autoreset_mode=mode)
    ref = vector_wrapper(SyncVectorEnv([make] * num_envs, autoreset_mode=mode), **kwargs)
    for other in (per_env, ref):
        for attr in ("action_space", "observation_space", "single_action_space"):
            assert getattr(outer, attr) == getattr(other, attr), attr
        assert outer.single_observation_space == other.single_observation_space
        assert outer.num_envs == other.num_envs == num_envs
    ref.action_space.seed(9)
    actions = [ref.action_space.sample() for _ in range(50)]
    got = _steps(outer, 123, actions)
    # (exact rewards, MountainCarContinuous's -0.1 a^2 included: make_gymnasium_vector's
    # envs keep gymnasium's rewards as float64)
    suite.assert_same(_steps(ref, 123, actions), got)
    if mode is AutoresetMode.NEXT_STEP or name != "RecordEpisodeStatistics":
        # (in SAME_STEP a per-env wrapper's episode info is in final_info, the vector
        # wrapper's at the top, on gymnasium's own vector envs too)
        suite.assert_same(_steps(per_env, 123, actions), got)
    outer.close()
    per_env.close()


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_episode_statistics_in_every_autoreset_mode(mode):
    envs = wrappers.vector.RecordEpisodeStatistics(
        suite.build([lambda: suite.Sampler(length=3)] * 2, "coroutine", autoreset_mode=mode)
    )
    envs.reset(seed=123)
    for _ in range(25):
        *_, terms, truncs, infos = envs.step(envs.action_space.sample())
        done = terms | truncs
        if done.any():
            # every episode: three steps, reward 1 each
            assert np.all(infos["episode"]["r"][done] == 3)
            assert np.all(infos["episode"]["l"][done] == 3)
            if mode is AutoresetMode.DISABLED:
                envs.reset(options={"reset_mask": done.copy()})
    assert envs.episode_count > 2
    assert np.all(np.array(envs.return_queue) == 3) and np.all(np.array(envs.length_queue) == 3)
    envs.close()


LOW = np.array([0, -10, -5], dtype=np.float32)
HIGH = np.array([10, -5, 10], dtype=np.float32)


def _box_obs() -> gym.Env:  # type: ignore[type-arg]
    return suite.Sampler(spaces.Box(LOW, HIGH))


def _box_act() -> gym.Env:  # type: ignore[type-arg]
    return suite.Sampler(act_space=spaces.Box(LOW, HIGH))


@pytest.mark.parametrize("how", ["coroutine", "thread"])
def test_normalize_observation(how):
    venv = wrappers.vector.NormalizeObservation(suite.build([_box_obs] * 3, how))
    ref = wrappers.vector.NormalizeObservation(SyncVectorEnv([_box_obs] * 3))
    assert venv.single_observation_space.dtype == np.float32
    assert np.all(venv.single_observation_space.low == -np.inf)
    assert np.all(venv.single_observation_space.high == np.inf)
    actions = [ref.action_space.sample() for _ in range(250)]
    suite.assert_same(suite.trace(ref, 123, actions), suite.trace(venv, 123, actions))
    assert np.array_equal(venv.obs_rms.mean, ref.obs_rms.mean)
    assert np.array_equal(venv.obs_rms.var, ref.obs_rms.var)
    # normalised: about zero mean and unit variance from here on
    seen = np.array([venv.step(venv.action_space.sample())[0] for _ in range(100)])
    assert seen.dtype == np.float32
    assert np.allclose(seen.mean(axis=(0, 1)), 0, atol=0.15)
    assert np.allclose(seen.var(axis=(0, 1)), 1, atol=0.2)
    # frozen statistics stay as they are; thawed, they move again
    assert venv.update_running_mean
    venv.update_running_mean = False
    mean, var = venv.obs_rms.mean.copy(), venv.obs_rms.var.copy()
    for _ in range(10):
        venv.step(venv.action_space.sample())
    assert np.array_equal(mean, venv.obs_rms.mean) and np.array_equal(var, venv.obs_rms.var)
    venv.update_running_mean = True
    for _ in range(10):
        venv.step(venv.action_space.sample())
    assert np.any(mean != venv.obs_rms.mean) and np.any(var != venv.obs_rms.var)
    venv.close()


def _tenth_normalized() -> gym.Env:  # type: ignore[type-arg]
    return wrappers.NormalizeReward(suite.Tenth())


def test_normalize_reward():
    venv = wrappers.vector.NormalizeReward(suite.build([suite.Tenth] * 3, "coroutine"))
    ref = wrappers.vector.NormalizeReward(SyncVectorEnv([suite.Tenth] * 3))
    actions = [ref.action_space.sample() for _ in range(100)]
    expected, got = suite.trace(ref, 0, actions), suite.trace(venv, 0, actions)
    suite.assert_same(expected, got)
    assert venv.return_rms.count == ref.return_rms.count
    assert np.array_equal(venv.return_rms.var, ref.return_rms.var)
    rewards = np.array([o[1] for o in got[1:]])
    assert rewards.max() > 1  # scaled up: the raw returns vary little
    venv.close()

    # one sub-env: the vector wrapper keeps the statistics the per-env wrapper keeps
    per_env = suite.build([_tenth_normalized], "coroutine")
    single = wrappers.vector.NormalizeReward(suite.build([suite.Tenth], "coroutine"))
    for envs in (per_env, single):
        envs.reset(seed=42)
        for _ in range(50):
            envs.step(np.zeros((1, 1), np.float32))
    (inner,) = per_env.get_attr("return_rms")
    assert single.return_rms.count == inner.count
    assert np.allclose(single.return_rms.mean, inner.mean, rtol=1e-4)
    assert np.allclose(single.return_rms.var, inner.var, rtol=1e-4)
    per_env.close()
    single.close()


def test_transform_observation_and_action():
    obs_env = wrappers.vector.TransformObservation(
        suite.build([_box_obs] * 5, "coroutine"),
        func=lambda x: x + 100,
        single_observation_space=spaces.Box(LOW + 100, HIGH + 100),
    )
    act_env = wrappers.vector.TransformAction(
        suite.build([_box_act] * 5, "coroutine"),
        func=lambda x: x - 100,
        single_action_space=spaces.Box(LOW + 100, HIGH + 100),
    )
    for space, single in (
        (obs_env.observation_space, obs_env.single_observation_space),
        (act_env.action_space, act_env.single_action_space),
    ):
        assert isinstance(space, spaces.Box) and space.shape == (5, 3)
        assert space.dtype == single.dtype == np.float32
        assert np.array_equal(space.low, np.tile(LOW + 100, (5, 1)))
        assert np.array_equal(space.high, np.tile(HIGH + 100, (5, 1)))
    obs, _ = obs_env.reset(seed=123)
    assert obs in obs_env.observation_space
    obs, *_ = obs_env.step(obs_env.action_space.sample())
    assert obs in obs_env.observation_space
    act_env.reset(seed=0)
    act_env.step(act_env.action_space.sample())  # shifted back into the sub-envs' space
    with pytest.raises(ValueError, match="not in"):
        act_env.step(np.zeros((5, 3), np.float32))  # 0 - 100: outside it
    # a batched space that is not the single one's batch: gymnasium warns
    with pytest.warns(Warning, match="don't match as expected"):
        wrappers.vector.TransformObservation(
            suite.build([_box_obs] * 2, "coroutine"),
            func=lambda x: x + 100,
            observation_space=spaces.Box(np.tile(LOW, (2, 1)) + 100, np.tile(HIGH, (2, 1)) + 100),
        )
    with pytest.warns(Warning, match="don't match as expected"):
        wrappers.vector.TransformAction(
            suite.build([_box_act] * 2, "coroutine"),
            func=lambda x: x,
            action_space=spaces.Box(np.tile(LOW, (2, 1)) + 100, np.tile(HIGH, (2, 1)) + 100),
        )
    obs_env.close()
    act_env.close()


def _with_stats() -> gym.Env:  # type: ignore[type-arg]
    return wrappers.RecordEpisodeStatistics(_make("CartPole-v1"))


@pytest.mark.parametrize("how", ["coroutine", "process"])
def test_dict_info_to_list(how):
    venv = wrappers.vector.DictInfoToList(suite.build([_with_stats] * 3, how))
    ref = wrappers.vector.DictInfoToList(SyncVectorEnv([_with_stats] * 3))
    _, info = venv.reset(seed=1)
    assert isinstance(info, list) and len(info) == 3
    actions = [ref.action_space.sample() for _ in range(60)]
    ref.reset(seed=1)
    ended = 0
    for a in actions:
        got, expected = venv.step(a)[-1], ref.step(a)[-1]
        for g, e in zip(got, expected, strict=True):
            if "episode" in e:
                ended += 1
                assert g["episode"]["r"] == e["episode"]["r"]
                assert g["episode"]["l"] == e["episode"]["l"]
            assert g.keys() == e.keys()
    assert ended
    with pytest.raises(TypeError):
        wrappers.vector.DictInfoToList(_make("CartPole-v1"))  # a single env: refused
    venv.close()


def _infos_with_data() -> gym.Env:  # type: ignore[type-arg]
    return suite.Informer({"data": np.array([1, 2, 3])}, {"data": np.array([1.0, 2.0])}, end=False)


@pytest.mark.parametrize("convert", ["NumpyToTorch", "ArrayConversion"])
def test_array_conversion_to_torch(convert):
    torch = pytest.importorskip("torch")
    pytest.importorskip("array_api_compat")
    kwargs = {} if convert == "NumpyToTorch" else {"env_xp": np, "target_xp": torch}
    wrapper = getattr(wrappers.vector, convert)
    venv = wrapper(suite.build([_infos_with_data] * 2, "coroutine"), **kwargs)
    ref = wrapper(SyncVectorEnv([_infos_with_data] * 2), **kwargs)
    obs, info = venv.reset(seed=0)
    ref_obs, ref_info = ref.reset(seed=0)
    assert isinstance(obs, torch.Tensor) and torch.equal(obs, ref_obs)
    assert isinstance(info["data"], torch.Tensor) and torch.equal(info["data"], ref_info["data"])
    action = torch.full((2, 1), 0.5)
    out, ref_out = venv.step(action), ref.step(action)
    for got, expected in zip(out[:4], ref_out[:4]):
        assert isinstance(got, torch.Tensor) and got.dtype == expected.dtype
        assert torch.equal(got, expected)
    assert out[2].dtype == out[3].dtype == torch.bool
    assert torch.equal(out[4]["data"], ref_out[4]["data"])
    assert venv.render() is None
    venv.close()


def test_vectorize_transform_action_and_per_env_dict_observations():
    envs = wrappers.vector.VectorizeTransformAction(
        suite.build([suite.Sampler] * 2, "coroutine"),
        wrapper=wrappers.TransformAction,
        func=lambda a: a["key"],
        action_space=spaces.Dict(key=spaces.Box(0.0, 1.0, (1,), np.float32)),
    )
    assert envs.action_space == spaces.Dict(key=spaces.Box(0.0, 1.0, (2, 1), np.float32))
    envs.reset(seed=0)
    obs, *_ = envs.step(envs.action_space.sample())
    assert obs in envs.observation_space
    envs.close()

    split = functools.partial(
        wrappers.TransformObservation,
        func=lambda x: {"key1": x[0:1], "key2": x[1:]},
        observation_space=spaces.Dict(
            key1=spaces.Box(-np.inf, np.inf, (1,)), key2=spaces.Box(-np.inf, np.inf, (3,))
        ),
    )
    fns = [lambda: split(_make("CartPole-v1"))] * 2
    envs = suite.build(fns, "thread")
    obs, _ = envs.reset(seed=0)
    assert set(obs) == {"key1", "key2"} and obs in envs.observation_space
    obs, *_ = envs.step(envs.action_space.sample())
    assert obs in envs.observation_space
    envs.close()
