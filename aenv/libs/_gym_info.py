"""Gymnasium ``info`` dicts carried through aenv whole, as one non-tensor entry.

:class:`InfoAsEntry` is an info reader (see :class:`~aenv.envs.GymLikeEnv`) that keeps each
``info`` dict a gymnasium env returns, unchanged, under one key of the step's and the reset's
TensorDict. The gymnasium bridges (:func:`~aenv.libs.gym.to_gymnasium`,
:func:`~aenv.libs.gym.to_gymnasium_vector`) give those dicts back as gymnasium's ``info``:
as they are for a single env, aggregated as gymnasium's vector envs do for a batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from aenv.envs._gymlike import BaseInfoDictReader
from aenv.specs import Composite, NonTensor

__all__ = ["InfoAsEntry", "info_dicts"]


class InfoAsEntry(BaseInfoDictReader):
    """Keeps gymnasium's whole ``info`` dict as the non-tensor entry ``key``.

    Args:
        key: the entry's name (``"info"``).
        batch_size: the env's batch size (``(num_envs,)`` for a gymnasium vector env, whose
            info dict, already aggregated, is kept as one value for the batch).

    Example:
        >>> env = GymWrapper(gymnasium.make("CartPole-v1"))
        >>> env = env.set_info_dict_reader(InfoAsEntry())
        >>> td = await env.reset(seed=0)
        >>> td["info"]
        {}
    """

    def __init__(self, key: str = "info", batch_size: tuple[int, ...] = ()) -> None:
        self.key = key
        # known up front: nothing to learn from sample infos (no probing reset and step)
        self._spec = Composite(
            {key: NonTensor(shape=batch_size, example_data={})}, shape=batch_size
        )

    @property
    def info_spec(self) -> Composite:
        return self._spec

    def __call__(self, info_dict: Mapping[str, Any], tensordict: TensorDictBase) -> TensorDictBase:
        tensordict.set(
            self.key, NonTensorData(data=dict(info_dict), batch_size=tensordict.batch_size)
        )
        return tensordict


def info_dicts(value: Any, num_envs: int) -> list[dict[str, Any]] | dict[str, Any]:
    """The info dicts of a batched entry written by :class:`InfoAsEntry`: one per env (a
    stack of single envs' dicts), or one dict already aggregated (a vector env's, kept as
    one value for the whole batch)."""
    if isinstance(value, NonTensorStack):
        items = value.tolist()
        return [dict(v) if isinstance(v, Mapping) else {} for v in items]
    if isinstance(value, NonTensorData):
        data = value.data
        return dict(data) if isinstance(data, Mapping) else {}
    return [{} for _ in range(num_envs)]
