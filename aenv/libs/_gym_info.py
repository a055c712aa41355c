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

import numpy as np
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from aenv._mdp_tree import non_tensor
from aenv.envs._gymlike import BaseInfoDictReader
from aenv.specs import Composite, NonTensor

__all__ = ["InfoAsEntry", "info_dicts", "split_infos"]


class InfoAsEntry(BaseInfoDictReader):
    """Keeps gymnasium's whole ``info`` dict as the non-tensor entry ``key``.

    Args:
        key: the entry's name (``"info"``).
        batch_size: the env's batch size (``(num_envs,)`` for a gymnasium vector env, whose
            aggregated info dict is split into each sub-env's own).

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
        batch = tensordict.batch_size
        if len(batch) == 1:
            # a vector env's aggregated dict: kept as each sub-env's own
            parts = split_infos(info_dict, batch[0])
            value: Any = NonTensorStack(*(non_tensor(d) for d in parts))
        else:
            value = non_tensor(dict(info_dict), batch)
        tensordict.set(self.key, value)
        return tensordict


def split_infos(info: Mapping[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Each sub-env's own info dict out of a vector env's aggregated one: entry ``k`` goes to
    the sub-envs its mask ``"_k"`` flags (all of them without a mask), nested dicts alike."""
    out: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in info.items():
        if key.startswith("_") and key[1:] in info:
            continue
        mask = info.get(f"_{key}")
        flags = np.ones(num_envs, dtype=np.bool_) if mask is None else np.asarray(mask)
        parts = split_infos(value, num_envs) if isinstance(value, Mapping) else None
        for i in np.flatnonzero(flags):
            out[int(i)][key] = parts[int(i)] if parts is not None else _item(value[int(i)])
    return out


def _item(value: Any) -> Any:
    # gymnasium aggregates python bools into a bool array, numpy ones into an object array
    return bool(value) if isinstance(value, np.bool_) else value


def info_dicts(value: Any, num_envs: int) -> list[dict[str, Any]]:
    """The info dict of each sub-env in a batched entry :class:`InfoAsEntry` wrote."""
    if isinstance(value, NonTensorStack):
        return [dict(v) if isinstance(v, Mapping) else {} for v in value.tolist()]
    if isinstance(value, NonTensorData):
        # equal dicts stack as one value
        data = value.data
        return [dict(data) if isinstance(data, Mapping) else {} for _ in range(num_envs)]
    return [{} for _ in range(num_envs)]
