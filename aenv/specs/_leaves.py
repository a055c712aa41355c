"""Continuous, binary and non-tensor leaf specs: Unbounded, Bounded, Binary, NonTensor."""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack

from aenv.exceptions import SpecError

from ._base import TensorSpec, enumerated, full_param
from ._shape import DEVICE_TYPING, parse_shape, shape_matches, torch_dtype

__all__ = [
    "Binary",
    "BinaryDiscreteTensorSpec",
    "Bounded",
    "ContinuousBox",
    "BoundedTensorSpec",
    "NonTensor",
    "NonTensorSpec",
    "Unbounded",
    "UnboundedContinuousTensorSpec",
    "UnboundedDiscreteTensorSpec",
]


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _int_rand_range(dtype: torch.dtype) -> tuple[int, int]:
    info = torch.iinfo(dtype)
    return max(info.min, -100), min(info.max, 100)


class Unbounded(TensorSpec):
    """A tensor with no bounds: any value of the right shape and dtype.

    ``rand()`` draws from a standard normal for float dtypes and uniformly in [-100, 100]
    (clipped to the dtype's range) for integer dtypes.

    Example:
        >>> import torch
        >>> from aenv.specs import Unbounded
        >>> spec = Unbounded(shape=(2, 3))
        >>> spec.zero().shape
        torch.Size([2, 3])
        >>> Unbounded((1,), dtype=torch.int64).rand().dtype
        torch.int64
    """

    _kind = "unbounded"

    def __init__(self, shape: Any = (1,), device: DEVICE_TYPING = None, dtype: Any = None) -> None:
        dtype = torch.get_default_dtype() if dtype is None else torch_dtype(dtype)
        super().__init__(shape, device, dtype)

    def _rand(self, shape: torch.Size) -> torch.Tensor:
        dtype = self.dtype
        if _is_float(dtype):
            return torch.randn(shape, dtype=dtype, device=self.device)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, device=self.device).bool()
        lo, hi = _int_rand_range(dtype)
        return torch.randint(lo, hi + 1, shape, dtype=dtype, device=self.device)

    def cardinality(self) -> int:
        """Unbounded specs have infinitely many values."""
        raise SpecError("Unbounded has no finite cardinality")


class UnboundedContinuousTensorSpec(Unbounded):
    """Legacy TorchRL name of :class:`Unbounded` (float default dtype)."""


class UnboundedDiscreteTensorSpec(Unbounded):
    """Legacy TorchRL name of an integer :class:`Unbounded` (int64 default dtype)."""

    def __init__(
        self, shape: Any = (1,), device: DEVICE_TYPING = None, dtype: Any = torch.int64
    ) -> None:
        super().__init__(shape, device, dtype)


class ContinuousBox(NamedTuple):
    """A bounded spec's domain: ``spec.space.low`` / ``spec.space.high`` (TorchRL's)."""

    low: torch.Tensor
    high: torch.Tensor


