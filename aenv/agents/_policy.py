"""Batched policies for the episode runner: many episodes' calls, one batched call."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import torch
from anyio.abc import TaskGroup
from tensordict import TensorDictBase

__all__ = ["BatchedPolicy"]


class BatchedPolicy:
    """Turns a batched policy into a per-episode one: calls made while a batch forms are
    stacked and served by one call of ``fn``.

    ``fn`` takes a tensordict of batch ``[B, ...]`` (the episodes' inputs stacked) and
    returns (or fills in) one of the same batch with the actions. A batch is sent when it
    holds ``max_batch_size`` calls or ``max_delay`` seconds after its first call, and
    batches overlap (a slow one does not hold up the next). It works inside ``async with``
    (the episode runner enters it for you).

    Example:
        >>> async def generate(td):             # one call for many episodes
        ...     td["action"] = ...              # [B] answers
        ...     return td
        >>> policy = BatchedPolicy(generate, max_batch_size=32, max_delay=0.01)
        >>> async with run_episodes(pool, policy, prompts) as stream: ...
    """

    def __init__(
        self,
        fn: Callable[[TensorDictBase], Awaitable[TensorDictBase | None]],
        *,
        max_batch_size: int = 64,
        max_delay: float = 0.005,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.max_delay = max_delay
        self._send: Any = None
        self._tg: TaskGroup | None = None
        self.batch_sizes: list[int] = []

    async def __aenter__(self) -> BatchedPolicy:
        if self._tg is not None:
            raise RuntimeError("this BatchedPolicy is already running")
        send, receive = anyio.create_memory_object_stream[Any](math.inf)
        self._send = send
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._serve, receive, tg)
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        tg, self._tg = self._tg, None
        assert tg is not None
        self._send.close()
        return await tg.__aexit__(*exc)

    @property
    def running(self) -> bool:
        return self._tg is not None

    async def __call__(self, td: TensorDictBase) -> TensorDictBase:
        if self._tg is None:
            raise RuntimeError("enter the BatchedPolicy (`async with policy:`) before calling it")
        fut: asyncio.Future[TensorDictBase] = asyncio.get_running_loop().create_future()
        self._send.send_nowait((td, fut))
        return await fut

    async def _serve(self, receive: Any, tg: TaskGroup) -> None:
        async with receive:
            async for first in receive:
                batch = [first]
                with anyio.move_on_after(self.max_delay):
                    try:
                        while len(batch) < self.max_batch_size:
                            batch.append(await receive.receive())
                    except anyio.EndOfStream:
                        pass
                tg.start_soon(self._run, batch)

    async def _run(self, batch: list[tuple[TensorDictBase, asyncio.Future[Any]]]) -> None:
        live = [(td, fut) for td, fut in batch if not fut.done()]  # cancelled callers: out
        if not live:
            return
        self.batch_sizes.append(len(live))
        try:
            stacked: TensorDictBase = torch.stack([td for td, _ in live], 0)  # type: ignore[assignment]
            result = await self.fn(stacked)
            out = stacked if result is None else result
            for i, (td, fut) in enumerate(live):
                if not fut.done():
                    fut.set_result(td.update(out[i]))
        except Exception as exc:
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(exc)
