"""Compose: a chain of transforms that is itself a transform."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from tensordict import TensorDictBase
from torch import nn

from aenv.specs import Composite
from aenv.transforms._base import Transform

__all__ = ["Compose"]


def not_a_transform(obj: object) -> str:
    """What to say of ``obj`` given where an aenv transform is expected: its type, and for
    one of TorchRL's transforms, the aenv way to get the same thing."""
    cls = type(obj)
    if not cls.__module__.startswith("torchrl."):
        return cls.__name__
    import aenv.transforms as ours

    twin = (
        f"aenv.transforms.{cls.__name__} (same name and arguments)"
        if hasattr(ours, cls.__name__)
        else "an aenv transform"
    )
    return (
        f"TorchRL's {cls.__name__}: aenv's TransformedEnv runs aenv transforms; use {twin}, "
        "or hand the env to TorchRL with aenv.libs.torchrl.to_torchrl(env) and use "
        "TorchRL's TransformedEnv there"
    )


class Compose(Transform):
    """A chain of transforms applied in order (inverse hooks in reverse order).

    Indexing gives the transform itself (keeping its parent); a slice gives a new Compose of
    clones with no parent.

    Example:
        >>> t = Compose(StepCounter(), RewardSum())
        >>> env = TransformedEnv(CountingEnv(), t)
        >>> env.transform[0].parent.base_env is env.base_env
        True
        >>> env.transform[1:][0] is env.transform[1]
        False
    """

    def __init__(self, *transforms: Transform) -> None:
        super().__init__()
        if len(transforms) == 1 and isinstance(transforms[0], (list, tuple)):
            transforms = tuple(transforms[0])
        for t in transforms:
            if not isinstance(t, Transform):
                raise TypeError(f"Compose takes Transforms, got {not_a_transform(t)}")
            t.set_container(self)
        self.transforms = nn.ModuleList(transforms)

    # ------------------------------------------------------------------ sequence protocol
    def __len__(self) -> int:
        return len(self.transforms)

    def __iter__(self) -> Iterator[Transform]:  # type: ignore[override]
        return iter(cast(Sequence[Transform], self.transforms))

    def __getitem__(self, index: int | slice) -> Transform:
        if isinstance(index, slice):
            return Compose(*[cast(Transform, t).clone() for t in self.transforms[index]])
        return cast(Transform, self.transforms[index])

    def append(self, transform: Transform) -> Compose:
        """Append a transform (its specs apply after those already here)."""
        if not isinstance(transform, Transform):
            raise TypeError(f"can only append Transforms, got {not_a_transform(transform)}")
        transform.set_container(self)
        self.transforms.append(transform)
        self._changed()
        return self

    def insert(self, index: int, transform: Transform) -> Compose:
        """Insert a transform at ``index`` (negative indices count from the end)."""
        if not isinstance(transform, Transform):
            raise TypeError(f"can only insert Transforms, got {type(transform).__name__}")
        n = len(self.transforms)
        if index < 0:
            index += n
        if not 0 <= index <= n:
            raise IndexError(f"index {index} out of range for a Compose of {n} transforms")
        transform.set_container(self)
        self.transforms.insert(index, transform)
        self._changed()
        return self

    def _changed(self) -> None:
        for t in self._all():
            t._clear_parent_cache()
        self._invalidate_specs()

    def _all(self) -> Iterator[Transform]:
        for t in self:
            yield t
            if isinstance(t, Compose):
                yield from t._all()

    def _clear_parent_cache(self) -> None:
        super()._clear_parent_cache()
        if "_modules" in self.__dict__ and "transforms" in self._modules:
            for t in self:
                t._clear_parent_cache()

    def clone(self) -> Compose:
        return Compose(*[t.clone() for t in self])

    # ------------------------------------------------------------------ hooks
    def _call(self, next_tensordict: TensorDictBase) -> Any:
        ts = list(self)
        for i, t in enumerate(ts):
            out = t._call(next_tensordict)
            if inspect.isawaitable(out):
                return self._finish(out, ts[i + 1 :], lambda t, td: t._call(td))
            next_tensordict = out
        return next_tensordict

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> Any:
        for i, t in enumerate(self):
            out = t._step(tensordict, next_tensordict)
            if inspect.isawaitable(out):
                rest = list(self)[i + 1 :]
                return self._finish(out, rest, lambda t, td: t._step(tensordict, td))
            next_tensordict = out
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> Any:
        for i, t in enumerate(self):
            out = t._reset(tensordict, tensordict_reset)
            if inspect.isawaitable(out):
                rest = list(self)[i + 1 :]
                return self._finish(out, rest, lambda t, td: t._reset(tensordict, td))
            tensordict_reset = out
        return tensordict_reset

    def _inv_call(self, tensordict: TensorDictBase) -> Any:
        ts = list(self)[::-1]
        for i, t in enumerate(ts):
            if not t._needs_inv:
                continue
            out = t._inv_call(tensordict)
            if inspect.isawaitable(out):
                return self._finish(out, ts[i + 1 :], lambda t, td: t._inv_call(td))
            tensordict = out
        return tensordict

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> Any:
        ts = list(self)[::-1]
        for i, t in enumerate(ts):
            out = t._reset_env_preprocess(tensordict)
            if inspect.isawaitable(out):
                return self._finish(out, ts[i + 1 :], lambda t, td: t._reset_env_preprocess(td))
            tensordict = out
        return tensordict

    @staticmethod
    async def _finish(pending: Any, rest: list[Transform], call: Any) -> TensorDictBase:
        td = await pending
        for t in rest:
            out = call(t, td)
            if inspect.isawaitable(out):
                out = await out
            td = out
        return cast(TensorDictBase, td)

    @property
    def _needs_inv(self) -> bool:
        return any(t._needs_inv for t in self)

    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        for t in self:
            batch_size = t.transform_env_batch_size(batch_size)
        return batch_size

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        for t in self:
            output_spec = t.transform_output_spec(output_spec)
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        for t in self:
            input_spec = t.transform_input_spec(input_spec)
        return input_spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        for t in self:
            observation_spec = t.transform_observation_spec(observation_spec)
        return observation_spec

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        for t in self:
            reward_spec = t.transform_reward_spec(reward_spec)
        return reward_spec

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        for t in self:
            done_spec = t.transform_done_spec(done_spec)
        return done_spec

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        for t in self:
            action_spec = t.transform_action_spec(action_spec)
        return action_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        for t in self:
            state_spec = t.transform_state_spec(state_spec)
        return state_spec

    def extra_repr(self) -> str:
        return ""