class Bounded(TensorSpec):
    """A tensor whose every element lies in ``[low, high]`` (bounds included).

    ``low``/``high`` are scalars or tensors broadcast to the spec's shape (inferred from them
    when ``shape`` is ``None``); they are kept as tensors of the full shape. The dtype defaults
    to that of tensor/array bounds, else float32. ``zero()`` gives zeros whatever the bounds.

    Example:
        >>> import torch
        >>> from aenv.specs import Bounded
        >>> spec = Bounded(low=-1.0, high=torch.tensor([1.0, 2.0]))
        >>> spec.shape, spec.high
        (torch.Size([2]), tensor([1., 2.]))
        >>> spec.project(torch.tensor([5.0, -5.0]))
        tensor([ 1., -1.])
    """

    _kind = "bounded"
    _param_names = ("low", "high")

    low: torch.Tensor
    high: torch.Tensor

    def __init__(
        self,
        low: Any,
        high: Any,
        shape: Any = None,
        device: DEVICE_TYPING = None,
        dtype: Any = None,
    ) -> None:
        if dtype is None:
            dtype = self._infer_dtype(low, high)
        dtype = torch_dtype(dtype)
        self._check_dtype(dtype)
        low_t = torch.as_tensor(low)
        high_t = torch.as_tensor(high)
        if shape is None:
            try:
                shape = torch.broadcast_shapes(low_t.shape, high_t.shape)
            except RuntimeError as exc:
                raise SpecError(
                    f"Bounded: low (shape {tuple(low_t.shape)}) and high (shape "
                    f"{tuple(high_t.shape)}) do not broadcast"
                ) from exc
        super().__init__(parse_shape(shape), device, dtype)
        if not _is_float(dtype):
            info = torch.iinfo(dtype)
            low_t = low_t.clamp(info.min, info.max) if low_t.is_floating_point() else low_t
            high_t = high_t.clamp(info.min, info.max) if high_t.is_floating_point() else high_t
        self.low = full_param(low_t, self.shape, dtype, self.device)
        self.high = full_param(high_t, self.shape, dtype, self.device)
        bad = self.low > self.high
        if bad.any():
            where = tuple(bad.nonzero()[0].tolist())
            raise SpecError(
                f"Bounded: low must be <= high everywhere, but low[{where}]="
                f"{self.low[where].item()} > high[{where}]={self.high[where].item()}"
            )

    @staticmethod
    def _infer_dtype(low: Any, high: Any) -> torch.dtype:
        dtypes = []
        for b in (low, high):
            if isinstance(b, torch.Tensor):
                dtypes.append(b.dtype)
            elif isinstance(b, (np.ndarray, np.generic)):
                dtypes.append(torch_dtype(b.dtype))
        if not dtypes:
            return torch.get_default_dtype()
        out = dtypes[0]
        for d in dtypes[1:]:
            out = torch.promote_types(out, d)
        return out

    @classmethod
    def _check_dtype(cls, dtype: Any) -> None:
        if dtype == torch.bool or dtype.is_complex:
            raise SpecError(f"Bounded does not support dtype {dtype}; use Binary for booleans")

    @property
    def minimum(self) -> torch.Tensor:
        """Alias of :attr:`low`."""
        return self.low

    @property
    def space(self) -> ContinuousBox:
        """The bounds as TorchRL's ``spec.space`` holds them (``.low``, ``.high``)."""
        return ContinuousBox(self.low, self.high)

    @property
    def maximum(self) -> torch.Tensor:
        """Alias of :attr:`high`."""
        return self.high

    def _bounds_finite(self) -> bool:
        """Whether every bound is finite (cached against the bound tensors' identity)."""
        key = (id(self.low), id(self.high))
        cached = self.__dict__.get("_finite_cache")
        if cached is None or cached[0] != key:
            flag = bool((torch.isfinite(self.low) & torch.isfinite(self.high)).all())
            self.__dict__["_finite_cache"] = cached = (key, flag)
        return cached[1]

    def _uniform_bounds(self) -> tuple[float, float] | None:
        """``(low, high)`` as floats when each bound is one finite value repeated over the
        whole shape and their distance is finite in the dtype, else None (cached against the bound tensors' identity and version)."""
        low, high = self.low, self.high
        key = (id(low), id(high), low._version, high._version)
        cached = self.__dict__.get("_uniform_cache")
        if cached is None or cached[0] != key:
            value: tuple[float, float] | None = None
            if low.numel() and bool(torch.isfinite(low).all() & torch.isfinite(high).all()):
                lo, hi = low.reshape(-1)[0], high.reshape(-1)[0]
                span_ok = float(hi) - float(lo) <= torch.finfo(low.dtype).max  # uniform_ needs it
                if span_ok and bool((low == lo).all() & (high == hi).all()):
                    value = (float(lo), float(hi))
            self.__dict__["_uniform_cache"] = cached = (key, value)
        return cached[1]

    def _rand(self, shape: torch.Size) -> torch.Tensor:
        low, high = self.low, self.high
        if _is_float(self.dtype):
            bounds = self._uniform_bounds()
            if bounds is not None:
                # one value per bound: draw in place (one kernel, where lerp takes three)
                out = torch.empty(shape, dtype=self.dtype, device=self.device)
                return out.uniform_(*bounds).clamp_(*bounds)
            u = torch.rand(shape, dtype=self.dtype, device=self.device)
            if self._bounds_finite():
                return torch.lerp(low, high, u).clamp_(low, high)
            out = low * (1 - u) + high * u
            lo_fin, hi_fin = torch.isfinite(low), torch.isfinite(high)
            n = torch.randn(shape, dtype=self.dtype, device=self.device)
            half = torch.where(lo_fin, low + n.abs(), torch.where(hi_fin, high - n.abs(), n))
            out = torch.where(lo_fin & hi_fin, out, half)
            return torch.minimum(torch.maximum(out, low), high)
        u = torch.rand(shape, dtype=torch.float64, device=self.device)
        lo, hi = low.to(torch.float64), high.to(torch.float64)
        out = (lo + torch.floor((hi - lo + 1) * u)).to(self.dtype)
        return torch.minimum(torch.maximum(out, low), high)

    def _check_values(self, val: torch.Tensor) -> str | None:
        ok = (val >= self.low) & (val <= self.high)
        if not bool(ok.all()):
            return "some elements are out of [low, high]"
        return None

    def _project(self, val: torch.Tensor) -> torch.Tensor:
        if not _is_float(self.dtype) and val.is_floating_point():
            val = val.round()
        if val.is_floating_point():
            val = torch.where(torch.isnan(val), self.low.to(val.dtype), val)
        val = val.to(self.dtype)
        return torch.minimum(torch.maximum(val, self.low), self.high)

    def _repr_extra(self) -> str:
        def fmt(t: torch.Tensor) -> str:
            if t.numel() and bool((t == t.reshape(-1)[0]).all()):
                return str(t.reshape(-1)[0].item())
            return str(t.tolist()) if t.numel() <= 8 else f"tensor(shape={tuple(t.shape)})"

        return f"low={fmt(self.low)}, high={fmt(self.high)}"

    def cardinality(self) -> int:
        """Number of values for integer bounds with a single (low, high) pair."""
        if _is_float(self.dtype):
            raise SpecError("a float Bounded has no finite cardinality")
        return int((self.high - self.low).max().item()) + 1


