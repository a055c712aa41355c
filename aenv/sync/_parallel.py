"""ParallelEnv: the seeds' sync API over a process pool (or a Ray one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aenv.envs._common import EnvBase
from aenv.sync._facades import SyncEnv, env_factories
from aenv.sync._runner import Runner

__all__ = ["ParallelEnv"]


class ParallelEnv(SyncEnv):
    """``num_workers`` envs in worker processes, as one sync env (the seeds' ``ParallelEnv``).

    A sync facade over a process :class:`~aenv.pool.AsyncEnvPool`: batch size
    ``(num_workers, *sub_batch)``, partial resets through ``"_reset"``, attribute reads
    fanned out to the sub-envs (``a, b, c, d = env.g``), method calls run in the workers
    (``env.m(x)``: one result per sub-env), ``rollout``, context manager,
    ``close()``. As in the seeds, ``num_workers`` counts sub-envs; how many processes host
    them is ``num_processes`` (default: one per CPU core, at most one per env) or
    ``envs_per_worker``. Workers are forked from a server process that imported torch,
    tensordict and aenv once (``forkserver``): the first pool of a process waits for that
    import, later ones start in a fraction of a second. As with ``spawn``, build the env
    under ``if __name__ == "__main__":`` in scripts.

    ``backend="ray"`` hosts the sub-envs in Ray actors instead (see the README's Ray
    section): ``num_processes`` / ``envs_per_worker`` then count actors / envs per actor,
    and ``backend_options`` takes the Ray backend's options (``address``, ``num_cpus``...).

    Args:
        num_workers: number of sub-envs.
        create_env_fn: an env factory (an :class:`~aenv.EnvCreator`, a class, a lambda...),
            or one per sub-env.
        create_env_kwargs: keyword arguments for the factories (one dict or one per env).
        num_processes: worker processes (default ``min(num_workers, cpu_count)``).
        envs_per_worker: sub-envs per worker process, instead of ``num_processes``.
        start_method: ``"forkserver"`` (default), ``"spawn"`` or ``"fork"`` (process backend).
        **pool_kwargs: passed to :class:`~aenv.pool.AsyncEnvPool` (``stack``,
            ``on_error``, ``step_timeout``, ``backend_options``, ...).

    Example:
        >>> from aenv.sync import ParallelEnv
        >>> from aenv.testing import CountingEnv
        >>> with ParallelEnv(4, CountingEnv, {"max_steps": 3}, num_processes=2) as env:
        ...     td = env.rollout(2)
        ...     a, b, c, d = env.max_steps
        >>> td.batch_size
        torch.Size([4, 2])
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: Callable[..., EnvBase] | Sequence[Callable[..., EnvBase]],
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        num_processes: int | None = None,
        envs_per_worker: int | None = None,
        start_method: str | None = None,
        runner: Runner | None = None,
        **pool_kwargs: Any,
    ) -> None:
        from aenv.pool import AsyncEnvPool, ProcessorAsyncEnvPool

        fns = env_factories(num_workers, create_env_fn)
        backend = pool_kwargs.pop("backend", "process")
        if backend == "ray":
            if start_method is not None:
                raise ValueError("start_method is for the process backend, not 'ray'")
            options = dict(pool_kwargs.pop("backend_options", None) or {})
            for name, value in (("num_actors", num_processes), ("envs_per_actor", envs_per_worker)):
                if value is not None:
                    options[name] = value
            ray_pool = AsyncEnvPool(
                fns,
                backend="ray",
                create_env_kwargs=create_env_kwargs,
                backend_options=options,
                **pool_kwargs,
            )
            super().__init__(ray_pool, runner=runner)
            return
        if backend not in ("process", "multiprocessing"):
            raise ValueError(f"ParallelEnv runs on the process backend (or 'ray'), not {backend!r}")
        pool = ProcessorAsyncEnvPool(
            fns,
            create_env_kwargs=create_env_kwargs,
            num_workers=num_processes,
            envs_per_worker=envs_per_worker,
            start_method=start_method,
            **pool_kwargs,
        )
        super().__init__(pool, runner=runner)

    @property
    def num_workers(self) -> int:
        """Number of sub-envs (the seeds' meaning)."""
        return self.env.num_envs  # type: ignore[attr-defined,no-any-return]

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (of the actors, on the ray backend)."""
        pool = self.env
        if pool.backend == "ray":  # type: ignore[attr-defined]
            return pool._backend.actor_pids  # type: ignore[attr-defined,no-any-return]
        return pool.worker_pids  # type: ignore[attr-defined,no-any-return]

    def start(self) -> ParallelEnv:
        """Kept for the seeds' API: workers start when the env is built."""
        return self
