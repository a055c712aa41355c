"""Synchronous facades over aenv's async implementation, and the loop runner they share.

The runner (:class:`Runner`, :func:`get_runner`, :func:`run_sync`) is the only place in aenv
where synchronous code touches an event loop; the facades (:class:`SyncEnv`,
:class:`SerialEnv`, :class:`ParallelEnv`, :func:`rollout`) make one runner call per method.
"""

from __future__ import annotations

from aenv.sync._checks import check_env_specs
from aenv.sync._creator import EnvCreator
from aenv.sync._facades import SerialEnv, SyncEnv, rollout
from aenv.sync._parallel import ParallelEnv
from aenv.sync._runner import Runner, get_runner, run_sync

__all__ = [
    "check_env_specs",
    "EnvCreator",
    "ParallelEnv",
    "Runner",
    "SerialEnv",
    "SyncEnv",
    "get_runner",
    "rollout",
    "run_sync",
]
