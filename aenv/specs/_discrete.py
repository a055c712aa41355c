"""Discrete leaf specs: Categorical, OneHot, MultiCategorical, MultiOneHot (with action masks)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from aenv.exceptions import SpecError

from ._base import TensorSpec, enumerated, full_param
from ._shape import DEVICE_TYPING, parse_shape, torch_dtype

__all__ = [
    "Categorical",
    "DiscreteTensorSpec",
    "OneHot",
    "OneHotDiscreteTensorSpec",
]


def _check_n(n: Any, what: str) -> int:
    try:
        out = int(n)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{what}: n must be an int, got {n!r}") from exc
    if out <= 0:
        raise SpecError(f"{what}: n must be > 0, got {out}")
    return out


def _sample_masked(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Indices drawn uniformly among the allowed entries of ``mask`` (..., n), batch ``shape``."""
    n = mask.shape[-1]
    probs = mask.expand(*shape, n).reshape(-1, n).to(torch.float32)
    if probs.shape[0] == 0:
        return torch.zeros(shape, dtype=torch.int64, device=mask.device)
    if bool((probs.sum(-1) == 0).any()):
        raise SpecError("cannot sample from a mask that allows no action")
    return torch.multinomial(probs, 1).reshape(shape)


# one-hot rows by (n, dtype, device): an identity matrix and, on the CPU for small n, its
# rows as numpy arrays (copying one and wrapping it with from_numpy is the cheapest fresh tensor)
_EYES: dict[tuple[int, torch.dtype, Any], tuple[torch.Tensor, tuple[np.ndarray, ...] | None]] = {}
_ROWS_MAX_N = 64  # cache single rows up to this n
_SCALAR = torch.Size(())
_EYE_MAX_N = 1024  # beyond this n, no identity matrix (n * n elements): one_hot instead


def _eye(
    n: int, dtype: torch.dtype, device: Any
) -> tuple[torch.Tensor, tuple[np.ndarray, ...] | None]:
    key = (n, dtype, device)
    found = _EYES.get(key)
    if found is None:
        eye = torch.eye(n, device=device).to(dtype)
        rows = None
        if eye.device.type == "cpu" and n <= _ROWS_MAX_N:
            try:
                rows = tuple(r.numpy().copy() for r in eye)
            except TypeError:  # a dtype numpy lacks (bfloat16, ...)
                rows = None
        found = _EYES[key] = (eye, rows)
    return found


