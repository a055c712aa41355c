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
    # each hook runs the chain's hooks in turn, awaiting only once one returns an awaitable
    def _call(self, next_tensordict: TensorDictBase) -> Any:
        return _chain(list(self), lambda t, td: t._call(td), next_tensordict)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> Any:
        return _chain(list(self), lambda t, td: t._step(tensordict, td), next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> Any:
        return _chain(list(self), lambda t, td: t._reset(tensordict, td), tensordict_reset)

    def _inv_call(self, tensordict: TensorDictBase) -> Any:
        ts = [t for t in reversed(self) if t._needs_inv]
        return _chain(ts, lambda t, td: t._inv_call(td), tensordict)

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> Any:
        return _chain(list(self)[::-1], lambda t, td: t._reset_env_preprocess(td), tensordict)

    @property
    def _needs_inv(self) -> bool:
        return any(t._needs_inv for t in self)

    # the spec hooks: each transform's in turn
    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        return _fold(self, "transform_env_batch_size", batch_size)  # type: ignore[no-any-return]

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        return _fold(self, "transform_output_spec", output_spec)  # type: ignore[no-any-return]

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        return _fold(self, "transform_input_spec", input_spec)  # type: ignore[no-any-return]

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        return _fold(self, "transform_observation_spec", observation_spec)  # type: ignore[no-any-return]

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        return _fold(self, "transform_reward_spec", reward_spec)  # type: ignore[no-any-return]

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        return _fold(self, "transform_done_spec", done_spec)  # type: ignore[no-any-return]

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        return _fold(self, "transform_action_spec", action_spec)  # type: ignore[no-any-return]

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        return _fold(self, "transform_state_spec", state_spec)  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return ""


def _fold(transforms: Compose, hook: str, value: Any) -> Any:
    """``value`` through hook ``hook`` of each transform in turn."""
    for t in transforms:
        value = getattr(t, hook)(value)
    return value


def _chain(transforms: list[Transform], call: Any, td: Any) -> Any:
    """``td`` through ``call(t, td)`` for each transform in turn; a coroutine from the first
    call that returns an awaitable on."""
    for i, t in enumerate(transforms):
        td = call(t, td)
        if inspect.isawaitable(td):
            return _chain_rest(td, transforms[i + 1 :], call)
    return td


async def _chain_rest(pending: Any, rest: list[Transform], call: Any) -> TensorDictBase:
    td = _chain(rest, call, await pending)
    return await td if inspect.isawaitable(td) else td  # type: ignore[no-any-return]
