"""Value converters between gymnasium's numpy world and aenv's tensors, one per spec.

``from_numpy_fn(spec)`` and ``to_numpy_fn(spec)`` are built once (at an env's init) and called
on every step, so they branch on the spec here and not on each value. They do no I/O.
Discrete values carry gymnasium's ``start`` offset (kept in the spec's ``_meta`` by
:func:`aenv.specs.from_gym_space`): aenv's values start at 0.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv.specs import (
    Binary,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    TensorSpec,
)
from aenv.specs._discrete import one_hot_row
from aenv.specs._shape import np_dtype

__all__ = ["from_numpy_fn", "from_numpy_into_fn", "np_dtype", "to_numpy_fn"]

Converter = Callable[[Any], Any]
#: writes a gymnasium value into a preallocated array; False (nothing written) where the
#: value is not one it takes as it is (the caller converts it with ``from_numpy_fn``)
IntoConverter = Callable[[Any, np.ndarray], bool]


def _tensor_from(value: Any, dtype: np.dtype, shape: torch.Size) -> torch.Tensor:
    """A tensor sharing ``value``'s memory when it is a fresh array of the right dtype."""
    if type(value) is np.ndarray and value.dtype == dtype and value.flags.writeable:
        out = torch.from_numpy(value)
    else:
        out = torch.from_numpy(np.array(value, dtype=dtype))
    if out.shape != shape:
        out = out.reshape(shape)
    return out


def _argmax(t: torch.Tensor) -> np.ndarray:
    """The index of each one-hot row of ``t``: numpy's argmax where numpy can view ``t``
    (a fifth of the cost of torch's argmax and the conversion after it)."""
    try:
        return t.numpy().argmax(-1)  # type: ignore[no-any-return]
    except (TypeError, RuntimeError):  # on a device, keeping a gradient, a dtype numpy lacks
        return t.argmax(-1).cpu().numpy()  # type: ignore[no-any-return]


def _start(spec: TensorSpec) -> Any:
    start = spec._meta.get("gym_start", 0)
    if isinstance(start, list):
        start = np.asarray(start)
        return start if start.any() else 0
    return start


def from_numpy_fn(spec: TensorSpec, device: torch.device | None = None) -> Converter:
    """A function turning a gymnasium value (numpy, python scalars, dicts, tuples, strings)
    into the tensor (or TensorDict / non-tensor data) ``spec`` describes."""
    move = device is not None and device.type != "cpu"
    conv = _from_numpy(spec)
    if not move:
        return conv
    return lambda value: conv(value).to(device, non_blocking=True)


def _from_numpy(spec: TensorSpec) -> Converter:
    shape = spec.shape
    if isinstance(spec, Composite):
        subs = {k: _from_numpy(v) for k, v in spec.items()}
        if spec._meta.get("gym_tuple"):
            items = [(int(k), k, f) for k, f in subs.items()]
            return lambda value: TensorDict({k: f(value[i]) for i, k, f in items}, batch_size=shape)
        return lambda value: TensorDict({k: f(value[k]) for k, f in subs.items()}, batch_size=shape)
    if isinstance(spec, NonTensor):
        if len(shape):
            if spec._meta.get("gym_space") is not None:
                # gymnasium's own values (sequences, graphs, ...), one per element
                return lambda value: NonTensorStack.from_list(list(value))  # type: ignore[misc]
            return lambda value: NonTensorStack.from_list([str(v) for v in value])  # type: ignore[misc]
        return lambda value: NonTensorData(data=value)
    if isinstance(spec, OneHot):
        n, start, dtype = spec.n, _start(spec), spec.dtype
        if spec.ndim == 1 and not isinstance(start, np.ndarray):
            device = spec.device

            def one_hot_scalar(value: Any) -> torch.Tensor:
                return one_hot_row(int(value) - start, n, dtype, device)

            return one_hot_scalar

        def one_hot(value: Any) -> torch.Tensor:
            idx = torch.as_tensor(np.asarray(value, dtype=np.int64) - start)
            return torch.nn.functional.one_hot(idx, n).to(dtype)

        return one_hot
    if isinstance(spec, MultiOneHot):
        nvec, start, dtype = spec.nvec.tolist(), _start(spec), spec.dtype

        def multi_one_hot(value: Any) -> torch.Tensor:
            idx = torch.as_tensor(np.asarray(value, dtype=np.int64) - start)
            parts = [torch.nn.functional.one_hot(idx[..., j], n) for j, n in enumerate(nvec)]
            return torch.cat(parts, -1).to(dtype)

        return multi_one_hot
    dtype = np_dtype(spec.dtype)
    if isinstance(spec, (Categorical, MultiCategorical)):
        start = _start(spec)
        if not isinstance(start, np.ndarray) and start == 0:
            return lambda value: _tensor_from(value, dtype, shape)
        return lambda value: _tensor_from(np.asarray(value) - start, dtype, shape)
    return lambda value: _tensor_from(value, dtype, shape)


