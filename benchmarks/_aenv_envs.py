"""aenv twins of the peer workloads' envs (benchmarks/peers/_torchrl_envs.py), same logic.

A benchmark compares frameworks, so the env code itself must be the same: these envs do
exactly what their TorchRL twins do, written against aenv's EnvBase.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from aenv import Categorical, Composite, EnvBase, Unbounded


class BenchCountingEnv(EnvBase):
    """Counts steps: observation = count, reward 1.0, done once count >= ``max_count``."""

    def __init__(self, max_count: int = 10_000) -> None:
        super().__init__(batch_size=())
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
