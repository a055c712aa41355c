"""Shared by the Ray backend tests: one local Ray cluster per test session, and envs.

The cluster is started by the first test that asks for it (``ray.init(num_cpus=2)``, in
this process) and shut down when the session's process exits: starting one costs seconds,
so every Ray test of a session shares it. Tests that need Ray skip, saying so, where it is
not installed.
"""

from __future__ import annotations

import atexit
import time
from typing import Any

import pytest
from tensordict import TensorDictBase

from aenv.testing import CountingEnv

SKIP_REASON = "the ray backend's tests need Ray: pip install 'aenv[ray]'"

#: what each pool of the Ray tests reserves per actor: small, so the 2-CPU cluster hosts
#: the actors of a test's pools (and of one still closing) at once
NUM_CPUS = 0.25


def ray_cluster() -> Any:
    """The ``ray`` module, connected to this session's local cluster (started on first use)."""
    ray = pytest.importorskip("ray", reason=SKIP_REASON)
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        atexit.register(ray.shutdown)
    return ray


def actor_states(ray: Any, actor_ids: list[str]) -> list[str]:
    """Ray's recorded state (``ALIVE``, ``DEAD``...) of each actor, through its state API."""
    table = ray._private.state.actors()
    return [table[actor_id]["State"] for actor_id in actor_ids]


def pool_actor_ids(pool: Any) -> list[str]:
    """The ids of the actors a Ray pool holds now."""
    return [g.actor._actor_id.hex() for g in pool._backend._groups]


class LoopBlockingEnv(CountingEnv):
    """A counting env whose step ``block_at`` (counted since it was built) blocks the thread
    it runs in for ``seconds``, without declaring itself ``blocking``: in a Ray actor it
    holds the actor's whole event loop, as a stuck C call in a sync env would."""

    def __init__(self, block_at: int = 0, seconds: float = 600.0, **kwargs: Any) -> None:
        kwargs.setdefault("max_steps", 1_000_000)
        super().__init__(**kwargs)
        self.block_at = block_at
        self.seconds = seconds
        self.total_steps = 0

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.total_steps == self.block_at:
            time.sleep(self.seconds)
        self.total_steps += 1
        return super()._step(tensordict)
