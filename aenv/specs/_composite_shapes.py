"""Shape algebra of Composite specs (expand, index, squeeze, reshape, unbind, copies).

Every operation applies to the composite's own leading dims and maps over the children.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from aenv.exceptions import SpecError

from ._base import TensorSpec
from ._shape import index_shape, norm_dim, parse_shape_args, to_device

__all__: list[str] = []


class _CompositeShapeMixin:
    """Mixed into Composite; relies on its ``_specs``, ``shape``, ``device`` and ``_meta``."""

    _specs: dict[str, TensorSpec]
    shape: torch.Size
    device: torch.device | None
    _meta: dict[str, Any]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def _new_unchecked(
        cls, specs: dict[str, TensorSpec], shape: torch.Size, device: Any, meta: dict[str, Any]
    ) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------------ copies and shapes
    def _map(self, shape: torch.Size, fn: Callable[[TensorSpec], TensorSpec]) -> Any:
        specs = {k: fn(v) for k, v in self._specs.items()}
        return type(self)._new_unchecked(specs, shape, self.device, self._meta)

    def clone(self) -> Any:
        """A deep copy (unlocked)."""
        return self._map(self.shape, lambda s: s.clone())

    def to(self, dest: Any) -> Any:
        """The composite and every child on another device."""
        if isinstance(dest, torch.dtype):
            raise SpecError("a Composite has no dtype to change")
        device = to_device(dest)
        if device == self.device:
            return self
        new = self._map(self.shape, lambda s: s.to(device))
        new.device = device
        return new

    def expand(self, *shape: Any) -> Any:
        """Prepends leading dims to the composite and to every child."""
        new = parse_shape_args(shape)
        nd = self.ndim
        if len(new) < nd or (nd and tuple(new[-nd:]) != tuple(self.shape)):
            raise SpecError(
                f"cannot expand Composite of shape {tuple(self.shape)} to {tuple(new)}: the new "
                "shape must end with the current shape"
            )
        lead = new[: len(new) - nd]
        if not lead:
            return self.clone()  # a new spec, as for any other shape: edits stay its own
        return self._map(new, lambda s: s.expand(*lead, *s.shape))

    def squeeze(self, dim: int | None = None) -> Any:
        """Removes size-1 dims of the composite's shape (all, or ``dim``) from every child."""
        if dim is None:
            dims = [i for i, s in enumerate(self.shape) if s == 1]
        else:
            d = norm_dim(dim, self.ndim)
            dims = [d] if self.shape[d] == 1 else []
        if not dims:
            return self
        out: Any = self
        for d in reversed(dims):
            shape = out.shape[:d] + out.shape[d + 1 :]
            out = out._map(shape, _squeezer(d))
        return out

    def unsqueeze(self, dim: int) -> Any:
        """Inserts a size-1 dim at ``dim`` of the composite and of every child."""
        d = norm_dim(dim, self.ndim, insert=True)
        shape = self.shape[:d] + (1,) + self.shape[d:]
        return self._map(torch.Size(shape), lambda s: s.unsqueeze(d))

    def reshape(self, *shape: Any) -> Any:
        """Reshapes the composite's own dims (children keep their trailing dims)."""
        new = parse_shape_args(shape)
        probe = torch.zeros(()).expand(self.shape).reshape(new).shape
        nd = self.ndim
        return self._map(probe, lambda s: s.reshape(*probe, *s.shape[nd:]))

    view = reshape

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """The composites of each slice along dim ``dim`` of the composite's shape."""
        d = norm_dim(dim, self.ndim)
        shape = self.shape[:d] + self.shape[d + 1 :]
        parts = {k: v.unbind(d) for k, v in self._specs.items()}
        return tuple(
            type(self)._new_unchecked(
                {k: p[i] for k, p in parts.items()}, shape, self.device, self._meta
            )
            for i in range(self.shape[d])
        )

    def _index(self, index: Any) -> Any:
        idx = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis for i in idx):
            pos = next(j for j, i in enumerate(idx) if i is Ellipsis)
            used = sum(1 for i in idx if i is not None and i is not Ellipsis)
            idx = idx[:pos] + (slice(None),) * max(self.ndim - used, 0) + idx[pos + 1 :]
        if sum(1 for i in idx if i is not None) > self.ndim:
            raise SpecError(f"too many indices for Composite of shape {tuple(self.shape)}")
        shape = index_shape(self.shape, idx)
        return self._map(shape, lambda s: s[idx])


def _squeezer(dim: int) -> Callable[[TensorSpec], TensorSpec]:
    return lambda s: s.squeeze(dim)
