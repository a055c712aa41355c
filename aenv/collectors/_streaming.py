"""Streaming collection on a pool: no env waits for another.

The engine keeps every env of an :class:`~aenv.pool.AsyncEnvPool` busy: it runs the policy
on whatever envs are ready (one batched call), sends each its action at once
(``async_step_send``), and receives results as envs finish (``async_step_recv``, waiting
for at least ``min_batch`` of them, or ``max_wait`` seconds). Every received step is a frame
carrying its ``"env_index"`` and ``("collector", "traj_ids")``; a batch is the first
``frames_per_batch`` frames in arrival order, and frames beyond it open the next batch.
Envs keep running between batches.

Policy calls run concurrently, each in a task of its own: a slow call (an LLM request)
delays only the envs it acts for, while the others keep stepping and being received. With
``per_env_policy`` each env's frame gets its own call. A batch waits for the calls still
running when it is full (their steps open the next batch).

Envs whose trajectory ended are reset through ``async_reset_send`` (from their next input,
with ``"_reset"``), and their reset results are picked up as they come. Trajectories cut by
``max_frames_per_traj`` are counted here, per env, since a pool's sub-envs cannot be
wrapped after the fact: the frame reaching the limit is marked truncated and its env reset.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import torch
from anyio.abc import TaskGroup
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv._mdp import time_named
from aenv.collectors._lockstep import TRAJ_KEY, mark_truncated
from aenv.collectors._utils import Interruptor, TrajCounter
from aenv.envs._rollout import _done_mask
from aenv.pool import AsyncEnvPool

__all__ = ["StreamingEngine"]

Act = Callable[[TensorDictBase, bool], Awaitable[TensorDictBase]]
_TRUNC_KEYS = ["truncated", "done"]


def _ensure_truncated(td: TensorDictBase) -> None:
    """Give ``td`` (and its ``"next"``) a root ``"truncated"`` flag (False) where missing, so
    every frame has the same keys once some are marked truncated."""
    for sub in (td, td.get("next", None)):
        if sub is None or sub.get("truncated", None) is not None:
            continue
        done = sub.get("done", None)
        if done is not None:
            sub.set("truncated", torch.zeros_like(done))


def _cat(chunks: list[TensorDictBase], out: TensorDictBase | None = None) -> TensorDictBase:
    if len(chunks) == 1 and out is None:
        return chunks[0]
    try:
        if out is not None:
            return torch.cat(chunks, 0, out=out)  # type: ignore[arg-type,return-value]
        return torch.cat(chunks, 0)  # type: ignore[arg-type,return-value]
    except (RuntimeError, KeyError, ValueError):
        frames = [f for c in chunks for f in c.unbind(0)]
        return LazyStackedTensorDict.lazy_stack(frames, dim=0)


class StreamingEngine:
    """Collects frames from a pool as each env finishes (see the module docstring)."""

    def __init__(
        self,
        pool: AsyncEnvPool,
        *,
        frames_per_batch: int,
        reset_when_done: bool,
        use_buffers: bool,
        set_truncated: bool,
        traj_counter: TrajCounter,
        storing_device: torch.device | None,
        max_frames_per_traj: int | None,
        min_batch: int,
        max_wait: float | None,
        per_env_policy: bool = False,
    ) -> None:
        if pool.batch_size[1:]:
            raise ValueError(
                "streaming collection needs a pool of unbatched envs (sub-env batch size ()), "
                f"got sub-envs of batch size {tuple(pool.batch_size[1:])}; pass streaming=False"
            )
        self.pool = pool
        self.n_envs = pool.num_envs
        self.frames_per_batch = frames_per_batch
        self.reset_when_done = reset_when_done
        self.use_buffers = use_buffers
        self.set_truncated = set_truncated
        self.traj_counter = traj_counter
        self.storing_device = storing_device
        self.max_frames = max_frames_per_traj
        self.min_batch = max(int(min_batch), 1)
        self.max_wait = max_wait
        self.per_env_policy = per_env_policy
        #: frames whose policy call runs, not yet sent
        self.acting = 0
        self._sent = anyio.Event()
        self._act_error: Exception | None = None
        # sub-envs may lack the "truncated" flag a pool declares (add_truncated_keys, restarts)
        self._need_trunc = (
            set_truncated or max_frames_per_traj is not None or "truncated" in pool.done_keys
        )
        self.traj_ids = torch.zeros(self.n_envs, dtype=torch.int64)
        self.step_counts = torch.zeros(self.n_envs, dtype=torch.int64)
        self.ready: list[TensorDictBase] = []
        self.in_flight = 0
        self.resetting = 0
        self.carry: list[TensorDictBase] = []
        self.buffer: TensorDictBase | None = None
        self.started = False
        #: frames received from each env so far
        self.frames_per_env = torch.zeros(self.n_envs, dtype=torch.int64)

    # ------------------------------------------------------------------ resets
    async def reset(self, index: Any = None) -> None:
        """Reset every env (``index=None``) or those at ``index``; in-flight steps are
        received first (their frames open the next batch)."""
        await self.drain()
        if index is None:
            envs = list(range(self.n_envs))
        else:
            envs = torch.arange(self.n_envs)[index].reshape(-1).tolist()
        drop = torch.zeros(self.n_envs, dtype=torch.bool)
        drop[envs] = True
        kept = []
        for td in self.ready:
            rows = ~drop[td.get("env_index")]
            if bool(rows.any()):
                kept.append(td if bool(rows.all()) else td[rows])
        self.ready = kept
        self.pool.async_reset_send(None, env_index=envs)
        self.resetting += len(envs)
        out = await self.pool.async_reset_recv(min_get=len(envs))
        self.resetting -= len(envs)
        # fresh ids in env order, so a full reset numbers trajectories like the env indices
        self.traj_ids[sorted(envs)] = self.traj_counter.take(len(envs))
        self._on_reset(out)
        self.started = True

    def _on_reset(self, out: TensorDictBase) -> None:
        """Reset results become ready inputs (their trajectory ids are already assigned)."""
        idx = out.get("env_index")
        self.step_counts[idx] = 0
        out.set(TRAJ_KEY, self.traj_ids[idx])
        self.ready.append(out)

    async def drain(self) -> None:
        """Receive every step and reset in flight (frames are kept for the next batch)."""
        sink: list[TensorDictBase] = []
        while self.in_flight or self.resetting:
            await self._receive(sink)
        self.carry.extend(sink)

    # ------------------------------------------------------------------ one batch
    async def collect(
        self, act: Act, random: bool, interruptor: Interruptor | None, fresh: bool
    ) -> TensorDictBase:
        """Collect one batch of ``frames_per_batch`` frames (fewer if interrupted)."""
        if fresh:
            await self.drain()
            self.carry.clear()
            self.ready.clear()
            await self.reset()
        elif not self.started:
            await self.reset()
        chunks, self.carry = self.carry, []
        count = sum(c.batch_size[0] for c in chunks)
        cap = self.frames_per_batch
        async with anyio.create_task_group() as tg:
            try:
                count = await self._fill(tg, act, random, interruptor, chunks, count)
            except Exception as exc:  # raised below, outside the task group (unwrapped)
                self._act_error = exc
            if self._act_error is not None:
                tg.cancel_scope.cancel()
        if self._act_error is not None:
            err, self._act_error = self._act_error, None
            raise err
        if not chunks:
            raise RuntimeError("the interruptor stopped collection before the first frame")
        if count > cap:
            last = chunks[-1]
            keep = last.batch_size[0] - (count - cap)
            chunks[-1] = last[:keep]
            self.carry = [last[keep:]]
        out = self._assemble(chunks, count >= cap)
        if self.set_truncated:
            self._truncate_last(out)
        return time_named(out)

    def _assemble(self, chunks: list[TensorDictBase], full: bool) -> TensorDictBase:
        if not (self.use_buffers and full):
            return _cat(chunks)
        if self.buffer is None:
            self.buffer = _cat(chunks)
            if isinstance(self.buffer, LazyStackedTensorDict) or len(chunks) == 1:
                self.buffer = self.buffer.clone()
            return self.buffer
        try:
            return torch.cat(chunks, 0, out=self.buffer)  # type: ignore[arg-type,return-value]
        except (RuntimeError, KeyError, ValueError):
            self.buffer = None
            self.use_buffers = False
            return _cat(chunks)

    def owns(self, td: TensorDictBase) -> bool:
        """Whether ``td`` is the engine's reusable buffer (overwritten by the next batch)."""
        return td is self.buffer

    def _truncate_last(self, out: TensorDictBase) -> None:
        idx = out.get("env_index").reshape(-1)
        pos = torch.arange(idx.numel())
        last = torch.full((self.n_envs,), -1, dtype=torch.int64)
        last = last.scatter_reduce(0, idx, pos, "amax")
        where = torch.zeros(idx.numel(), dtype=torch.bool)
        where[last[last >= 0]] = True
        mark_truncated(out.get("next"), _TRUNC_KEYS, where)

    async def _fill(
        self,
        tg: TaskGroup,
        act: Act,
        random: bool,
        interruptor: Interruptor | None,
        chunks: list[TensorDictBase],
        count: int,
    ) -> int:
        """Act on ready envs and receive frames until the batch is full; the new count."""
        while count < self.frames_per_batch:
            if interruptor is not None and interruptor.collection_stopped():
                break
            ready, self.ready = self.ready, []
            for td in ready:
                pieces = td.split(1, 0) if self.per_env_policy else (td,)
                for piece in pieces:
                    self.acting += piece.batch_size[0]
                    tg.start_soon(self._act_and_send, act, piece, random)
            count += await self._receive(chunks)
            if self._act_error is not None:
                break
        return count

    async def _act_and_send(self, act: Act, td: TensorDictBase, random: bool) -> None:
        n = td.batch_size[0]
        try:
            td = await act(td, random)
            self.pool.async_step_send(td)
            self.in_flight += n
        except Exception as exc:  # raised by collect(), outside the task group
            self._act_error = exc
        finally:
            self.acting -= n
            self._sent.set()

    # ------------------------------------------------------------------ receiving
    async def _receive(self, chunks: list[TensorDictBase]) -> int:
        """Wait for the next results; returns how many frames went into ``chunks``."""
        pool = self.pool
        if not self.in_flight and not self.resetting and self.acting:
            # nothing to receive until a policy call sends its step
            self._sent = anyio.Event()
            await self._sent.wait()
            return 0
        if self.resetting:
            if self.in_flight:
                try:  # take finished resets without waiting: steps are what we wait for
                    out = await pool.async_reset_recv(min_get=1, timeout=0)
                except TimeoutError:
                    out = None
            else:
                out = await pool.async_reset_recv(min_get=1)
            if out is not None:
                self.resetting -= out.batch_size[0]
                self._on_reset(out)
                return 0
        if not self.in_flight:
            return 0
        want = min(self.min_batch, self.in_flight)
        if want > 1 and self.max_wait is not None:
            try:
                stepped = await pool.async_step_recv(min_get=want, timeout=self.max_wait)
            except TimeoutError:
                stepped = await pool.async_step_recv(min_get=1)
        else:
            stepped = await pool.async_step_recv(min_get=want)
        return self._on_step(stepped, chunks)

    def _on_step(self, stepped: TensorDictBase, chunks: list[TensorDictBase]) -> int:
        k = stepped.batch_size[0]
        self.in_flight -= k
        idx = stepped.get("env_index")
        if self._need_trunc:
            _ensure_truncated(stepped)
        next_td = stepped.get("next")
        done = _done_mask(self.pool, next_td)
        self.step_counts[idx] += 1
        self.frames_per_env[idx] += 1
        ended = done if self.reset_when_done else torch.zeros_like(done)
        if self.max_frames is not None:
            trunc = (self.step_counts[idx] >= self.max_frames) & ~done
            if bool(trunc.any()):
                mark_truncated(next_td, _TRUNC_KEYS, trunc)
                ended = ended | trunc
        # one step_mdp for the whole chunk (the pool's step_and_maybe_reset does one per env)
        nxt = self.pool.step_mdp(stepped)
        if bool(ended.any()):
            ended_envs = idx[ended]
            self.step_counts[ended_envs] = 0
            self.traj_ids[ended_envs] = self.traj_counter.take(ended_envs.numel())
            # reset the ended envs from their next input, so carried entries (policy states)
            # survive as in step_and_maybe_reset; they come back through async_reset_recv
            to_reset = nxt[ended]
            to_reset.set("_reset", torch.ones(to_reset.batch_size[0], 1, dtype=torch.bool))
            self.pool.async_reset_send(to_reset, env_index=ended_envs.tolist())
            self.resetting += ended_envs.numel()
            nxt = nxt[~ended]
        if nxt.batch_size[0]:
            nxt.set(TRAJ_KEY, self.traj_ids[nxt.get("env_index")])
            self.ready.append(nxt)
        storing = self.storing_device
        chunks.append(stepped.to(storing) if storing is not None else stepped)
        return k
