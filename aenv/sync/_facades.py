"""Sync facades: any async env (or a pool of them) driven from plain synchronous code.

Each method is one hop through the loop runner (:func:`aenv.sync.get_runner`): a batched
call over a pool is one hop, never one per sub-env.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from aenv.envs._common import EnvBase
from aenv.exceptions import PoolError
from aenv.sync._runner import Runner, get_runner

__all__ = ["SerialEnv", "SyncEnv", "rollout"]


class SyncEnv:
    """Wraps an async env so that sync code can use it: every method is one runner call.

    Specs, keys, ``batch_size`` and other attributes pass through to the env; its async
    methods come back as sync ones (``env.call(...)`` on a pool, for instance).

    Args:
        env: any aenv env (an :class:`~aenv.EnvBase`, a pool, a transformed env).
        runner: the runner to use (default: the process-wide one).

    Example:
        >>> from aenv.sync import SyncEnv
        >>> from aenv.testing import CountingEnv
        >>> with SyncEnv(CountingEnv(max_steps=3)) as env:
        ...     td = env.rollout(10)
        >>> td["next", "observation"].squeeze(-1)
        tensor([1., 2., 3.])
    """

    #: read by TransformedEnv (a lower layer) to transform the facade's env
    _aenv_sync_facade = True

    def __init__(self, env: EnvBase, *, runner: Runner | None = None) -> None:
        if isinstance(env, SyncEnv):
            env = env.env
        if not isinstance(env, EnvBase):
            raise TypeError(f"SyncEnv wraps an aenv EnvBase, got {type(env).__name__}")
        self.__dict__["env"] = env
        self.__dict__["_runner"] = runner

    @property
    def env(self) -> EnvBase:
        """The wrapped async env."""
        return self.__dict__["env"]  # type: ignore[no-any-return]

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        runner = self.__dict__["_runner"] or get_runner()
        return runner.run(fn, *args, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"

    def _rewrap(self, env: EnvBase) -> SyncEnv:
        """A plain facade over ``env`` on this facade's runner."""
        return SyncEnv(env, runner=self.__dict__["_runner"])

    def append_transform(self, transform: Any) -> SyncEnv:
        """A sync facade over the env with ``transform`` appended (outermost).

        On a facade of a :class:`~aenv.TransformedEnv` the transform joins its chain and this
        facade is returned; otherwise a new facade over ``TransformedEnv(self.env, transform)``.
        """
        from aenv.transforms import TransformedEnv

        env = self.env
        if isinstance(env, TransformedEnv):
            env.append_transform(transform)
            return self
        return self._rewrap(TransformedEnv(env, transform))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        pool = _pool_under(self.env)
        if pool is not None and not name.startswith("_") and not _own(self.env, name):
            # a sub-env attribute or method: one hop for all sub-envs, calls where they live
            return self._fan_out(pool, name)
        value = getattr(self.env, name)
        if inspect.iscoroutinefunction(value):

            @functools.wraps(value)
            def sync_method(*args: Any, **kwargs: Any) -> Any:
                return self._run(value, *args, **kwargs)

            return sync_method
        return value

    def _fan_out(self, pool: Any, name: str) -> Any:
        """``env.name`` on a batched env: a method of the sub-envs comes back as a callable
        that calls it in every sub-env (where each lives) and returns one result per env;
        an attribute is read from every sub-env. Either is one runner hop for all envs."""
        if pool.sub_env_has_method(name):

            def fanned_out(*args: Any, **kwargs: Any) -> list[Any]:
                return self._run(pool.call, name, *args, **kwargs)  # type: ignore[no-any-return]

            fanned_out.__name__ = fanned_out.__qualname__ = name
            return fanned_out
        try:
            return self._run(pool.get_attr, name)
        except PoolError as exc:
            if all(_is_attribute_error(e) for e in exc.errors.values()):
                raise AttributeError(
                    f"{type(self).__name__!r} object has no attribute {name!r}, and "
                    f"sub-env(s) {sorted(exc.errors)} have none either"
                ) from exc
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.env, name, value)

    # ------------------------------------------------------------------ env API
    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """Reset (or partially reset, through ``"_reset"`` entries); see :meth:`EnvBase.reset`."""
        return self._run(self.env.reset, tensordict, **kwargs)  # type: ignore[no-any-return]

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step; writes ``"next"`` into ``tensordict`` and returns it."""
        return self._run(self.env.step, tensordict)  # type: ignore[no-any-return]

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset what is done: ``(stepped, next_input)``."""
        return self._run(self.env.step_and_maybe_reset, tensordict)  # type: ignore[no-any-return]

    def rand_step(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Step with a random action."""
        return self._run(self.env.rand_step, tensordict)  # type: ignore[no-any-return]

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Random actions drawn from the action spec (no hop: nothing to await). Defined
        here rather than found by ``__getattr__``: a training loop calls it every step."""
        return self.env.rand_action(tensordict)

    def rollout(
        self,
        max_steps: int,
        policy: Callable[..., Any] | None = None,
        callback: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> TensorDictBase:
        """Run a whole rollout in one runner call; arguments as :meth:`EnvBase.rollout`."""
        return self._run(self.env.rollout, max_steps, policy, callback, **kwargs)  # type: ignore[no-any-return]

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed the env; returns the next seed."""
        return self._run(self.env.set_seed, seed, static_seed)  # type: ignore[no-any-return]

    def check_env_specs(self, **kwargs: Any) -> None:
        """:func:`aenv.acheck_env_specs` on the wrapped env, in one runner call."""
        from aenv.envs._utils import acheck_env_specs

        self._run(acheck_env_specs, self.env, **kwargs)

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Close the env (idempotent: ``raise_if_closed``, TorchRL's, changes nothing)."""
        if not self.env.is_closed:
            self._run(self.env.aclose)

    def __enter__(self) -> SyncEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SerialEnv(SyncEnv):
    """``num_workers`` envs in this process, as one sync env (the seeds' ``SerialEnv``).

    A sync facade over a coroutine :class:`~aenv.pool.AsyncEnvPool`: batch size
    ``(num_workers, *sub_batch)``, partial resets through ``"_reset"``, attribute reads
    fanned out to the sub-envs (``a, b, c, d = env.g``) and method calls too (``env.m(x)``
    calls ``m`` in every sub-env and returns one result per env), each in one hop.

    Args:
        num_workers: number of sub-envs.
        create_env_fn: an env factory, or one per worker.
        create_env_kwargs: keyword arguments for the factories (one dict or one per worker).
        **pool_kwargs: passed to :class:`~aenv.pool.AsyncEnvPool` (``stack``,
            ``on_error``, ``step_timeout``, ``backend``, ...).

    Example:
        >>> from aenv.sync import SerialEnv
        >>> from aenv.testing import CountingEnv
        >>> with SerialEnv(4, CountingEnv, {"max_steps": 3}) as env:
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
        runner: Runner | None = None,
        **pool_kwargs: Any,
    ) -> None:
        from aenv.pool import AsyncEnvPool

        fns = env_factories(num_workers, create_env_fn)
        pool_kwargs.setdefault("backend", "coroutine")
        pool = AsyncEnvPool(fns, create_env_kwargs=create_env_kwargs, **pool_kwargs)
        super().__init__(pool, runner=runner)

    @property
    def num_workers(self) -> int:
        return self.env.num_envs  # type: ignore[attr-defined,no-any-return]


def _pool_under(env: Any) -> Any:
    """The pool an env is, or wraps (through transformed envs); None if none."""
    from aenv.pool import AsyncEnvPool

    while env is not None:
        if isinstance(env, AsyncEnvPool):
            return env
        env = env.__dict__.get("base_env")
    return None


def _own(env: Any, name: str) -> bool:
    """Whether ``name`` is an attribute of ``env`` or of the envs it wraps down to the pool
    (found statically: no fan-out to sub-envs behind it)."""
    while env is not None:
        try:
            inspect.getattr_static(env, name)
        except AttributeError:
            env = env.__dict__.get("base_env")
        else:
            return True
    return False


def _is_attribute_error(exc: BaseException) -> bool:
    """True for an AttributeError, also when a backend wrapped it (its cause)."""
    while exc is not None:
        if isinstance(exc, AttributeError):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


def env_factories(
    num_workers: int,
    create_env_fn: Callable[..., EnvBase] | Sequence[Callable[..., EnvBase]],
) -> list[Callable[..., EnvBase]]:
    """One factory per sub-env: ``create_env_fn`` repeated, or the given list (checked)."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if callable(create_env_fn):
        return [create_env_fn] * num_workers
    fns = list(create_env_fn)
    if len(fns) != num_workers:
        raise ValueError(f"{len(fns)} env factories for {num_workers} workers")
    return fns


def rollout(
    env: EnvBase | SyncEnv,
    max_steps: int,
    policy: Callable[..., Any] | None = None,
    callback: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> TensorDictBase:
    """Run a rollout of any env from sync code (one runner call); see :meth:`EnvBase.rollout`.

    Example:
        >>> from aenv.sync import rollout
        >>> from aenv.testing import CountingEnv
        >>> rollout(CountingEnv(max_steps=2), 5).batch_size
        torch.Size([2])
    """
    if isinstance(env, SyncEnv):
        return env.rollout(max_steps, policy, callback, **kwargs)
    if not isinstance(env, EnvBase):
        raise TypeError(f"rollout needs an aenv env or a SyncEnv, got {type(env).__name__}")
    return get_runner().run(env.rollout, max_steps, policy, callback, **kwargs)
