"""Spec helpers built on the spec classes (kept apart from them to avoid import cycles)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from ._composite import Composite
from ._discrete import Categorical
from ._leaves import NonTensor, Unbounded

__all__ = ["done_flags", "flag", "make_composite_from_td"]


def flag(shape: tuple[int, ...]) -> Categorical:
    """A boolean flag spec of ``shape`` (a mask, a done flag)."""
    return Categorical(2, shape=shape, dtype=torch.bool)


def done_flags(shape: tuple[int, ...]) -> dict[str, Categorical]:
    """``done``, ``terminated`` and ``truncated`` flag specs of ``shape``, for one level."""
    return {k: flag(shape) for k in ("done", "terminated", "truncated")}


def make_composite_from_td(
    data: TensorDictBase,
    *,
    unsqueeze_null_shapes: bool = True,
    dynamic_shape: bool = False,
) -> Composite:
    """Builds a :class:`Composite` describing ``data``, every tensor as :class:`Unbounded`.

    The composite's shape is ``data.batch_size``; nested tensordicts become nested
    composites and non-tensor entries :class:`NonTensor` leaves (holding their data as
    ``example_data``).

    Args:
        data: the tensordict to describe.
        unsqueeze_null_shapes: describe 0-dim tensors (shape ``()``, only possible in an
            unbatched tensordict) with shape ``(1,)``, as TorchRL does.
        dynamic_shape: mark every non-batch dim as dynamic (-1).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from aenv.specs import make_composite_from_td
        >>> td = TensorDict({"obs": torch.zeros(2, 3), "next": {"r": torch.zeros(2, 1)}}, [2])
        >>> spec = make_composite_from_td(td)
        >>> spec["obs"].shape, spec.shape
        (torch.Size([2, 3]), torch.Size([2]))
    """
    batch = data.batch_size
    nb = len(batch)
    out = Composite(shape=batch, device=data.device)
    for key in data.keys():
        value: Any = data.get(key)
        if isinstance(value, TensorDictBase) and not _is_non_tensor(value):
            out[key] = make_composite_from_td(
                value, unsqueeze_null_shapes=unsqueeze_null_shapes, dynamic_shape=dynamic_shape
            )
            continue
        if _is_non_tensor(value):
            example = value.tolist() if value.batch_size else value.data
            if value.batch_size:
                first = example
                for _ in value.batch_size:
                    first = first[0] if isinstance(first, list) and first else first
                example = first
            out[key] = NonTensor(shape=value.batch_size, device=data.device, example_data=example)
            continue
        if not isinstance(value, torch.Tensor):
            out[key] = NonTensor(shape=batch, device=data.device, example_data=value)
            continue
        shape = list(value.shape)
        if unsqueeze_null_shapes and not shape:
            shape.append(1)
        if dynamic_shape:
            shape = shape[:nb] + [-1] * (len(shape) - nb)
        out[key] = Unbounded(shape=shape, device=data.device, dtype=value.dtype)
    return out


def _is_non_tensor(value: Any) -> bool:
    from tensordict import NonTensorData, NonTensorStack

    return isinstance(value, (NonTensorData, NonTensorStack))
