"""Mock envs for aenv's tests and for users' own tests."""

from aenv.testing._counting import CountingEnv, NestedCountingEnv
from aenv.testing._marl import MultiAgentCountingEnv
from aenv.testing._mocks import (
    CpuBoundEnv,
    DynamicSpecEnv,
    FailingEnv,
    HangingEnv,
    LatencyEnv,
    SyncLatencyEnv,
    TextEnv,
    latency_ideal_steps,
)
from aenv.testing._processes import assert_no_leaked_processes, sandbox_processes
from aenv.testing._text import GuessTextEnv

__all__ = [
    "CpuBoundEnv",
    "CountingEnv",
    "DynamicSpecEnv",
    "FailingEnv",
    "GuessTextEnv",
    "HangingEnv",
    "LatencyEnv",
    "MultiAgentCountingEnv",
    "NestedCountingEnv",
    "SyncLatencyEnv",
    "TextEnv",
    "assert_no_leaked_processes",
    "latency_ideal_steps",
    "sandbox_processes",
]
