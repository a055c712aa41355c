"""Spec helpers the library wrappers share: boolean flags, and a level's done flags."""

from __future__ import annotations

import torch

from aenv.specs import Categorical

__all__ = ["done_flags", "flag"]


def flag(shape: tuple[int, ...]) -> Categorical:
    """A boolean flag spec of ``shape`` (a mask, a done flag)."""
    return Categorical(2, shape=shape, dtype=torch.bool)


def done_flags(shape: tuple[int, ...]) -> dict[str, Categorical]:
    """``done``, ``terminated`` and ``truncated`` flag specs of ``shape``, for one level."""
    return {k: flag(shape) for k in ("done", "terminated", "truncated")}