BoundedTensorSpec = Bounded


class Binary(TensorSpec):
    """A tensor of 0/1 values whose last dim has ``n`` elements (default dtype int8).

    Example:
        >>> import torch
        >>> from aenv.specs import Binary
        >>> spec = Binary(3, shape=(2, 3), dtype=torch.bool)
        >>> spec.rand().shape, spec.cardinality()
        (torch.Size([2, 3]), 8)
    """

    _kind = "binary"
    _event_ndim = 1

    def __init__(
        self,
        n: int | None = None,
        shape: Any = None,
        device: DEVICE_TYPING = None,
        dtype: Any = torch.int8,
    ) -> None:
        if shape is None:
            if n is None:
                raise SpecError("Binary needs n or shape")
            shape = (n,)
        shape = parse_shape(shape)
        if not len(shape):
            raise SpecError("Binary needs at least one dim (the last one has n elements)")
        if n is None:
            n = shape[-1]
        if n < 0 or shape[-1] != n:
            raise SpecError(f"Binary: the last dim of shape {tuple(shape)} must be n={n}")
        dtype = torch_dtype(dtype)
        self._check_dtype(dtype)
        super().__init__(shape, device, dtype)
        self.n = int(n)

    @classmethod
    def _check_dtype(cls, dtype: Any) -> None:
        if dtype.is_complex:
            raise SpecError(f"Binary does not support dtype {dtype}")

    def _rand(self, shape: torch.Size) -> torch.Tensor:
        return torch.randint(0, 2, shape, device=self.device).to(self.dtype)

    def _check_values(self, val: torch.Tensor) -> str | None:
        if val.dtype != torch.bool and not bool(((val == 0) | (val == 1)).all()):
            return "some elements are neither 0 nor 1"
        return None

    def _project(self, val: torch.Tensor) -> torch.Tensor:
        if val.dtype == torch.bool:
            return val.to(self.dtype)
        return (val > 0.5 if val.is_floating_point() else val > 0).to(self.dtype)

    def _extra_eq(self, other: Any) -> bool:
        return bool(self.n == other.n)

    def cardinality(self) -> int:
        """``2 ** n``."""
        return 2**self.n

    def enumerate(self) -> torch.Tensor:
        """All ``2 ** n`` values, stacked on a new leading dim (batch dims expanded)."""
        combos = torch.tensor(
            list(itertools.product((0, 1), repeat=self.n)), dtype=self.dtype, device=self.device
        ).reshape(-1, self.n)
        return enumerated(combos, self.shape[:-1])

    def _repr_extra(self) -> str:
        return f"n={self.n}"


