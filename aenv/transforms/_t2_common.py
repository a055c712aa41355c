"""Small helpers shared by the shape, image, cat and step transforms (no I/O, no state)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey
from aenv.exceptions import SpecError
from aenv.specs import Bounded, TensorSpec, Unbounded

__all__ = [
    "batch_mask",
    "check_negative_dim",
    "done_mask",
    "map_leaf",
    "rebound",
    "where_batch",
]


def check_negative_dim(owner: str, dim: int, allow_positive: bool = False) -> int:
    """``dim`` itself, after checking that it counts from the end (batch-size agnostic)."""
    if dim >= 0 and not allow_positive:
        raise ValueError(
            f"{owner}: dim must be negative (counted from the last dim, so that it does not "
            f"depend on batch dims), got {dim}; pass allow_positive_dim=True to force it"
        )
    return dim


def batch_mask(td: TensorDictBase | None, batch_size: torch.Size) -> torch.Tensor | None:
    """The root ``"_reset"`` mask of ``td`` as a bool tensor of shape ``batch_size``.

    None means "every element" (no mask, or a mask that selects everything).
    """
    if td is None:
        return None
    mask = td.get("_reset", None)
    if mask is None:
        return None
    mask = mask.to(torch.bool)
    if mask.shape != batch_size:
        if mask.numel() == batch_size.numel():
            mask = mask.reshape(batch_size)
        else:  # a mask with extra trailing dims (nested levels): any element reset
            mask = mask.reshape(*batch_size, -1).any(-1)
    if bool(mask.all()):
        return None
    return mask


def where_batch(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` where the batch-shaped ``mask`` is True, else ``old`` (broadcast over trailing dims)."""
    m = mask.reshape(*mask.shape, *([1] * (new.ndim - mask.ndim)))
    return torch.where(m, new, old)


def done_mask(
    td: TensorDictBase, done_keys: Sequence[NestedKey], batch_size: torch.Size
) -> torch.Tensor:
    """Per batch element: is any done flag set? A bool tensor of shape ``batch_size``."""
    out = torch.zeros(batch_size, dtype=torch.bool, device=td.device)
    for key in done_keys:
        flag = td.get(key, None)
        if isinstance(flag, torch.Tensor):
            out = out | flag.reshape(*batch_size, -1).any(-1)
    return out


def map_leaf(
    spec: TensorSpec, shape: Sequence[int], fn: Callable[[torch.Tensor], torch.Tensor]
) -> TensorSpec:
    """A copy of a leaf spec with a new ``shape``; ``fn`` maps its per-element parameters.

    Bounds (and masks shaped like the spec) go through ``fn`` so they keep matching elements.
    Parameters of another shape (a categorical mask's extra ``n`` dim) cannot follow a shape
    change, so such specs are refused.
    """
    for name in spec._param_names:
        value = getattr(spec, name, None)
        if isinstance(value, torch.Tensor) and value.shape != spec.shape:
            raise SpecError(
                f"cannot reshape a {type(spec).__name__} whose {name!r} has shape "
                f"{tuple(value.shape)} (spec shape {tuple(spec.shape)})"
            )
    return spec._copy_with(torch.Size(shape), fn)


def rebound(
    spec: TensorSpec, shape: Sequence[int], *, dtype: torch.dtype | None = None
) -> TensorSpec:
    """A Bounded (same overall range) or Unbounded spec of a new shape (and dtype).

    For transforms whose outputs are convex mixes of their inputs (resize, grayscale): the
    output stays within the overall ``[min(low), max(high)]`` of the input spec.
    """
    dtype = spec.dtype if dtype is None else dtype
    if isinstance(spec, Bounded):
        return Bounded(
            spec.low.min().item(),
            spec.high.max().item(),
            shape=torch.Size(shape),
            dtype=dtype,
            device=spec.device,
        )
    if isinstance(spec, Unbounded):
        return Unbounded(torch.Size(shape), device=spec.device, dtype=dtype)
    raise SpecError(f"expected a Bounded or Unbounded spec, got {type(spec).__name__}")
