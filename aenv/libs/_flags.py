"""What the library wrappers share: their optional import, and (from the specs) boolean
flags and a level's done flags."""

from __future__ import annotations

import importlib
from typing import Any

from aenv.exceptions import BackendUnavailableError
from aenv.specs._utils import done_flags, flag

__all__ = ["done_flags", "flag", "require"]


def require(module: str, needs: str) -> Any:
    """The optional library ``module``, imported; else :class:`BackendUnavailableError`
    saying that ``needs`` (what needs it, and how to install it)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise BackendUnavailableError(needs) from None
