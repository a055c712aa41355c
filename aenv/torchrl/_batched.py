"""TorchRL's batched envs: ``SerialEnv`` and ``ParallelEnv`` with TorchRL's arguments
(``mp_start_method``, ``serial_for_single``), restart after ``close()``, and indexing
(``penv[1:]``: a batched env over some of the sub-envs, sharing their workers)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase as _AsyncEnvBase
from aenv.exceptions import EnvClosedError
from aenv.sync import ParallelEnv as _ParallelEnv
from aenv.sync import SerialEnv as _SerialEnv
from aenv.sync._facades import SyncEnv, env_factories
from aenv.torchrl._envs import async_factory

__all__ = ["ParallelEnv", "SerialEnv", "SubsetEnv"]


class _Restartable:
    """TorchRL's batched-env lifecycle on a sync facade: a closed env starts again (new
    sub-envs from the same factories) when used, or on :meth:`start`."""

    _build_args: tuple[tuple[Any, ...], dict[str, Any]]
    env: Any

    def start(self) -> Any:
        """Start the sub-envs again if the env was closed; returns the env."""
        if self.env.is_closed:  # type: ignore[attr-defined]
            args, kwargs = self._build_args
            fresh = type(self)(*args, **kwargs)
            self.__dict__["env"] = fresh.env
        return self

    @property
    def is_closed(self) -> bool:
        return self.env.is_closed  # type: ignore[attr-defined,no-any-return]

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.env.is_closed and getattr(fn, "__self__", None) is self.env:  # type: ignore[attr-defined]
            self.start()
            fn = getattr(self.env, fn.__name__)  # type: ignore[attr-defined]
        return super()._run(fn, *args, **kwargs)  # type: ignore[misc]

    def __getitem__(self, index: Any) -> SyncEnv:
        """The sub-envs at ``index`` (int, slice, list, array or tensor) as one batched env,
        sharing this env's sub-envs (closing it leaves them running)."""
        self.start()
        pool = self.env  # type: ignore[attr-defined]
        indices = torch.arange(pool.num_envs)[_as_index(index)].reshape(-1).tolist()
        return SyncEnv(SubsetEnv(pool, indices), runner=self.__dict__["_runner"])


def _as_index(index: Any) -> Any:
    if isinstance(index, np.ndarray):
        return torch.as_tensor(index)
    if isinstance(index, int):
        return [index]
    return index


class SerialEnv(_Restartable, _SerialEnv):
    """TorchRL's ``SerialEnv``: sub-envs in this process, sync; factories may build envs of
    this namespace (``aenv.torchrl.EnvBase`` subclasses, ``GymEnv``...) or aenv envs.

    Example:
        >>> from aenv.torchrl import GymEnv, SerialEnv
        >>> env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
        >>> env[1:].rollout(3).batch_size
        torch.Size([1, 3])
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: Callable[..., Any] | Sequence[Callable[..., Any]],
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self.__dict__["_build_args"] = ((num_workers, create_env_fn, create_env_kwargs), kwargs)
        fns = [async_factory(fn) for fn in env_factories(num_workers, create_env_fn)]
        super().__init__(num_workers, fns, create_env_kwargs, **_torchrl_kwargs(kwargs))


class ParallelEnv(_Restartable, _ParallelEnv):
    """TorchRL's ``ParallelEnv``: sub-envs in worker processes, sync.

    ``mp_start_method`` picks how workers start; without it a start method set for the
    whole program (``multiprocessing.set_start_method("fork")``, as TorchRL's tutorials do)
    is honoured, and otherwise aenv's ``forkserver`` is used (TorchRL's default is
    ``spawn``; both need the ``__main__`` guard in scripts, ``fork`` does not).
    ``serial_for_single=True`` with one worker gives a :class:`SerialEnv`.

    Example:
        >>> from aenv.torchrl import GymEnv, ParallelEnv
        >>> if __name__ == "__main__":
        ...     env = ParallelEnv(2, lambda: GymEnv("CartPole-v1"), mp_start_method="fork")
        ...     env.rollout(3).batch_size
        torch.Size([2, 3])
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        num_workers = args[0] if args else kwargs.get("num_workers")
        if kwargs.get("serial_for_single") and num_workers == 1:
            kwargs.pop("mp_start_method", None)
            kwargs.pop("serial_for_single")
            return SerialEnv(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        num_workers: int,
        create_env_fn: Callable[..., Any] | Sequence[Callable[..., Any]],
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        mp_start_method: str | None = None,
        serial_for_single: bool = False,
        **kwargs: Any,
    ) -> None:
        self.__dict__["_build_args"] = (
            (num_workers, create_env_fn, create_env_kwargs),
            {"mp_start_method": mp_start_method, **kwargs},
        )
        start = (
            mp_start_method
            or kwargs.pop("start_method", None)
            or multiprocessing.get_start_method(allow_none=True)
        )
        fns = [async_factory(fn) for fn in env_factories(num_workers, create_env_fn)]
        super().__init__(
            num_workers, fns, create_env_kwargs, start_method=start, **_torchrl_kwargs(kwargs)
        )

    @property
    def mp_start_method(self) -> str:
        """How the worker processes were started (``"fork"``, ``"forkserver"``, ``"spawn"``)."""
        return self.env._backend.start_method  # type: ignore[no-any-return]


