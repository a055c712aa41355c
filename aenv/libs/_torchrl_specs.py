"""Spec conversion between TorchRL's ``torchrl.data`` specs and aenv's :mod:`aenv.specs`.

The two families describe the same things with the same constructor arguments (aenv's specs
are modelled on TorchRL's), so a spec converts leaf by leaf: its kind, shape, device, dtype
and domain (bounds, ``n`` / ``nvec``, action masks, non-tensor example data); composites
and heterogeneous stacks convert recursively. A spec of a kind with no counterpart raises
:class:`~aenv.exceptions.SpecError` naming it and where it sits.
"""

from __future__ import annotations

from typing import Any

import torch

from aenv import specs as aspecs
from aenv.exceptions import BackendUnavailableError, SpecError

__all__ = ["from_torchrl_spec", "to_torchrl_spec", "torchrl_module"]


def torchrl_module() -> Any:
    """``torchrl``, or a :class:`BackendUnavailableError` saying how to install it."""
    try:
        import torchrl
        import torchrl.data
        import torchrl.envs
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the TorchRL bridge needs torchrl: pip install 'aenv[torchrl]' (import failed: {exc})"
        ) from exc
    return torchrl


def _mask(spec: Any) -> torch.Tensor | None:
    mask = getattr(spec, "mask", None)
    return None if mask is None else mask.clone()


def _one_nvec(nvec: Any, where: str) -> torch.Tensor:
    """The per-element ``nvec`` of a MultiCategorical (TorchRL expands it over the batch
    dims; aenv keeps one row)."""
    nvec = torch.as_tensor(nvec)
    rows = nvec.reshape(-1, nvec.shape[-1]) if nvec.ndim else nvec.reshape(1, 1)
    if not bool((rows == rows[0]).all()):
        raise SpecError(
            f"cannot convert the MultiCategorical at {where or 'the root'}: its nvec differs "
            f"across batch elements ({nvec.tolist()}); aenv's has one nvec for all of them"
        )
    return rows[0].clone()


def _convert(spec: Any, family: Any, src: Any, where: str) -> Any:
    """``spec`` (of the family ``src``) as a spec of ``family``; ``where`` names its key."""
    dev, dtype, shape = spec.device, spec.dtype, spec.shape
    # heterogeneous stacks first: they also subclass their element kinds
    if isinstance(spec, src.StackedComposite | src.Stacked):
        parts = spec._specs if hasattr(spec, "_specs") else spec._stack
        dim = spec.dim if hasattr(spec, "_specs") else spec.stack_dim
        return torch.stack([_convert(p, family, src, where) for p in parts], dim)
    if isinstance(spec, src.Composite):
        out = family.Composite(shape=shape, device=dev)
        for key, sub in spec.items():
            out[key] = None if sub is None else _convert(sub, family, src, f"{where}/{key}")
        return out
    # the most derived kinds first: in TorchRL, Binary and MultiCategorical subclass
    # Categorical and MultiOneHot subclasses OneHot
    if isinstance(spec, src.Binary):
        return family.Binary(n=shape[-1], shape=shape, device=dev, dtype=dtype)
    if isinstance(spec, src.MultiCategorical):
        nvec = _one_nvec(spec.nvec, where)
        out = family.MultiCategorical(nvec, shape=shape, device=dev, dtype=dtype)
        if getattr(spec, "mask", None) is not None:
            out.update_mask(_mask(spec))
        return out
    if isinstance(spec, src.Categorical):
        return family.Categorical(spec.n, shape=shape, device=dev, dtype=dtype, mask=_mask(spec))
    if isinstance(spec, src.MultiOneHot):
        counts = spec.nvec.tolist() if isinstance(spec.nvec, torch.Tensor) else list(spec.nvec)
        return family.MultiOneHot(counts, shape=shape, device=dev, dtype=dtype)
    if isinstance(spec, src.OneHot):
        return family.OneHot(spec.n, shape=shape, device=dev, dtype=dtype, mask=_mask(spec))
    if isinstance(spec, src.NonTensor):
        return family.NonTensor(
            shape=shape, device=dev, dtype=dtype, example_data=spec.example_data
        )
    if isinstance(spec, src.Bounded):
        return family.Bounded(
            spec.low.clone(), spec.high.clone(), shape=shape, device=dev, dtype=dtype
        )
    if isinstance(spec, src.Unbounded):
        return family.Unbounded(shape=shape, device=dev, dtype=dtype)
    raise SpecError(
        f"cannot convert the spec at {where or 'the root'}: {type(spec).__name__} has no "
        f"counterpart in the other spec family (expected Composite, Unbounded, Bounded, "
        f"Categorical, OneHot, Binary, MultiCategorical, MultiOneHot, NonTensor or a stack)"
    )


def from_torchrl_spec(spec: Any) -> aspecs.TensorSpec:
    """A TorchRL spec (``torchrl.data``, a composite included) as an aenv spec.

    Example:
        >>> from torchrl.data import Bounded
        >>> from_torchrl_spec(Bounded(-1.0, 1.0, (3,)))
        Bounded(shape=torch.Size([3]), ...)
    """
    trl = torchrl_module()
    return _convert(spec, aspecs, trl.data, "")  # type: ignore[no-any-return]


def to_torchrl_spec(spec: aspecs.TensorSpec) -> Any:
    """An aenv spec as a TorchRL spec (the inverse of :func:`from_torchrl_spec`).

    Example:
        >>> from aenv.specs import Categorical
        >>> to_torchrl_spec(Categorical(4)).n
        4
    """
    trl = torchrl_module()
    return _convert(spec, trl.data, aspecs, "")
