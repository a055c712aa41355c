"""Multi-discrete leaf specs: MultiCategorical and MultiOneHot."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch

from aenv.exceptions import SpecError

from ._base import TensorSpec, enumerated
from ._discrete import (
    Categorical,
    _first_allowed,
    _mask_ok,
    _MaskMixin,
    _sample_masked,
    one_hot_rows,
)
from ._shape import DEVICE_TYPING, parse_shape, torch_dtype

__all__ = [
    "MultiCategorical",
    "MultiDiscreteTensorSpec",
    "MultiOneHot",
    "MultiOneHotDiscreteTensorSpec",
]


def _parse_nvec(nvec: Any, what: str) -> torch.Tensor:
    t = torch.as_tensor(nvec, dtype=torch.int64).reshape(-1)
    if not t.numel() or bool((t <= 0).any()):
        raise SpecError(f"{what}: nvec must be a non-empty list of positive ints, got {nvec!r}")
    return t


def _segments(nlist: list[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each column's block of a last dim that concatenates ``nlist``."""
    starts = itertools.accumulate([0, *nlist[:-1]])
    return [(s, s + n) for s, n in zip(starts, nlist)]


class _Multi:
    """Several discrete values side by side, ``nvec[i]`` choices for the i-th."""

    nvec: torch.Tensor
    _nlist: list[int]

    def _set_nvec(self, nvec: Any, shape: Any, what: str, last: Any) -> torch.Size:
        """Set ``nvec``; the spec's shape (``shape``, by default one dim), checked to end
        with ``last(nvec)`` (``what`` names it)."""
        name = type(self).__name__
        self.nvec = _parse_nvec(nvec, name)
        self._nlist = self.nvec.tolist()
        size = last(self._nlist)
        out = torch.Size((size,)) if shape is None else parse_shape(shape)
        if not len(out) or out[-1] != size:
            raise SpecError(f"{name}: the last dim of shape {tuple(out)} must be {what}={size}")
        return out

    def _segments(self) -> list[tuple[int, int]]:
        return _segments(self._nlist)

    def _extra_eq(self, other: Any) -> bool:
        return bool(self._nlist == other._nlist)

    def cardinality(self) -> int:
        """``prod(nvec)``."""
        return math.prod(self._nlist)


class MultiCategorical(_Multi, _MaskMixin, TensorSpec):
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
        shape = self._set_nvec(nvec, shape, "len(nvec)", len)
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

    def enumerate(self) -> torch.Tensor:
        """Every combination over a new leading dim, expanded to the batch dims."""
        combos = torch.tensor(
            list(itertools.product(*(range(n) for n in self._nlist))), device=self.device
        ).to(self.dtype)
        return enumerated(combos, self.shape[:-1])

    def to_one_hot(self, val: torch.Tensor) -> torch.Tensor:
        """The one-hot (bool) encoding of each column, concatenated on the last dim."""
        v = val.long()
        parts = [torch.nn.functional.one_hot(v[..., i], n) for i, n in enumerate(self._nlist)]
        return torch.cat(parts, -1).bool()

    def to_one_hot_spec(self) -> MultiOneHot:
        """The equivalent :class:`MultiOneHot` spec (a mask does not carry over)."""
        shape = self.shape[:-1] + (sum(self._nlist),)
        return MultiOneHot(self._nlist, shape, device=self.device)

    def _repr_extra(self) -> str:
        return f"nvec={self._nlist}" + (", masked" if self.mask is not None else "")


MultiDiscreteTensorSpec = MultiCategorical


class MultiOneHot(_Multi, TensorSpec):
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
        shape = self._set_nvec(nvec, shape, "sum(nvec)", sum)
        dtype = torch_dtype(dtype)
        if dtype.is_complex:
            raise SpecError(f"MultiOneHot does not support dtype {dtype}")
        super().__init__(shape, device, dtype)

    def _rand(self, shape: torch.Size) -> torch.Tensor:
        batch = shape[:-1]
        dtype, device = self.dtype, self.device
        parts = [
            one_hot_rows(torch.randint(0, n, batch, device=device), n, dtype, device)
            for n in self._nlist
        ]
        return torch.cat(parts, -1)

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

    def enumerate(self) -> torch.Tensor:
        """Every combination over a new leading dim, expanded to the batch dims."""
        rows = []
        for combo in itertools.product(*(range(n) for n in self._nlist)):
            rows.append(
                torch.cat(
                    [
                        torch.nn.functional.one_hot(torch.tensor(c), n)
                        for c, n in zip(combo, self._nlist)
                    ]
                )
            )
        combos = torch.stack(rows).to(self.dtype).to(self.device)
        return enumerated(combos, self.shape[:-1])

    def encode(self, val: Any, *, ignore_device: bool = False) -> Any:
        """Turns a value into a tensor of this spec; category indices (one per segment, on
        the last dim) are one-hot encoded."""
        k, total = len(self._nlist), self.shape[-1]
        if k != total:
            out = val if isinstance(val, torch.Tensor) else torch.as_tensor(np.asarray(val))
            if out.ndim and out.shape[-1] == k and out.shape[:-1] == self.shape[:-1]:
                if out.is_floating_point() and not bool((out == out.round()).all()):
                    raise SpecError(
                        f"cannot encode {out.tolist()} into {self.describe()}: category "
                        "indices must be whole numbers"
                    )
                idx = out.long()
                if bool((idx < 0).any()) or bool((idx >= self.nvec.to(idx.device)).any()):
                    raise SpecError(
                        f"cannot encode {idx.tolist()} into {self.describe()}: category "
                        f"indices must be in [0, nvec) with nvec={self._nlist}"
                    )
                one_hot = MultiCategorical(self._nlist).to_one_hot(idx)
                return one_hot.to(device=self.device or idx.device, dtype=self.dtype)
        return super().encode(val, ignore_device=ignore_device)

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
