"""Discrete leaf specs: Categorical, OneHot, MultiCategorical, MultiOneHot (with action masks)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from aenv.exceptions import SpecError

from ._base import TensorSpec, full_param
from ._shape import DEVICE_TYPING, concrete_shape, parse_shape, torch_dtype

__all__ = [
    "Categorical",
    "DiscreteTensorSpec",
    "MultiCategorical",
    "MultiDiscreteTensorSpec",
    "MultiOneHot",
    "MultiOneHotDiscreteTensorSpec",
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


def _first_allowed(mask: torch.Tensor) -> torch.Tensor:
    return mask.to(torch.int8).argmax(-1)


def _mask_ok(mask: torch.Tensor, idx: torch.Tensor) -> bool:
    m = mask.expand(*idx.shape, mask.shape[-1])
    return bool(m.gather(-1, idx.long().unsqueeze(-1)).all())


def _check_mask(mask: torch.Tensor, what: str) -> None:
    if mask.numel() and not bool(mask.any(-1).all()):
        raise SpecError(f"{what}: the mask must allow at least one value everywhere")


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


class Categorical(_MaskMixin, TensorSpec):
    """Integer values in ``[0, n)`` (one category index per element; default dtype int64).

    Example:
        >>> import torch
        >>> from aenv.specs import Categorical
        >>> spec = Categorical(4, shape=(2,))
        >>> spec.update_mask(torch.tensor([True, False, False, True]))
        >>> bool(((spec.rand() == 0) | (spec.rand() == 3)).all())
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

    def _extra_eq(self, other: Any) -> bool:
        return bool(self.n == other.n)

    def cardinality(self) -> int:
        """``n``."""
        return self.n

    def enumerate(self) -> torch.Tensor:
        """``arange(n)`` over a new leading dim, expanded to the spec's shape."""
        batch = concrete_shape(self.shape)
        vals = torch.arange(self.n, device=self.device).to(self.dtype)
        return vals.reshape(-1, *(1,) * len(batch)).expand(-1, *batch).clone()

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

    def _repr_extra(self) -> str:
        return f"n={self.n}" + (", masked" if self.mask is not None else "")


DiscreteTensorSpec = Categorical


class OneHot(_MaskMixin, TensorSpec):
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
        batch = shape[:-1]
        if self.mask is not None:
            idx = _sample_masked(self.mask, batch)
        else:
            idx = torch.randint(0, self.n, batch, device=self.device)
        return torch.nn.functional.one_hot(idx, self.n).to(self.dtype)

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

    def _extra_eq(self, other: Any) -> bool:
        return bool(self.n == other.n)

    def cardinality(self) -> int:
        """``n``."""
        return self.n

    def enumerate(self) -> torch.Tensor:
        """The ``n`` one-hot vectors over a new leading dim, expanded to the batch dims."""
        batch = concrete_shape(self.shape[:-1])
        eye = torch.eye(self.n, device=self.device).to(self.dtype)
        return eye.reshape(self.n, *(1,) * len(batch), self.n).expand(-1, *batch, -1).clone()

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

    def _repr_extra(self) -> str:
        return f"n={self.n}" + (", masked" if self.mask is not None else "")


OneHotDiscreteTensorSpec = OneHot


def _parse_nvec(nvec: Any, what: str) -> torch.Tensor:
    t = torch.as_tensor(nvec, dtype=torch.int64).reshape(-1)
    if not t.numel() or bool((t <= 0).any()):
        raise SpecError(f"{what}: nvec must be a non-empty list of positive ints, got {nvec!r}")
    return t


