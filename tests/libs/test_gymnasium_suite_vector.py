"""Gymnasium's vector-env tests, re-expressed against aenv's bridges (part 1: the API).

Gymnasium 1.4's ``tests/vector`` (``test_vector_env.py``, ``test_sync_vector_env.py``,
``test_async_vector_env.py``, ``test_vector_wrapper.py``) check ``SyncVectorEnv`` /
``AsyncVectorEnv``; here the same behaviour is asked of the bridges: ``make_gymnasium_vector``
on the coroutine backend (the thread and process backends for a representative subset) and
``to_gymnasium_vector`` over a pool built by hand (``"pool"``), compared with gymnasium's
own ``SyncVectorEnv`` wherever a check compares behaviour. Autoreset, observation modes and
infos are in ``test_gymnasium_suite_autoreset.py``, the vector wrappers in
``test_gymnasium_suite_wrappers.py``.

Checked here: equal results with ``SyncVectorEnv`` step for step (CartPole, 100 steps);
shapes and dtypes of reset and step; spaces of every kind in and out; seeds
(``np_random_seed``, ``seed + i``, seeds kept by ``reset(seed=None)``, per-env seed lists,
the action space's random state taken from the sub-env); ``reset_mask`` partial resets and
their errors; the number of actions (``ValueError`` / ``TypeError``); ``render``, ``call``,
``get_attr``, ``set_attr``; metadata not leaking into the sub-envs; spaces of one's own;
float16 observations; ``ClosedEnvironmentError``; a sub-env's exception raised as itself;
``VectorWrapper`` forwarding. And the env checkers of gymnasium and Stable-Baselines3 on
``to_gymnasium`` of single envs of spaces the other bridge tests do not check them on.

Not re-expressed (the bridge does not claim them; README, "Gymnasium, both ways"):
``AsyncVectorEnv``'s own API (``reset_async`` / ``step_wait``, their timeouts and
out-of-order errors, the warnings its workers print, shared memory and its refusal of
custom spaces, ``copy=``), ``SyncVectorEnv.envs``, and the exact wording of
``SyncVectorEnv``'s unlike-spaces error (the bridge raises ``SpaceMismatchError``, a
``RuntimeError``). ``BipedalWalker`` (Box2D) in the action-seed check is replaced by
``MountainCarContinuous`` (a ``Box`` action too), and the env-determinism check runs over
the classic-control and toy-text envs (those needing no optional dependency).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import ClosedEnvironmentError
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space
from libs import _gymnasium_suite as suite

from aenv.exceptions import PoolError
from aenv.libs.gym import GymWrapper, to_gymnasium

pytestmark = pytest.mark.timeout(60)

HOWS = suite.HOWS
CHEAP = ["coroutine", "pool"]


# every route in NEXT_STEP; SAME_STEP on the cheap ones (the other backends share its code)
PAIRS = [(how, AutoresetMode.NEXT_STEP) for how in HOWS] + [
    (how, AutoresetMode.SAME_STEP) for how in CHEAP
]


@pytest.mark.parametrize("how, mode", PAIRS, ids=lambda x: getattr(x, "value", x))
def test_same_results_as_sync_vector_env(how, mode):
    fns = [suite.seeded("CartPole-v1", i) for i in range(4)]
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    venv = suite.build(fns, how, autoreset_mode=mode)
    assert venv.num_envs == ref.num_envs == 4
    for name in ("observation_space", "single_observation_space"):
        assert getattr(venv, name) == getattr(ref, name)
    for name in ("action_space", "single_action_space"):
        assert getattr(venv, name) == getattr(ref, name)
    ref.action_space.seed(7)
    actions = [ref.action_space.sample() for _ in range(100)]
    expected = suite.trace(ref, 0, actions)
    got = suite.trace(venv, 0, actions)
    suite.assert_same(expected, got)
    assert any(step[2].any() for step in got[1:])  # episodes ended, sub-envs restarted
    ref.close()
    venv.close()


@pytest.mark.parametrize("how", CHEAP)
def test_reset_and_step_shapes_and_dtypes(how):
    venv = suite.build([suite.seeded("CartPole-v1", i) for i in range(8)], how)
    assert venv.num_envs == 8
    obs, infos = venv.reset()
    assert isinstance(venv.observation_space, spaces.Box)
    assert isinstance(obs, np.ndarray) and isinstance(infos, dict)
    assert obs.dtype == venv.observation_space.dtype
    assert obs.shape == (8, *venv.single_observation_space.shape) == venv.observation_space.shape
    venv.close()

    lake = suite.build([suite.seeded("FrozenLake-v1", i) for i in range(8)], how)
    lake.reset()
    assert isinstance(lake.single_action_space, spaces.Discrete)
    assert isinstance(lake.action_space, spaces.MultiDiscrete)
    # a batch sampled from the vector space, or one action per sub-env from the single one
    for actions in (lake.action_space.sample(), [lake.single_action_space.sample()] * 8):
        obs, rewards, terms, truncs, _ = lake.step(actions)
        assert isinstance(lake.observation_space, spaces.MultiDiscrete)
        assert obs.dtype == lake.observation_space.dtype
        assert obs.shape == (8,) == lake.observation_space.shape
        assert rewards.shape == (8,) and isinstance(rewards[0], np.floating)
        for flags in (terms, truncs):
            assert flags.dtype == np.bool_ and flags.shape == (8,)
    lake.close()


# spaces of gymnasium's space tests that tests/libs/test_to_gymnasium_vector.py does not
# already cross (it has int8 / start MultiDiscrete, bool Box, Sequence, Graph, OneOf, Text)
SPACES = [
    spaces.Discrete(3, start=-1),
    spaces.Box(0.0, np.inf, (2, 2)),
    spaces.Box(np.array([-10.0, 0.0]), np.array([10.0, 10.0]), dtype=np.float64),
    spaces.Box(-np.inf, 0.0, (2, 1)),
    spaces.MultiDiscrete([2, 2], start=[10, 10]),
    spaces.MultiDiscrete([[2, 3], [3, 2]], start=[[10, 20], [30, 40]]),
    spaces.MultiDiscrete([2, 3], dtype=np.uint16),
    spaces.MultiBinary(8),
    spaces.MultiBinary([2, 3]),
    spaces.Text(min_length=3, max_length=6),
    spaces.Text(6, charset="abcdef"),
    spaces.Tuple(
        (spaces.Discrete(5), spaces.Tuple((spaces.Box(0.0, 1.0, (3,)), spaces.Discrete(2))))
    ),
    spaces.Tuple((spaces.Discrete(3), spaces.Dict(p=spaces.Box(0.0, 1.0), v=spaces.Discrete(2)))),
    spaces.Tuple((spaces.Graph(spaces.Box(-1, 1, (2, 1)), None), spaces.Discrete(2))),
    spaces.Dict(
        a=spaces.Box(0, 1, (3, 3)),
        b=spaces.Dict(b1=spaces.Box(-100, 100, (2,)), b2=spaces.Box(-1, 1, (2,))),
        c=spaces.Discrete(4),
    ),
    spaces.Graph(spaces.Box(-1, 1, (2,)), None),
    spaces.Sequence(spaces.Dict(a=spaces.Discrete(3), b=spaces.Box(0, 1, (2,)))),
]


@pytest.mark.parametrize("space", SPACES, ids=str)
def test_every_space_as_observation_and_action(space):
    """Observation and action of one space: the batched spaces are gymnasium's, reset and
    step give values in them, equal to ``SyncVectorEnv``'s under the same seeds."""
    fns = [lambda: suite.Sampler(space, space)] * 3
    ref = SyncVectorEnv(fns)
    venv = suite.build(fns, "coroutine")
    assert venv.observation_space == batch_space(space, 3) == ref.observation_space
    assert venv.action_space == ref.action_space
    ref.action_space.seed(3)
    actions = [ref.action_space.sample() for _ in range(3)]
    got = suite.trace(venv, 0, actions)
    for out in got:
        assert out[0] in venv.observation_space
    suite.assert_same(suite.trace(ref, 0, actions), got)
    venv.close()


