"""Lockstep collection: every env of a batch steps together (the seeds' SyncDataCollector).

A batch is one run of the rollout loop every env shares (:func:`aenv.envs._rollout.run_rollout`:
the policy on the whole batch, then ``step_and_maybe_reset`` on the whole env, in time rows
where the env has them), going on from where the batch before left the envs, so a batch of
``frames_per_batch`` frames is ``[*env.batch_size, T]`` with ``T = ceil(frames_per_batch /
env.batch_size.numel())`` and its last dim named ``"time"``. An episode that ends at a
batch's last step is reset when the next batch starts (the rollout resets what its first
input says ended); trajectory ids are numbered from the done flags, in the order the
episodes started.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import unravel
from aenv.collectors._utils import Interruptor, TrajCounter
from aenv.envs._common import EnvBase
from aenv.envs._rollout import _done_mask, run_rollout

__all__ = ["LockstepEngine"]

TRAJ_KEY = ("collector", "traj_ids")

Act = Callable[[TensorDictBase, bool], Awaitable[TensorDictBase]]
#: the policy a lockstep batch runs: called on the step's input (None: random actions)
Policy = Callable[[TensorDictBase], Any]


def mark_truncated(next_td: TensorDictBase, keys: list[Any], where: torch.Tensor | None) -> None:
    """Set the root ``"truncated"`` and ``"done"`` flags of ``next_td`` (all, or ``where``),
    writing new tensors (the old ones may be shared with the next step's input)."""
    for key in keys:
        value = next_td.get(key, None)
        if value is None:
            continue
        if where is None:
            next_td.set(key, torch.ones_like(value))
        else:
            mask = where.reshape(*where.shape, *([1] * (value.ndim - where.ndim)))
            next_td.set(key, value | mask)


def truncation_keys(env: EnvBase) -> list[Any]:
    """The root-level ``"truncated"`` / ``"done"`` keys of an env's done spec."""
    return [k for k in env.done_keys if len(unravel(k)) == 1 and k in ("truncated", "done")]


class LockstepEngine:
    """Steps a (possibly batched) env in lockstep and returns ``[*batch, T]`` batches."""

    def __init__(
        self,
        env: EnvBase,
        *,
        frames_per_batch: int,
        reset_when_done: bool,
        set_truncated: bool,
        traj_counter: TrajCounter,
        storing_device: torch.device | None,
    ) -> None:
        self.env = env
        self.n_envs = max(env.batch_size.numel(), 1)
        self.steps_per_batch = math.ceil(frames_per_batch / self.n_envs)
        self.frames_per_batch = self.steps_per_batch * self.n_envs
        self.reset_when_done = reset_when_done
        self.set_truncated = set_truncated
        self.traj_counter = traj_counter
        self.storing_device = storing_device
        #: the next batch's first input (the last one's final ``"next"``, through step_mdp)
        self.shuttle: TensorDictBase | None = None
        #: each env's trajectory id in the next batch's first frame
        self.ids = torch.zeros(env.batch_size, dtype=torch.int64)
        self._trunc_keys = truncation_keys(env)

    # ------------------------------------------------------------------ resets
    async def reset(self, index: Any = None) -> None:
        """Reset every env (``index=None``) or those at ``index`` along the batch; the reset
        envs start new trajectories."""
        env = self.env
        bs = env.batch_size
        if index is None or self.shuttle is None:
            self.shuttle = await env.reset()
            self.ids = self.traj_counter.take(max(bs.numel(), 1)).reshape(bs)
            return
        if not bs:
            raise ValueError("reset(index=...) needs a batched env; this env has no batch dims")
        mask = torch.zeros(bs, dtype=torch.bool)
        mask[index] = True
        td = self.shuttle
        td.set("_reset", mask.unsqueeze(-1))
        self.shuttle = await env.reset(td)
        ids = self.ids.clone()
        ids[mask] = self.traj_counter.take(int(mask.sum()))
        self.ids = ids

    async def drain(self) -> None:
        """Nothing is ever in flight between lockstep batches."""

    # ------------------------------------------------------------------ one batch
    async def collect(
        self, policy: Policy | None, interruptor: Interruptor | None, fresh: bool
    ) -> TensorDictBase:
        """Collect one batch; ``fresh`` resets every env first (``reset_at_each_iter``)."""
        if fresh or self.shuttle is None:
            await self.reset()
        until = None
        if interruptor is not None:
            if interruptor.collection_stopped():
                raise RuntimeError("the interruptor stopped collection before the first step")
            until = interruptor.collection_stopped
        env = self.env
        out = await run_rollout(
            env,
            self.steps_per_batch,
            policy,
            None,
            auto_reset=False,
            auto_cast_to_device=False,
            break_when_any_done=False,
            break_when_all_done=None,
            return_contiguous=True,
            tensordict=self.shuttle,
            set_truncated=False,
            reset_done=self.reset_when_done,
            until=until,
        )
        # (a copy: the batch is the caller's to change)
        self.shuttle = env._step_mdp(out[..., -1]).clone()
        done = _done_mask(env, out.get("next"))
        out.set(TRAJ_KEY, self._traj_ids(done))
        if self.set_truncated:
            last = torch.zeros_like(done)
            last[..., -1] = True
            mark_truncated(out.get("next"), self._trunc_keys, last)
        if self.storing_device is not None:
            out = out.to(self.storing_device)
        return out

    def _traj_ids(self, done: torch.Tensor) -> torch.Tensor:
        """Each frame's trajectory id (``[*batch, T]``) from where episodes ended (``done``,
        the same shape): a new id, in time then env order, for every episode that follows
        one ending (one ending at the last step included: its id is the next batch's)."""
        steps = done.shape[-1]
        if not self.reset_when_done:
            return self.ids.unsqueeze(-1).expand(done.shape).clone()
        flat = done.reshape(-1, steps).T  # (time-major: ids go out in time order)
        fresh = torch.full((steps + 1, flat.shape[1]), -1, dtype=torch.int64)
        fresh[0] = self.ids.reshape(-1)
        count = int(flat.sum())
        if count:
            fresh[1:][flat] = self.traj_counter.take(count)
        # (a new id is above every older one: the latest start holds)
        ids = fresh.cummax(0).values
        self.ids = ids[-1].reshape(self.ids.shape).clone()
        return ids[:-1].T.reshape(done.shape)

    def owns(self, td: TensorDictBase) -> bool:
        """Whether ``td`` is a buffer the engine reuses (never: each batch is new)."""
        return False
