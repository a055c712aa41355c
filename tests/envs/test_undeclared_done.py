"""A done flag the spec does not declare is refused, never silently dropped."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from aenv import SpecError
from aenv.envs import EnvBase
from aenv.specs import Categorical, Composite, Unbounded


class _TruncatingEnv(EnvBase):
    """Declares done and terminated, returns truncated too (after 2 steps)."""

    def __init__(self, declare_truncated: bool = False, nested: bool = False) -> None:
        super().__init__()
        self.nested = nested
        flags = {
            name: Categorical(2, (1,), dtype=torch.bool)
            for name in ("done", "terminated", *(("truncated",) if declare_truncated else ()))
        }
        done_spec = Composite(flags)
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Unbounded((1,))
        self.reward_spec = Unbounded((1,))
        self.full_done_spec = Composite(agent=done_spec) if nested else done_spec
        self.count = 0

    def _flags(self, **flags: bool) -> dict:
        out = {k: torch.tensor([v]) for k, v in flags.items()}
        return {"agent": out} if self.nested else out

    def _reset(self, td, **kwargs):
        self.count = 0
        return TensorDict({"observation": torch.zeros(1)}, batch_size=())

    def _step(self, td):
        self.count += 1
        out = {"observation": torch.full((1,), float(self.count)), "reward": torch.ones(1)}
        out.update(self._flags(truncated=self.count >= 2))
        return TensorDict(out, batch_size=())

    def _set_seed(self, seed):
        pass


@pytest.mark.parametrize("nested", [False, True])
async def test_undeclared_truncated_is_refused_naming_the_key(nested):
    env = _TruncatingEnv(nested=nested)
    td = await env.reset()
    with pytest.raises(SpecError, match="truncated") as info:
        await env.rand_step(td)
    assert ("('agent', 'truncated')" if nested else "'truncated'") in str(info.value)
    assert "add_truncated_keys" in str(info.value)


async def test_declared_truncated_ends_the_episode():
    env = _TruncatingEnv(declare_truncated=True)
    traj = await env.rollout(10)
    assert traj.batch_size == torch.Size([2])  # stopped at the truncation
    assert traj["next", "done"].squeeze(-1).tolist() == [False, True]


async def test_add_truncated_keys_fixes_it():
    env = _TruncatingEnv()
    env.add_truncated_keys()
    traj = await env.rollout(10)
    assert traj["next", "truncated"].squeeze(-1).tolist() == [False, True]