def from_numpy_into_fn(spec: TensorSpec) -> IntoConverter | None:
    """``from_numpy_fn(spec)`` that writes into a reused array (a row's numpy view) in place
    of making a tensor per value, for the values a step loop sends most: an integer into a
    one-hot vector or a scalar categorical, an array of the exact shape and dtype into a
    box. Anything else (a float for a discrete value, an index out of range, another shape)
    returns False with nothing written, and takes ``from_numpy_fn``'s conversion and its
    errors. None for the specs it has no writer for."""
    if isinstance(spec, OneHot) and spec.ndim == 1:
        start, n = _start(spec), spec.n
        if isinstance(start, np.ndarray):
            return None

        def one_hot_into(value: Any, dst: np.ndarray) -> bool:
            try:
                i = operator.index(value) - start
            except TypeError:
                return False
            if not 0 <= i < n:
                return False
            dst.fill(0)
            dst[i] = 1
            return True

        return one_hot_into
    if isinstance(spec, Categorical) and spec.ndim == 0:
        start = _start(spec)
        if (
            isinstance(start, np.ndarray)
            or spec.dtype.is_floating_point
            or spec.dtype == torch.bool
        ):
            return None
        info = np.iinfo(np_dtype(spec.dtype))
        lo, hi = info.min + start, info.max + start

        def categorical_into(value: Any, dst: np.ndarray) -> bool:
            try:
                i = operator.index(value)
            except TypeError:
                return False
            if not lo <= i <= hi:
                return False
            dst[()] = i - start
            return True

        return categorical_into
    if isinstance(spec, (Composite, NonTensor, OneHot, MultiOneHot, MultiCategorical, Binary)):
        return None

    def array_into(value: Any, dst: np.ndarray) -> bool:
        if type(value) is not np.ndarray or value.dtype != dst.dtype or value.shape != dst.shape:
            return False
        np.copyto(dst, value)
        return True

    return array_into


def to_numpy_fn(spec: TensorSpec, space: Any = None) -> Converter:
    """A function turning a tensor of ``spec`` into the value gymnasium expects.

    ``space`` (optional) is the gymnasium space the value goes to: a scalar ``Discrete``
    gets a numpy scalar of the space's dtype (as its ``sample()`` gives), a ``Box`` an array
    of the space's dtype.
    """
    if isinstance(spec, Composite):
        subs = {k: to_numpy_fn(v, _sub_space(space, k)) for k, v in spec.items()}
        if spec._meta.get("gym_tuple"):
            return lambda td: tuple(subs[str(i)](td.get(str(i))) for i in range(len(subs)))
        return lambda td: {k: f(td.get(k)) for k, f in subs.items()}
    if isinstance(spec, NonTensor):
        if spec.shape and type(space).__name__ == "Tuple":
            # a batch of values: gymnasium batches these spaces as Tuples
            return lambda value: tuple(_non_tensor_to_python(value))
        return _non_tensor_to_python
    # discrete values come back with gymnasium's dtype (the space's, else the one kept at
    # conversion): an int8 MultiDiscrete must not come back as int64
    int_dtype = np.dtype(
        getattr(space, "dtype", None) or spec._meta.get("gym_dtype", None) or np.int64
    )
    if isinstance(spec, OneHot):
        start = _start(spec)
        if spec.ndim == 1:
            if spec.n <= 1024:
                # (gymnasium's scalars, made once: a step looks its value up)
                values = tuple(int_dtype.type(i + start) for i in range(spec.n))
                return lambda t: values[t.tolist().index(1)]
            return lambda t: int_dtype.type(t.tolist().index(1) + start)
        return lambda t: (_argmax(t) + start).astype(int_dtype, copy=False)
    if isinstance(spec, MultiOneHot):
        nvec, start = spec.nvec.tolist(), _start(spec)

        def multi_one_hot(t: torch.Tensor) -> np.ndarray:
            parts = t.split(nvec, -1)
            idx = torch.stack([p.argmax(-1) for p in parts], -1)
            return (idx.cpu().numpy() + start).astype(int_dtype, copy=False)

        return multi_one_hot
    if spec._meta.get("gym_space") is not None:
        # kept spaces (boolean boxes, multi-dimensional MultiDiscrete): values as they are
        kept_dtype = np.dtype(spec._meta["gym_space"].dtype)
        return lambda t: t.detach().cpu().numpy().astype(kept_dtype, copy=False)
    if isinstance(spec, Categorical) and spec.ndim == 0:
        start = _start(spec)
        return lambda t: int_dtype.type(t.item() + start)
    if isinstance(spec, (Categorical, MultiCategorical)):
        start = _start(spec)
        if isinstance(start, np.ndarray) or start != 0:
            return lambda t: (t.cpu().numpy() + start).astype(int_dtype, copy=False)
        return _plain_numpy
    if isinstance(spec, Binary):
        target = np.dtype(getattr(space, "dtype", np.int8) or np.int8)
        return lambda t: t.cpu().numpy().astype(target, copy=False)
    box_dtype = getattr(space, "dtype", None)
    if box_dtype is not None and np.dtype(box_dtype) != np_dtype(spec.dtype):
        return lambda t: t.detach().cpu().numpy().astype(box_dtype)
    return _plain_numpy


def _plain_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _non_tensor_to_python(value: Any) -> Any:
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if isinstance(value, NonTensorData):
        return value.data
    return value


def _sub_space(space: Any, key: str) -> Any:
    if space is None:
        return None
    sub = getattr(space, "spaces", None)
    if sub is None:
        return None
    try:
        return sub[key] if isinstance(sub, dict) else sub[int(key)]
    except (KeyError, IndexError, ValueError):
        return None
