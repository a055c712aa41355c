"""Gymnasium env factories as one gymnasium ``VectorEnv`` run by an aenv pool:
``make_gymnasium_vector``, a stand-in for ``SyncVectorEnv`` / ``AsyncVectorEnv``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from gymnasium.vector import AutoresetMode

from aenv.envs._common import EnvBase
from aenv.exceptions import SpaceMismatchError
from aenv.libs._to_gymnasium_vector import AenvGymnasiumVectorEnv
from aenv.sync import Runner, get_runner

__all__ = ["make_gymnasium_vector"]


def _wrapped(make: Callable[[], Any], categorical: bool, infos: bool) -> EnvBase:
    """A gymnasium env from ``make`` as an aenv env (built where the pool places it)."""
    from aenv.libs._gym_env import GymWrapper
    from aenv.libs._gym_info import InfoAsEntry

    # (float64 rewards: gymnasium's python floats kept exact, as its vector envs keep them)
    env = GymWrapper(make(), categorical_action_encoding=categorical, reward_dtype=torch.float64)
    if infos:
        env.set_info_dict_reader(InfoAsEntry())
    return env


def make_gymnasium_vector(
    env_fns: Sequence[Callable[[], Any]],
    *,
    backend: str = "coroutine",
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    observation_mode: str | tuple[Any, Any] = "same",
    keep_infos: bool = True,
    runner: Runner | None = None,
    **pool_kwargs: Any,
) -> AenvGymnasiumVectorEnv:
    """Gymnasium env factories as one gymnasium ``VectorEnv`` run by an aenv pool: a
    stand-in for ``SyncVectorEnv(env_fns)`` / ``AsyncVectorEnv(env_fns)``.

    Each env is wrapped with :class:`~aenv.libs.gym.GymWrapper` (Discrete values as
    indices), its info dicts kept whole (``keep_infos``, :class:`~aenv.libs.gym.InfoAsEntry`),
    in an :class:`~aenv.pool.AsyncEnvPool` of ``backend`` (``"coroutine"``, ``"thread"``,
    ``"process"``; ``pool_kwargs`` go to the pool), bridged by :func:`to_gymnasium_vector`.

    Raises:
        SpaceMismatchError: the envs' spaces differ in shape or type (the pool cannot stack
            them), or, with ``observation_mode="same"``, in bounds.

    Example:
        >>> envs = make_gymnasium_vector([lambda: gymnasium.make("CartPole-v1")] * 4)
        >>> obs, info = envs.reset(seed=0)
        >>> obs, rewards, terms, truncs, info = envs.step(envs.action_space.sample())
    """
    from aenv.exceptions import SpecError
    from aenv.pool import AsyncEnvPool

    # indices for Discrete actions: what gymnasium's vector envs take
    fns = [functools.partial(_wrapped, fn, True, keep_infos) for fn in env_fns]
    try:
        pool = AsyncEnvPool(fns, backend=backend, **pool_kwargs)
    except SpecError as exc:
        raise SpaceMismatchError(
            f"the {len(fns)} envs' spaces cannot be batched into one vector env: {exc}"
        ) from exc
    try:
        return AenvGymnasiumVectorEnv(
            pool, runner=runner, autoreset_mode=autoreset_mode, observation_mode=observation_mode
        )
    except BaseException:
        (runner or get_runner()).run(pool.aclose)
        raise
