"""MO-Gymnasium as aenv envs (``pip install 'aenv[mo-gymnasium]'``): :class:`MOGymWrapper`
(an env instance) and :class:`MOGymEnv` (by id), with vector rewards."""

from __future__ import annotations

from aenv.libs._mo_gymnasium import MOGymEnv, MOGymWrapper

__all__ = ["MOGymEnv", "MOGymWrapper"]
