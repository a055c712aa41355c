"""The per-env half of the pool: await one env's step or reset, from any number of tasks.

Built for one coroutine per episode: each task owns an env index and awaits
``pool.step_one(i, td)`` as it would ``env.step(td)``. Each call has its own future (the
outcome is handed to it, never to a shared ready queue), so concurrent callers never see
each other's results; cancelling a caller stops its env's work and frees the env at once.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import set_next
from aenv.exceptions import BatchSizeError
from aenv.pool._backend import Failure
from aenv.pool._dispatch import _Dispatcher
from aenv.pool._stream import _as_index
from aenv.pool._sub_checks import check_sub_inputs

__all__ = ["PerEnvMixin"]


class PerEnvMixin(_Dispatcher):
    """``step_one`` / ``reset_one`` / ``step_and_maybe_reset_one`` of
    :class:`~aenv.pool.AsyncEnvPool`."""

    _sub_batch: torch.Size
    _metas: Any  # the pool's, one EnvMetaData per env
    _check_open: Any  # EnvBase's
    _next_input: Any  # StreamMixin's

    def _one_input(self, env_index: int, td: TensorDictBase | None, op: str = "reset") -> None:
        self._check_open()
        env_index = _as_index(env_index)
        if not 0 <= env_index < self.num_envs:
            raise IndexError(f"env index {env_index} out of range for a pool of {self.num_envs}")
        if td is not None and td.batch_size != self._sub_batch:
            raise BatchSizeError(
                f"env {env_index}'s input must have the sub-env batch size "
                f"{tuple(self._sub_batch)}, got {tuple(td.batch_size)}"
            )
        check_sub_inputs(self, op, (env_index,), (td,))

    @staticmethod
    def _outcome(outcome: Any) -> Any:
        if isinstance(outcome, Failure):
            raise outcome.exc
        return outcome

    async def step_one(self, env_index: int, tensordict: TensorDictBase) -> TensorDictBase:
        """Step env ``env_index`` alone: ``tensordict`` (one env's input, the sub-env batch
        size) comes back with its ``"next"`` filled in, as :meth:`EnvBase.step` returns it.

        Any number of tasks may await their own envs at once. A failure raises the env's
        :class:`~aenv.exceptions.EnvStepError` or
        :class:`~aenv.exceptions.StepTimeoutError` (with ``on_error="restart"`` or
        ``"observe"``, a failed step comes back truncated instead). Cancelling the caller
        stops the step and frees the env (see :meth:`cancel`).

        Example:
            >>> td = await pool.reset_one(3)
            >>> td = await pool.step_one(3, pool.rand_action_one(3, td))
            >>> td["next", "observation"]
        """
        self._one_input(env_index, tensordict, "step")
        nxt = self._outcome(await self._run_one("step", env_index, tensordict))
        set_next(tensordict, nxt)
        return tensordict

    async def reset_one(
        self, env_index: int, tensordict: TensorDictBase | None = None, **kwargs: Any
    ) -> TensorDictBase:
        """Reset env ``env_index`` alone (``tensordict``, e.g. a prompt, is passed to its
        reset); returns the reset tensordict. See :meth:`step_one`."""
        self._one_input(env_index, tensordict)
        out = await self._run_one("reset", env_index, (tensordict, kwargs))
        return self._outcome(out)  # type: ignore[no-any-return]

    async def step_and_maybe_reset_one(
        self, env_index: int, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step env ``env_index`` and reset it if done: ``(stepped, next_input)`` as
        :meth:`EnvBase.step_and_maybe_reset` returns them. See :meth:`step_one`."""
        op = "step_and_maybe_reset"
        self._one_input(env_index, tensordict, op)
        nxt, reset = self._outcome(await self._run_one(op, env_index, tensordict))
        set_next(tensordict, nxt)
        return tensordict, self._next_input(tensordict, reset)

    def rand_action_one(
        self, env_index: int, tensordict: TensorDictBase | None = None
    ) -> TensorDictBase:
        """A random action for env ``env_index`` (drawn from its own action spec), written
        into ``tensordict`` (one env's input) or a new one."""
        spec = self._metas[env_index].specs["input_spec"]["full_action_spec"]
        action = spec.rand()
        if tensordict is None:
            return action  # type: ignore[no-any-return]
        return tensordict.update(action)
