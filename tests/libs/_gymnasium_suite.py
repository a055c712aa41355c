"""Small gymnasium envs and bridge builders for the tests/libs/test_gymnasium_suite*.py files.

The envs live here (a module of their own, not a test module) so that the process backend's
workers import them by name. Each is written for what one group of checks needs: a counter
whose episodes end at a settable step, an env sampling any space, one returning given infos,
one of a space of one's own, one that fails on demand, one paying a reward every tenth step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence

from aenv.libs.gym import GymWrapper, InfoAsEntry, make_gymnasium_vector, to_gymnasium_vector
from aenv.pool import AsyncEnvPool

# "pool": to_gymnasium_vector over an AsyncEnvPool built here; the others make_gymnasium_vector
HOWS = ["coroutine", "pool", "thread", "process"]


class Counter(gym.Env):  # type: ignore[type-arg]
    """Observes a step count (reset sets it to the seed, else 0); the reward is the action;
    the episode terminates when the count reaches ``limit`` (set it with ``set_attr``)."""

    def __init__(self, limit: int = 3) -> None:
        self.observation_space = spaces.Discrete(5)
        self.action_space = spaces.Discrete(5)
        self.limit = limit

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.count = 0 if seed is None else seed
        return self.count, {}

    def step(self, action: Any):
        self.count += 1
        return self.count, float(action), self.count == self.limit, False, {}


class Sampler(gym.Env):  # type: ignore[type-arg]
    """Observations sampled from ``obs_space`` (seeded by reset); actions must be in
    ``act_space``; an episode lasts ``length`` steps (0: forever), reward 1 a step."""

    def __init__(
        self,
        obs_space: spaces.Space | None = None,  # type: ignore[type-arg]
        act_space: spaces.Space | None = None,  # type: ignore[type-arg]
        length: int = 0,
    ) -> None:
        self.observation_space = obs_space or spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = act_space or spaces.Box(0.0, 1.0, (1,), np.float32)
        self.length = length

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.observation_space.seed(self.np_random_seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action: Any):
        if action not in self.action_space:
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self.t += 1
        done = self.length > 0 and self.t >= self.length
        return self.observation_space.sample(), 1.0, done, False, {}


class Informer(gym.Env):  # type: ignore[type-arg]
    """Returns ``reset_info`` from reset and ``step_info`` from every step (which ends the
    episode when ``end`` is set)."""

    def __init__(self, reset_info: dict[str, Any], step_info: dict[str, Any], end: bool = True):
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.reset_info, self.step_info, self.end = reset_info, step_info, end

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), dict(self.reset_info)

    def step(self, action: Any):
        return np.ones(1, np.float32), 0.0, self.end, False, dict(self.step_info)


class Digit(gym.Space):  # type: ignore[type-arg]
    """A space of one's own (no batching rule in gymnasium): its values are anything."""

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        return int(self.np_random.integers(0, 10))

    def contains(self, x: Any) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Digit)


class Echo(gym.Env):  # type: ignore[type-arg]
    """Spaces of one's own: reset observes ``"start"``, a step echoes its action in a string."""

    def __init__(self) -> None:
        self.observation_space = Digit()
        self.action_space = Digit()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action: Any):
        return f"got {action}", 0.0, False, False, {}


class Faulty(gym.Env):  # type: ignore[type-arg]
    """Raises ``ValueError`` from a reset seeded 1 and from a step with an action >= 1."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed == 1:
            raise ValueError("reset refused seed 1")
        return np.zeros(1, np.float32), {}

    def step(self, action: Any):
        if action >= 1:
            raise ValueError(f"step refused action {action}")
        return np.zeros(1, np.float32), 0.0, False, False, {}


class Tenth(gym.Env):  # type: ignore[type-arg]
    """Episodes of ten steps; the tenth pays 1, the others 0 (for reward normalisation)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action: Any):
        self.t += 1
        end = self.t == 10
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), float(end), end, False, {}


def _seeded(env_id: str, seed: int, kwargs: dict[str, Any]) -> gym.Env:  # type: ignore[type-arg]
    env = gym.make(env_id, disable_env_checker=True, **kwargs)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    return env


def seeded(env_id: str, seed: int, **kwargs: Any) -> Callable[[], gym.Env]:  # type: ignore[type-arg]
    """A factory of registered env ``env_id``, reset with ``seed`` and its action space seeded
    with it (what a vector env's seeds and action samples then follow)."""
    return functools.partial(_seeded, env_id, seed, kwargs)


def _wrap(fn: Callable[[], Any]) -> GymWrapper:
    env = GymWrapper(fn(), categorical_action_encoding=True)
    env.set_info_dict_reader(InfoAsEntry())
    return env


def build(fns: Sequence[Callable[[], Any]], how: str, **kwargs: Any) -> Any:
    """The bridge over ``fns``: ``make_gymnasium_vector`` on backend ``how``, or (``"pool"``)
    ``to_gymnasium_vector`` over a coroutine pool of wrapped envs built here."""
    if how != "pool":
        return make_gymnasium_vector(fns, backend=how, **kwargs)
    pool = AsyncEnvPool([functools.partial(_wrap, fn) for fn in fns], backend="coroutine")
    return to_gymnasium_vector(pool, **kwargs)


def trace(venv: Any, seed: Any, actions: Sequence[Any], disabled: bool = False) -> list[Any]:
    """What ``venv`` returns over a reset and ``actions``; with ``disabled`` (no autoreset),
    finished sub-envs are reset with a mask after each step."""
    out: list[Any] = [venv.reset(seed=seed)]
    for a in actions:
        step = venv.step(a)
        out.append(step)
        done = np.logical_or(step[2], step[3])
        if disabled and done.any():
            out.append(venv.reset(options={"reset_mask": done}))
    return out


def assert_same(expected: list[Any], got: list[Any], float32_rewards: bool = False) -> None:
    """Equal traces: every array of the same dtype and values, every info the same.

    With ``float32_rewards``, step rewards are compared as float32 values: aenv's reward
    spec is float32, so a reward that is not a float32 value comes back rounded (README).
    """
    assert len(expected) == len(got)
    for t, (e, g) in enumerate(zip(expected, got)):
        if float32_rewards and len(e) == 5:
            assert e[1].dtype == g[1].dtype
            assert np.array_equal(e[1].astype(np.float32), g[1].astype(np.float32)), t
            e, g = (*e[:1], *e[2:]), (*g[:1], *g[2:])
        assert data_equivalence(e, g, exact=True), f"item {t}: {e!r} != {g!r}"
