"""``torch.stack`` on specs, and the stack-dim logic shared by the heterogeneous stacks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from aenv.exceptions import SpecError

from ._base import TensorSpec
from ._composite import Composite
from ._shape import norm_dim, parse_shape_args

__all__ = ["stack_specs"]


def _common_shape(specs: Sequence[TensorSpec], dim: int) -> torch.Size:
    ndims = {s.ndim for s in specs}
    if len(ndims) != 1:
        raise SpecError(f"cannot stack specs with different numbers of dims: {sorted(ndims)}")
    first = specs[0].shape
    shape = [s if all(o.shape[i] == s for o in specs) else -1 for i, s in enumerate(first)]
    shape.insert(dim, len(specs))
    return torch.Size(shape)


def stack_specs(specs: Sequence[TensorSpec], dim: int = 0, *, out: Any = None) -> TensorSpec:
    """Stacks specs along a new dim, as ``torch.stack(specs, dim)`` does.

    Identical specs (or same-class specs that differ only in bounds or masks) give one plain
    spec of the stacked shape; leaves that differ otherwise give a :class:`Stacked`, and
    composites that differ in keys or shapes a :class:`StackedComposite`.
    """
    if out is not None:
        raise SpecError("torch.stack on specs does not support out=")
    specs = list(specs)
    if not specs:
        raise SpecError("cannot stack an empty list of specs")
    first = specs[0]
    if all(s is first for s in specs):
        # n references to one spec (a pool's envs sharing their specs): the same result,
        # without looking at each reference at every level
        return _stack_same(first, len(specs), norm_dim(dim, first.ndim, insert=True))
    n_comp = sum(isinstance(s, Composite) for s in specs)
    if n_comp not in (0, len(specs)):
        raise SpecError("cannot stack Composite specs together with leaf specs")
    _common_shape(specs, 0)
    d = norm_dim(dim, first.ndim, insert=True)
    if n_comp:
        return _stack_composites(specs, d)  # type: ignore[arg-type]
    from ._stacked import Stacked

    if d <= first.batch_ndim and all(first._stackable_with(s) for s in specs[1:]):
        return _dense_stack(specs, d)
    return Stacked(*specs, dim=d)


def _stack_same(spec: TensorSpec, n: int, d: int) -> TensorSpec:
    """``stack_specs([spec] * n, d)``, in a time that does not grow with ``n``."""
    from ._stacked import Stacked, StackedComposite

    if isinstance(spec, Composite):
        if type(spec) is Composite:
            children = {}
            for key, child in spec._specs.items():
                stacked = _stack_same(child, n, d)
                if isinstance(stacked, (Stacked, StackedComposite)):
                    break
                children[key] = stacked
            else:
                shape = torch.Size((*spec.shape[:d], n, *spec.shape[d:]))
                return Composite._new_unchecked(children, shape, spec.device, spec._meta)
        return StackedComposite(*[spec] * n, dim=d)
    if d <= spec.batch_ndim and spec._stackable_with(spec):
        return _dense_stack([spec], d, n)
    return Stacked(*[spec] * n, dim=d)


def _dense_stack(specs: list[TensorSpec], d: int, n: int | None = None) -> TensorSpec:
    """The dense stack of ``specs`` (``n`` references to ``specs[0]`` when ``n`` is given)."""
    first = specs[0]
    if n is None:
        n = len(specs)
    shape = torch.Size((*first.shape[:d], n, *first.shape[d:]))
    same = all(s is first or s == first for s in specs[1:])
    new = first._copy_with(shape, lambda t: t.unsqueeze(d).expand(*t.shape[:d], n, *t.shape[d:]))
    if not same:
        for name in first._param_names:
            vals = [getattr(s, name) for s in specs]
            if all(v is None for v in vals):
                continue
            ref = next(v for v in vals if v is not None)
            filled = [torch.ones_like(ref) if v is None else v for v in vals]
            setattr(new, name, torch.stack(filled, d))
    return new


def _stack_composites(specs: list[Composite], d: int) -> TensorSpec:
    from ._stacked import Stacked, StackedComposite

    first = specs[0]
    plain = all(type(s) is Composite for s in specs)
    if plain and all(
        s.shape == first.shape
        and s.device == first.device
        and s._specs.keys() == first._specs.keys()
        for s in specs[1:]
    ):
        children = {}
        for key in first._specs:
            child = stack_specs([s._specs[key] for s in specs], d)
            if isinstance(child, (Stacked, StackedComposite)):
                break
            children[key] = child
        else:
            shape = torch.Size((*first.shape[:d], len(specs), *first.shape[d:]))
            return Composite._new_unchecked(children, shape, first.device, first._meta)
    return StackedComposite(*specs, dim=d)


class _LazyStackMixin:
    """Indexing, unbinding and shape changes shared by Stacked and StackedComposite."""

    _stack: list[Any]
    stack_dim: int
    shape: torch.Size

    @property
    def _cls(self) -> Any:
        return type(self)

    def _rebuild(self, specs: list[Any], dim: int) -> Any:
        return stack_specs(specs, dim)

    def _stack_index(self, index: Any) -> Any:
        idx = index if isinstance(index, tuple) else (index,)
        if not all(isinstance(i, (int, slice)) for i in idx):
            raise SpecError(f"{type(self).__name__} supports int and slice indices only")
        if len(idx) > len(self.shape):
            raise SpecError(
                f"too many indices for {type(self).__name__} of shape {tuple(self.shape)}"
            )
        pre, post = idx[: self.stack_dim], idx[self.stack_dim + 1 :]
        at = idx[self.stack_dim] if len(idx) > self.stack_dim else slice(None)
        elem_idx = (*pre, *post)
        specs = self._stack[at] if isinstance(at, slice) else [self._stack[at]]
        if elem_idx:
            specs = [s[elem_idx] for s in specs]
        if isinstance(at, int):
            return specs[0]
        new_dim = self.stack_dim - sum(isinstance(i, int) for i in pre)
        return self._rebuild(list(specs), new_dim)

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """The stacked specs (along the stack dim), or stacks of each slice (other dims)."""
        d = norm_dim(dim, len(self.shape))
        if d == self.stack_dim:
            return tuple(self._stack)
        ed = d if d < self.stack_dim else d - 1
        parts = [s.unbind(ed) for s in self._stack]
        new_dim = self.stack_dim - 1 if d < self.stack_dim else self.stack_dim
        return tuple(self._rebuild([p[i] for p in parts], new_dim) for i in range(len(parts[0])))

    def expand(self, *shape: Any) -> Any:
        """Prepends leading dims to every stacked spec."""
        new = parse_shape_args(shape)
        nd = len(self.shape)
        if len(new) < nd or (nd and any(n not in (s, -1) for n, s in zip(new[-nd:], self.shape))):
            raise SpecError(
                f"cannot expand {type(self).__name__} of shape {tuple(self.shape)} to "
                f"{tuple(new)}: the new shape must end with the current shape"
            )
        lead = new[: len(new) - nd]
        if not lead:
            return self.clone()  # a new spec, as for any other shape: edits stay its own
        specs = [s.expand(*lead, *s.shape) for s in self._stack]
        return self._cls(*specs, dim=self.stack_dim + len(lead))

    def unsqueeze(self, dim: int) -> Any:
        """Inserts a size-1 dim at ``dim``."""
        d = norm_dim(dim, len(self.shape), insert=True)
        if d <= self.stack_dim:
            return self._cls(*[s.unsqueeze(d) for s in self._stack], dim=self.stack_dim + 1)
        return self._cls(*[s.unsqueeze(d - 1) for s in self._stack], dim=self.stack_dim)

    def squeeze(self, dim: int | None = None) -> Any:
        """Removes size-1 dims (a size-1 stack dim gives back the single stacked spec)."""
        dims = (
            [i for i, s in enumerate(self.shape) if s == 1]
            if dim is None
            else [norm_dim(dim, len(self.shape))]
        )
        out = self
        for d in sorted(dims, reverse=True):
            if out.shape[d] != 1:
                continue
            if d == out.stack_dim:
                return out._stack[0] if dim is not None else out._stack[0].squeeze()
            ed = d if d < out.stack_dim else d - 1
            new_dim = out.stack_dim - 1 if d < out.stack_dim else out.stack_dim
            out = self._cls(*[s.squeeze(ed) for s in out._stack], dim=new_dim)
        return out

    def reshape(self, *shape: Any) -> Any:
        """Heterogeneous stacks cannot be reshaped."""
        raise SpecError(f"{type(self).__name__} cannot be reshaped")

    view = reshape

    def clone(self) -> Any:
        """A deep copy."""
        return self._cls(*[s.clone() for s in self._stack], dim=self.stack_dim)

    def to(self, dest: Any) -> Any:
        """Every stacked spec on another device (or dtype, for leaves)."""
        return self._cls(*[s.to(dest) for s in self._stack], dim=self.stack_dim)

    def __len__(self) -> int:
        return len(self._stack)

    def _split(self, val: Any) -> list[Any] | str:
        """One value per stacked spec, or why ``val`` cannot be split so."""
        raise NotImplementedError

    def _each(self, val: Any, what: str, fn: Any) -> list[Any]:
        """``fn(spec, value)`` for each stacked spec and its part of ``val``."""
        items = self._split(val)
        if isinstance(items, str):
            raise SpecError(f"cannot {what} {self.describe()}: {items}")  # type: ignore[attr-defined]
        return [fn(s, v) for s, v in zip(self._stack, items)]

    def to_numpy(self, val: Any, safe: bool = False) -> Any:
        """A list with the numpy value of each stacked element."""
        if safe:
            self.assert_is_in(val)  # type: ignore[attr-defined]
        return self._each(val, "convert to numpy", lambda s, v: s.to_numpy(v))

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other.stack_dim == self.stack_dim  # type: ignore[attr-defined]
            and len(other._stack) == len(self._stack)  # type: ignore[attr-defined]
            and all(a == b for a, b in zip(self._stack, other._stack))  # type: ignore[attr-defined]
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(s).replace("\n", "\n    ") for s in self._stack)
        return (
            f"{type(self).__name__}(\n    {inner},\n    shape={tuple(self.shape)}, "
            f"dim={self.stack_dim})"
        )
