"""Shape transforms: UnsqueezeTransform, SqueezeTransform, FlattenObservation, PermuteTransform.

Dims count from the end (negative), so one transform serves any batch size: a batch-unlocked
env's data may carry more leading dims than its specs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from aenv._mdp import NestedKey
from aenv.exceptions import SpecError
from aenv.specs import TensorSpec
from aenv.transforms._base import Transform
from aenv.transforms._t2_common import check_negative_dim, map_leaf

__all__ = ["FlattenObservation", "PermuteTransform", "SqueezeTransform", "UnsqueezeTransform"]

Keys = Sequence[NestedKey] | NestedKey | None


def _spec_dim(spec: TensorSpec, dim: int, *, insert: bool = False) -> int:
    """``dim`` (negative, counted on data) as a non-negative index into ``spec.shape``."""
    nd = spec.ndim + (1 if insert else 0)
    out = dim + nd if dim < 0 else dim
    if not 0 <= out < nd:
        raise SpecError(f"dim {dim} is out of range for a spec of shape {tuple(spec.shape)}")
    return out


def _unsqueeze_spec(spec: TensorSpec, dim: int) -> TensorSpec:
    d = _spec_dim(spec, dim, insert=True)
    shape = (*spec.shape[:d], 1, *spec.shape[d:])
    return map_leaf(spec, shape, lambda t: t.unsqueeze(d))


def _squeeze_spec(spec: TensorSpec, dim: int) -> TensorSpec:
    d = _spec_dim(spec, dim)
    if spec.shape[d] != 1:
        raise SpecError(
            f"cannot squeeze dim {dim} of a spec of shape {tuple(spec.shape)}: its size is not 1"
        )
    shape = (*spec.shape[:d], *spec.shape[d + 1 :])
    return map_leaf(spec, shape, lambda t: t.squeeze(d))


class _DimTransform(Transform):
    """A transform of one dim, ``dim`` (see :class:`UnsqueezeTransform` for its arguments)."""

    def __init__(
        self,
        dim: int = -1,
        in_keys: Keys = None,
        out_keys: Keys = None,
        in_keys_inv: Keys = None,
        out_keys_inv: Keys = None,
        *,
        allow_positive_dim: bool = False,
    ) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        self.dim = check_negative_dim(type(self).__name__, dim, allow_positive_dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, {super().extra_repr()}"


class UnsqueezeTransform(_DimTransform):
    """Inserts a dimension of size one at the specified position.

    Forward on ``in_keys`` (outputs); the inverse (``in_keys_inv``) squeezes that dim out of
    the outer entries again, so a policy may produce actions with the extra dim.

    Args:
        dim: where to insert the dim; negative (counted from the end of the data, which keeps
            the transform independent of batch dims) unless ``allow_positive_dim``.
        allow_positive_dim: accept a non-negative ``dim`` (counted on the full tensor,
            batch dims included; only safe when the data's batch size never changes).
        in_keys, out_keys, in_keys_inv, out_keys_inv: as for :class:`Transform`.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), UnsqueezeTransform(-1, in_keys=["th"]))
        >>> (await env.reset())["th"].shape
        torch.Size([1])
    """

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.unsqueeze(self.dim)

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.squeeze(self.dim)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return _unsqueeze_spec(spec, self.dim)

    _inv_transform_spec = _transform_spec


class SqueezeTransform(_DimTransform):
    """Removes a dimension of size one at the specified position.

    The inverse (``in_keys_inv``) puts the dim back on outer entries before the base env
    sees them.

    Args:
        dim: the size-1 dim to remove; negative unless ``allow_positive_dim``.
        allow_positive_dim: accept a non-negative ``dim`` (see :class:`UnsqueezeTransform`).
        in_keys, out_keys, in_keys_inv, out_keys_inv: as for :class:`Transform`.

    Example:
        >>> env = TransformedEnv(CountingEnv(), SqueezeTransform(-1, in_keys=["observation"]))
        >>> (await env.reset())["observation"].shape
        torch.Size([])
    """

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        if value.shape[self.dim] != 1:
            raise ValueError(
                f"SqueezeTransform: dim {self.dim} of a tensor of shape {tuple(value.shape)} "
                "is not of size 1"
            )
        return value.squeeze(self.dim)

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.unsqueeze(self.dim)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return _squeeze_spec(spec, self.dim)

    _inv_transform_spec = _transform_spec


class FlattenObservation(Transform):
    """Flatten adjacent dimensions of a tensor (``first_dim`` to ``last_dim``, both included).

    Args:
        first_dim: first dim to flatten (negative unless ``allow_positive_dim``).
        last_dim: last dim to flatten (negative unless ``allow_positive_dim``).
        in_keys: entries to flatten (default ``["pixels"]``).
        out_keys: where to write them (default: in place).
        allow_positive_dim: accept non-negative dims (see :class:`UnsqueezeTransform`).

    Example:
        >>> t = FlattenObservation(-3, -1, in_keys=["pixels"])  # (C, H, W) -> (C * H * W,)
        >>> env = TransformedEnv(PixelEnv(), t)  # any env with a "pixels" entry
    """

    def __init__(
        self,
        first_dim: int,
        last_dim: int,
        in_keys: Keys = None,
        out_keys: Keys = None,
        *,
        allow_positive_dim: bool = False,
    ) -> None:
        if in_keys is None:
            in_keys = ["pixels"]
        super().__init__(in_keys, out_keys)
        name = type(self).__name__
        self.first_dim = check_negative_dim(name, first_dim, allow_positive_dim)
        self.last_dim = check_negative_dim(name, last_dim, allow_positive_dim)
        if (first_dim < 0) == (last_dim < 0) and first_dim > last_dim:
            raise ValueError(
                f"{name}: first_dim ({first_dim}) must come before last_dim ({last_dim})"
            )

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.flatten(self.first_dim, self.last_dim)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        first = _spec_dim(spec, self.first_dim)
        last = _spec_dim(spec, self.last_dim)
        if first > last:
            raise SpecError(f"FlattenObservation: bad dims for spec shape {tuple(spec.shape)}")
        shape = spec.shape
        size = math.prod(shape[first : last + 1])
        new = (*shape[:first], size, *shape[last + 1 :])
        return map_leaf(spec, new, lambda t: t.flatten(first, last))

    def extra_repr(self) -> str:
        return f"first_dim={self.first_dim}, last_dim={self.last_dim}, {super().extra_repr()}"


class PermuteTransform(Transform):
    """Permutation transform: reorders the last ``len(dims)`` dims of the entries.

    Args:
        dims: the new order, a permutation of ``[-len(dims), ..., -1]`` (e.g. ``[-1, -3, -2]``
            turns ``(H, W, C)`` into ``(C, H, W)``).
        in_keys, out_keys: entries permuted in the forward pass.
        in_keys_inv, out_keys_inv: entries permuted back (inverse order) on the way in.

    Example:
        >>> t = PermuteTransform([-1, -3, -2], in_keys=["pixels"])  # (H, W, C) -> (C, H, W)
        >>> t(TensorDict(pixels=torch.zeros(4, 5, 3)))["pixels"].shape
        torch.Size([3, 4, 5])
    """

    def __init__(
        self,
        dims: Sequence[int],
        in_keys: Keys = None,
        out_keys: Keys = None,
        in_keys_inv: Keys = None,
        out_keys_inv: Keys = None,
    ) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        dims = [int(d) for d in dims]
        n = len(dims)
        if sorted(dims) != list(range(-n, 0)):
            raise ValueError(
                f"PermuteTransform: dims must be a permutation of {list(range(-n, 0))}, got {dims}"
            )
        self.dims = dims
        # inverse permutation: position j of the output holds input dim dims[j]
        inv = [0] * n
        for j, d in enumerate(dims):
            inv[d + n] = j - n
        self.inv_dims = inv

    @staticmethod
    def _permute(value: torch.Tensor, dims: list[int]) -> torch.Tensor:
        nd = value.ndim
        lead = list(range(nd - len(dims)))
        return value.permute(*lead, *[nd + d for d in dims])

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return self._permute(value, self.dims)

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return self._permute(value, self.inv_dims)

    def _spec_permute(self, spec: TensorSpec, dims: list[int]) -> TensorSpec:
        nd = spec.ndim
        if nd < len(dims):
            raise SpecError(f"PermuteTransform: spec shape {tuple(spec.shape)} has too few dims")
        order = [*range(nd - len(dims)), *[nd + d for d in dims]]
        shape = [spec.shape[i] for i in order]
        return map_leaf(spec, shape, lambda t: t.permute(*order))

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return self._spec_permute(spec, self.dims)

    # inner (base) spec -> outer spec: the outer entry is the forward permutation
    _inv_transform_spec = _transform_spec

    def extra_repr(self) -> str:
        return f"dims={self.dims}, {super().extra_repr()}"
