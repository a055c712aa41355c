"""Gymnasium in both directions: gymnasium envs as aenv envs, aenv envs as gymnasium envs.

* :class:`GymEnv` / :class:`GymWrapper`: a gymnasium env (single or vector) as an aenv env.
* :func:`to_gymnasium` / :func:`to_gymnasium_vector`: an aenv env as a ``gymnasium.Env`` /
  ``gymnasium.vector.VectorEnv`` driven through aenv's loop runner;
  :func:`make_gymnasium_vector`: gymnasium env factories as a ``VectorEnv`` run by an aenv
  pool (a stand-in for ``SyncVectorEnv`` / ``AsyncVectorEnv``).
* :func:`set_gym_backend` / :func:`gym_backend`: gymnasium (default) or the legacy ``gym``.
"""

from __future__ import annotations

from aenv.envs._gymlike import (
    BaseInfoDictReader,
    DefaultInfoDictReader,
    GymLikeEnv,
    default_info_dict_reader,
)
from aenv.libs._gym_backend import gym_backend, set_gym_backend
from aenv.libs._gym_env import GymEnv, GymWrapper
from aenv.libs._gym_info import InfoAsEntry
from aenv.libs._make_gymnasium_vector import make_gymnasium_vector
from aenv.libs._to_gymnasium import AenvGymnasiumEnv, to_gymnasium
from aenv.libs._to_gymnasium_vector import AenvGymnasiumVectorEnv, to_gymnasium_vector

__all__ = [
    "AenvGymnasiumEnv",
    "AenvGymnasiumVectorEnv",
    "BaseInfoDictReader",
    "DefaultInfoDictReader",
    "GymEnv",
    "GymLikeEnv",
    "GymWrapper",
    "InfoAsEntry",
    "default_info_dict_reader",
    "gym_backend",
    "make_gymnasium_vector",
    "set_gym_backend",
    "to_gymnasium",
    "to_gymnasium_vector",
]
