"""What the library wrappers share: their optional import, boolean flags, a level's done flags."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from aenv.exceptions import BackendUnavailableError
from aenv.specs import Categorical

__all__ = ["done_flags", "flag", "require"]


def flag(shape: tuple[int, ...]) -> Categorical:
    """A boolean flag spec of ``shape`` (a mask, a done flag)."""
    return Categorical(2, shape=shape, dtype=torch.bool)


def done_flags(shape: tuple[int, ...]) -> dict[str, Categorical]:
    """``done``, ``terminated`` and ``truncated`` flag specs of ``shape``, for one level."""
    return {k: flag(shape) for k in ("done", "terminated", "truncated")}


def require(module: str, needs: str) -> Any:
    """The optional library ``module``, imported; else :class:`BackendUnavailableError`
    saying that ``needs`` (what needs it, and how to install it)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise BackendUnavailableError(needs) from None
