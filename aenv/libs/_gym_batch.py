"""Batched gymnasium values, walked as their single space says (gymnasium's ``batch_space``:
Dict and Tuple spaces batch part by part, array spaces along a first dim, others as tuples),
and the checks of the vector bridge's inputs. No I/O."""

from __future__ import annotations

from typing import Any

import numpy as np

from aenv.envs._common import EnvBase
from aenv.specs import NonTensor

__all__ = [
    "at",
    "cause",
    "has_non_tensor",
    "is_pool",
    "leading_sizes",
    "put",
    "reset_mask",
]


def is_pool(env: EnvBase) -> bool:
    from aenv.pool import AsyncEnvPool

    return isinstance(env, AsyncEnvPool)


def _is_array_space(space: Any) -> bool:
    from gymnasium import spaces

    return isinstance(
        space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary
    )


def has_non_tensor(spec: Any) -> bool:
    return any(isinstance(leaf, NonTensor) for leaf in spec.values(True, True))


def put(space: Any, batch: Any, index: int, value: Any) -> Any:
    """``batch`` (a batched value of the single space ``space``) with element ``index``
    replaced by ``value``; arrays are copied, not changed."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {k: put(sub, batch[k], index, value[k]) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(
            put(sub, b, index, v) for sub, b, v in zip(space.spaces, batch, value, strict=True)
        )
    if _is_array_space(space):
        out = np.array(batch, copy=True)
        out[index] = value
        return out
    items = list(batch)
    items[index] = value
    return tuple(items)


def at(space: Any, batch: Any, index: int) -> Any:
    """Element ``index`` of a batched value of the single space ``space``."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {k: at(sub, batch[k], index) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(at(sub, b, index) for sub, b in zip(space.spaces, batch, strict=True))
    return batch[index]


def leading_sizes(space: Any, value: Any) -> list[int | None]:
    """The batch size of every part of a batched value of the single space ``space`` (None:
    a scalar where a batch was due); parts follow gymnasium's ``batch_space``: Dict and
    Tuple spaces batch part by part, array spaces along a first dim, others as tuples."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict):
            return [None]
        return [n for k, sub in space.spaces.items() for n in leading_sizes(sub, value.get(k))]
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, tuple | list) or len(value) != len(space.spaces):
            return [None]
        return [n for sub, v in zip(space.spaces, value) for n in leading_sizes(sub, v)]
    if _is_array_space(space):
        shape = np.shape(value)
        return [shape[0] if shape else None]
    return [len(value)] if isinstance(value, tuple | list) else [None]


def cause(err: BaseException) -> BaseException:
    """The original exception of a sub-env's error (its ``__cause__`` chain's root)."""
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def reset_mask(mask: Any, n: int) -> np.ndarray | None:
    """``options["reset_mask"]`` checked: a boolean array of shape ``(n,)`` with a True."""
    if mask is None:
        return None
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True "
            f"value, got reset_mask={mask}"
        )
    return mask
