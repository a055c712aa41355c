"""Wrappers of other libraries' envs as aenv envs, and of aenv envs as theirs.

Each library lives in its own public module (``aenv.libs.gym``) and is imported only when
that module is: ``import aenv.libs`` imports no optional dependency.
"""

from __future__ import annotations

__all__: list[str] = []
