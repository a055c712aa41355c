""":class:`ProcessorAsyncEnvPool`: the pool on the process backend (the seeds' name).

This module holds the class only; the backend itself (:mod:`aenv.pool._process`) is
imported when a pool is built, as for every backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aenv.pool._pool import AsyncEnvPool, EnvFns

__all__ = ["ProcessorAsyncEnvPool"]


class ProcessorAsyncEnvPool(AsyncEnvPool):
    """:class:`AsyncEnvPool` on the process backend (``backend="multiprocessing"``).

    Envs live in worker processes, several per worker; inside a worker, async envs
    interleave on the worker's own event loop. Tensors cross through shared memory
    preallocated from the specs; the parent's loop watches one socket per worker, so results
    stream in as each env finishes. A worker that dies is seen at once and respawned; its
    envs' pending operations fail with :class:`~aenv.exceptions.WorkerCrashedError`.

    Args:
        env_fns: env factories (pickled with cloudpickle, so lambdas work), or a
            ``(num_envs, factory)`` pair.
        num_workers: worker processes (default ``min(num_envs, cpu_count)``).
        envs_per_worker: envs per worker, instead of ``num_workers``.
        start_method: ``"forkserver"`` (default), ``"spawn"`` or ``"fork"``.
        **kwargs: as :class:`AsyncEnvPool` (``stack``, ``on_error``, ``step_timeout``,
            ``backend_options`` for the other backend options, ...).

    Example:
        >>> from functools import partial
        >>> from aenv.testing import LatencyEnv
        >>> pool = ProcessorAsyncEnvPool((8, partial(LatencyEnv, median=0.01)), num_workers=2)
        >>> td = await pool.reset()
        >>> td = await pool.rand_step(td)
        >>> td.batch_size
        torch.Size([8])
        >>> await pool.aclose()
    """

    _backend_name = "process"

    def __init__(
        self,
        env_fns: EnvFns,
        *,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        start_method: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        options = dict(backend_options or {})
        for name, value in (
            ("num_workers", num_workers),
            ("envs_per_worker", envs_per_worker),
            ("start_method", start_method),
        ):
            if value is not None:
                options[name] = value
        super().__init__(env_fns, backend_options=options, **kwargs)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes."""
        return self._backend.worker_pids  # type: ignore[attr-defined,no-any-return]
