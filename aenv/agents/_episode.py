"""Episode storage: turns (observations, actions, rewards, text and tensors), why the
episode ended, its error and its timing; padded tensordicts and lossless JSONL."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from aenv._mdp_tree import non_tensor
from aenv.pool._dispatch import error_fields

__all__ = [
    "DONE_REASONS",
    "Episode",
    "ErrorInfo",
    "Turn",
    "load_episodes",
    "save_episodes",
    "stack_episodes",
]

#: Why an episode ended: the env terminated or truncated it, the runner's ``max_turns`` or
#: ``episode_timeout`` budget ran out, or an error (the env's or the policy's) ended it.
DONE_REASONS = ("terminated", "truncated", "max_turns", "timeout", "error")


@dataclasses.dataclass
class ErrorInfo:
    """An error kept as data: the exception's type name, message and formatted traceback."""

    type: str
    message: str
    traceback: str

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        """The error of ``exc`` (a sub-env's remote traceback where it has one)."""
        return cls(*error_fields(exc))


@dataclasses.dataclass(slots=True)
class Turn:
    """One step of an episode.

    ``observation`` is what the policy saw, ``action`` what it answered, ``reward`` the
    env's reward entries, all keyed by name (nested keys joined with ``"."``) with strings
    kept as strings and tensors as tensors. ``policy_s`` and ``env_s`` time the policy call
    and the env step.
    """

    observation: dict[str, Any]
    action: dict[str, Any]
    reward: dict[str, Any]
    terminated: bool = False
    truncated: bool = False
    policy_s: float = 0.0
    env_s: float = 0.0