class MultiCategorical(_MaskMixin, TensorSpec):
    """Several categorical values side by side: element ``i`` of the last dim is in ``[0, nvec[i])``.

    Example:
        >>> from aenv.specs import MultiCategorical
        >>> spec = MultiCategorical([2, 3])
        >>> spec.shape, spec.cardinality()
        (torch.Size([2]), 6)
    """

    _kind = "multi_categorical"
    _event_ndim = 1
    _param_names = ("mask",)

    def __init__(
        self,
        nvec: Any,
        shape: Any = None,
        device: DEVICE_TYPING = None,
        dtype: Any = torch.int64,
        mask: Any = None,
    ) -> None:
        self.nvec = _parse_nvec(nvec, "MultiCategorical")
        self._nlist = self.nvec.tolist()
        k = len(self._nlist)
        shape = (k,) if shape is None else parse_shape(shape)
        if not len(shape) or shape[-1] != k:
            raise SpecError(
                f"MultiCategorical: the last dim of shape {tuple(shape)} must be len(nvec)={k}"
            )
        dtype = torch_dtype(dtype)
        Categorical._check_dtype(dtype)
        super().__init__(shape, device, dtype)
        self.mask = None
        if mask is not None:
            self.update_mask(mask)

    @classmethod
    def _check_dtype(cls, dtype: Any) -> None:
        Categorical._check_dtype(dtype)

    def _mask_shape(self) -> torch.Size:
        return self.shape[:-1] + (sum(self._nlist),)

    def _segments(self) -> list[tuple[int, int]]:
        starts = itertools.accumulate([0, *self._nlist[:-1]])
        return [(s, s + n) for s, n in zip(starts, self._nlist)]

    def _rand(self, shape: torch.Size) -> torch.Tensor:
        batch = shape[:-1]
        if self.mask is not None:
            cols = [_sample_masked(self.mask[..., a:b], batch) for a, b in self._segments()]
            return torch.stack(cols, -1).to(self.dtype)
        nvec = self.nvec.to(self.device)
        u = torch.rand(shape, device=self.device)
        return torch.minimum((u * nvec).floor().long(), nvec - 1).to(self.dtype)

    def _check_values(self, val: torch.Tensor) -> str | None:
        nvec = self.nvec.to(val.device)
        if not bool(((val >= 0) & (val < nvec)).all()):
            return f"some elements are out of [0, nvec) with nvec={self._nlist}"
        if self.mask is not None and val.numel():
            for i, (a, b) in enumerate(self._segments()):
                if not _mask_ok(self.mask[..., a:b], val[..., i]):
                    return f"some elements of column {i} are masked out"
        return None

    def _project(self, val: torch.Tensor) -> torch.Tensor:
        if val.is_floating_point():
            val = torch.nan_to_num(val).round()
        nvec = self.nvec.to(val.device)
        val = torch.minimum(val.to(torch.int64).clamp_min(0), nvec - 1)
        if self.mask is not None and val.numel():
            cols = []
            for i, (a, b) in enumerate(self._segments()):
                m = self.mask[..., a:b].expand(*val.shape[:-1], b - a)
                col = val[..., i]
                ok = m.gather(-1, col.unsqueeze(-1)).squeeze(-1)
                cols.append(torch.where(ok, col, _first_allowed(m)))
            val = torch.stack(cols, -1)
        return val.to(self.dtype)

    def _extra_eq(self, other: Any) -> bool:
        return bool(self._nlist == other._nlist)

    def cardinality(self) -> int:
        """``prod(nvec)``."""
        return math.prod(self._nlist)

    def enumerate(self) -> torch.Tensor:
        """Every combination over a new leading dim, expanded to the batch dims."""
        combos = torch.tensor(
            list(itertools.product(*(range(n) for n in self._nlist))), device=self.device
        ).to(self.dtype)
        batch = concrete_shape(self.shape[:-1])
        k = len(self._nlist)
        return combos.reshape(-1, *(1,) * len(batch), k).expand(-1, *batch, k).clone()

    def _repr_extra(self) -> str:
        return f"nvec={self._nlist}" + (", masked" if self.mask is not None else "")


MultiDiscreteTensorSpec = MultiCategorical


