"""Collectors: batches of frames from envs and a policy.

:class:`Collector` is the async implementation (lockstep on an env, streaming on a pool);
:class:`SyncDataCollector` is the seeds' sync facade over it; :func:`split_trajectories`
regroups frames into padded trajectories.
"""

from aenv.collectors._collector import Collector
from aenv.collectors._sync import SyncDataCollector
from aenv.collectors._utils import Interruptor, split_trajectories

__all__ = ["Collector", "Interruptor", "SyncDataCollector", "split_trajectories"]
