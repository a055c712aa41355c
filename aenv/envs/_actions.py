"""Action checks off the fast path: dtype casting and heterogeneous (lazy-stacked) actions.

:meth:`EnvBase._check_actions` reads each action once and compares shape and dtype; only an
action whose dtype differs from its spec's, or one a lazy stack cannot read as one tensor
(sub-envs whose actions differ in shape), comes here.

The casting rule: a value that the spec's dtype holds exactly is cast to it (a float
one-hot ``1.0`` for an ``int8`` :class:`~aenv.specs.Binary`, ``int32`` indices for an
``int64`` :class:`~aenv.specs.Categorical`, ``float64`` for ``float32``, rounded to the
nearest ``float32`` as float dtypes hold any value); a value it cannot hold (``0.5`` for an
integer action, ``300`` for ``int8``, a finite value that overflows to infinity) is a
:class:`~aenv.exceptions.SpecViolationError` naming the key, the spec and what came.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv.exceptions import SpecViolationError

__all__ = ["cast_action", "check_stacked_action", "heterogeneous", "write_casts"]


def cast_action(key: Any, spec: Any, value: torch.Tensor) -> torch.Tensor:
    """``value`` as ``spec.dtype`` when that dtype holds it exactly (see the module doc).

    Raises:
        SpecViolationError: the dtype cannot hold the value.
    """
    target = spec.dtype
    lost: torch.Tensor | None = None
    if value.is_complex() and not target.is_complex:  # only values with no imaginary part
        real = value.real
        cast = real.to(target)
        lost = (value.imag != 0) | (cast.to(real.dtype) != real)
    else:
        cast = value.to(target)
        if target.is_floating_point or target.is_complex:  # rounds: only overflow is lost
            if value.is_floating_point():
                lost = torch.isinf(cast) & torch.isfinite(value)
        else:  # an integer or bool dtype: the value must come back unchanged
            back = cast.to(value.dtype)
            lost = back != value
            if value.is_floating_point():
                lost = lost | torch.isnan(value)
    if lost is not None and bool(lost.any()):
        bad = value[lost] if lost.ndim else value
        raise SpecViolationError(
            f"action {key!r} of dtype {value.dtype} does not fit dtype {target} of its spec "
            f"{spec!r}: {bad.reshape(-1)[:5].tolist()} cannot be held exactly (a value the "
            "spec's dtype holds exactly is cast; pass whole numbers for integer actions)",
            key=key,
        )
    return cast


def _stack_level(td: TensorDictBase, key: Any) -> tuple[Any, Any]:
    """The lazy stack holding ``key``'s leaf and the key inside it: ``td`` itself, or the
    level the key's prefix names (``("agents", "action")``: ``td["agents"]``)."""
    if isinstance(key, tuple) and len(key) > 1:
        parent = td.get(key[:-1], None)
        if isinstance(parent, LazyStackedTensorDict):
            return parent, key[-1]
    return td, key


def heterogeneous(td: TensorDictBase, key: Any, spec: Any) -> bool:
    """True when ``key``'s leaf lives in a lazy stack (``td``, or the level of the key's
    prefix) along the stack dim of a heterogeneous ``spec``, one element per spec."""
    stack = getattr(spec, "_stack", None)
    if stack is None:  # (a non-tensor spec, also without a dtype: no stack to look for)
        return False
    level, _ = _stack_level(td, key)
    return (
        isinstance(level, LazyStackedTensorDict)
        and level.stack_dim == spec.stack_dim
        and len(level.tensordicts) == len(stack)
    )


def check_stacked_action(
    td: TensorDictBase, key: Any, spec: Any, run_type_checks: bool
) -> list[tuple[Any, Any, torch.Tensor]]:
    """Check a heterogeneous action element by element (each element of the lazy stack
    against its own spec, recursively for stacks of stacks: a pool of multi-agent envs);
    returns the casts to write, as ``(tensordict, key, value)``.

    Raises:
        SpecViolationError: an element is missing the action, has the wrong shape, a dtype
            that cannot hold it, or (with type checks) a value outside its spec.
    """
    casts: list[tuple[Any, Any, torch.Tensor]] = []
    _check_elements(td, key, spec, run_type_checks, (), casts)
    return casts


def _check_elements(
    td: TensorDictBase,
    key: Any,
    spec: Any,
    run_type_checks: bool,
    where: tuple[int, ...],
    casts: list[tuple[Any, Any, torch.Tensor]],
) -> None:
    if heterogeneous(td, key, spec):
        level, leaf = _stack_level(td, key)
        for i, (sub, sub_spec) in enumerate(zip(level.tensordicts, spec._stack)):  # type: ignore[attr-defined]
            _check_elements(sub, leaf, sub_spec, run_type_checks, (*where, i), casts)
        return
    name = "element " + ", ".join(map(str, where)) if where else "the input"
    value = td.get(key, None)
    if value is None:
        raise SpecViolationError(
            f"action key {key!r} is missing from {name}; expected {spec!r}", key=key
        )
    if not isinstance(value, torch.Tensor):
        return
    expected = spec.shape
    if value.shape != expected and (
        len(value.shape) != len(expected)
        or any(e != -1 and e != s for e, s in zip(expected, value.shape))
    ):
        raise SpecViolationError(
            f"action {key!r} of {name} has shape {tuple(value.shape)}, expected "
            f"{tuple(expected)} (spec {spec!r})",
            key=key,
        )
    if spec.dtype is not None and value.dtype != spec.dtype:
        value = cast_action(key, spec, value)
        casts.append((td, key, value))
    if run_type_checks and not spec.is_in(value):
        raise SpecViolationError(f"action {key!r} of {name} is outside its spec {spec!r}", key=key)


def write_casts(td: TensorDictBase, casts: list[tuple[Any, Any, torch.Tensor]]) -> None:
    """Write cast actions where they were read (``None``: ``td`` itself)."""
    for target, key, value in casts:
        (td if target is None else target).set(key, value)