@pytest.mark.parametrize("space", SPACES, ids=str)
def test_gymnasium_env_checker_on_a_bridged_single_env(space):
    """gymnasium's ``check_env`` on ``to_gymnasium`` of an env of each space (observation and
    action): seeding, spaces, reset and step results in them."""
    env = to_gymnasium(GymWrapper(suite.Sampler(space, space), categorical_action_encoding=True))
    assert env.observation_space == space and env.action_space == space
    check_env(env, skip_render_check=True)
    env.close()


# spaces SB3 takes that tests/libs/test_to_gymnasium_vector.py's SB3 check does not cover
SB3_SPACES = [
    (spaces.MultiBinary(6), spaces.Discrete(3)),
    (spaces.Box(0, 255, (16, 16, 3), np.uint8), spaces.Discrete(4)),
    (spaces.Discrete(7), spaces.MultiBinary(2)),
    (
        spaces.Dict(a=spaces.Box(-1, 1, (2,)), b=spaces.MultiDiscrete([3, 2])),
        spaces.Box(-1, 1, (2,), np.float32),
    ),
]


@pytest.mark.parametrize("obs_space, act_space", SB3_SPACES, ids=str)
def test_sb3_env_checker_on_a_bridged_single_env(obs_space, act_space):
    sb3_checker = pytest.importorskip("stable_baselines3.common.env_checker")
    env = to_gymnasium(
        GymWrapper(suite.Sampler(obs_space, act_space), categorical_action_encoding=True)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its advice (normalise Box spaces) is no failure
        sb3_checker.check_env(env, warn=True)
    env.close()


def test_spaces_of_ones_own():
    """A space with no batching rule: batched as a ``Tuple`` of it, values as given."""
    venv = suite.build([suite.Echo] * 4, "coroutine")
    assert isinstance(venv.single_observation_space, suite.Digit)
    assert isinstance(venv.single_action_space, suite.Digit)
    assert isinstance(venv.observation_space, spaces.Tuple)
    assert isinstance(venv.action_space, spaces.Tuple)
    obs, _ = venv.reset()
    assert obs == ("start",) * 4
    obs, *_ = venv.step(("a", "b", 3, None))
    assert obs == ("got a", "got b", "got 3", "got None")
    venv.close()


def test_float16_observations_keep_their_dtype():
    box = spaces.Box(-1.0, 1.0, (3,), np.float16)
    venv = suite.build([lambda: suite.Sampler(box)] * 2, "coroutine")
    obs, _ = venv.reset(seed=0)
    assert obs.dtype == np.float16 and obs.shape == (2, 3)
    obs, *_ = venv.step(venv.action_space.sample())
    assert obs.dtype == np.float16 and obs.shape == (2, 3) and obs in venv.observation_space
    venv.close()


@pytest.mark.parametrize("how", HOWS)
def test_seeds(how):
    fns = [suite.seeded("CartPole-v1", i) for i in range(4)]
    venv = suite.build(fns, how)
    # each factory reset its env with seed i: the seeds are there before any reset
    assert venv.np_random_seed == (0, 1, 2, 3)
    venv.reset(seed=42)
    assert venv.np_random_seed == (42, 43, 44, 45)
    venv.reset()  # no seed: the sub-envs keep theirs
    assert venv.np_random_seed == (42, 43, 44, 45)
    obs, _ = venv.reset(seed=[5, 100, 7, 9])
    assert venv.np_random_seed == (5, 100, 7, 9)
    ref = SyncVectorEnv(fns)
    ref_obs, _ = ref.reset(seed=[5, 100, 7, 9])
    assert np.array_equal(obs, ref_obs)
    with pytest.raises(ValueError):
        venv.reset(seed=[1, 2])
    venv.close()


def test_action_space_random_state_follows_the_sub_env():
    """The batched action space starts from the sub-env's action-space random state (as
    ``SyncVectorEnv``'s does): the same samples as the single env's."""
    env = suite.seeded("MountainCarContinuous-v0", 123)()
    venv = suite.build([suite.seeded("MountainCarContinuous-v0", 123)], "coroutine")
    assert env.action_space.np_random.bit_generator.state == (
        venv.action_space.np_random.bit_generator.state
    )
    for _ in range(50):
        assert np.array_equal(env.action_space.sample()[None], venv.action_space.sample())
    venv.close()


ENV_IDS = [
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
    "FrozenLake-v1",
    "CliffWalking-v1",
    "Taxi-v4",
    "Blackjack-v1",
]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_determinism_of_action_samples(env_id):
    """Two bridges of envs seeded alike sample the same actions, as ``SyncVectorEnv`` does."""
    one = suite.build([suite.seeded(env_id, 123)] * 3, "coroutine")
    two = suite.build([suite.seeded(env_id, 123)] * 3, "coroutine")
    ref = SyncVectorEnv([suite.seeded(env_id, 123)] * 3)
    for _ in range(30):
        a = one.action_space.sample()
        assert data_equivalence(a, two.action_space.sample())
        assert data_equivalence(a, ref.action_space.sample())
    one.close()
    two.close()


@pytest.mark.parametrize("how", CHEAP)
def test_partial_reset_with_a_mask(how):
    fns = [suite.seeded("CartPole-v1", 0)] * 3
    venv = suite.build(fns, how, autoreset_mode=AutoresetMode.DISABLED)
    first, _ = venv.reset(seed=[0, 1, 2])
    venv.action_space.seed(123)
    for _ in range(3):
        stepped, *_ = venv.step(venv.action_space.sample())
    obs, _ = venv.reset(seed=[0, 1, 0], options={"reset_mask": np.array([True, True, False])})
    assert np.array_equal(obs[:2], first[:2])  # restarted with their first seeds
    assert np.array_equal(obs[2], stepped[2])  # kept where it was
    venv.close()


def test_reset_mask_errors():
    venv = suite.build([suite.seeded("CartPole-v1", 0)] * 3, "coroutine", autoreset_mode="Disabled")
    venv.reset(options={"reset_mask": np.array([True, True, True])})
    for bad in ([True], [True] * 4, [[True] * 3]):
        mask = np.array(bad)
        with pytest.raises(ValueError) as err:
            venv.reset(options={"reset_mask": mask})
        # the message names the option, the shape it needs and the one it got
        assert "reset_mask" in str(err.value) and "(3,)" in str(err.value)
        assert str(mask.shape) in str(err.value)
    with pytest.raises(ValueError, match="at least one True"):
        venv.reset(options={"reset_mask": np.zeros(3, bool)})
    for values in ([1, 1, 0], [1.0, 1.0, 0.0]):
        mask = np.array(values)
        with pytest.raises(TypeError, match=f"np.bool_.*{mask.dtype}"):
            venv.reset(options={"reset_mask": mask})
    venv.close()


@pytest.mark.parametrize("how", CHEAP)
def test_number_of_actions(how):
    venv = suite.build(
        [suite.seeded("CartPole-v1", i) for i in range(4)], how, autoreset_mode="Disabled"
    )
    venv.reset()
    actions = venv.action_space.sample()
    obs, rewards, terms, truncs, _ = venv.step(actions)
    assert len(obs) == len(rewards) == len(terms) == len(truncs) == 4
    with pytest.raises(ValueError):
        venv.step(actions[:3])
    with pytest.raises(ValueError):
        venv.step(np.concatenate([actions, actions[:1]]))
    with pytest.raises(TypeError):
        venv.step(0)
    venv.close()


@pytest.mark.parametrize("how", HOWS)
def test_render_call_get_attr_set_attr(how):
    venv = suite.build(
        [suite.seeded("CartPole-v1", i, render_mode="rgb_array") for i in range(3)], how
    )
    assert venv.render_mode == "rgb_array"
    venv.reset()
    frames = venv.render()
    assert isinstance(frames, tuple) and len(frames) == 3
    assert all(isinstance(f, np.ndarray) and f.ndim == 3 for f in frames)
    gravity = venv.call("gravity")  # an attribute, not a method: read
    assert gravity == (9.8, 9.8, 9.8) and all(isinstance(g, float) for g in gravity)
    venv.set_attr("gravity", [9.81, 3.72, 8.87])
    assert venv.get_attr("gravity") == (9.81, 3.72, 8.87)
    venv.close()

    listing = suite.build(
        [suite.seeded("CartPole-v1", i, render_mode="rgb_array_list") for i in range(2)], how
    )
    listing.reset()
    images = listing.call("render")  # a method: called on every sub-env
    assert isinstance(images, tuple) and len(images) == 2
    assert all(len(i) == 1 and isinstance(i[0], np.ndarray) for i in images)
    listing.close()
    plain = suite.build([suite.seeded("CartPole-v1", 0)], how)
    assert plain.render_mode is None
    plain.close()


def test_metadata_stays_the_vector_envs():
    one = suite.build([suite.seeded("CartPole-v1", 0)], "coroutine", autoreset_mode="NextStep")
    two = suite.build([suite.seeded("CartPole-v1", 1)], "coroutine", autoreset_mode="SameStep")
    assert one.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert two.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert "autoreset_mode" not in one.get_attr("metadata")[0]
    one.close()
    two.close()


@pytest.mark.parametrize("how", CHEAP)
def test_closed_env_refuses_calls(how):
    venv = suite.build([suite.seeded("CartPole-v1", i) for i in range(2)], how)
    venv.reset()
    venv.close()
    with pytest.raises(ClosedEnvironmentError):
        venv.reset()
    with pytest.raises(ClosedEnvironmentError):
        venv.step(np.zeros(2, np.int64))
    venv.close()  # closing twice is harmless


@pytest.mark.parametrize("how", HOWS)
def test_a_sub_env_error_is_raised_as_itself(how):
    """A sub-env's exception comes out with its own type and message, as from gymnasium's
    vector envs (a bad seed in reset, a bad action in step)."""
    venv = suite.build([suite.Faulty] * 3, how)
    venv.reset(seed=[0, 0, 0])
    with pytest.raises(ValueError, match="reset refused seed 1") as err:
        venv.reset(seed=[1, 0, 0])
    # the pool's own account (every failing env, the others' results) stays reachable
    assert isinstance(err.value.__context__, PoolError)
    assert list(err.value.__context__.errors) == [0]
    venv.reset(seed=[0, 2, 3])
    with pytest.raises(ValueError, match="step refused action 1"):
        venv.step(np.array([0, 1, 2]))
    venv.close()


class _CountingResets(VectorWrapper):
    def __init__(self, env) -> None:
        super().__init__(env)
        self.resets = 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        return super().reset(seed=seed, options=options)


def test_vector_wrapper_forwards_to_the_bridge():
    venv = suite.build([suite.seeded("CartPole-v1", i) for i in range(3)], "coroutine")
    wrapped = _CountingResets(venv)
    wrapped.reset()
    assert wrapped.resets == 1
    assert wrapped.metadata == venv.metadata
    assert wrapped.env.call("gravity") == (9.8,) * 3
    wrapped.env.set_attr("gravity", [20.0, 20.0, 20.0])
    assert wrapped.env.get_attr("gravity") == (20.0,) * 3
    wrapped.metadata = {"render_modes": ["rgb_array"]}  # the wrapper's own from now on
    assert venv.metadata != wrapped.metadata
    wrapped.close()
