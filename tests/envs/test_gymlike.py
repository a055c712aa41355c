from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aenv.envs._gymlike import DefaultInfoDictReader, GymLikeEnv
from aenv.specs import Bounded, Categorical, Composite, Unbounded


class LegacyBackend:
    """A gym<0.26-style backend: 4-tuple steps, reset returns the observation only."""

    def __init__(self, limit: int = 3, timelimit: bool = True) -> None:
        self.limit = limit
        self.timelimit = timelimit

    def reset(self, **kwargs: Any) -> Any:
        self.t = 0
        return {"state": np.zeros(2, dtype=np.float32)}

    def step(self, action: Any) -> tuple[Any, ...]:
        self.t += 1
        done = self.t >= self.limit
        info = {"TimeLimit.truncated": done and self.timelimit, "t": self.t}
        return {"state": np.full(2, self.t, dtype=np.float32)}, float(action), done, info


class LegacyEnv(GymLikeEnv):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._env = LegacyBackend(**kwargs)
        self._init_gym_specs(
            Composite(observation=Unbounded((2,))),
            Categorical(3, dtype=torch.int64),
        )

    def _set_seed(self, seed: int | None) -> None:
        pass


async def test_legacy_outputs_and_state_rename():
    env = LegacyEnv()
    r = await env.rollout(10)
    assert r.shape == (3,)
    assert r["next", "observation"][:, 0].tolist() == [1, 2, 3]
    assert r["next", "truncated"].squeeze(-1).tolist() == [False, False, True]
    assert r["next", "terminated"].squeeze(-1).tolist() == [False, False, False]
    assert torch.equal(r["next", "reward"].squeeze(-1), r["action"].float())


async def test_legacy_terminated_without_timelimit():
    env = LegacyEnv(timelimit=False)
    r = await env.rollout(10)
    assert r["next", "terminated"][-1].item() and not r["next", "truncated"][-1].item()


async def test_info_reader_inferred_and_frame_skip():
    env = LegacyEnv(limit=5)
    env.frame_skip = 2
    env.set_info_dict_reader(DefaultInfoDictReader(["t"]))
    assert env.observation_spec["t"].dtype == torch.int64
    td = await env.reset()
    assert td["t"].item() == 0
    td["action"] = torch.tensor(1)
    td = await env.step(td)
    assert td["next", "t"].item() == 2 and td["next", "reward"].item() == 2.0


def test_read_helpers():
    env = LegacyEnv()
    term, trunc, done, brk = env.read_done(True, False)
    assert done.item() and term.item() and not trunc.item() and brk
    assert env.read_reward(1.5).shape == (1,)
    assert env.read_action(torch.tensor(2)) == 2
    assert isinstance(env.full_action_spec["action"], Categorical)
    assert not isinstance(env.observation_spec["observation"], Bounded)
