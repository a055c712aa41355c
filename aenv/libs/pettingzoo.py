"""PettingZoo as aenv multi-agent envs (``pip install 'aenv[pettingzoo]'``):
:class:`PettingZooWrapper` (a ParallelEnv or AECEnv instance) and :class:`PettingZooEnv`
(built by task name). PettingZoo is imported only when an env is built."""

from __future__ import annotations

from aenv.libs._pettingzoo import PettingZooEnv, PettingZooWrapper

__all__ = ["PettingZooEnv", "PettingZooWrapper"]
