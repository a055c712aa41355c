"""Per-resource caps on concurrency and rate, shared by every env and pool of a process.

``AsyncEnvPool(max_concurrency=...)`` caps a whole pool; a :class:`Limiter` caps one
resource (sandboxes, a tool server, a model endpoint) wherever it is used: envs of
several pools, tools and the model client can share one by name (:meth:`Limiter.named`).

A limiter is per process. It is thread-safe and not bound to an event loop, so the
envs of a thread pool (each on its own loop) share it; but the workers of a process pool
each hold their own copy (a limiter pickled into a worker, or looked up by name there, is
that worker's). To cap a resource across a process pool's workers, use a
:class:`~aenv.llm.SharedLimiter` (its slots are file locks the kernel lets go of when a
holder dies).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["Limiter"]

_registry: dict[str, Limiter] = {}
_registry_lock = threading.Lock()


class Limiter:
    """At most ``max_concurrent`` holders at once, and at most ``rate_per_s`` acquisitions
    per second (evenly spaced); either may be None (no cap).

    Waiters are served first come, first served. A waiter cancelled at any point, even
    after a slot was handed to it, leaves no slot taken.

    Example:
        >>> import asyncio
        >>> from aenv.llm import Limiter
        >>> lim = Limiter(2)
        >>> async def job():
        ...     async with lim.slot():
        ...         await asyncio.sleep(0.01)
        ...         return lim.active
        >>> async def main():
        ...     return max(await asyncio.gather(*(job() for _ in range(6))))
        >>> asyncio.run(main())
        2
    """

    def __init__(
        self, max_concurrent: int | None = None, rate_per_s: float | None = None, *, name: str = ""
    ) -> None:
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1 or None, got {max_concurrent}")
        if rate_per_s is not None and rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0 or None, got {rate_per_s}")
        self.max_concurrent = max_concurrent
        self.rate_per_s = rate_per_s
        self.name = name
        self._lock = threading.Lock()
        self._active = 0
        self._peak = 0
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._next_start = 0.0

    @classmethod
    def named(
        cls, name: str, max_concurrent: int | None = None, rate_per_s: float | None = None
    ) -> Limiter:
        """The process-wide limiter called ``name``, made with these caps on first use;
        later calls get the same object (and must not ask for other caps)."""
        with _registry_lock:
            lim = _registry.get(name)
            if lim is None:
                lim = _registry[name] = cls(max_concurrent, rate_per_s, name=name)
            elif (max_concurrent, rate_per_s) != (None, None) and (
                lim.max_concurrent,
                lim.rate_per_s,
            ) != (max_concurrent, rate_per_s):
                raise ValueError(
                    f"limiter {name!r} exists with max_concurrent={lim.max_concurrent}, "
                    f"rate_per_s={lim.rate_per_s}; asked for {max_concurrent}, {rate_per_s}"
                )
            return lim

    @property
    def active(self) -> int:
        """How many slots are held now."""
        return self._active

    @property
    def peak(self) -> int:
        """The most slots ever held at once."""
        return self._peak

    @property
    def waiting(self) -> int:
        """How many acquirers wait for a slot."""
        return sum(1 for _, f in self._waiters if not f.done())

    def __repr__(self) -> str:
        return (
            f"Limiter({self.name!r}, max_concurrent={self.max_concurrent}, "
            f"rate_per_s={self.rate_per_s}, active={self._active})"
        )

    def __reduce__(self) -> Any:
        # a copy in another process starts empty (see the module docstring)
        if self.name:
            return (Limiter.named, (self.name, self.max_concurrent, self.rate_per_s))
        return (Limiter, (self.max_concurrent, self.rate_per_s))

    # ------------------------------------------------------------------ acquire / release
    async def acquire(self) -> None:
        """Wait for a slot (and for the rate's next start time); pair with :meth:`release`."""
        if self.max_concurrent is not None:
            await self._acquire_slot()
        if self.rate_per_s is not None:
            try:
                await self._wait_rate()
            except BaseException:
                self.release()
                raise

    def release(self) -> None:
        """Give a slot back (to the longest waiter, if any)."""
        if self.max_concurrent is None:
            return
        with self._lock:
            while self._waiters:
                loop, fut = self._waiters.popleft()
                if fut.done():  # cancelled while waiting
                    continue
                try:  # the slot passes straight to the waiter: active stays the same
                    loop.call_soon_threadsafe(self._grant, fut)
                except RuntimeError:  # its loop is closed: it will never take it
                    continue
                return
            self._active -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """``async with limiter.slot():`` holds a slot for the block."""
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    async def _acquire_slot(self) -> None:
        assert self.max_concurrent is not None
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._active < self.max_concurrent and not self._waiters:
                self._active += 1
                self._peak = max(self._peak, self._active)
                return
            fut: asyncio.Future[None] = loop.create_future()
            entry = (loop, fut)
            self._waiters.append(entry)
        try:
            await fut
        except BaseException:
            with self._lock:
                queued = entry in self._waiters
                if queued:
                    self._waiters.remove(entry)
            # popped by release(): either the grant already ran (we hold a slot we will
            # never use: give it back), or it is scheduled and will see the cancelled
            # future and give it back itself
            if not queued and fut.done() and not fut.cancelled():
                self.release()
            raise

    def _grant(self, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():
            self.release()  # its waiter left before it could take the slot
            return
        with self._lock:
            self._peak = max(self._peak, self._active)
        fut.set_result(None)

    async def _wait_rate(self) -> None:
        assert self.rate_per_s is not None
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_start)
            self._next_start = start + 1.0 / self.rate_per_s
        if start > now:
            await asyncio.sleep(start - now)
