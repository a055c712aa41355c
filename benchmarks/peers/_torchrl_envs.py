"""Minimal TorchRL envs the peer workloads measure (runs inside the torchrl venv).

Both are plain, idiomatic ``EnvBase`` subclasses written the way TorchRL's docs show: specs set
in ``__init__``, a fresh ``TensorDict`` returned from ``_reset`` and ``_step``.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

__all__ = ["CountingEnv", "LatencyEnv"]


class CountingEnv(EnvBase):
    """Counts steps: observation = count, reward 1.0, done once count >= ``max_count``."""

    def __init__(self, max_count: int = 10_000) -> None:
        super().__init__(batch_size=torch.Size([]))
        self.max_count = max_count
        self.observation_spec = Composite(observation=Unbounded((1,), dtype=torch.float32))
        self.action_spec = Categorical(2, shape=(1,))
        self.reward_spec = Unbounded((1,), dtype=torch.float32)
        self.count = 0

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        self.count = 0
        return TensorDict(
            {
                "observation": torch.zeros(1),
                "done": torch.zeros(1, dtype=torch.bool),
                "terminated": torch.zeros(1, dtype=torch.bool),
            },
            batch_size=self.batch_size,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.count += 1
        done = torch.tensor([self.count >= self.max_count])
        return TensorDict(
            {
                "observation": torch.full((1,), float(self.count)),
                "reward": torch.ones(1),
                "done": done,
                "terminated": done.clone(),
            },
            batch_size=self.batch_size,
        )

    def _set_seed(self, seed: int | None) -> None:
        return None


class LatencyEnv(EnvBase):
    """Sleeps a lognormal latency (``time.sleep``, blocking) in every ``_step``; never done.

    Each env draws its latencies from its own generator seeded with ``(seed, index)``.
    """

    def __init__(
        self,
        median: float = 0.05,
        sigma: float = 1.0,
        seed: int = 0,
        index: int = 0,
        obs_dim: int = 4,
    ) -> None:
        super().__init__(batch_size=torch.Size([]))
        self.median = median
        self.sigma = sigma
        self.obs_dim = obs_dim
        self._rng = np.random.default_rng([seed, index])
        self.observation_spec = Composite(observation=Unbounded((obs_dim,), dtype=torch.float32))
        self.action_spec = Unbounded((1,), dtype=torch.float32)
        self.reward_spec = Unbounded((1,), dtype=torch.float32)

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        return TensorDict(
            {
                "observation": torch.zeros(self.obs_dim),
                "done": torch.zeros(1, dtype=torch.bool),
                "terminated": torch.zeros(1, dtype=torch.bool),
            },
            batch_size=self.batch_size,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        time.sleep(float(self._rng.lognormal(np.log(self.median), self.sigma)))
        return TensorDict(
            {
                "observation": torch.zeros(self.obs_dim),
                "reward": torch.ones(1),
                "done": torch.zeros(1, dtype=torch.bool),
                "terminated": torch.zeros(1, dtype=torch.bool),
            },
            batch_size=self.batch_size,
        )

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