def one_hot_rows(idx: torch.Tensor, n: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``one_hot(idx, n).to(dtype)`` as one lookup in a cached identity matrix (a fresh tensor).

    For indices known to lie in ``[0, n)`` (no range check: a negative index would wrap).
    ``torch.nn.functional.one_hot`` checks the range (two reductions) and needs a cast; this
    does neither. A scalar index on the CPU copies a cached row (the caller owns the result
    and may write to it).
    """
    if n > _EYE_MAX_N:
        return torch.nn.functional.one_hot(idx, n).to(dtype)
    eye, rows = _eye(n, dtype, device)
    if idx.ndim == 1:
        return eye.index_select(0, idx)  # (a fresh tensor; cheaper than eye[idx])
    if idx.ndim:
        # (not eye[idx]: advanced indexing runs on torch's intra-op threads from ~2k
        # indices, a rollout's chunk of random actions, see aenv.envs._rowplan.serial_copy;
        # index_select stays in the calling thread up to ~8k)
        return eye.index_select(0, idx.reshape(-1)).reshape(*idx.shape, n)
    if rows is not None and idx.is_cpu:
        return torch.from_numpy(rows[idx.item()].copy())  # type: ignore[index]
    return eye[idx].clone()  # a 0-dim index gives a view of ``eye``


def one_hot_row(i: int, n: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """The one-hot vector of index ``i`` (checked to lie in ``[0, n)``) as a fresh tensor."""
    if not 0 <= i < n:
        raise RuntimeError(f"one-hot index {i} is out of [0, {n})")
    if n <= _ROWS_MAX_N:
        rows = _eye(n, dtype, device)[1]
        if rows is not None:
            return torch.from_numpy(rows[i].copy())
    return one_hot_rows(torch.tensor(i, device=device), n, dtype, device)


def _first_allowed(mask: torch.Tensor) -> torch.Tensor:
    return mask.to(torch.int8).argmax(-1)


def _mask_ok(mask: torch.Tensor, idx: torch.Tensor) -> bool:
    m = mask.expand(*idx.shape, mask.shape[-1])
    return bool(m.gather(-1, idx.long().unsqueeze(-1)).all())


def _check_mask(mask: torch.Tensor, what: str) -> None:
    if mask.numel() and not bool(mask.any(-1).all()):
        raise SpecError(f"{what}: the mask must allow at least one value everywhere")


def _shared_mask(mask: torch.Tensor) -> torch.Tensor:
    rows = mask.reshape(-1, mask.shape[-1])
    if not bool((rows == rows[0]).all()):
        raise SpecError("enumerate(use_mask=True) needs the same mask for every element")
    return rows[0]


class _MaskMixin:
    mask: torch.Tensor | None
    shape: torch.Size
    device: torch.device | None

    def _mask_shape(self) -> torch.Size:
        raise NotImplementedError

    def update_mask(self, mask: Any) -> None:
        """Sets (or, with ``None``, clears) the mask of allowed values, in place.

        ``rand()`` then draws only allowed values and ``is_in`` rejects the others.
        """
        if mask is None:
            self.mask = None
            return
        full = full_param(mask, self._mask_shape(), torch.bool, self.device)
        _check_mask(full, type(self).__name__)
        self.mask = full


class _OneOfN(_MaskMixin):
    """A choice of one of ``n`` values per element (Categorical, OneHot)."""

    n: int

    def _extra_eq(self, other: Any) -> bool:
        return bool(self.n == other.n)

    def cardinality(self) -> int:
        """``n``."""
        return self.n

    def _repr_extra(self) -> str:
        return f"n={self.n}" + (", masked" if self.mask is not None else "")


class Categorical(_OneOfN, TensorSpec):
    """Integer values in ``[0, n)`` (one category index per element; default dtype int64).

    Example:
        >>> import torch
        >>> from aenv.specs import Categorical
        >>> spec = Categorical(4, shape=(2,))
        >>> spec.update_mask(torch.tensor([True, False, False, True]))
        >>> val = spec.rand()
        >>> bool(((val == 0) | (val == 3)).all())
        True
    """

    _kind = "categorical"
    _param_names = ("mask",)

    def __init__(
        self,
        n: int,
        shape: Any = (),
        device: DEVICE_TYPING = None,
        dtype: Any = torch.int64,
        mask: Any = None,
    ) -> None:
        self.n = _check_n(n, "Categorical")
        dtype = torch_dtype(dtype)
        self._check_dtype(dtype)
        if dtype == torch.bool and self.n > 2:
            raise SpecError(f"Categorical with dtype bool needs n <= 2, got n={self.n}")
        super().__init__(parse_shape(shape), device, dtype)
        self.mask = None
        if mask is not None:
            self.update_mask(mask)

    @classmethod
    def _check_dtype(cls, dtype: Any) -> None:
        if dtype.is_floating_point or dtype.is_complex:
            raise SpecError(f"{cls.__name__} needs an integer or bool dtype, got {dtype}")

    def _mask_shape(self) -> torch.Size:
        return self.shape + (self.n,)

    def _rand(self, shape: torch.Size) -> torch.Tensor:
        if self.mask is not None:
            return _sample_masked(self.mask, shape).to(self.dtype)
        if self.dtype == torch.bool:
            return torch.randint(0, self.n, shape, device=self.device).bool()
        if self.dtype is torch.int64 and self.device is None:
            return torch.randint(self.n, shape)  # the same draw; fewer arguments to parse
        return torch.randint(0, self.n, shape, dtype=self.dtype, device=self.device)

    def _check_values(self, val: torch.Tensor) -> str | None:
        if val.dtype != torch.bool and not bool(((val >= 0) & (val < self.n)).all()):
            return f"some elements are out of [0, {self.n})"
        if val.dtype == torch.bool and self.n == 1 and bool(val.any()):
            return "some elements are out of [0, 1)"
        if self.mask is not None and val.numel() and not _mask_ok(self.mask, val):
            return "some elements are masked out"
        return None

    def _project(self, val: torch.Tensor) -> torch.Tensor:
        if val.is_floating_point():
            val = torch.nan_to_num(val).round()
        val = val.to(torch.int64).clamp(0, self.n - 1)
        if self.mask is not None and val.numel():
            m = self.mask.expand(*val.shape, self.n)
            ok = m.gather(-1, val.unsqueeze(-1)).squeeze(-1)
            val = torch.where(ok, val, _first_allowed(m))
        return val.to(self.dtype)

    def enumerate(self, use_mask: bool = False) -> torch.Tensor:
        """``arange(n)`` over a new leading dim, expanded to the spec's shape.

        With ``use_mask``, only the values the mask allows (the same mask everywhere).
        """
        vals = torch.arange(self.n, device=self.device)
        if use_mask and self.mask is not None:
            vals = vals[_shared_mask(self.mask)]
        vals = vals.to(self.dtype)
        return enumerated(vals, self.shape)

    def index(self, index: torch.Tensor, tensor_to_index: torch.Tensor) -> torch.Tensor:
        """``tensor_to_index[..., index]`` element-wise (last dim of ``tensor_to_index`` has n)."""
        t = tensor_to_index.expand(*index.shape, tensor_to_index.shape[-1])
        return t.gather(-1, index.long().unsqueeze(-1)).squeeze(-1)

    def to_one_hot(self, val: torch.Tensor) -> torch.Tensor:
        """The one-hot (bool) encoding of a categorical value."""
        return torch.nn.functional.one_hot(val.long(), self.n).bool()

    def to_one_hot_spec(self) -> OneHot:
        """The equivalent :class:`OneHot` spec."""
        return OneHot(self.n, self.shape + (self.n,), device=self.device, mask=self.mask)


DiscreteTensorSpec = Categorical


class OneHot(_OneOfN, TensorSpec):
    """One-hot values: the last dim has ``n`` elements, exactly one of them set (default bool).

    Example:
        >>> from aenv.specs import OneHot
        >>> spec = OneHot(3)
        >>> int(spec.rand().sum())
        1
        >>> spec.project(torch.tensor([0.1, 2.0, -1.0])).tolist()
        [False, True, False]
    """

    _kind = "one_hot"
    _event_ndim = 1
    _param_names = ("mask",)

    def __init__(
        self,
        n: int,
        shape: Any = None,
        device: DEVICE_TYPING = None,
        dtype: Any = torch.bool,
        mask: Any = None,
    ) -> None:
        self.n = _check_n(n, "OneHot")
        shape = (self.n,) if shape is None else parse_shape(shape)
        if not len(shape) or shape[-1] != self.n:
            raise SpecError(f"OneHot: the last dim of shape {tuple(shape)} must be n={self.n}")
        dtype = torch_dtype(dtype)
        if dtype.is_complex:
            raise SpecError(f"OneHot does not support dtype {dtype}")
        super().__init__(shape, device, dtype)
        self.mask = None
        if mask is not None:
            self.update_mask(mask)

    def _mask_shape(self) -> torch.Size:
        return self.shape

    def _rand(self, shape: torch.Size) -> torch.Tensor:
        n, dtype, device = self.n, self.dtype, self.device
        if len(shape) == 1 and self.mask is None and n <= _ROWS_MAX_N:
            # the per-step case (one unmasked one-hot): a cached row, copied
            rows = _eye(n, dtype, device)[1]
            idx = torch.randint(0, n, _SCALAR, device=device)
            if rows is not None and idx.is_cpu:
                return torch.from_numpy(rows[idx.item()].copy())  # type: ignore[index]
            return one_hot_rows(idx, n, dtype, device)
        batch = shape[:-1]
        if self.mask is not None:
            idx = _sample_masked(self.mask, batch)
        else:
            idx = torch.randint(0, n, batch, device=device)
        return one_hot_rows(idx, n, dtype, device)

    def _zero(self, shape: torch.Size) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _check_values(self, val: torch.Tensor) -> str | None:
        if val.dtype != torch.bool and not bool(((val == 0) | (val == 1)).all()):
            return "some elements are neither 0 nor 1"
        if not bool((val.to(torch.int64).sum(-1) == 1).all()):
            return "some rows do not have exactly one element set"
        if self.mask is not None and bool((val.bool() & ~self.mask).any()):
            return "some elements are masked out"
        return None

    def _project(self, val: torch.Tensor) -> torch.Tensor:
        scores = torch.nan_to_num(val.to(torch.float32), nan=-math.inf)
        if self.mask is not None:
            scores = scores.masked_fill(~self.mask.expand_as(scores), -math.inf)
            scores = torch.where(self.mask.expand_as(scores) & (scores == -math.inf), -1e30, scores)
        idx = scores.argmax(-1)
        return torch.nn.functional.one_hot(idx, self.n).to(self.dtype)

    def enumerate(self, use_mask: bool = False) -> torch.Tensor:
        """The ``n`` one-hot vectors over a new leading dim, expanded to the batch dims.

        With ``use_mask``, only the values the mask allows (the same mask everywhere).
        """
        eye = torch.eye(self.n, device=self.device).to(self.dtype)
        if use_mask and self.mask is not None:
            eye = eye[_shared_mask(self.mask)]
        return enumerated(eye, self.shape[:-1])

    def index(self, index: torch.Tensor, tensor_to_index: torch.Tensor) -> torch.Tensor:
        """Picks ``tensor_to_index[..., k]`` where ``index`` (one-hot) has its k-th element set."""
        idx = index.to(torch.int8).argmax(-1)
        t = tensor_to_index.expand(*idx.shape, tensor_to_index.shape[-1])
        return t.gather(-1, idx.unsqueeze(-1)).squeeze(-1)

    def to_categorical(self, val: torch.Tensor) -> torch.Tensor:
        """The category index of a one-hot value."""
        return val.to(torch.int8).argmax(-1)

    def to_categorical_spec(self) -> Categorical:
        """The equivalent :class:`Categorical` spec."""
        return Categorical(self.n, self.shape[:-1], device=self.device, mask=self.mask)


OneHotDiscreteTensorSpec = OneHot
