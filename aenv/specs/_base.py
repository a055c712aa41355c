"""The abstract :class:`TensorSpec` base: shape algebra, checks, projection and encoding.

Leaf specs keep their per-element parameters (bounds, masks) as tensors whose leading dims are
the spec's batch dims (every dim but the last ``_event_ndim`` ones), so one generic
``_transform`` serves indexing, expansion, squeezing, reshaping and unbinding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from aenv.exceptions import SpecError, SpecViolationError

from ._shape import (
    DEVICE_TYPING,
    concrete_shape,
    has_dynamic,
    index_shape,
    norm_dim,
    parse_shape,
    parse_shape_args,
    shape_matches,
    to_device,
)

__all__ = ["TensorSpec", "describe_value"]

# sizes a dynamic (-1) dim takes in rand() (uniform in 1..5) and zero()/one() (always 1)
DYNAMIC_RAND_MAX = 5
DYNAMIC_ZERO_SIZE = 1


def describe_value(val: Any) -> str:
    """A short description of a value for error messages: type, shape, dtype, min/max."""
    if isinstance(val, torch.Tensor):
        if getattr(val, "is_nested", False):
            return f"nested tensor of {val.size(0)} elements, dtype={val.dtype}"
        desc = f"tensor(shape={tuple(val.shape)}, dtype={val.dtype}, device={val.device}"
        if val.numel() and not val.is_complex():
            flat = val.detach()
            if flat.dtype == torch.bool:
                flat = flat.to(torch.int8)
            desc += f", min={flat.min().item()}, max={flat.max().item()}"
        return desc + ")"
    if isinstance(val, np.ndarray):
        return f"numpy array(shape={val.shape}, dtype={val.dtype})"
    shape = getattr(val, "batch_size", None)
    if shape is not None:
        return f"{type(val).__name__}(batch_size={tuple(shape)})"
    return f"{type(val).__name__} {val!r:.80}"


class TensorSpec:
    """Abstract base of every spec: a description of the shape, dtype, device and domain of a value.

    Shapes always include batch dims. A ``-1`` size marks a dynamic dim: ``rand()`` draws its
    size uniformly in 1..5, ``zero()`` and ``one()`` give it size 1, and ``is_in`` accepts any
    size there.

    Example:
        >>> from aenv.specs import Bounded
        >>> spec = Bounded(-1.0, 1.0, shape=(3,))
        >>> spec.is_in(spec.rand())
        True
        >>> spec.expand(4, 3).shape
        torch.Size([4, 3])
    """

    _kind: ClassVar[str] = "tensor"
    _event_ndim: ClassVar[int] = 0
    _param_names: ClassVar[tuple[str, ...]] = ()

    shape: torch.Size
    device: torch.device | None
    dtype: Any

    def __init__(self, shape: Any, device: DEVICE_TYPING = None, dtype: Any = None) -> None:
        self.shape = parse_shape(shape)
        self.device = to_device(device)
        self.dtype = dtype
        self._meta: dict[str, Any] = {}
        if len(self.shape) < self._event_ndim:
            raise SpecError(f"{type(self).__name__} needs at least {self._event_ndim} dim(s)")

    # ------------------------------------------------------------------ basic properties
    @property
    def ndim(self) -> int:
        """Number of dims of the spec's shape."""
        return len(self.shape)

    def ndimension(self) -> int:
        """Alias of :attr:`ndim`."""
        return len(self.shape)

    @property
    def batch_ndim(self) -> int:
        """Number of leading dims that shape operations (index, expand, ...) may touch."""
        return len(self.shape) - self._event_ndim

    @property
    def is_locked(self) -> bool:
        """Leaves carry no lock; see :meth:`aenv.specs.Composite.lock_`."""
        return False

    def lock_(self, recurse: bool = True) -> TensorSpec:
        """No-op on leaves (kept so that any spec can be locked)."""
        return self

    def unlock_(self, recurse: bool = True) -> TensorSpec:
        """No-op on leaves."""
        return self

    def is_empty(self) -> bool:
        """A leaf is never empty."""
        return False

    # ------------------------------------------------------------------ sampling
    def _full_shape(self, shape: Any, dynamic_size: Callable[[], int]) -> torch.Size:
        full = parse_shape(shape) + self.shape
        if has_dynamic(full):
            full = torch.Size(dynamic_size() if s == -1 else s for s in full)
        return full

    def rand(self, shape: Any = None) -> Any:
        """A random value in the spec, with extra leading dims ``shape``."""
        if shape is None and -1 not in self.shape:  # the per-step case: no shape work
            return self._rand(self.shape)
        return self._rand(self._full_shape(shape, _rand_dynamic))

    def zero(self, shape: Any = None) -> Any:
        """A zero-filled value (the spec's "zero": e.g. the first category), extra dims ``shape``."""
        if shape is None and -1 not in self.shape:
            return self._zero(self.shape)
        return self._zero(self._full_shape(shape, _zero_dynamic))

    def one(self, shape: Any = None) -> Any:
        """A one-filled value, with extra leading dims ``shape``."""
        return self._one(self._full_shape(shape, _zero_dynamic))

    def zeros(self, shape: Any = None) -> Any:
        """Alias of :meth:`zero`."""
        return self.zero(shape)

    def ones(self, shape: Any = None) -> Any:
        """Alias of :meth:`one`."""
        return self.one(shape)

    def sample(self, shape: Any = None) -> Any:
        """Alias of :meth:`rand`."""
        return self.rand(shape)

    def _rand(self, shape: torch.Size) -> Any:
        raise NotImplementedError

    def _zero(self, shape: torch.Size) -> Any:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _one(self, shape: torch.Size) -> Any:
        return torch.ones(shape, dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ membership
    def _check(self, val: Any) -> str | None:
        """Why ``val`` is not in the spec, or ``None`` when it is."""
        if not isinstance(val, torch.Tensor):
            return f"expected a tensor, got {type(val).__name__}"
        if not shape_matches(self.shape, val.shape):
            return f"shape {tuple(val.shape)} does not match {tuple(self.shape)}"
        if val.dtype != self.dtype:
            return f"dtype {val.dtype} is not {self.dtype}"
        return self._check_values(val)

    def _check_values(self, val: torch.Tensor) -> str | None:
        return None

    def is_in(self, val: Any) -> bool:
        """Whether ``val`` lies in the spec (shape, dtype and domain)."""
        return self._check(val) is None

    def contains(self, val: Any) -> bool:
        """Alias of :meth:`is_in`."""
        return self.is_in(val)

    def assert_is_in(self, val: Any, key: Any = None) -> None:
        """Raises :class:`~aenv.exceptions.SpecViolationError` when ``val`` is not in the spec."""
        reason = self._check(val)
        if reason is not None:
            where = f" at key {key!r}" if key is not None else ""
            raise SpecViolationError(
                f"value{where} is not in its spec: {reason}.\n  spec: {self.describe()}\n"
                f"  got:  {describe_value(val)}",
                key=key,
            )

    def describe(self) -> str:
        """A one-line description (class, shape, dtype and domain) for messages."""
        return repr(self).replace("\n", " ")

    # ------------------------------------------------------------------ conversions
    def _as_tensor(self, val: Any) -> torch.Tensor:
        if isinstance(val, torch.Tensor):
            return val.to(device=self.device or val.device, dtype=self.dtype)
        if isinstance(val, np.ndarray):
            if not val.flags.writeable or val.dtype.byteorder not in "=|":
                val = val.copy()
            return torch.from_numpy(np.ascontiguousarray(val)).to(
                device=self.device, dtype=self.dtype
            )
        return torch.as_tensor(val, dtype=self.dtype, device=self.device)

    def encode(self, val: Any, *, ignore_device: bool = False) -> Any:
        """Turns a numpy array, list, python scalar or tensor into a tensor of this spec.

        The result has the spec's dtype and device; a value with the right number of
        elements but another shape is reshaped.
        """
        out = self._as_tensor(val)
        if not shape_matches(self.shape, out.shape):
            if not has_dynamic(self.shape) and out.numel() == math.prod(self.shape):
                out = out.reshape(self.shape)
            else:
                raise SpecError(
                    f"cannot encode a value of shape {tuple(out.shape)} into {self.describe()}"
                )
        return out

    def to_numpy(self, val: Any, safe: bool = False) -> Any:
        """Turns a value of this spec into a numpy array (``safe`` checks it first)."""
        if safe:
            self.assert_is_in(val)
        if isinstance(val, torch.Tensor):
            return val.detach().cpu().numpy()
        return np.asarray(val)

    def project(self, val: Any) -> Any:
        """Maps a value of the right shape into the spec (the result always ``is_in``)."""
        out = self._as_tensor(val) if not isinstance(val, torch.Tensor) else val
        if out.device != (self.device or out.device):
            out = out.to(self.device)
        if not shape_matches(self.shape, out.shape):
            try:
                out = out.expand(self.shape)
            except RuntimeError as exc:
                raise SpecError(
                    f"cannot project a value of shape {tuple(out.shape)} onto {self.describe()}"
                ) from exc
        return self._project(out)

    def _project(self, val: torch.Tensor) -> torch.Tensor:
        return val.to(self.dtype)

    # ------------------------------------------------------------------ copies and devices
    def _copy_with(self, shape: torch.Size, fn: Callable[[torch.Tensor], torch.Tensor] | None):
        # (a shallow copy of the attribute dict: what copy.copy does for these classes, at a
        # fraction of its cost through __reduce_ex__; envs copy specs per construction)
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.shape = shape
        new._meta = dict(self._meta)
        if fn is not None:
            for name in self._param_names:
                val = getattr(self, name)
                if val is not None:
                    setattr(new, name, fn(val))
        return new

    def clone(self) -> TensorSpec:
        """A copy of the spec whose tensors can be changed without touching this one."""
        return self._copy_with(self.shape, torch.Tensor.clone)

    def to(self, dest: Any) -> TensorSpec:
        """The spec on another device (or with another dtype when ``dest`` is a dtype)."""
        if isinstance(dest, torch.dtype):
            if dest == self.dtype:
                return self
            self._check_dtype(dest)
            old = self.dtype
            # value-like params (bounds) follow the dtype; masks and the like keep theirs
            new = self._copy_with(self.shape, lambda t: t.to(dest) if t.dtype == old else t)
            new.dtype = dest
            return new
        device = to_device(dest)
        if device == self.device:
            return self
        new = self._copy_with(self.shape, lambda t: t.to(device))
        new.device = device
        return new

    def cpu(self) -> TensorSpec:
        """The spec on the CPU."""
        return self.to("cpu")

    def cuda(self, device: int | None = None) -> TensorSpec:
        """The spec on a CUDA device."""
        return self.to("cuda" if device is None else f"cuda:{device}")

    @classmethod
    def _check_dtype(cls, dtype: Any) -> None:
        return None

    # ------------------------------------------------------------------ shape algebra
    def _tail(self) -> torch.Size:
        return self.shape[self.batch_ndim :]

    def expand(self, *shape: Any) -> TensorSpec:
        """The spec with new leading dims; ``shape`` must end with the current shape."""
        new = parse_shape_args(shape)
        nd = self.ndim
        if len(new) < nd or (nd and any(n not in (s, -1) for n, s in zip(new[-nd:], self.shape))):
            raise SpecError(
                f"cannot expand {type(self).__name__} of shape {tuple(self.shape)} to "
                f"{tuple(new)}: the new shape must end with the current shape"
            )
        lead = new[: len(new) - nd]
        if -1 in lead:
            raise SpecError(f"cannot expand to {tuple(new)}: new leading dims must be known")
        if not lead:
            return self.clone()  # a new spec, as for any other shape: edits stay its own
        full = lead + self.shape
        return self._copy_with(full, lambda t: t.expand(*lead, *t.shape))

    def _batch_dim(self, dim: int, *, insert: bool = False) -> int:
        out = norm_dim(dim, self.batch_ndim, insert=insert)
        return out

    def squeeze(self, dim: int | None = None) -> TensorSpec:
        """The spec without size-1 batch dims (all of them, or only ``dim``)."""
        if dim is None:
            dims = tuple(i for i in range(self.batch_ndim) if self.shape[i] == 1)
        else:
            d = self._batch_dim(dim)
            dims = (d,) if self.shape[d] == 1 else ()
        if not dims:
            return self
        shape = torch.Size(s for i, s in enumerate(self.shape) if i not in dims)
        return self._copy_with(shape, lambda t: t.squeeze(dims))

    def unsqueeze(self, dim: int) -> TensorSpec:
        """The spec with a new size-1 batch dim at ``dim``."""
        d = self._batch_dim(dim, insert=True)
        shape = self.shape[:d] + (1,) + self.shape[d:]
        return self._copy_with(torch.Size(shape), lambda t: t.unsqueeze(d))

    def reshape(self, *shape: Any) -> TensorSpec:
        """The spec with another batch shape (event dims, such as a one-hot's n, are kept)."""
        new = list(parse_shape_args(shape))
        if has_dynamic(self.shape):
            raise SpecError("cannot reshape a spec with dynamic (-1) dims")
        tail = self._tail()
        if self._event_ndim and (
            len(new) < self._event_ndim or tuple(new[-self._event_ndim :]) != tuple(tail)
        ):
            raise SpecError(f"reshape of {type(self).__name__} must keep the last dims {tail}")
        batch = new[: len(new) - self._event_ndim]
        numel = math.prod(self.shape[: self.batch_ndim])
        if batch.count(-1) == 1:
            known = math.prod(s for s in batch if s != -1)
            batch[batch.index(-1)] = numel // known if known else 0
        if math.prod(batch) != numel:
            raise SpecError(f"cannot reshape {tuple(self.shape)} to {tuple(new)}")
        full = torch.Size(batch) + tail
        return self._copy_with(full, lambda t: t.reshape(*batch, *t.shape[self.batch_ndim :]))

    view = reshape

    def unbind(self, dim: int = 0) -> tuple[TensorSpec, ...]:
        """The specs of each slice along batch dim ``dim``."""
        d = self._batch_dim(dim)
        size = self.shape[d]
        if size == -1:
            raise SpecError("cannot unbind a spec along a dynamic (-1) dim")
        lead = (slice(None),) * d
        return tuple(self[(*lead, i)] for i in range(size))

    def _norm_index(self, index: Any) -> tuple[Any, ...]:
        idx = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis for i in idx):
            pos = next(j for j, i in enumerate(idx) if i is Ellipsis)
            used = sum(1 for i in idx if i is not None and i is not Ellipsis)
            fill = (slice(None),) * max(self.batch_ndim - used, 0)
            idx = idx[:pos] + fill + idx[pos + 1 :]
        used = sum(1 for i in idx if i is not None)
        if used > self.batch_ndim:
            raise SpecError(
                f"too many indices for {type(self).__name__} of shape {tuple(self.shape)} "
                f"({self.batch_ndim} indexable dim(s))"
            )
        return idx

    def __getitem__(self, index: Any) -> TensorSpec:
        idx = self._norm_index(index)
        batch = index_shape(self.shape[: self.batch_ndim], idx)
        return self._copy_with(batch + self._tail(), lambda t: t[idx])

    def index(self, index: Any, tensor_to_index: torch.Tensor) -> torch.Tensor:
        """Indexes ``tensor_to_index`` with a value of this spec (discrete specs only)."""
        raise SpecError(f"{type(self).__name__} cannot be used to index a tensor")

    # ------------------------------------------------------------------ discrete helpers
    def cardinality(self) -> int:
        """Number of distinct values of one element (discrete specs only)."""
        raise SpecError(f"{type(self).__name__} is not discrete: it has no cardinality")

    def enumerate(self) -> Any:
        """Every possible value, stacked on a new leading dim (discrete specs only)."""
        raise SpecError(f"{type(self).__name__} is not discrete: it cannot be enumerated")

    # ------------------------------------------------------------------ comparison and display
    def _extra_eq(self, other: Any) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorSpec) or other._kind != self._kind:
            return False
        if (
            other.shape != self.shape
            or other.dtype != self.dtype
            or other.device != self.device
            or not self._extra_eq(other)
        ):
            return False
        for name in self._param_names:
            a, b = getattr(self, name), getattr(other, name)
            if (a is None) != (b is None):
                return False
            if a is not None and (a.shape != b.shape or not torch.equal(a, b.to(a.device))):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def _repr_extra(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._repr_extra()
        extra = f", {extra}" if extra else ""
        return (
            f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"device={self.device}{extra})"
        )

    # ------------------------------------------------------------------ torch.stack hook
    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.stack:
            from ._stacking import stack_specs

            return stack_specs(*args, **kwargs)
        return NotImplemented

    def _stackable_with(self, other: TensorSpec) -> bool:
        """Whether a dense stack of self and other is one spec of the same class."""
        return (
            type(other) is type(self)
            and other.shape == self.shape
            and other.dtype == self.dtype
            and other.device == self.device
            and self._extra_eq(other)
        )


def _rand_dynamic() -> int:
    return int(torch.randint(1, DYNAMIC_RAND_MAX + 1, ()).item())


def _zero_dynamic() -> int:
    return DYNAMIC_ZERO_SIZE


def full_param(val: Any, shape: torch.Size, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """A fresh parameter tensor (bound, mask) broadcast to ``shape`` (dynamic dims as 1)."""
    t = torch.as_tensor(val, dtype=dtype, device=device)
    target = concrete_shape(shape)
    try:
        return t.expand(target).clone()
    except RuntimeError as exc:
        raise SpecError(
            f"cannot broadcast a tensor of shape {tuple(t.shape)} to {tuple(shape)}"
        ) from exc


def enumerated(values: torch.Tensor, batch: torch.Size) -> torch.Tensor:
    """What ``enumerate()`` returns: ``values`` (every possible value of one element, along
    the first dim) repeated over the spec's ``batch`` dims (dynamic dims as 1), a fresh tensor."""
    batch = concrete_shape(batch)
    event = values.shape[1:]
    return values.reshape(-1, *(1,) * len(batch), *event).expand(-1, *batch, *event).clone()
