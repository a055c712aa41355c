"""DeepMind Control as aenv envs (``pip install 'aenv[dmcontrol]'``): :class:`DMControlWrapper`
(any ``dm_env.Environment``) and :class:`DMControlEnv` (a suite task by name), with
:func:`from_dm_env_spec` for the spec conversion. dm_control is imported only when an env is
built."""

from __future__ import annotations

from aenv.libs._dm_control import DMControlEnv, DMControlWrapper, from_dm_env_spec

__all__ = ["DMControlEnv", "DMControlWrapper", "from_dm_env_spec"]
