"""pytest plugin: gymnasium's ``SyncVectorEnv`` / ``AsyncVectorEnv`` replaced by aenv's bridge.

Loaded by ``tools/gymnasium_vector_suite.py`` (``-p _gymnasium_bridge_plugin``) before
gymnasium's test modules are imported, so that ``from gymnasium.vector import SyncVectorEnv``
in them (and ``gymnasium.make_vec``) builds the bridge: each sub-env a
:class:`~aenv.libs.gym.GymWrapper` (indices for Discrete actions, info dicts kept whole by
:class:`~aenv.libs.gym.InfoAsEntry`) in an :class:`~aenv.pool.AsyncEnvPool` of the backend
named by ``AENV_BRIDGE_BACKEND``, driven through :func:`~aenv.libs.gym.to_gymnasium_vector`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import gymnasium.vector
import gymnasium.vector.async_vector_env
import gymnasium.vector.sync_vector_env
from gymnasium.vector import AutoresetMode

from aenv.libs.gym import AenvGymnasiumVectorEnv, GymWrapper, InfoAsEntry
from aenv.pool import AsyncEnvPool

BACKEND = os.environ.get("AENV_BRIDGE_BACKEND", "coroutine")


def _sub_env(make: Callable[[], Any]) -> GymWrapper:
    wrapper = GymWrapper(make(), categorical_action_encoding=True)
    wrapper.set_info_dict_reader(InfoAsEntry())
    return wrapper


class _Bridged(AenvGymnasiumVectorEnv):
    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        copy: bool = True,
        observation_mode: str = "same",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        **_async_only: Any,  # shared_memory, context, daemon, worker: no meaning here
    ) -> None:
        fns = [functools.partial(_sub_env, fn) for fn in env_fns]
        pool = AsyncEnvPool(fns, backend=BACKEND)
        try:
            super().__init__(pool, autoreset_mode=autoreset_mode, observation_mode=observation_mode)
        except BaseException:
            pool_close(pool)
            raise
        self.env_fns = env_fns
        self.copy = copy


def pool_close(pool: AsyncEnvPool) -> None:
    from aenv.sync import get_runner

    get_runner().run(pool.aclose)


class SyncVectorEnv(_Bridged):
    """aenv's bridge standing in for gymnasium's SyncVectorEnv."""


class AsyncVectorEnv(_Bridged):
    """aenv's bridge standing in for gymnasium's AsyncVectorEnv."""


for module in (
    gymnasium.vector,
    gymnasium.vector.sync_vector_env,
    gymnasium.vector.async_vector_env,
):
    module.SyncVectorEnv = SyncVectorEnv  # type: ignore[attr-defined]
    module.AsyncVectorEnv = AsyncVectorEnv  # type: ignore[attr-defined]
