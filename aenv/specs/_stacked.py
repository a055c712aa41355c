"""Stacking specs: ``torch.stack`` on specs, and the heterogeneous :class:`Stacked` /
:class:`StackedComposite` that keep one spec per stacked element."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv.exceptions import SpecError

from ._base import TensorSpec
from ._composite import _NO_DEFAULT, Composite, _norm_key
from ._shape import norm_dim, parse_shape, shape_matches, to_device
from ._stacking import _common_shape, _LazyStackMixin, stack_specs

__all__ = ["Stacked", "StackedComposite", "stack_specs"]


class Stacked(_LazyStackMixin, TensorSpec):
    """A heterogeneous stack of leaf specs (differing shapes, classes or dtypes).

    Its shape has a ``-1`` wherever the stacked shapes differ; ``spec[i]`` (along the stack
    dim) gives the i-th spec back. ``rand()``/``zero()`` stack densely when the values have
    equal shapes and otherwise return a (strided) ``torch.nested`` tensor, which needs the
    stack dim to be the first dim of the result.

    Example:
        >>> import torch
        >>> from aenv.specs import Unbounded
        >>> spec = torch.stack([Unbounded((2,)), Unbounded((3,))], 0)
        >>> spec.shape, spec[1].shape
        (torch.Size([2, -1]), torch.Size([3]))
    """

    _kind = "stacked"

    def __init__(self, *specs: TensorSpec, dim: int = 0) -> None:
        if len(specs) == 1 and isinstance(specs[0], (list, tuple)):
            specs = tuple(specs[0])
        if not specs or any(isinstance(s, Composite) for s in specs):
            raise SpecError(
                "Stacked needs one or more leaf specs (use StackedComposite for composites)"
            )
        self._stack = list(specs)
        self.stack_dim = norm_dim(dim, specs[0].ndim, insert=True)
        dtypes = {s.dtype for s in specs}
        super().__init__(
            _common_shape(self._stack, self.stack_dim),
            specs[0].device,
            dtypes.pop() if len(dtypes) == 1 else None,
        )

    @property
    def batch_ndim(self) -> int:  # type: ignore[override]
        return min(s.batch_ndim for s in self._stack) + 1

    def _gather(self, values: list[Any], extra: int) -> Any:
        d = extra + self.stack_dim
        if isinstance(values[0], torch.Tensor):
            if all(v.shape == values[0].shape for v in values):
                return torch.stack(values, d)
            if d != 0:
                raise SpecError("values of a ragged Stacked spec can only be stacked on dim 0")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return torch.nested.nested_tensor(values)
        return torch.stack(values, d)

    def rand(self, shape: Any = None) -> Any:
        """One value per stacked spec, stacked (densely when shapes agree)."""
        extra = parse_shape(shape)
        return self._gather([s.rand(extra) for s in self._stack], len(extra))

    def zero(self, shape: Any = None) -> Any:
        """Zeros of every stacked spec, stacked."""
        extra = parse_shape(shape)
        return self._gather([s.zero(extra) for s in self._stack], len(extra))

    def one(self, shape: Any = None) -> Any:
        """Ones of every stacked spec, stacked."""
        extra = parse_shape(shape)
        return self._gather([s.one(extra) for s in self._stack], len(extra))

    def _split(self, val: Any) -> list[Any] | str:
        n = len(self._stack)
        if isinstance(val, (list, tuple)):
            items = list(val)
        elif isinstance(val, torch.Tensor) and val.is_nested:
            if self.stack_dim != 0:
                return "a nested tensor only fits a spec stacked on dim 0"
            items = list(val.unbind(0))
        elif isinstance(val, (torch.Tensor, TensorDictBase)):
            shape = val.shape if isinstance(val, torch.Tensor) else val.batch_size
            if not shape_matches(self.shape, shape[: len(self.shape)]) or len(shape) != len(
                self.shape
            ):
                return f"shape {tuple(shape)} does not match {tuple(self.shape)}"
            items = list(val.unbind(self.stack_dim))
        else:
            return f"expected a tensor or a list, got {type(val).__name__}"
        if len(items) != n:
            return f"{len(items)} elements do not match the {n} stacked specs"
        return items

    def _check(self, val: Any) -> str | None:
        items = self._split(val)
        if isinstance(items, str):
            return items
        for i, (s, v) in enumerate(zip(self._stack, items)):
            reason = s._check(v)
            if reason is not None:
                return f"element {i}: {reason}"
        return None

    def project(self, val: Any) -> Any:
        """Projects each element into its own spec."""
        return self._gather(self._each(val, "project onto", lambda s, v: s.project(v)), 0)

    def encode(self, val: Any, *, ignore_device: bool = False) -> Any:
        """Encodes each element with its own spec."""
        items = self._split(val) if not isinstance(val, torch.Tensor) or val.is_nested else None
        if items is None:
            items = list(torch.as_tensor(val).unbind(self.stack_dim))
        if isinstance(items, str):
            raise SpecError(f"cannot encode into {self.describe()}: {items}")
        return self._gather([s.encode(v) for s, v in zip(self._stack, items)], 0)

    def __getitem__(self, index: Any) -> TensorSpec:
        return self._stack_index(index)

    def _stackable_with(self, other: TensorSpec) -> bool:
        return False

    def describe(self) -> str:
        """A one-line description for messages."""
        return f"Stacked({len(self._stack)} specs, shape={tuple(self.shape)}, dim={self.stack_dim})"


class StackedComposite(_LazyStackMixin, Composite):
    """A heterogeneous stack of composites (differing keys or shapes).

    ``rand()``/``zero()`` give a :class:`tensordict.LazyStackedTensorDict`; ``spec[i]`` the i-th
    composite; ``spec[key]`` the stack of that key's specs; ``keys()`` the keys every stacked
    composite has; ``is_in`` accepts (lazy) stacks; ``unbind(stack_dim)`` gives the originals.

    Example:
        >>> import torch
        >>> from aenv.specs import Composite, Unbounded
        >>> a = Composite(x=Unbounded((3,)))
        >>> b = Composite(x=Unbounded((3,)), y=Unbounded((1,)))
        >>> spec = torch.stack([a, b], 0)
        >>> list(spec.keys()), type(spec.rand()).__name__
        (['x'], 'LazyStackedTensorDict')
    """

    _kind = "stacked_composite"

    def __init__(self, *specs: Composite, dim: int = 0) -> None:
        if len(specs) == 1 and isinstance(specs[0], (list, tuple)):
            specs = tuple(specs[0])
        if not specs or not all(isinstance(s, Composite) for s in specs):
            raise SpecError("StackedComposite needs one or more Composite specs")
        self._stack = list(specs)
        self.stack_dim = norm_dim(dim, specs[0].ndim, insert=True)
        self.shape = _common_shape(self._stack, self.stack_dim)
        self.device = specs[0].device
        self.dtype = None
        self._meta = {}
        self._locked = False
        self._cache = {}

    # the key view: one stacked spec per key shared by every element
    @property
    def _specs(self) -> dict[str, TensorSpec]:  # type: ignore[override]
        cached = self._cache.get("view")
        if cached is not None:
            return cached
        first = self._stack[0]
        view = {
            k: stack_specs([s._specs[k] for s in self._stack], self.stack_dim)
            for k in first._specs
            if all(k in s._specs for s in self._stack[1:])
        }
        if self._locked:
            self._cache["view"] = view
        return view

    def lock_(self, recurse: bool = True) -> StackedComposite:
        """Locks every stacked composite."""
        self._locked = True
        for s in self._stack:
            s.lock_(recurse)
        return self

    def _share_(self) -> StackedComposite:
        """Locks this stack and every stacked composite for good (see Composite._share_)."""
        self._locked = True
        self._shared = True
        for s in self._stack:
            s._share_()
        return self

    def unlock_(self, recurse: bool = True) -> StackedComposite:
        """Unlocks every stacked composite (a stack held by several envs refuses, as a
        :class:`Composite` does)."""
        if self._shared:
            Composite.unlock_(self)  # (raises)
        self._locked = False
        self._cache.clear()
        for s in self._stack:
            s.unlock_(recurse)
        return self

    def set(self, key: Any, spec: TensorSpec) -> StackedComposite:
        """Sets ``spec`` (unbound along the stack dim) in every stacked composite."""
        key = _norm_key(key)
        self._check_unlocked("set", key)
        parts = spec.unbind(self.stack_dim)
        if len(parts) != len(self._stack):
            raise SpecError(
                f"cannot set {key!r}: its stack dim has {len(parts)} elements, not {len(self._stack)}"
            )
        for s, p in zip(self._stack, parts):
            s.set(key, p)
        self._cache.clear()
        return self

    def __delitem__(self, key: Any) -> None:
        self._check_unlocked("delete", key)
        for s in self._stack:
            if key in s:
                del s[key]
        self._cache.clear()

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (str, tuple)) and (
            isinstance(index, str) or all(isinstance(k, str) for k in index)
        ):
            out = self.get(index, _NO_DEFAULT)
            if out is _NO_DEFAULT:
                raise KeyError(f"key {index!r} is not in every stacked composite")
            return out
        return self._stack_index(index)

    def update(self, other: Composite | Mapping[Any, TensorSpec]) -> StackedComposite:
        """Sets every entry of ``other`` in every stacked composite."""
        for key, item in other.items():
            self.set(key, item)
        return self

    def empty(self) -> StackedComposite:
        """A stack of empty composites of the same shapes."""
        return StackedComposite(*[s.empty() for s in self._stack], dim=self.stack_dim)

    def is_empty(self, recurse: bool = True) -> bool:
        """Whether every stacked composite is empty."""
        return all(s.is_empty(recurse) for s in self._stack)

    def _fill(self, method: str, shape: Any) -> TensorDictBase:
        extra = parse_shape(shape)
        tds = [getattr(s, method)(extra) for s in self._stack]
        return LazyStackedTensorDict(*tds, stack_dim=len(extra) + self.stack_dim)

    def _split(self, val: Any) -> list[Any] | str:
        if isinstance(val, (list, tuple)):
            items = list(val)
        elif isinstance(val, TensorDictBase):
            if len(val.batch_size) != len(self.shape) or not shape_matches(
                self.shape, val.batch_size
            ):
                return f"batch size {tuple(val.batch_size)} does not match {tuple(self.shape)}"
            items = list(val.unbind(self.stack_dim))
        else:
            return f"expected a TensorDict, got {type(val).__name__}"
        if len(items) != len(self._stack):
            return f"{len(items)} elements do not match the {len(self._stack)} stacked specs"
        return items

    def _check_nested(self, val: Any, prefix: tuple[str, ...]) -> tuple[Any, str, Any] | None:
        items = self._split(val)
        if isinstance(items, str):
            return prefix, items, val
        for i, (s, v) in enumerate(zip(self._stack, items)):
            failure = s._check_nested(v, prefix)
            if failure is not None:
                return failure[0], f"stacked element {i}: {failure[1]}", failure[2]
        return None

    def project(self, val: Any) -> TensorDictBase:
        """Projects each stacked element with its own composite."""
        tds = self._each(val, "project onto", lambda s, v: s.project(v))
        return LazyStackedTensorDict(*tds, stack_dim=self.stack_dim)

    def encode(self, val: Any, *, ignore_device: bool = False) -> TensorDictBase:
        """Encodes a list (or stack) of dicts, one per stacked composite."""
        tds = self._each(val, "encode into", lambda s, v: s.encode(v))
        return LazyStackedTensorDict(*tds, stack_dim=self.stack_dim)

    def _index(self, index: Any) -> Any:
        return self._stack_index(index)

    def to(self, dest: Any) -> StackedComposite:
        """Every stacked composite on another device."""
        device = to_device(dest)
        return StackedComposite(*[s.to(device) for s in self._stack], dim=self.stack_dim)

    def describe(self) -> str:
        """A one-line description for messages."""
        return f"StackedComposite({len(self._stack)} composites, shape={tuple(self.shape)})"

    def get(self, key: Any, default: Any = None) -> Any:
        """The stack of the specs at ``key`` (``default`` if some element lacks it)."""
        key = _norm_key(key)
        vals = [s.get(key, _NO_DEFAULT) for s in self._stack]
        if any(v is _NO_DEFAULT for v in vals):
            return default
        return stack_specs(vals, self.stack_dim)

    def __contains__(self, key: object) -> bool:
        return all(key in s for s in self._stack)
