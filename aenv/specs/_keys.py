"""Key helpers of Composite specs: key normalisation, key views, reading values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.exceptions import SpecError

__all__ = ["SpecKeys"]

_NO_DEFAULT = object()
NestedKey = Any  # str or tuple of str


class SpecKeys(tuple):
    """An immutable tuple of keys whose ``in`` also accepts 1-tuples and nested tuple keys."""

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        return tuple.__contains__(self, key)


def _norm_key(key: Any) -> str | tuple[str, ...]:
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return key[0] if len(key) == 1 else key
    raise SpecError(f"spec keys are str or non-empty tuples of str, got {key!r}")


def _is_key(key: Any) -> bool:
    return isinstance(key, str) or (
        isinstance(key, tuple) and bool(key) and all(isinstance(k, str) for k in key)
    )


def _default_is_leaf(cls: type) -> bool:
    from ._composite import Composite

    return not issubclass(cls, Composite)


def _get_value(val: Any, key: str) -> Any:
    """``val[key]`` of a TensorDict or a mapping; heterogeneous stacks come back as lists."""
    if isinstance(val, TensorDictBase):
        try:
            return val.get(key, _NO_DEFAULT)
        except RuntimeError:
            return val.get(key, as_list=True)  # type: ignore[call-overload]
    return val.get(key, _NO_DEFAULT) if isinstance(val, Mapping) else _NO_DEFAULT


def _new_td(source: dict[str, Any], batch_size: torch.Size, device: Any) -> TensorDict:
    return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)  # type: ignore[arg-type]
