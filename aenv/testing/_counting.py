"""Counting envs: the smallest envs with real done, partial step and partial reset logic."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.specs import Bounded, Categorical, Composite, Unbounded
from aenv.specs._utils import flag

__all__ = ["CountingEnv", "NestedCountingEnv"]


def _counting_specs(env: EnvBase) -> None:
    bs = env.batch_size
    env.observation_spec = Composite(observation=Unbounded((*bs, 1), dtype=torch.float32), shape=bs)
    env.action_spec = Categorical(2, shape=(*bs, 1))
    env.reward_spec = Unbounded((*bs, 1))
    env.full_done_spec = Composite(done=flag((*bs, 1)), terminated=flag((*bs, 1)), shape=bs)


class CountingEnv(EnvBase):
    """Counts its steps; done once the count reaches ``max_steps``.

    Observation ``"observation"`` (float32, ``(*batch, 1)``) is the count; the action
    ``"action"`` (int64 in {0, 1}, ``(*batch, 1)``) is read but does not change the count;
    reward is 1 per step. Honours ``"_reset"`` and ``"_step"`` masks for batched use.
    ``max_steps`` may differ per batch element (a list or tensor of shape ``batch_size``).

    Example:
        >>> env = CountingEnv(max_steps=3)
        >>> (await env.rollout(10))["next", "observation"].squeeze(-1)
        tensor([1., 2., 3.])
    """

    def __init__(
        self,
        max_steps: int | list[int] | torch.Tensor = 5,
        batch_size: tuple[int, ...] = (),
        start_val: int = 0,
        device: str | torch.device | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(batch_size=batch_size, device=device, **kwargs)  # type: ignore[arg-type]
        bs = self.batch_size
        limit = torch.as_tensor(max_steps, dtype=torch.float32)
        self.max_steps = limit.unsqueeze(-1) if limit.ndim else limit
        self.start_val = start_val
        # built once per batch size and device, held by every env of it (EnvBase._specs_once)
        self._specs_once(_counting_specs)
        self.count = torch.full((*bs, 1), start_val, dtype=torch.float32)
        self.seed: int | None = None

    def _set_seed(self, seed: int | None) -> None:
        self.seed = seed

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: object) -> TensorDictBase:
        reset = tensordict.get("_reset", None) if tensordict is not None else None
        if reset is None:
            self.count = torch.full_like(self.count, self.start_val)
        else:
            self.count = torch.where(reset, torch.full_like(self.count, self.start_val), self.count)
        done = self.count >= self.max_steps
        return TensorDict(
            {"observation": self.count.clone(), "done": done, "terminated": done.clone()},
            batch_size=self.batch_size,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        stepping = tensordict.get("_step", None)
        inc = torch.ones_like(self.count)
        if stepping is not None:
            inc = stepping.reshape(self.count.shape).to(inc.dtype)
        self.count = self.count + inc
        done = self.count >= self.max_steps
        return TensorDict(
            {
                "observation": self.count.clone(),
                "reward": torch.ones_like(self.count),
                "done": done,
                "terminated": done.clone(),
            },
            batch_size=self.batch_size,
        )


class NestedCountingEnv(EnvBase):
    """A multi-agent style counting env: per-agent entries under ``"agents"``.

    Each agent counts its own steps (``("agents", "observation")``, ``(*batch, n_agents,
    1)``) and is done at ``max_steps``; the root ``"done"`` is set when every agent is done.
    Partial resets work per agent (``("agents", "_reset")``) and at the root.
    """

    def __init__(
        self,
        max_steps: int = 5,
        n_agents: int = 2,
        batch_size: tuple[int, ...] = (),
        **kwargs: object,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)  # type: ignore[arg-type]
        bs = self.batch_size
        self.max_steps = max_steps
        self.n_agents = n_agents
        agent_shape = (*bs, n_agents)
        self.observation_spec = Composite(
            agents=Composite(observation=Unbounded((*agent_shape, 1)), shape=agent_shape),
            shape=bs,
        )
        self.action_spec = Composite(
            agents=Composite(action=Bounded(-1.0, 1.0, shape=(*agent_shape, 1)), shape=agent_shape),
            shape=bs,
        )
        self.reward_spec = Composite(
            agents=Composite(reward=Unbounded((*agent_shape, 1)), shape=agent_shape), shape=bs
        )
        self.full_done_spec = Composite(
            done=flag((*bs, 1)),
            terminated=flag((*bs, 1)),
            agents=Composite(
                done=flag((*agent_shape, 1)),
                terminated=flag((*agent_shape, 1)),
                shape=agent_shape,
            ),
            shape=bs,
        )
        self.count = torch.zeros((*agent_shape, 1))

    def _set_seed(self, seed: int | None) -> None:
        self.seed = seed

    def _out(self, reward: bool) -> TensorDictBase:
        agent_done = self.count >= self.max_steps
        root_done = agent_done.all(-2)
        agents = {
            "observation": self.count.clone(),
            "done": agent_done,
            "terminated": agent_done.clone(),
        }
        if reward:
            agents["reward"] = torch.ones_like(self.count)
        return TensorDict(
            {"agents": agents, "done": root_done, "terminated": root_done.clone()},
            batch_size=self.batch_size,
        )

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: object) -> TensorDictBase:
        mask = None
        if tensordict is not None:
            root = tensordict.get("_reset", None)
            nested = tensordict.get(("agents", "_reset"), None)
            if root is not None:
                mask = root.unsqueeze(-2).expand_as(self.count)
            elif nested is not None:
                mask = nested
        if mask is None:
            self.count = torch.zeros_like(self.count)
        else:
            self.count = torch.where(mask, torch.zeros_like(self.count), self.count)
        return self._out(reward=False)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.count = self.count + 1
        return self._out(reward=True)