@dataclasses.dataclass
class Episode:
    """One episode run by :func:`~aenv.agents.run_episodes`.

    Attributes:
        prompt: the reset input the episode started from (a dict).
        turns: its steps, in order.
        final_observation: the observation after the last step.
        done_reason: one of :data:`DONE_REASONS`.
        error: what went wrong when ``done_reason == "error"`` (or when a failed env step
            was observed, ``on_error="observe"``), else None.
        prompt_index: the prompt's position in the source; ``epoch`` the pass over it;
            ``group`` the id of the group of ``group_size`` episodes of this prompt and
            epoch; ``env_index`` the pool env it ran on.
        started_at / ended_at: wall-clock times (``time.time()``).

    Example:
        >>> ep.total_reward, ep.done_reason, len(ep)
        (1.0, 'terminated', 3)
        >>> td = ep.to_tensordict(pad_to=8)   # batch [8], "mask" marks the real steps
    """

    prompt: dict[str, Any]
    turns: list[Turn] = dataclasses.field(default_factory=list)
    final_observation: dict[str, Any] = dataclasses.field(default_factory=dict)
    done_reason: str = ""
    error: ErrorInfo | None = None
    prompt_index: int = 0
    epoch: int = 0
    group: int = 0
    env_index: int = -1
    started_at: float = 0.0
    ended_at: float = 0.0

    def __len__(self) -> int:
        return len(self.turns)

    @property
    def total_reward(self) -> float:
        """The sum of every turn's rewards."""
        total = 0.0
        for turn in self.turns:
            for value in turn.reward.values():
                if isinstance(value, torch.Tensor):
                    total += float(value.sum())
                elif isinstance(value, (int, float)):
                    total += float(value)
        return total

    @property
    def duration(self) -> float:
        """Seconds from the episode's start to its end."""
        return self.ended_at - self.started_at

    # ------------------------------------------------------------------ tensordicts
    def to_tensordict(self, pad_to: int | None = None) -> TensorDictBase:
        """The episode as a tensordict of batch ``[T]`` (``T = pad_to or len(self)``).

        Root entries are the observations and actions, ``"next"`` the next observations,
        rewards and done flags (TorchRL's layout); ``"mask"`` is True on real steps. Padded
        steps hold zeros and empty strings: never another step's text.
        """
        n = len(self.turns)
        size = n if pad_to is None else pad_to
        if size < n:
            raise ValueError(f"pad_to={pad_to} is shorter than the episode ({n} turns)")
        nexts = [t.observation for t in self.turns[1:]] + [self.final_observation] if n else []
        td = TensorDict(batch_size=[size])
        _fill(td, (), [t.observation for t in self.turns], size)
        _fill(td, (), [t.action for t in self.turns], size)
        _fill(td, ("next",), nexts, size)
        _fill(td, ("next",), [t.reward for t in self.turns], size)
        flags = {
            "terminated": [t.terminated for t in self.turns],
            "truncated": [t.truncated for t in self.turns],
        }
        flags["done"] = [a or b for a, b in zip(flags["terminated"], flags["truncated"])]
        for name, values in flags.items():
            column = torch.zeros(size, 1, dtype=torch.bool)
            column[:n, 0] = torch.tensor(values, dtype=torch.bool)
            td.set(("next", name), column)
        mask = torch.zeros(size, dtype=torch.bool)
        mask[:n] = True
        td.set("mask", mask)
        return td

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` gives the same episode back (tensors keep
        dtype, shape and values)."""
        out = dataclasses.asdict(self)
        out["turns"] = [dataclasses.asdict(t) for t in self.turns]
        return _encode(out)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Episode:
        """The episode :meth:`to_dict` wrote."""
        raw = _decode(dict(data))
        raw["turns"] = [Turn(**t) for t in raw["turns"]]
        if raw["error"] is not None:
            raw["error"] = ErrorInfo(**raw["error"])
        return cls(**raw)

    def to_json(self) -> str:
        """One line of JSON (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Episode:
        """The episode :meth:`to_json` wrote."""
        return cls.from_dict(json.loads(line))


def stack_episodes(episodes: Sequence[Episode], pad_to: int | None = None) -> TensorDictBase:
    """Episodes as one tensordict of batch ``[len(episodes), T]``, padded to the longest
    (or ``pad_to``) with ``"mask"`` marking the real steps (see
    :meth:`Episode.to_tensordict`)."""
    if not episodes:
        raise ValueError("no episodes to stack")
    size = pad_to if pad_to is not None else max(len(ep) for ep in episodes)
    return torch.stack([ep.to_tensordict(size) for ep in episodes], 0)  # type: ignore[return-value]


def save_episodes(episodes: Iterable[Episode], path: str | Path, *, append: bool = False) -> int:
    """Write episodes to a JSONL file, one per line; returns how many were written."""
    n = 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for ep in episodes:
            f.write(ep.to_json())
            f.write("\n")
            n += 1
    return n


def load_episodes(path: str | Path) -> list[Episode]:
    """The episodes of a JSONL file written by :func:`save_episodes`."""
    with open(path, encoding="utf-8") as f:
        return [Episode.from_json(line) for line in f if line.strip()]


# ---------------------------------------------------------------------- helpers
def _fill(
    td: TensorDictBase, prefix: tuple[str, ...], rows: list[dict[str, Any]], size: int
) -> None:
    """Write one column per key of ``rows`` (one dict per real step) into ``td``."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    n = len(rows)
    for name in keys:
        key = (*prefix, *name.split("."))
        values = [row.get(name) for row in rows]
        sample = next(v for v in values if v is not None)
        if isinstance(sample, torch.Tensor):
            column = torch.zeros(size, *sample.shape, dtype=sample.dtype)
            for i, v in enumerate(values):
                if v is not None:
                    column[i] = v
            td.set(key, column)
        elif isinstance(sample, (bool, int, float)):
            column = torch.zeros(size, dtype=torch.as_tensor(sample).dtype)
            column[:n] = torch.tensor([0 if v is None else v for v in values])
            td.set(key, column)
        else:
            # text (or other objects): padding is "" (None for objects), never a copy
            pad: Any = "" if isinstance(sample, str) else None
            items = [pad if v is None else v for v in values] + [pad] * (size - n)
            td.set(key, NonTensorStack(*[non_tensor(v) for v in items]))


_TENSOR = "__tensor__"


def _encode(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        data = t.float().tolist() if t.dtype == torch.bfloat16 else t.tolist()
        return {_TENSOR: {"dtype": str(t.dtype).removeprefix("torch."), "data": data}}
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    return obj


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        spec = obj.get(_TENSOR)
        if spec is not None and len(obj) == 1:
            return torch.tensor(spec["data"], dtype=getattr(torch, spec["dtype"]))
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj
