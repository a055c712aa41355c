"""A prompted text env for agent-loop tests and benchmarks: one question, a few tries."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import entry
from aenv._mdp_tree import NO_DIMS, non_tensor, non_tensor_value
from aenv.envs._common import EnvBase
from aenv.specs import Composite, NonTensor, Unbounded
from aenv.specs._utils import done_flags

__all__ = ["GuessTextEnv"]


def _text(td: TensorDictBase | None, key: str, default: str) -> str:
    value = None if td is None else entry(td, key)
    if value is None:
        return default
    value = non_tensor_value(value)
    return value if isinstance(value, str) else str(value)


class GuessTextEnv(EnvBase):
    """A text env reset with a prompt: the agent answers until it says the target.

    The reset input carries ``"prompt"`` (the question) and ``"target"`` (the answer);
    both are strings, e.g. ``{"prompt": "2 + 2 =", "target": "4"}``. The observation
    ``"text"`` is the conversation so far; the action ``"action"`` is the agent's answer.
    An answer equal to the target ends the episode terminated with reward 1; any other
    gets reward 0 and the env says "try again"; after ``max_steps`` answers the episode is
    truncated. ``median`` / ``sigma`` give each step a lognormal latency (awaited, from a
    generator seeded by ``seed``), as a remote tool or sandbox would take; a reset input
    with a ``"latencies"`` tensor gives the episode's step latencies instead (one per step,
    to replay a schedule).

    Its specs are built once per batch size and device and shared by every such env, and
    its steps and resets build their outputs without TensorDict's checks (the entries are
    known to fit): an episode runner drives thousands of these envs at once.

    Example:
        >>> env = GuessTextEnv(max_steps=3)
        >>> td = await env.reset(TensorDict({"prompt": "2 + 2 =", "target": "4"}))
        >>> td["action"] = "4"
        >>> (await env.step(td))["next", "reward"]
        tensor([1.])
    """

    # each step gives done, terminated and truncated, consistent: no completion needed
    _done_outputs_complete = True

    def __init__(
        self,
        max_steps: int = 8,
        *,
        median: float = 0.0,
        sigma: float = 0.0,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_steps = max_steps
        self.median = median
        self.sigma = sigma
        self._rng = np.random.default_rng(seed)
        # built once, held by every env (see EnvBase._specs_once)
        self._specs_once(_guess_specs)
        self.prompt = ""
        self.target = ""
        self.schedule: list[float] | None = None
        self.text = ""
        self.count = 0

    def _set_seed(self, seed: int | None) -> None:
        self._rng = np.random.default_rng(seed)

    def draw_latency(self) -> float:
        """The next step's latency (seconds)."""
        if self.schedule is not None:
            return self.schedule[self.count] if self.count < len(self.schedule) else 0.0
        if self.median <= 0:
            return 0.0
        if self.sigma == 0:
            return self.median
        return float(self.median * math.exp(self.sigma * self._rng.standard_normal()))

    async def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        self.prompt = _text(tensordict, "prompt", "")
        self.target = _text(tensordict, "target", "")
        self.text = self.prompt
        self.count = 0
        schedule = None if tensordict is None else entry(tensordict, "latencies")
        self.schedule = None if schedule is None else schedule.reshape(-1).tolist()
        return TensorDict._new_unsafe(
            {"text": non_tensor(self.text), "prompt": non_tensor(self.prompt)},  # type: ignore[dict-item]
            batch_size=NO_DIMS,
            device=None,
            nested=False,
        )

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        latency = self.draw_latency()
        if latency:
            await asyncio.sleep(latency)
        answer = _text(tensordict, "action", "")
        self.count += 1
        right = answer == self.target
        truncated = not right and self.count >= self.max_steps
        self.text = f"{self.text}\n> {answer}\n{'right' if right else 'try again'}"
        # (torch.full, not torch.tensor([...]): a few µs less per entry)
        return TensorDict._new_unsafe(
            {
                "text": non_tensor(self.text),  # type: ignore[dict-item]
                "prompt": non_tensor(self.prompt),  # type: ignore[dict-item]
                "reward": torch.full((1,), 1.0 if right else 0.0),
                "done": torch.full((1,), right or truncated),
                "terminated": torch.full((1,), right),
                "truncated": torch.full((1,), truncated),
            },
            batch_size=NO_DIMS,
            device=None,
            nested=False,
        )


def _guess_specs(env: GuessTextEnv) -> None:
    env.observation_spec = Composite(
        text=NonTensor(shape=(), example_data="prompt"),
        prompt=NonTensor(shape=(), example_data="prompt"),
    )
    env.action_spec = NonTensor(shape=(), example_data="answer")
    env.reward_spec = Unbounded((1,))
    env.full_done_spec = Composite(done_flags((1,)))
