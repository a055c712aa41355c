"""Transforms that look back in time or at the library env: TimeMaxPool, EndOfLifeTransform."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey, unravel
from aenv.specs import Categorical, Composite
from aenv.transforms._base import Transform, reset_mask

__all__ = ["EndOfLifeTransform", "TimeMaxPool"]


class TimeMaxPool(Transform):
    """Replaces observations by their element-wise max over the last ``T`` steps.

    A window of the last ``T`` values of each ``in_key`` is kept (as a buffer of the
    transform, one row per batch element); a reset restarts the window of the reset
    elements with the reset observation.

    Args:
        in_keys: observations to pool (default ``["observation"]``).
        out_keys: where to write the pooled values (default: in place).
        T: window length.

    Example:
        >>> env = TransformedEnv(CountingEnv(max_steps=9), TimeMaxPool(T=3))
        >>> (await env.rollout(3))["next", "observation"].squeeze(-1)
        tensor([1., 2., 3.])
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        T: int = 1,
    ) -> None:
        if T < 1:
            raise ValueError(f"TimeMaxPool needs T >= 1, got {T}")
        super().__init__(in_keys if in_keys is not None else ["observation"], out_keys)
        self.T = T
        self._windows: dict[NestedKey, torch.Tensor] = {}

    def _push(self, key: NestedKey, value: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        window = self._windows.get(key)
        if window is None or window.shape[1:] != value.shape or mask is None:
            # a (re)started window: the first value fills it
            window = value.unsqueeze(0).expand(self.T, *value.shape).clone()
        elif mask is not None:
            fresh = value.unsqueeze(0).expand_as(window)
            window = torch.where(mask.unsqueeze(0), fresh, window)
        self._windows[key] = window
        return window.amax(0)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            value = tensordict_reset.get(in_key, None)
            if value is None:
                continue
            mask = reset_mask(tensordict, unravel(in_key)[:-1], value)
            tensordict_reset.set(out_key, self._push(in_key, value, mask))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            value = next_tensordict.get(in_key)
            window = self._windows.get(in_key)
            if window is None or window.shape[1:] != value.shape:
                pooled = self._push(in_key, value, None)
            else:
                window = torch.cat([window[1:], value.unsqueeze(0)], 0)
                self._windows[in_key] = window
                pooled = window.amax(0)
            next_tensordict.set(out_key, pooled)
        return next_tensordict

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, T={self.T}"


class EndOfLifeTransform(Transform):
    """Flags the loss of a life (Atari-style games): ``eol_key`` is True on a step after
    which the game's life count dropped, or that ended the episode.

    The life count is read from the base env after each reset and step by following
    ``eol_attribute`` (dotted attributes, the last one called if callable; library wrappers
    forward attribute reads to the library env, so ``"unwrapped.ale.lives"`` reaches
    Gymnasium's Atari env). The count is also written at ``lives_key``. The base env must
    live in this process (a wrapper, or a pool on the coroutine or thread backend whose
    attribute reads fan out to its sub-envs).

    Args:
        eol_key: the end-of-life flag written in ``"next"``.
        lives_key: the life count written on resets and steps.
        done_key: the done flag that also ends a life.
        eol_attribute: where the life count is read on the base env.

    Example:
        >>> env = TransformedEnv(GymEnv("ALE/Breakout-v5"), EndOfLifeTransform())
        >>> r = await env.rollout(100)
        >>> r["next", "end-of-life"].any()
    """

    def __init__(
        self,
        eol_key: NestedKey = "end-of-life",
        lives_key: NestedKey = "lives",
        done_key: NestedKey = "done",
        eol_attribute: str = "unwrapped.ale.lives",
    ) -> None:
        super().__init__()
        self.eol_key = eol_key
        self.lives_key = lives_key
        self.done_key = done_key
        self.eol_attribute = eol_attribute

    def _lives(self) -> torch.Tensor:
        env = self.container
        if env is None:
            raise RuntimeError("EndOfLifeTransform must belong to a TransformedEnv")
        value: Any = env.base_env
        for name in self.eol_attribute.split("."):
            if isinstance(value, list):
                value = [getattr(v, name) for v in value]
            else:
                value = getattr(value, name)
        if isinstance(value, list):
            value = [v() if callable(v) else v for v in value]
        elif callable(value):
            value = value()
        lives = torch.as_tensor(value, dtype=torch.int64)
        return lives.reshape(*env.batch_size, 1)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        shape = (*output_spec.shape, 1)
        obs = output_spec["full_observation_spec"]
        obs[self.eol_key] = Categorical(2, shape=shape, dtype=torch.bool)
        obs[self.lives_key] = Categorical(2**31 - 1, shape=shape, dtype=torch.int64)
        return output_spec

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        lives = self._lives()
        tensordict_reset.set(self.lives_key, lives)
        tensordict_reset.set(self.eol_key, torch.zeros_like(lives, dtype=torch.bool))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        lives = self._lives()
        prev = tensordict.get(self.lives_key, None)
        eol = torch.zeros_like(lives, dtype=torch.bool) if prev is None else lives < prev
        done = next_tensordict.get(self.done_key, None)
        if done is not None:
            eol = eol | done.reshape(eol.shape).to(torch.bool)
        next_tensordict.set(self.lives_key, lives)
        next_tensordict.set(self.eol_key, eol)
        return next_tensordict
