"""Lockstep collection: every env of a batch steps together (the seeds' SyncDataCollector).

Each time step runs the policy on the whole batch and awaits ``step_and_maybe_reset`` on the
whole env, so a batch of ``frames_per_batch`` frames is ``[*env.batch_size, T]`` with
``T = ceil(frames_per_batch / env.batch_size.numel())`` and its last dim named ``"time"``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv._mdp import time_named, unravel
from aenv.collectors._utils import Interruptor, TrajCounter
from aenv.envs._common import EnvBase
from aenv.envs._rollout import _done_mask

__all__ = ["LockstepEngine"]

TRAJ_KEY = ("collector", "traj_ids")

Act = Callable[[TensorDictBase, bool], Awaitable[TensorDictBase]]


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


def stack_frames(frames: list[TensorDictBase], dim: int) -> TensorDictBase:
    """Stack frames densely, lazily where their shapes or keys differ."""
    try:
        return torch.stack(frames, dim)  # type: ignore[arg-type,return-value]
    except (RuntimeError, KeyError, ValueError):
        return LazyStackedTensorDict.lazy_stack(frames, dim=dim)


class LockstepEngine:
    """Steps a (possibly batched) env in lockstep and returns ``[*batch, T]`` batches."""

    def __init__(
        self,
        env: EnvBase,
        *,
        frames_per_batch: int,
        reset_when_done: bool,
        use_buffers: bool,
        set_truncated: bool,
        traj_counter: TrajCounter,
        storing_device: torch.device | None,
    ) -> None:
        self.env = env
        self.n_envs = max(env.batch_size.numel(), 1)
        self.steps_per_batch = math.ceil(frames_per_batch / self.n_envs)
        self.frames_per_batch = self.steps_per_batch * self.n_envs
        self.reset_when_done = reset_when_done
        self.use_buffers = use_buffers
        self.set_truncated = set_truncated
        self.traj_counter = traj_counter
        self.storing_device = storing_device
        self.shuttle: TensorDictBase | None = None
        self.buffer: TensorDictBase | None = None
        self._trunc_keys = truncation_keys(env)

    # ------------------------------------------------------------------ resets
    async def reset(self, index: Any = None) -> None:
        """Reset every env (``index=None``) or those at ``index`` along the batch; the reset
        envs start new trajectories."""
        env = self.env
        bs = env.batch_size
        if index is None or self.shuttle is None:
            td = await env.reset()
            td.set(TRAJ_KEY, self.traj_counter.take(max(bs.numel(), 1)).reshape(bs))
            self.shuttle = td
            return
        if not bs:
            raise ValueError("reset(index=...) needs a batched env; this env has no batch dims")
        mask = torch.zeros(bs, dtype=torch.bool)
        mask[index] = True
        td = self.shuttle
        td.set("_reset", mask.unsqueeze(-1))
        td = await env.reset(td)
        ids = td.get(TRAJ_KEY).clone()
        ids[mask] = self.traj_counter.take(int(mask.sum()))
        td.set(TRAJ_KEY, ids)
        self.shuttle = td

    async def drain(self) -> None:
        """Nothing is ever in flight between lockstep batches."""

    # ------------------------------------------------------------------ one batch
    async def collect(
        self, act: Act, random: bool, interruptor: Interruptor | None, fresh: bool
    ) -> TensorDictBase:
        """Collect one batch; ``fresh`` resets every env first (``reset_at_each_iter``)."""
        if fresh or self.shuttle is None:
            await self.reset()
        env = self.env
        frames: list[TensorDictBase] = []
        td = self.shuttle
        assert td is not None
        storing = self.storing_device
        for _ in range(self.steps_per_batch):
            if interruptor is not None and interruptor.collection_stopped():
                break
            td = await act(td, random)
            if self.reset_when_done:
                stepped, nxt = await env.step_and_maybe_reset(td)
            else:
                stepped = await env.step(td)
                nxt = env._step_mdp(stepped)
            if self.reset_when_done:
                done = _done_mask(env, stepped.get("next"))
                if bool(done.any()):
                    ids = nxt.get(TRAJ_KEY).clone()
                    ids[done] = self.traj_counter.take(int(done.sum()))
                    nxt.set(TRAJ_KEY, ids)
            frames.append(stepped.to(storing) if storing is not None else stepped)
            td = nxt
        self.shuttle = td
        if not frames:
            raise RuntimeError("the interruptor stopped collection before the first step")
        if self.set_truncated:
            mark_truncated(frames[-1].get("next"), self._trunc_keys, None)
        return time_named(self._stack(frames))

    def _stack(self, frames: list[TensorDictBase]) -> TensorDictBase:
        dim = frames[0].batch_dims
        if self.use_buffers and len(frames) == self.steps_per_batch:
            try:
                if self.buffer is None:
                    self.buffer = torch.stack(frames, dim)  # type: ignore[arg-type,assignment]
                    return self.buffer  # type: ignore[return-value]
                return torch.stack(frames, dim, out=self.buffer)  # type: ignore[arg-type,return-value]
            except (RuntimeError, KeyError, ValueError):
                # shapes or keys vary (dynamic specs): no fixed buffer from now on
                self.buffer = None
                self.use_buffers = False
        return stack_frames(frames, dim)

    def owns(self, td: TensorDictBase) -> bool:
        """Whether ``td`` is the engine's reusable buffer (overwritten by the next batch)."""
        return td is self.buffer
