"""Fixtures: small gymnasium envs for the gym tests: Dict and Tuple observations, a self-resetting one."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class DictObsEnv(gym.Env):
    """A 1-D walk: Dict observation (position Box, steps Discrete), Discrete(3) action."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, max_steps: int = 6) -> None:
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32),
                "steps": spaces.Discrete(max_steps + 1),
            }
        )
        self.action_space = spaces.Discrete(3)
        self.max_steps = max_steps

    def _obs(self) -> dict[str, Any]:
        return {"position": self.pos.copy(), "steps": self.t}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, size=2).astype(np.float32)
        self.t = 0
        return self._obs(), {"start": float(self.pos[0])}

    def step(self, action: Any):
        self.pos = np.clip(self.pos + (int(action) - 1) * 0.5, -10, 10).astype(np.float32)
        self.t += 1
        terminated = bool(abs(self.pos[0]) >= 2.0)
        truncated = self.t >= self.max_steps and not terminated
        info = {"dist": float(np.abs(self.pos).sum()), "t": self.t, "name": "walk"}
        return self._obs(), float(-abs(self.pos[0])), terminated, truncated, info


class TupleObsEnv(gym.Env):
    """Tuple observation (Box, Discrete) and a Box action; ends after ``max_steps``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, max_steps: int = 5) -> None:
        self.observation_space = spaces.Tuple(
            (spaces.Box(-5.0, 5.0, shape=(3,), dtype=np.float32), spaces.Discrete(4))
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.max_steps = max_steps

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.x = self.np_random.uniform(-1, 1, size=3).astype(np.float32)
        self.t = 0
        return (self.x.copy(), 0), {}

    def step(self, action: Any):
        self.x = np.clip(self.x + np.asarray(action, dtype=np.float32), -5, 5).astype(np.float32)
        self.t += 1
        return (self.x.copy(), self.t % 4), float(self.x.sum()), self.t >= self.max_steps, False, {}


class SelfResettingEnv(gym.Env):
    """Counts to ``limit`` then resets itself in the same step (obs = next episode's start),
    reporting the episode's last observation in ``info["final_obs"]`` when ``report``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, limit: int = 3, report: bool = True) -> None:
        self.observation_space = spaces.Box(-1e6, 1e6, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.limit = limit
        self.report = report
        self.episode = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return np.array([100.0 * self.episode], dtype=np.float32), {}

    def step(self, action: Any):
        self.t += 1
        obs = np.array([100.0 * self.episode + self.t], dtype=np.float32)
        if self.t >= self.limit:
            info = {"final_obs": obs} if self.report else {}
            new_obs, _ = self.reset()
            return new_obs, 1.0, True, False, info
        return obs, 1.0, False, False, {}


import pytest  # noqa: E402


@pytest.fixture
def dict_env() -> DictObsEnv:
    return DictObsEnv()


@pytest.fixture
def tuple_env() -> TupleObsEnv:
    return TupleObsEnv()


@pytest.fixture
def self_resetting_cls() -> type[SelfResettingEnv]:
    return SelfResettingEnv
