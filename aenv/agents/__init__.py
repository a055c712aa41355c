"""Agent loops: one coroutine per episode over a pool, prompts run in groups, episodes kept.

:func:`run_episodes` runs each episode as its own coroutine (awaiting its own policy call
and its own env step, hundreds at once), refills freed envs from a :class:`PromptSource`
and streams :class:`Episode`\\ s as they finish and :class:`Group`\\ s as they complete;
:func:`collect_episodes` is its sync facade. Episodes keep their turns, done reason, error
and timing, and convert to padded tensordicts or JSONL.
"""

from __future__ import annotations

from aenv.agents._episode import (
    DONE_REASONS,
    Episode,
    ErrorInfo,
    Turn,
    load_episodes,
    save_episodes,
    stack_episodes,
)
from aenv.agents._groups import EpisodeSpec, Group, PromptSource, group_advantages
from aenv.agents._policy import BatchedPolicy
from aenv.agents._runner import Collected, EpisodeStream, collect_episodes, run_episodes

__all__ = [
    "DONE_REASONS",
    "BatchedPolicy",
    "Collected",
    "Episode",
    "EpisodeSpec",
    "EpisodeStream",
    "ErrorInfo",
    "Group",
    "PromptSource",
    "Turn",
    "collect_episodes",
    "group_advantages",
    "load_episodes",
    "run_episodes",
    "save_episodes",
    "stack_episodes",
]
