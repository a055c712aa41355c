"""Env pools: many envs as one async env, on coroutine, thread, process or Ray backends, with
whole-batch or streaming results as each env finishes.

Backends plug in by name through :mod:`aenv.pool._backend` (its docstring is the contract).
"""

from __future__ import annotations

from aenv.pool._backend import BACKENDS, Backend, Failure, backend_class
from aenv.pool._dispatch import ERROR_KEYS
from aenv.pool._pool import AsyncEnvPool, CoroutineAsyncEnvPool, ThreadingAsyncEnvPool
from aenv.pool._process_pool import ProcessorAsyncEnvPool

__all__ = [
    "BACKENDS",
    "ERROR_KEYS",
    "AsyncEnvPool",
    "Backend",
    "CoroutineAsyncEnvPool",
    "Failure",
    "ProcessorAsyncEnvPool",
    "ThreadingAsyncEnvPool",
    "backend_class",
]