BinaryDiscreteTensorSpec = Binary


class NonTensor(TensorSpec):
    """Non-tensor data (strings, dicts, objects) of a given batch shape.

    ``zero()``/``rand()``/``one()`` give a :class:`tensordict.NonTensorData` holding
    ``example_data`` (shape ``()``) or a :class:`tensordict.NonTensorStack` (batched).

    Example:
        >>> from aenv.specs import NonTensor
        >>> spec = NonTensor(shape=(2,), example_data="hello")
        >>> spec.zero().tolist()
        ['hello', 'hello']
        >>> spec.is_in(spec.encode(["a", "b"]))
        True
    """

    _kind = "non_tensor"

    def __init__(
        self,
        shape: Any = (),
        device: DEVICE_TYPING = None,
        dtype: Any = None,
        example_data: Any = None,
    ) -> None:
        super().__init__(shape, device, dtype)
        self.example_data = example_data

    def _make(self, shape: torch.Size) -> Any:
        data = NonTensorData(data=self.example_data, batch_size=shape, device=self.device)
        return data.maybe_to_stack() if len(shape) else data

    _rand = _zero = _one = _make

    def _check(self, val: Any) -> str | None:
        if isinstance(val, torch.Tensor):
            return "expected non-tensor data, got a tensor"
        batch = getattr(val, "batch_size", None)
        if batch is not None:
            if not shape_matches(self.shape, batch):
                return f"batch size {tuple(batch)} does not match {tuple(self.shape)}"
            return None
        if self.ndim == 0:
            return None
        if self.ndim == 1 and isinstance(val, (list, tuple)):
            if shape_matches(self.shape, (len(val),)):
                return None
            return f"{len(val)} elements do not match shape {tuple(self.shape)}"
        return f"plain {type(val).__name__} does not match batched shape {tuple(self.shape)}"

    def encode(self, val: Any, *, ignore_device: bool = False) -> Any:
        """Wraps ``val`` into NonTensorData (shape ``()``) or a NonTensorStack (batched)."""
        if isinstance(val, (NonTensorData, NonTensorStack)):
            return val
        if self.ndim == 0:
            return NonTensorData(data=val, device=self.device)
        if isinstance(val, (list, tuple)) and len(val) == self.shape[0] and self.ndim == 1:
            return NonTensorStack.from_list(list(val))
        if self.ndim and -1 in self.shape:
            raise SpecError(f"cannot encode {type(val).__name__} into dynamic {self.describe()}")
        return NonTensorData(data=val, batch_size=self.shape, device=self.device).maybe_to_stack()

    def project(self, val: Any) -> Any:
        """Non-tensor values are only wrapped (see :meth:`encode`)."""
        return self.encode(val)

    def to_numpy(self, val: Any, safe: bool = False) -> Any:
        """The python data held by ``val`` (lists for stacks)."""
        if safe:
            self.assert_is_in(val)
        if isinstance(val, NonTensorData):
            return val.data if not val.batch_size else val.maybe_to_stack().tolist()
        if isinstance(val, NonTensorStack):
            return val.tolist()
        return val

    # example_data is only what zero()/rand() give: it is no part of what the spec admits,
    # so it stays out of equality (envs whose example is their own prompt stack densely)

    def _repr_extra(self) -> str:
        return f"example_data={self.example_data!r:.40}"


NonTensorSpec = NonTensor
