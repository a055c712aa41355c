"""Shared by the process-backend tests: an env whose action picks a fault, a batch of such
actions, and a channel stand-in that records what a worker runtime sends."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import anyio
import cloudpickle
import torch
from tensordict import TensorDict, TensorDictBase

from aenv import EnvBase
from aenv.specs import Categorical, Composite, Unbounded

# the env classes travel to spawned workers by value (this module is not importable there)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NORMAL, EXIT, HANG_ASYNC, HANG_BLOCKING, RAISE_ODD = range(5)


class OddError(Exception):
    """An exception that cannot be rebuilt from its args (unpicklable as is)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"odd {a} {b}")


class ControlledEnv(EnvBase):
    """Counts steps; the action picks a fault: exit, async hang, blocking hang, raise."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Categorical(5, shape=(1,))
        self.reward_spec = Unbounded((1,))
        self.count = 0

    def _set_seed(self, seed: int | None) -> None:
        pass

    async def _reset(self, td: TensorDictBase | None, **kw: Any) -> TensorDictBase:
        self.count = 0
        return TensorDict({"observation": torch.zeros(1)}, [])

    async def _step(self, td: TensorDictBase) -> TensorDictBase:
        action = int(td["action"])
        if action == EXIT:
            os._exit(3)
        if action == HANG_ASYNC:
            await anyio.sleep_forever()
        if action == HANG_BLOCKING:
            time.sleep(3600)
        if action == RAISE_ODD:
            raise OddError(1, 2)
        self.count += 1
        return TensorDict(
            {
                "observation": torch.full((1,), float(self.count)),
                "reward": torch.ones(1),
                "done": torch.zeros(1, dtype=torch.bool),
            },
            [],
        )


def actions(*values: int) -> TensorDict:
    """A batch of one action per env."""
    return TensorDict({"action": torch.tensor(values).reshape(-1, 1)}, [len(values)])


class Recorder:
    """A worker runtime's channel that records the messages it sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.arrived = asyncio.Event()

    def send(self, frame: list[tuple[Any, ...]]) -> None:
        self.sent.extend(frame)
        self.arrived.set()
