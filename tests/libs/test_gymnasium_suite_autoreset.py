"""Gymnasium's vector-env tests, re-expressed against aenv's bridges (part 2: autoreset,
observation modes, infos).

From gymnasium 1.4's ``tests/vector/test_autoreset_mode.py``, ``test_observation_mode.py``,
``test_vector_env_info.py`` and ``test_vector_env.py::test_final_obs_info``: the three
autoreset modes step by step on a counting env (what each step returns, which action is
ignored, ``final_obs`` / ``final_info`` and their masks), ``metadata["autoreset_mode"]`` from
the enum or its value, ``final_obs`` in the single observation space for spaces of every
kind; the observation modes (``"same"`` refusing unlike bounds, ``"different"`` and an
explicit pair of spaces batching them, unlike shapes or kinds refused, a bad mode name);
infos aggregated as gymnasium aggregates them (``info[k]`` and its ``info["_k"]`` mask,
nested dicts, keys only some sub-envs give, values of any type), compared with
``SyncVectorEnv``. Run on the coroutine backend and a hand-built pool, and on the thread and
process backends for the autoreset and info cases.

Not re-expressed: ``test_make_vec_autoreset`` and ``VectorEnv._add_info`` on a bare
``VectorEnv`` test gymnasium's own ``make_vec`` and base class, not a vector env (the info
aggregation they pin down is checked here through the bridge's outputs instead).
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_differing_spaces
from libs import _gymnasium_suite as suite

pytestmark = pytest.mark.timeout(60)

HOWS = suite.HOWS
MODES = list(AutoresetMode)


def _counters(how, mode):
    venv = suite.build([suite.Counter] * 3, how, autoreset_mode=mode)
    assert venv.metadata["autoreset_mode"] is mode
    venv.set_attr("limit", [2, 3, 3])
    assert venv.get_attr("limit") == (2, 3, 3)
    return venv


def _check(out, obs, rewards, terms, info=None):
    assert np.array_equal(out[0], obs), out[0]
    assert np.array_equal(out[1], rewards), out[1]
    assert np.array_equal(out[2], terms), out[2]
    assert not out[3].any()
    if info is not None:
        assert data_equivalence(out[4], info), out[4]


@pytest.mark.parametrize("how", HOWS)
def test_next_step(how):
    """A finished sub-env shows its next episode's start one step later, with reward 0 and
    not done; the action it gets on that step is ignored."""
    venv = _counters(how, AutoresetMode.NEXT_STEP)
    obs, info = venv.reset()
    assert np.array_equal(obs, [0, 0, 0]) and info == {}
    F, T = False, True
    _check(venv.step([1, 2, 3]), [1, 1, 1], [1, 2, 3], [F, F, F], {})
    _check(venv.step([1, 2, 3]), [2, 2, 2], [1, 2, 3], [T, F, F], {})
    _check(venv.step([1, 2, 3]), [0, 3, 3], [0, 2, 3], [F, T, T], {})
    _check(venv.step([1, 2, 3]), [1, 0, 0], [1, 0, 0], [F, F, F], {})
    venv.close()


def _finals(obs_or_none, mask):
    # the final observations as values of the space's dtype (np.int64 for a Discrete), where
    # SyncVectorEnv passes on what the sub-env returned (a python int here): README
    final_obs = np.empty(3, dtype=object)
    final_obs[:] = [None if o is None else np.int64(o) for o in obs_or_none]
    return {
        "final_obs": final_obs,
        "_final_obs": np.array(mask),
        "final_info": {},
        "_final_info": np.array(mask),
    }


@pytest.mark.parametrize("how", HOWS)
def test_same_step(how):
    """A finished sub-env shows its next episode's start on the step that ends the episode;
    the last observation and info are in ``final_obs`` / ``final_info``."""
    venv = _counters(how, AutoresetMode.SAME_STEP)
    obs, info = venv.reset()
    assert np.array_equal(obs, [0, 0, 0]) and info == {}
    F, T = False, True
    _check(venv.step([1, 2, 3]), [1, 1, 1], [1, 2, 3], [F, F, F], {})
    _check(
        venv.step([1, 2, 3]), [0, 2, 2], [1, 2, 3], [T, F, F], _finals([2, None, None], [T, F, F])
    )
    _check(venv.step([1, 2, 3]), [1, 0, 0], [1, 2, 3], [F, T, T], _finals([None, 3, 3], [F, T, T]))
    _check(
        venv.step([1, 2, 3]), [0, 1, 1], [1, 2, 3], [T, F, F], _finals([2, None, None], [T, F, F])
    )
    venv.close()


@pytest.mark.parametrize("how", HOWS)
def test_disabled(how):
    """A finished sub-env waits for ``reset(options={"reset_mask": ...})``; the others keep
    their state through that reset."""
    venv = _counters(how, AutoresetMode.DISABLED)
    obs, info = venv.reset()
    assert np.array_equal(obs, [0, 0, 0]) and info == {}
    F, T = False, True
    _check(venv.step([1, 2, 3]), [1, 1, 1], [1, 2, 3], [F, F, F], {})
    out = venv.step([1, 2, 3])
    _check(out, [2, 2, 2], [1, 2, 3], [T, F, F], {})
    obs, info = venv.reset(options={"reset_mask": out[2]})
    assert np.array_equal(obs, [0, 2, 2]) and info == {}
    out = venv.step([1, 2, 3])
    _check(out, [1, 3, 3], [1, 2, 3], [F, T, T], {})
    obs, info = venv.reset(options={"reset_mask": out[2]})
    assert np.array_equal(obs, [1, 0, 0]) and info == {}
    _check(venv.step([1, 2, 3]), [2, 1, 1], [1, 2, 3], [T, F, F], {})
    venv.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_autoreset_mode_metadata_from_enum_or_value(mode):
    for given in (mode, mode.value):
        venv = suite.build([suite.Sampler] * 2, "coroutine", autoreset_mode=given)
        assert venv.metadata["autoreset_mode"] is mode
        venv.close()


FINAL_OBS_SPACES = [
    spaces.Discrete(5, start=-2),
    spaces.Box(0, 255, (4, 4, 3), np.uint8),
    spaces.MultiBinary(5),
    spaces.Tuple((spaces.Discrete(3), spaces.Box(0.0, 1.0, (2,)))),
    spaces.Dict(p=spaces.Dict(x=spaces.Discrete(29)), v=spaces.Box(0, 255, (), np.uint8)),
    spaces.Text(4),
    spaces.Graph(spaces.Box(-1, 1, (2,)), spaces.Discrete(3)),
]


@pytest.mark.parametrize("space", FINAL_OBS_SPACES, ids=str)
def test_same_step_final_obs_in_the_single_space(space):
    venv = suite.build(
        [lambda: suite.Sampler(space, spaces.Discrete(2), length=2)] * 3,
        "coroutine",
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    venv.reset(seed=0)
    venv.step([0, 1, 1])
    *_, info = venv.step([0, 1, 1])
    assert info["_final_obs"].all()
    for final in info["final_obs"]:
        assert final in venv.single_observation_space
    venv.close()


@pytest.mark.parametrize("how", HOWS)
def test_infos_aggregated_with_masks(how):
    fns = [
        lambda: suite.Informer({"a": 1}, {"c": np.array([1, 2])}),
        lambda: suite.Informer({"a": 2, "b": 3}, {"c": np.array([3, 4])}),
    ]
    venv = suite.build(fns, how)
    _, info = venv.reset()
    expected = {"a": np.array([1, 2]), "_a": np.array([True, True])}
    expected |= {"b": np.array([0, 3]), "_b": np.array([False, True])}
    assert data_equivalence(info, expected)
    *_, info = venv.step(venv.action_space.sample())
    assert data_equivalence(info, {"c": np.array([[1, 2], [3, 4]]), "_c": np.array([True, True])})
    venv.close()


# infos of every shape gymnasium aggregates: numbers, None, arrays, objects, nested dicts,
# keys only some sub-envs give
INFOS = [
    ({"a": 0, "b": 0.0, "c": None, "d": np.zeros(2), "e": spaces.Discrete(1)}, {"n": 1}),
    ({"a": 1, "b": 1.0, "c": None, "d": np.ones(2)}, {"episode": {"r": 1.5, "l": 3}, "n": 2}),
    ({"e": spaces.Discrete(3), "s": "text"}, {"episode": {"r": 2.5}, "m": [1, 2]}),
]


# every mode on the cheap routes; SAME_STEP (with final_info, the richest) on the others,
# whose infos go through the same aggregation
PAIRS = [(how, mode) for how in ("coroutine", "pool") for mode in MODES] + [
    (how, AutoresetMode.SAME_STEP) for how in ("thread", "process")
]


@pytest.mark.parametrize("how, mode", PAIRS, ids=lambda x: getattr(x, "value", x))
def test_infos_of_every_kind_match_sync_vector_env(how, mode):
    fns = [lambda r=r, s=s: suite.Informer(r, s) for r, s in INFOS]
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    venv = suite.build(fns, how, autoreset_mode=mode)
    actions = [ref.action_space.sample() for _ in range(4)]
    disabled = mode is AutoresetMode.DISABLED
    expected = suite.trace(ref, 0, actions, disabled)
    got = suite.trace(venv, 0, actions, disabled)
    for e, g in zip(expected, got):
        assert data_equivalence(e[-1], g[-1]), (e[-1], g[-1])  # the infos, exactly
    venv.close()


def test_final_obs_and_reset_info_in_next_step():
    """gymnasium's final-observation check in NEXT_STEP: the step after an episode's end
    returns the reset's observation and info, and ignores its action (even one outside
    the action space)."""

    class Ends(suite.Informer):
        def __init__(self):
            super().__init__({"reset": True}, {})
            self.observation_space = spaces.Discrete(4)
            self.action_space = spaces.Discrete(4)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return 0, {"reset": True}

        def step(self, action):
            assert action in self.action_space
            return (action if action < 3 else 0), 0.0, action >= 3, False, {"action": action}

    venv = suite.build([Ends], "coroutine")
    obs, info = venv.reset()
    assert obs == np.array([0]) and info == {"reset": np.array([True]), "_reset": np.array([True])}
    for a in (1, 2):
        obs, _, term, _, info = venv.step([a])
        assert obs == np.array([a]) and not term[0]
        assert info == {"action": np.array([a]), "_action": np.array([True])}
    obs, _, term, _, info = venv.step([3])
    assert obs == np.array([0]) and term[0]
    assert info == {"action": np.array([3]), "_action": np.array([True])}
    obs, _, term, _, info = venv.step([4])  # not in Discrete(4): ignored on this step
    assert obs == np.array([0]) and not term[0]
    assert info == {"reset": np.array([True]), "_reset": np.array([True])}
    venv.close()


def _boxes(highs, shape=(2,)):
    return [lambda h=h: suite.Sampler(spaces.Box(0, h, shape)) for h in highs]


@pytest.mark.parametrize("how", ["coroutine", "pool"])
def test_observation_modes(how):
    with pytest.raises(ValueError, match="observation_mode"):
        suite.build(_boxes([1, 1, 1]), how, observation_mode="invalid")
    # "same" refuses unlike bounds, and says what to use instead
    with pytest.raises(RuntimeError, match="observation_mode='different'"):
        suite.build(_boxes([1, 2, 3]), how, observation_mode="same")

    singles = [spaces.Box(0, h, (5,)) for h in (1, 2, 3)]
    pair = (
        spaces.Box(0, np.repeat(np.arange(1, 4), 5).reshape((3, 5)), (3, 5)),
        spaces.Box(0, 1, (5,)),
    )
    for mode in ("different", pair):
        venv = suite.build(_boxes([1, 2, 3], (5,)), how, observation_mode=mode)
        assert venv.observation_space == batch_differing_spaces(singles)
        assert venv.single_observation_space == singles[0]
        obs, _ = venv.reset(seed=0)
        assert obs in venv.observation_space
        obs, *_ = venv.step(venv.action_space.sample())
        assert obs in venv.observation_space
        venv.close()


@pytest.mark.parametrize(
    "mode", ["same", "different", (spaces.Box(0, 4, (3, 5)), spaces.Box(0, 4, (5,)))], ids=str
)
def test_unlike_shapes_or_kinds_are_refused(mode):
    shapes = [lambda i=i: suite.Sampler(spaces.Box(0, 1, (i + 1,))) for i in range(3)]
    kinds = [
        lambda: suite.Sampler(spaces.Box(0, 1, (3,))),
        lambda: suite.Sampler(spaces.Discrete(5)),
        lambda: suite.Sampler(spaces.Dict(a=spaces.Discrete(2), b=spaces.Box(0, 1, (2,)))),
    ]
    for fns in (shapes, kinds):
        with pytest.raises((RuntimeError, ValueError, TypeError)):
            suite.build(fns, "coroutine", observation_mode=mode)
