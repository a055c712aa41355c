"""MO-Gymnasium (multi-objective gymnasium envs: vector rewards) as aenv envs."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aenv.libs._flags import require
from aenv.libs._gym_env import GymEnv, GymWrapper
from aenv.specs import Bounded, Unbounded

__all__ = ["MOGymEnv", "MOGymWrapper"]


def _mo_gymnasium() -> Any:
    return require("mo_gymnasium", "MOGymEnv needs MO-Gymnasium: pip install 'aenv[mo-gymnasium]'")


class MOGymWrapper(GymWrapper):
    """An MO-Gymnasium env (a gymnasium env whose reward is a vector, one entry per
    objective) as an aenv env: everything as :class:`~aenv.libs.gym.GymWrapper`, except
    that ``"reward"`` has shape ``(*batch, n_objectives)`` and its spec comes from the
    env's ``reward_space`` (``Bounded`` where the bounds are finite).

    Args:
        env: the MO-Gymnasium env (``mo_gymnasium.make(...)``).
        **kwargs: see :class:`~aenv.libs.gym.GymWrapper`.

    Example:
        >>> import mo_gymnasium
        >>> env = MOGymWrapper(mo_gymnasium.make("deep-sea-treasure-v0"))
        >>> env.reward_spec.shape
        torch.Size([2])
    """

    def _build_specs(self) -> None:
        super()._build_specs()
        space = getattr(self._env.unwrapped, "reward_space", None)
        if space is None or len(space.shape) != 1:
            raise TypeError(
                f"MOGymWrapper needs an env with a 1-D reward_space (one entry per objective), "
                f"got {space!r} from {type(self._env.unwrapped).__name__}"
            )
        bs, dev = self.batch_size, self._device
        shape = (*bs, space.shape[0])
        low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
        if np.isfinite(low).all() and np.isfinite(high).all():
            spec: Any = Bounded(
                torch.as_tensor(low).expand(shape), torch.as_tensor(high).expand(shape), shape, dev
            )
        else:
            spec = Unbounded(shape, dev)
        self.reward_spec = spec
        self._reward_shape = shape

    def read_reward(self, reward: Any) -> torch.Tensor:
        """The reward vector, ``(*batch, n_objectives)`` float32."""
        return torch.from_numpy(np.array(reward, dtype=np.float32).reshape(self._reward_shape))


class MOGymEnv(GymEnv, MOGymWrapper):
    """An MO-Gymnasium env built from its id (``mo_gymnasium.make``), e.g.
    ``MOGymEnv("deep-sea-treasure-v0")``; arguments as :class:`~aenv.libs.gym.GymEnv`.

    Example:
        >>> env = MOGymEnv("mo-mountaincar-v0")
        >>> (await env.rollout(5))["next", "reward"].shape
        torch.Size([5, 3])
    """

    def __init__(self, env_name: str, **kwargs: Any) -> None:
        _mo_gymnasium()  # registers its ids with gymnasium
        super().__init__(env_name, **kwargs)