def _torchrl_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """TorchRL's batched-env keyword arguments that have no aenv meaning, dropped; the rest
    pass to the pool."""
    out = dict(kwargs)
    for name in ("shared_memory", "use_buffers", "non_blocking", "daemon", "consolidate"):
        out.pop(name, None)
    return out


class SubsetEnv(_AsyncEnvBase):
    """Some sub-envs of a pool as one batched env (what ``penv[1:]`` returns, async).

    Steps and resets go to the pool as partial steps and resets of these envs only
    (``"_step"`` / ``"_reset"`` masks): one call for all of them, on the pool's own
    sub-envs. Closing the subset leaves the pool and its envs running.

    Args:
        pool: an :class:`~aenv.pool.AsyncEnvPool`.
        indices: the sub-envs, in the order of the subset's batch dim.

    Example:
        >>> from aenv.pool import AsyncEnvPool
        >>> from aenv.testing import CountingEnv
        >>> pool = AsyncEnvPool([CountingEnv] * 3)
        >>> (await SubsetEnv(pool, [0, 2]).rollout(2)).batch_size
        torch.Size([2, 2])
    """

    def __init__(self, pool: Any, indices: Sequence[int]) -> None:
        if not indices:
            raise ValueError("a subset of a batched env needs at least one sub-env")
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        super().__init__(device=pool.device, batch_size=(len(idx), *pool.batch_size[1:]))
        self.__dict__["pool"] = pool
        self._idx = idx
        self.output_spec = pool.output_spec[idx].clone()
        self.input_spec = pool.input_spec[idx].clone()

    @property
    def pool(self) -> Any:
        return self.__dict__["pool"]

    def _check_open(self) -> None:
        super()._check_open()
        if self.pool.is_closed:
            raise EnvClosedError("the batched env this subset belongs to is closed")

    def _mask(self, sub_mask: torch.Tensor | None) -> torch.Tensor:
        pool = self.pool
        mask = torch.zeros(pool.batch_size[:1], dtype=torch.bool)
        mask[self._idx] = True if sub_mask is None else sub_mask.reshape(len(self._idx), -1).any(-1)
        return mask.reshape(*pool.batch_size[:1], *([1] * (len(pool.batch_size) - 1)), 1)

    async def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        pool = self.pool
        sub_mask = None if tensordict is None else tensordict.get("_reset", None)
        full = pool.full_state_spec.zero() if not pool.full_state_spec.is_empty() else None
        if full is None:
            full = TensorDict(batch_size=pool.batch_size)
        _fill(full, tensordict, self._idx)
        full.set("_reset", self._mask(sub_mask))
        out = await pool.reset(full)
        return out[self._idx].exclude("_reset")

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        pool = self.pool
        full = pool.full_action_spec.zero()
        if not pool.full_state_spec.is_empty():
            full.update(pool.full_state_spec.zero())
        _fill(full, tensordict, self._idx)
        full.set("_step", self._mask(tensordict.get("_step", None)).reshape(pool.batch_size[:1]))
        out = await pool.step(full)
        return out.get("next")[self._idx]

    def _set_seed(self, seed: int | None) -> None:
        raise NotImplementedError(
            "seed the batched env a subset was taken from (its set_seed seeds every sub-env)"
        )

    async def _aclose(self) -> None:
        return None  # the sub-envs belong to the batched env


def _fill(full: TensorDictBase, sub: TensorDictBase | None, idx: torch.Tensor) -> None:
    """Write ``sub``'s entries that ``full`` has into rows ``idx`` of ``full``."""
    if sub is None:
        return
    keys = [k for k in full.keys(True, True) if k in sub.keys(True, True)]
    if keys:
        full[idx] = full[idx].update(sub.select(*keys))