class MultiOneHot(TensorSpec):
    """Several one-hot values concatenated along the last dim (of size ``sum(nvec)``).

    Example:
        >>> from aenv.specs import MultiOneHot
        >>> spec = MultiOneHot([2, 3])
        >>> spec.shape, int(spec.rand().sum())
        (torch.Size([5]), 2)
    """

    _kind = "multi_one_hot"
    _event_ndim = 1

    def __init__(
        self,
        nvec: Any,
        shape: Any = None,
        device: DEVICE_TYPING = None,
        dtype: Any = torch.bool,
    ) -> None:
        self.nvec = _parse_nvec(nvec, "MultiOneHot")
        self._nlist = self.nvec.tolist()
        total = sum(self._nlist)
        shape = (total,) if shape is None else parse_shape(shape)
        if not len(shape) or shape[-1] != total:
            raise SpecError(
                f"MultiOneHot: the last dim of shape {tuple(shape)} must be sum(nvec)={total}"
            )
        dtype = torch_dtype(dtype)
        if dtype.is_complex:
            raise SpecError(f"MultiOneHot does not support dtype {dtype}")
        super().__init__(shape, device, dtype)

    def _segments(self) -> list[tuple[int, int]]:
        starts = itertools.accumulate([0, *self._nlist[:-1]])
        return [(s, s + n) for s, n in zip(starts, self._nlist)]

    def _rand(self, shape: torch.Size) -> torch.Tensor:
        batch = shape[:-1]
        parts = [
            torch.nn.functional.one_hot(torch.randint(0, n, batch, device=self.device), n)
            for n in self._nlist
        ]
        return torch.cat(parts, -1).to(self.dtype)

    def _check_values(self, val: torch.Tensor) -> str | None:
        if val.dtype != torch.bool and not bool(((val == 0) | (val == 1)).all()):
            return "some elements are neither 0 nor 1"
        v = val.to(torch.int64)
        for i, (a, b) in enumerate(self._segments()):
            if not bool((v[..., a:b].sum(-1) == 1).all()):
                return f"segment {i} does not have exactly one element set everywhere"
        return None

    def _project(self, val: torch.Tensor) -> torch.Tensor:
        scores = torch.nan_to_num(val.to(torch.float32), nan=-math.inf)
        parts = [
            torch.nn.functional.one_hot(scores[..., a:b].argmax(-1), b - a)
            for a, b in self._segments()
        ]
        return torch.cat(parts, -1).to(self.dtype)

    def _extra_eq(self, other: Any) -> bool:
        return bool(self._nlist == other._nlist)

    def cardinality(self) -> int:
        """``prod(nvec)``."""
        return math.prod(self._nlist)

    def enumerate(self) -> torch.Tensor:
        """Every combination over a new leading dim, expanded to the batch dims."""
        rows = []
        for combo in itertools.product(*(range(n) for n in self._nlist)):
            rows.append(
                torch.cat([torch.nn.functional.one_hot(torch.tensor(c), n) for c, n in zip(combo, self._nlist)])
            )
        combos = torch.stack(rows).to(self.dtype).to(self.device)
        batch = concrete_shape(self.shape[:-1])
        k = self.shape[-1]
        return combos.reshape(-1, *(1,) * len(batch), k).expand(-1, *batch, k).clone()

    def to_categorical(self, val: torch.Tensor) -> torch.Tensor:
        """The category index of each segment, stacked on the last dim."""
        v = val.to(torch.int8)
        return torch.stack([v[..., a:b].argmax(-1) for a, b in self._segments()], -1)

    def to_categorical_spec(self) -> MultiCategorical:
        """The equivalent :class:`MultiCategorical` spec."""
        shape = self.shape[:-1] + (len(self._nlist),)
        return MultiCategorical(self._nlist, shape, device=self.device)

    def _repr_extra(self) -> str:
        return f"nvec={self._nlist}"


MultiOneHotDiscreteTensorSpec = MultiOneHot
