"""The :class:`Composite` spec: a (nested) mapping from keys to specs sharing leading dims."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv.exceptions import LockedSpecError, SpecError, SpecViolationError

from ._base import TensorSpec, describe_value
from ._composite_shapes import _CompositeShapeMixin
from ._keys import (
    _NO_DEFAULT,
    NestedKey,
    SpecKeys,
    _default_is_leaf,
    _get_value,
    _is_key,
    _new_td,
    _norm_key,
)
from ._shape import (
    DEVICE_TYPING,
    has_dynamic,
    parse_shape,
    to_device,
)

__all__ = ["Composite", "CompositeSpec", "SpecKeys"]


class Composite(_CompositeShapeMixin, TensorSpec):
    """A nested mapping of specs; every child's shape starts with the composite's shape.

    Keys are str, or tuples of str for nested entries (setting a nested key creates the
    intermediate composites). ``rand()``/``zero()``/``one()`` give a
    :class:`tensordict.TensorDict` of batch size ``(*shape, *spec.shape)``. A locked composite
    (``lock_()``, recursive) refuses changes with :class:`~aenv.exceptions.LockedSpecError`
    and caches its key lists.

    Example:
        >>> import torch
        >>> from aenv.specs import Bounded, Composite, Unbounded
        >>> spec = Composite(obs=Unbounded((4, 3)), shape=(4,))
        >>> spec["next", "reward"] = Unbounded((4, 1))
        >>> spec.keys(True, True)
        ('obs', ('next', 'reward'))
        >>> spec.zero().batch_size
        torch.Size([4])
    """

    _kind = "composite"
    #: held by several envs: locked for good (see _share_)
    _shared = False

    def __init__(
        self,
        spec: Mapping[str, TensorSpec] | None = None,
        *,
        shape: Any = None,
        batch_size: Any = None,
        device: DEVICE_TYPING = None,
        **kwargs: TensorSpec,
    ) -> None:
        if shape is not None and batch_size is not None:
            if parse_shape(shape) != parse_shape(batch_size):
                raise SpecError(f"Composite: shape {shape} and batch_size {batch_size} differ")
        self.shape = parse_shape(shape if shape is not None else batch_size)
        self.device = to_device(device)
        self.dtype = None
        self._meta = {}
        self._specs: dict[str, TensorSpec] = {}
        self._locked = False
        self._cache: dict[Any, Any] = {}
        if spec is not None:
            if not isinstance(spec, Mapping):
                raise SpecError(f"Composite expects a mapping of specs, got {type(spec).__name__}")
            items = list(spec.items())
        else:
            items = []
        for key, value in [*items, *kwargs.items()]:
            self.set(key, value)

    @classmethod
    def _new_unchecked(
        cls, specs: dict[str, TensorSpec], shape: torch.Size, device: Any, meta: dict[str, Any]
    ) -> Composite:
        new = cls.__new__(cls)
        new.shape = shape
        new.device = device
        new.dtype = None
        new._meta = dict(meta)
        new._specs = specs
        new._locked = False
        new._cache = {}
        return new

    # ------------------------------------------------------------------ locking
    @property
    def is_locked(self) -> bool:
        """Whether the composite refuses changes."""
        return self._locked

    def lock_(self, recurse: bool = True) -> Composite:
        """Locks this composite and (``recurse``) every nested composite; returns self."""
        self._locked = True
        if recurse:
            for child in self._specs.values():
                child.lock_(recurse=True)
        return self

    def unlock_(self, recurse: bool = True) -> Composite:
        """Unlocks this composite and (``recurse``) every nested one; returns self.

        Raises:
            LockedSpecError: the composite is held by several envs at once (see
                :meth:`_share_`); an env's own, unlocked copy comes from
                ``env.set_spec_lock_(False)``.
        """
        if self._shared:
            raise LockedSpecError(
                "cannot unlock this Composite: several envs hold it (envs built alike share "
                "their specs); call env.set_spec_lock_(False) to give the env its own "
                "unlocked copy, or clone() it"
            )
        self._locked = False
        self._cache.clear()
        if recurse:
            for child in self._specs.values():
                child.unlock_(recurse=True)
        return self

    def _share_(self) -> Composite:
        """Lock this composite and every nested one for good: it is held by several envs
        (or kept as the template of envs to come), so none may change it for the others.
        Clones are unlocked and not shared. Returns self."""
        self._locked = True
        self._shared = True
        for child in self._specs.values():
            if isinstance(child, Composite):
                child._share_()
        return self

    def _check_unlocked(self, action: str, key: Any) -> None:
        if self._locked:
            raise LockedSpecError(
                f"cannot {action} key {key!r}: the Composite is locked; call unlock_() on it "
                "(or on the env, set_spec_lock_(False)) before modifying it"
            )

    # ------------------------------------------------------------------ mapping API
    def set(self, key: NestedKey, spec: TensorSpec) -> Composite:
        """Sets ``spec`` at ``key`` (nested keys create intermediate composites); returns self."""
        key = _norm_key(key)
        self._check_unlocked("set", key)
        if isinstance(key, tuple):
            sub = self._specs.get(key[0])
            if sub is None:
                sub = Composite(shape=self.shape, device=self.device)
                self._set_str(key[0], sub)
            elif not isinstance(sub, Composite):
                raise SpecError(
                    f"cannot set {key!r}: {key[0]!r} holds a leaf spec, not a Composite"
                )
            sub.set(key[1:], spec)
            self._cache.clear()
            return self
        self._set_str(key, spec)
        return self

    def _set_str(self, key: str, spec: Any) -> None:
        if not isinstance(spec, TensorSpec):
            raise SpecError(
                f"Composite: the value at key {key!r} must be a TensorSpec, got {type(spec).__name__}"
            )
        nd = self.ndim
        if spec.shape[:nd] != self.shape:
            raise SpecError(
                f"Composite: the shape of key {key!r} ({tuple(spec.shape)}) must start with the "
                f"composite's shape {tuple(self.shape)}"
            )
        if self.device is not None and spec.device != self.device:
            spec = spec.to(self.device)
        self._specs[key] = spec
        self._cache.clear()

    def __setitem__(self, key: NestedKey, spec: TensorSpec) -> None:
        if not _is_key(key):
            raise SpecError(f"Composite: cannot set at index {key!r}; only keys can be set")
        self.set(key, spec)

    def _walk(self, key: tuple[str, ...]) -> Any:
        node: Any = self
        for k in key:
            if not isinstance(node, Composite):
                return _NO_DEFAULT
            node = node._specs.get(k, _NO_DEFAULT)
            if node is _NO_DEFAULT:
                return node
        return node

    def get(self, key: NestedKey, default: Any = None) -> Any:
        """The spec at ``key`` or ``default`` (``None`` unless given) when it is missing."""
        key = _norm_key(key)
        out = self._specs.get(key, _NO_DEFAULT) if isinstance(key, str) else self._walk(key)
        return default if out is _NO_DEFAULT else out

    def __getitem__(self, index: Any) -> Any:
        if _is_key(index):
            key = _norm_key(index)
            out = self._specs.get(key, _NO_DEFAULT) if isinstance(key, str) else self._walk(key)
            if out is _NO_DEFAULT:
                raise KeyError(f"key {key!r} not found in Composite with keys {list(self._specs)}")
            return out
        return self._index(index)

    def __delitem__(self, key: NestedKey) -> None:
        key = _norm_key(key)
        if isinstance(key, tuple):
            parent = self._walk(key[:-1])
            if not isinstance(parent, Composite):
                raise KeyError(f"key {key!r} not found")
            self._check_unlocked("delete", key)
            del parent[key[-1]]
            self._cache.clear()
            return
        self._check_unlocked("delete", key)
        if key not in self._specs:
            raise KeyError(f"key {key!r} not found in Composite with keys {list(self._specs)}")
        del self._specs[key]
        self._cache.clear()

    def pop(self, key: NestedKey, default: Any = _NO_DEFAULT) -> Any:
        """Removes and returns the spec at ``key`` (``default`` when missing, if given)."""
        out = self.get(key, _NO_DEFAULT)
        if out is _NO_DEFAULT:
            if default is _NO_DEFAULT:
                raise KeyError(f"key {key!r} not found in Composite")
            return default
        del self[key]
        return out

    def __contains__(self, key: object) -> bool:
        if not _is_key(key):
            return False
        key = _norm_key(key)
        if isinstance(key, str):
            return key in self._specs
        return self._walk(key) is not _NO_DEFAULT

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def _iter_items(
        self, nested: bool, leaves_only: bool, is_leaf: Callable[[type], bool], prefix: tuple
    ) -> Iterator[tuple[Any, TensorSpec]]:
        for k, v in self._specs.items():
            key = (*prefix, k) if prefix else k
            leaf = is_leaf(type(v))
            if not leaves_only or leaf:
                yield key, v
            if nested and not leaf and isinstance(v, Composite):
                yield from v._iter_items(nested, leaves_only, is_leaf, (*prefix, k))

    def _items_tuple(
        self, include_nested: bool, leaves_only: bool, is_leaf: Callable[[type], bool] | None
    ) -> tuple[tuple[Any, TensorSpec], ...]:
        if is_leaf is None:
            cache_key = (include_nested, leaves_only)
            out = self._cache.get(cache_key)
            if out is None:
                out = tuple(self._iter_items(include_nested, leaves_only, _default_is_leaf, ()))
                if self._locked:
                    self._cache[cache_key] = out
            return out
        return tuple(self._iter_items(include_nested, leaves_only, is_leaf, ()))

    def keys(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable[[type], bool] | None = None,
    ) -> SpecKeys:
        """Keys in insertion order (nested ones as tuples); cached while the spec is locked."""
        if is_leaf is None and self._locked:
            cache_key = ("keys", include_nested, leaves_only)
            out = self._cache.get(cache_key)
            if out is None:
                out = SpecKeys(k for k, _ in self._items_tuple(include_nested, leaves_only, None))
                self._cache[cache_key] = out
            return out
        return SpecKeys(k for k, _ in self._items_tuple(include_nested, leaves_only, is_leaf))

    def items(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable[[type], bool] | None = None,
    ) -> tuple[tuple[Any, TensorSpec], ...]:
        """``(key, spec)`` pairs, with the same arguments as :meth:`keys`."""
        return self._items_tuple(include_nested, leaves_only, is_leaf)

    def values(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable[[type], bool] | None = None,
    ) -> tuple[TensorSpec, ...]:
        """Specs, with the same arguments as :meth:`keys`."""
        return tuple(v for _, v in self._items_tuple(include_nested, leaves_only, is_leaf))

    def update(self, other: Composite | Mapping[Any, TensorSpec]) -> Composite:
        """Sets every entry of ``other``; nested composites are updated recursively."""
        for key, item in other.items():
            current = self.get(key)
            if isinstance(current, Composite) and isinstance(item, Composite):
                current.update(item)
                self._cache.clear()
            else:
                self.set(key, item)
        return self

    def empty(self) -> Composite:
        """A composite with the same shape and device and no keys."""
        return Composite._new_unchecked({}, self.shape, self.device, self._meta)

    def is_empty(self, recurse: bool = True) -> bool:
        """Whether there is no leaf at all (``recurse=False``: no key at all)."""
        if not recurse:
            return not self._specs
        return not self._items_tuple(True, True, None)

    def select(self, *keys: NestedKey, strict: bool = True) -> Composite:
        """A composite holding only ``keys`` (missing ones raise unless ``strict=False``)."""
        out = self.empty()
        for key in keys:
            val = self.get(key, _NO_DEFAULT)
            if val is _NO_DEFAULT:
                if strict:
                    raise KeyError(f"key {key!r} not found in Composite")
                continue
            out.set(key, val)
        return out

    def exclude(self, *keys: NestedKey) -> Composite:
        """A shallow copy without ``keys``."""
        out = Composite._new_unchecked(dict(self._specs), self.shape, self.device, self._meta)
        for key in keys:
            key = _norm_key(key)
            if isinstance(key, str):
                out._specs.pop(key, None)
            elif key in out:
                parent = out._walk(key[:-1])
                parent = parent.exclude(key[-1])
                out.set(key[:-1], parent)
        return out

    # ------------------------------------------------------------------ sampling
    def _plan(self) -> tuple[int | None, tuple[tuple[str, TensorSpec, bool], ...]]:
        """(dim of a heterogeneous stack among the children or None, (key, child, direct))."""
        plan = self._cache.get("plan")
        if plan is None:
            from ._stacked import Stacked, StackedComposite

            lazy = None
            entries = []
            for k, v in self._specs.items():
                if isinstance(v, (Stacked, StackedComposite)) and v.stack_dim < self.ndim:
                    lazy = v.stack_dim
                direct = not isinstance(v, (Composite, Stacked)) and not has_dynamic(v.shape)
                entries.append((k, v, direct))
            plan = (lazy, tuple(entries))
            if self._locked:
                self._cache["plan"] = plan
        return plan

    def _fill(self, method: str, shape: Any) -> TensorDictBase:
        if has_dynamic(self.shape):
            raise SpecError("cannot sample a Composite whose own shape has dynamic (-1) dims")
        extra = parse_shape(shape)
        lazy, entries = self._plan()
        if lazy is not None:
            tds = [getattr(c, method)(extra) for c in self.unbind(lazy)]
            return LazyStackedTensorDict(*tds, stack_dim=len(extra) + lazy)
        private = "_" + method
        source: dict[str, Any] = {}
        if extra:
            for key, child, direct in entries:
                if direct:
                    source[key] = getattr(child, private)(extra + child.shape)
                else:
                    source[key] = getattr(child, method)(extra)
            return _new_td(source, extra + self.shape, self.device)
        for key, child, direct in entries:
            source[key] = (
                getattr(child, private)(child.shape) if direct else getattr(child, method)()
            )
        return _new_td(source, self.shape, self.device)

    def rand(self, shape: Any = None) -> TensorDictBase:
        """A TensorDict of random values in the spec, batch size ``(*shape, *self.shape)``."""
        return self._fill("rand", shape)

    def zero(self, shape: Any = None) -> TensorDictBase:
        """A TensorDict of zeros, batch size ``(*shape, *self.shape)``."""
        return self._fill("zero", shape)

    def one(self, shape: Any = None) -> TensorDictBase:
        """A TensorDict of ones, batch size ``(*shape, *self.shape)``."""
        return self._fill("one", shape)

    # ------------------------------------------------------------------ membership
    def _check_nested(self, val: Any, prefix: tuple[str, ...]) -> tuple[Any, str, Any] | None:
        if not isinstance(val, (TensorDictBase, Mapping)):
            return prefix, f"expected a TensorDict, got {type(val).__name__}", val
        for key, child in self._specs.items():
            path = (*prefix, key)
            sub = _get_value(val, key)
            if sub is _NO_DEFAULT:
                return path, "the key is missing", None
            if isinstance(child, Composite):
                failure = child._check_nested(sub, path)
                if failure is not None:
                    return failure
                continue
            reason = child._check(sub)
            if reason is not None:
                return path, f"{reason}; spec: {child.describe()}", sub
        return None

    def _check(self, val: Any) -> str | None:
        failure = self._check_nested(val, ())
        return None if failure is None else f"at key {failure[0]!r}: {failure[1]}"

    def assert_is_in(self, val: Any, key: Any = None) -> None:
        """Raises :class:`~aenv.exceptions.SpecViolationError` naming the nested key at fault."""
        failure = self._check_nested(val, ())
        if failure is None:
            return
        path, reason, sub = failure
        if key is not None:
            path = (*(key if isinstance(key, tuple) else (key,)), *path)
        shown = path[0] if len(path) == 1 else path
        got = describe_value(sub) if sub is not None else "nothing"
        raise SpecViolationError(
            f"value at key {shown!r} is not in its spec: {reason}.\n  got: {got}", key=shown
        )

    # ------------------------------------------------------------------ conversions
    def project(self, val: Any) -> TensorDictBase:
        """A shallow copy of ``val`` with every spec'd entry projected into its spec."""
        out = val.copy() if isinstance(val, TensorDictBase) else self.encode(val)
        for key, child in self._specs.items():
            sub = _get_value(out, key)
            if sub is not _NO_DEFAULT:
                out.set(key, child.project(sub))
        return out

    def encode(self, val: Any, *, ignore_device: bool = False) -> TensorDictBase:
        """Turns a (nested) dict of arrays / lists / scalars into a TensorDict of this spec."""
        if isinstance(val, TensorDictBase):
            val = dict(val.items())
        source: dict[str, Any] = {}
        for key, item in val.items():
            child = self._specs.get(key)
            if child is None:
                raise SpecError(f"cannot encode key {key!r}: not in the spec {list(self._specs)}")
            source[key] = child.encode(item)
        return _new_td(source, self.shape, self.device)

    def to_numpy(self, val: Any, safe: bool = False) -> dict[str, Any]:
        """A (nested) dict of numpy arrays from a TensorDict of this spec."""
        if safe:
            self.assert_is_in(val)
        out: dict[str, Any] = {}
        for key, child in self._specs.items():
            sub = _get_value(val, key)
            if sub is not _NO_DEFAULT:
                out[key] = child.to_numpy(sub)
        return out

    # ------------------------------------------------------------------ comparison and display
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Composite) or other._kind != self._kind:
            return False
        if other.shape != self.shape or other.device != self.device:
            return False
        if self._specs.keys() != other._specs.keys():
            return False
        return all(v == other._specs[k] for k, v in self._specs.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        lines = []
        for k, v in self._specs.items():
            child = repr(v).replace("\n", "\n    ")
            lines.append(f"    {k}: {child}")
        body = ("\n" + ",\n".join(lines) + ",\n") if lines else ""
        lock = ", locked" if self._locked else ""
        return f"{type(self).__name__}({body}shape={tuple(self.shape)}, device={self.device}{lock})"

    def describe(self) -> str:
        """A one-line description for messages."""
        return f"Composite(keys={list(self._specs)}, shape={tuple(self.shape)})"


CompositeSpec = Composite
