"""Mock envs for aenv's tests and for users' own tests."""

from aenv.testing._counting import CountingEnv, NestedCountingEnv
from aenv.testing._mocks import (
    DynamicSpecEnv,
    FailingEnv,
    HangingEnv,
    LatencyEnv,
    SyncLatencyEnv,
    TextEnv,
)

__all__ = [
    "CountingEnv",
    "DynamicSpecEnv",
    "FailingEnv",
    "HangingEnv",
    "LatencyEnv",
    "NestedCountingEnv",
    "SyncLatencyEnv",
    "TextEnv",
]
