"""EnvPool as aenv envs: :class:`MultiThreadedEnv` (by task id) and
:class:`MultiThreadedEnvWrapper` (an EnvPool env instance). EnvPool itself is imported only
when an env is built (``pip install envpool``)."""

from __future__ import annotations

from aenv.libs._envpool import MultiThreadedEnv, MultiThreadedEnvWrapper

__all__ = ["MultiThreadedEnv", "MultiThreadedEnvWrapper"]
