"""TorchRL's sync collectors: ``Collector`` (TorchRL 0.14's name) and ``SyncDataCollector``,
over envs of this namespace, aenv envs or sync facades."""

from __future__ import annotations

from typing import Any

from aenv.collectors import SyncDataCollector as _SyncDataCollector
from aenv.torchrl._envs import SyncVerbs, async_env, async_factory

__all__ = ["Collector", "SyncDataCollector"]


class SyncDataCollector(_SyncDataCollector):
    """TorchRL's ``SyncDataCollector``, iterated from sync code; the env may be one of this
    namespace (an instance, a factory, or a list of factories), as in TorchRL.

    Arguments as :class:`aenv.collectors.SyncDataCollector` (TorchRL's, plus aenv's
    ``streaming`` options); the policy runs with autograd off, as in TorchRL.

    Example:
        >>> from aenv.torchrl import GymEnv, SyncDataCollector
        >>> collector = SyncDataCollector(GymEnv("CartPole-v1"), None, frames_per_batch=10,
        ...                               total_frames=20)
        >>> [batch.batch_size for batch in collector]
        [torch.Size([10]), torch.Size([10])]
    """

    def __init__(self, create_env_fn: Any, policy: Any = None, **kwargs: Any) -> None:
        if isinstance(create_env_fn, SyncVerbs):
            create_env_fn = async_env(create_env_fn)
        elif isinstance(create_env_fn, (list, tuple)):
            create_env_fn = [async_factory(fn) for fn in create_env_fn]
        elif callable(create_env_fn) and not hasattr(create_env_fn, "_step"):
            create_env_fn = async_factory(create_env_fn)
        super().__init__(create_env_fn, policy, **kwargs)


#: TorchRL 0.14's name for its single-process sync collector
Collector = SyncDataCollector
