"""Multi-agent grouping: how agents are gathered in nested groups of a tensordict.

A multi-agent env carries per-agent entries in nested groups (``("agents", "action")`` of
shape ``(*batch, n_agents, ...)``); the group map says which agent lives in which group.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

__all__ = ["MarlGroupMapType", "check_marl_grouping"]


class MarlGroupMapType(enum.Enum):
    """The two standard ways of grouping agents (the seeds' ``MarlGroupMapType``).

    ``ALL_IN_ONE_GROUP``: one group ``"agents"`` holds every agent (their data is stacked
    along one agent dim, the usual choice for homogeneous agents). ``ONE_GROUP_PER_AGENT``:
    each agent is its own group, named after it (heterogeneous agents).

    Example:
        >>> MarlGroupMapType.ALL_IN_ONE_GROUP.get_group_map(["a", "b"])
        {'agents': ['a', 'b']}
        >>> MarlGroupMapType.ONE_GROUP_PER_AGENT.get_group_map(["a", "b"])
        {'a': ['a'], 'b': ['b']}
    """

    ALL_IN_ONE_GROUP = 1
    ONE_GROUP_PER_AGENT = 2

    def get_group_map(self, agent_names: Sequence[str]) -> dict[str, list[str]]:
        """The group map of this grouping for ``agent_names``."""
        names = list(agent_names)
        if self is MarlGroupMapType.ALL_IN_ONE_GROUP:
            return {"agents": names}
        return {name: [name] for name in names}


def check_marl_grouping(group_map: Mapping[str, Sequence[str]], agent_names: Sequence[str]) -> None:
    """Check that ``group_map`` puts each of ``agent_names`` in exactly one group.

    Raises ValueError naming the problem: an empty map or group, an agent in two groups, an
    agent in no group, a group naming an unknown agent, or repeated agent names.

    Example:
        >>> check_marl_grouping({"red": ["a"], "blue": ["b", "c"]}, ["a", "b", "c"])
        >>> check_marl_grouping({"red": ["a"]}, ["a", "b"])
        Traceback (most recent call last):
        ...
        ValueError: agents ['b'] are in no group of the group map {'red': ['a']}
    """
    names = list(agent_names)
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"agent names must be unique, got {dup} more than once")
    if not group_map:
        raise ValueError("the group map is empty: every agent must belong to a group")
    seen: dict[str, str] = {}
    for group, members in group_map.items():
        if not members:
            raise ValueError(f"group {group!r} of the group map has no agent")
        for agent in members:
            if agent in seen:
                raise ValueError(f"agent {agent!r} is in two groups: {seen[agent]!r} and {group!r}")
            seen[agent] = group
    unknown = sorted(set(seen) - set(names))
    if unknown:
        raise ValueError(f"the group map names unknown agents {unknown}; agents are {names}")
    missing = [n for n in names if n not in seen]
    if missing:
        raise ValueError(f"agents {missing} are in no group of the group map {dict(group_map)}")
