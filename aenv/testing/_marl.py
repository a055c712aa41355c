"""MultiAgentCountingEnv: a small multi-agent env whose agents live in nested groups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._marl import MarlGroupMapType, check_marl_grouping
from aenv.specs import Categorical, Composite, Unbounded
from aenv.specs._utils import flag

__all__ = ["MultiAgentCountingEnv"]


class MultiAgentCountingEnv(EnvBase):
    """Agents that count their steps, gathered in groups by a group map (seeds' MARL layout).

    Agent ``i`` is named ``"agent_{i}"``. Each group ``g`` of the group map is a nested entry
    of shape ``(*batch, n_agents_in_g)`` holding ``(g, "observation")`` (the agent's count),
    ``(g, "action")`` (0 or 1), ``(g, "reward")`` (``1 + action``) and ``(g, "done")`` /
    ``(g, "terminated")`` (the agent reached ``max_steps``, which grows by one per agent
    index, so agents finish at different steps). The root ``"done"`` is set once every agent
    is done, and the root ``"state"`` (shared by all agents) is the sum of all counts.
    Resets honour ``"_reset"`` at the root and per group (agent-wise masks).

    Args:
        n_agents: number of agents.
        group_map: a :class:`~aenv.MarlGroupMapType` or an explicit ``{group: [agents]}``
            (checked with :func:`~aenv.check_marl_grouping`).
        max_steps: the steps of agent 0; agent ``i`` is done after ``max_steps + i``.
        batch_size: the env's batch dims.

    Example:
        >>> env = MultiAgentCountingEnv(3, MarlGroupMapType.ONE_GROUP_PER_AGENT)
        >>> sorted(env.group_map)
        ['agent_0', 'agent_1', 'agent_2']
        >>> (await env.rollout(10))["next", "agent_2", "observation"].shape
        torch.Size([7, 1, 1])
    """

    def __init__(
        self,
        n_agents: int = 2,
        group_map: MarlGroupMapType | Mapping[str, Sequence[str]] = (
            MarlGroupMapType.ALL_IN_ONE_GROUP
        ),
        max_steps: int = 5,
        batch_size: tuple[int, ...] = (),
        **kwargs: object,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)  # type: ignore[arg-type]
        self.agent_names = [f"agent_{i}" for i in range(n_agents)]
        if isinstance(group_map, MarlGroupMapType):
            group_map = group_map.get_group_map(self.agent_names)
        check_marl_grouping(group_map, self.agent_names)
        self.group_map = {g: list(agents) for g, agents in group_map.items()}
        bs = self.batch_size
        obs = Composite(state=Unbounded((*bs, 1)), shape=bs)
        act = Composite(shape=bs)
        rew = Composite(shape=bs)
        done = Composite(done=flag((*bs, 1)), terminated=flag((*bs, 1)), shape=bs)
        self.count: dict[str, torch.Tensor] = {}
        self.limit: dict[str, torch.Tensor] = {}
        for group, agents in self.group_map.items():
            shape = (*bs, len(agents))
            obs[group] = Composite(observation=Unbounded((*shape, 1)), shape=shape)
            act[group] = Composite(action=Categorical(2, shape=(*shape, 1)), shape=shape)
            rew[group] = Composite(reward=Unbounded((*shape, 1)), shape=shape)
            done[group] = Composite(
                done=flag((*shape, 1)), terminated=flag((*shape, 1)), shape=shape
            )
            self.count[group] = torch.zeros((*shape, 1))
            per_agent = [max_steps + self.agent_names.index(a) for a in agents]
            self.limit[group] = torch.tensor(per_agent, dtype=torch.float32).unsqueeze(-1)
        self.observation_spec = obs
        self.full_action_spec = act
        self.full_reward_spec = rew
        self.full_done_spec = done

    def _set_seed(self, seed: int | None) -> None:
        self.seed = seed

    def _out(self, rewards: dict[str, torch.Tensor] | None) -> TensorDictBase:
        out = TensorDict({}, batch_size=self.batch_size)
        all_done = []
        total = torch.zeros((*self.batch_size, 1))
        for group, count in self.count.items():
            done = count >= self.limit[group]
            all_done.append(done.flatten(len(self.batch_size)).all(-1, keepdim=True))
            total = total + count.sum(-2)
            entries = {"observation": count.clone(), "done": done, "terminated": done.clone()}
            if rewards is not None:
                entries["reward"] = rewards[group]
            out.set(group, TensorDict(entries, batch_size=count.shape[:-1]))
        root = torch.stack(all_done, -1).all(-1)
        out.set("done", root)
        out.set("terminated", root.clone())
        out.set("state", total)
        return out

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: object) -> TensorDictBase:
        root = tensordict.get("_reset", None) if tensordict is not None else None
        for group, count in self.count.items():
            mask = None
            if root is not None:
                mask = root.unsqueeze(-2).expand_as(count)
            elif tensordict is not None:
                mask = tensordict.get((group, "_reset"), None)
            zero = torch.zeros_like(count)
            self.count[group] = zero if mask is None else torch.where(mask, zero, count)
        return self._out(None)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        rewards = {}
        for group, count in self.count.items():
            action = tensordict.get((group, "action"))
            self.count[group] = count + 1
            rewards[group] = 1.0 + action.to(torch.float32)
        return self._out(rewards)
