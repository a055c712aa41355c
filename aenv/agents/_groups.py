"""Prompt sources (each prompt ``group_size`` times per epoch) and groups of episodes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp_tree import non_tensor
from aenv.agents._episode import Episode

__all__ = ["EpisodeSpec", "Group", "PromptSource", "group_advantages", "prompt_tensordict"]


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: its prompt, where the prompt sits in the source, its group."""

    prompt: Mapping[str, Any] | TensorDictBase
    prompt_index: int
    epoch: int
    group: int


class PromptSource:
    """Prompts for the episode runner: each one ``group_size`` times per epoch.

    ``prompts`` is a sequence (re-read each epoch; ``shuffle`` reorders it per epoch from
    ``seed``) or any iterable (read once: one epoch). Each prompt is a dict or a
    TensorDict: what the env's reset receives. The ``group_size`` copies of a prompt come
    one after the other, so its group can complete while later prompts still run.

    Example:
        >>> source = PromptSource([{"prompt": "2 + 2 ="}, {"prompt": "3 + 3 ="}], group_size=4)
        >>> [s.prompt_index for s in source]
        [0, 0, 0, 0, 1, 1, 1, 1]
    """

    def __init__(
        self,
        prompts: Iterable[Mapping[str, Any] | TensorDictBase],
        *,
        group_size: int = 1,
        epochs: int = 1,
        shuffle: bool = False,
        seed: int | None = None,
    ) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        is_seq = isinstance(prompts, Sequence) and not isinstance(prompts, (str, bytes))
        if not is_seq and (epochs > 1 or shuffle):
            raise ValueError(
                "epochs > 1 and shuffle need a sequence of prompts (an iterable is read once)"
            )
        self.prompts = prompts
        self.group_size = group_size
        self.epochs = epochs
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[EpisodeSpec]:
        group = 0
        rng = random.Random(self.seed)
        for epoch in range(self.epochs):
            order: Iterable[tuple[int, Any]] = enumerate(self.prompts)
            if self.shuffle:
                pairs = list(order)
                rng.shuffle(pairs)
                order = pairs
            for index, prompt in order:
                if not isinstance(prompt, (Mapping, TensorDictBase)):
                    raise TypeError(
                        f"prompt {index} must be a dict or a TensorDict, got "
                        f"{type(prompt).__name__}"
                    )
                for _ in range(self.group_size):
                    yield EpisodeSpec(prompt, index, epoch, group)
                group += 1


def prompt_tensordict(
    prompt: Mapping[str, Any] | TensorDictBase, batch_size: torch.Size
) -> TensorDictBase:
    """A fresh reset input from a prompt (strings and other objects as non-tensor data)."""
    if isinstance(prompt, TensorDictBase):
        return prompt.clone()
    entries: dict[Any, Any] = {}
    n = len(batch_size)
    fits = True
    for key, value in prompt.items():
        if type(value) is str:  # (the usual entry: no isinstance checks, µs each)
            value = non_tensor(value, batch_size)
        elif isinstance(value, torch.Tensor):
            value = value.clone()
            fits = fits and value.shape[:n] == batch_size
        elif isinstance(value, Mapping):
            value = prompt_tensordict(value, batch_size)
        else:
            value = non_tensor(value, batch_size)
        fits = fits and type(key) is str
        entries[key] = value
    if fits:
        # every entry made to fit: no TensorDict checks (one prompt per episode, thousands
        # of episodes at once)
        return TensorDict._new_unsafe(entries, batch_size, nested=False)
    td = TensorDict(batch_size=batch_size)
    for key, value in entries.items():
        td.set(key, value)  # (TensorDict's checks say what does not fit)
    return td


@dataclasses.dataclass
class Group:
    """The ``group_size`` episodes of one prompt in one epoch, in finish order."""

    group: int
    prompt_index: int
    epoch: int
    prompt: dict[str, Any]
    episodes: list[Episode]

    @property
    def rewards(self) -> torch.Tensor:
        """Each episode's total reward (float32, ``[group_size]``)."""
        return torch.tensor([ep.total_reward for ep in self.episodes], dtype=torch.float32)

    def advantages(self, normalize_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
        """The episodes' rewards minus the group mean (divided by the group's standard
        deviation, plus ``eps``, with ``normalize_std``); see :func:`group_advantages`."""
        return group_advantages(self.rewards[None], normalize_std, eps)[0]


def group_advantages(
    rewards: torch.Tensor | Sequence[Group], normalize_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO-style advantages: each reward minus its group's mean (zero mean per group),
    divided by the group's standard deviation (plus ``eps``) when ``normalize_std``.

    Args:
        rewards: ``[num_groups, group_size]`` rewards, or groups of equal size.
        normalize_std: divide by the per-group (unbiased) standard deviation.
        eps: added to the standard deviation so uniform groups give zeros, not NaN.

    Example:
        >>> group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
        tensor([[ 0.5000, -0.5000, -0.5000,  0.5000]])
    """
    if not isinstance(rewards, torch.Tensor):
        sizes = {len(g.episodes) for g in rewards}
        if len(sizes) > 1:
            raise ValueError(f"groups of different sizes {sorted(sizes)} cannot be stacked")
        rewards = torch.stack([g.rewards for g in rewards])
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [num_groups, group_size], got {tuple(rewards.shape)}")
    rewards = rewards.float()
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if normalize_std:
        std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else 0.0
        centred = centred / (std + eps)
    return centred
