"""A concurrency cap that holds across the processes of one machine (a process pool's workers).

A :class:`~aenv.llm.Limiter` is per process: each worker of a process pool has its own.
:class:`SharedLimiter` keeps the cap in the kernel instead: the cap's ``N`` slots are ``N``
files of a directory named after the resource, and holding a slot is holding an exclusive
``flock`` on one of them. Any process that names the same resource (a worker building its
env from a factory, a pickled limiter arriving in a worker) shares the slots, and a process
that dies, however it dies (``SIGKILL`` included), lets go of its slots with its open files:
nothing to clean up, no slot leaked.

Within a process, waiters first queue on an ordinary :class:`~aenv.llm.Limiter` with the
same cap (first come, first served, no thread), so at most ``N`` of them at a time go for a
file; such an acquirer takes any free slot file at once, or else waits for one in a daemon
thread of its own (a ``flock`` that blocks), which a cancelled acquirer leaves behind to let
go of the slot as soon as it gets it.

Limits: concurrency only (a rate across processes is not kept); the processes must share a
file system (one machine); a slot's descriptor is close-on-exec, but a plain ``fork`` of a
process holding a slot shares the hold with the child until one of them closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import tempfile
import threading
from typing import Any

from aenv.llm._limiter import Limiter

__all__ = ["SharedLimiter"]


def _default_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"aenv-limiters-{os.getuid()}")


def _try_lock(path: str) -> int | None:
    """An exclusive hold on ``path`` (its open descriptor), or None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Wait:
    """One blocking wait for a slot file, run in its own thread; the awaiting task may
    give up on it (then the thread lets go of the slot as soon as it gets it)."""

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self.loop = loop
        self.future: asyncio.Future[int] = loop.create_future()
        self.lock = threading.Lock()
        self.abandoned = False
        self.fd: int | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="aenv-shared-limiter", daemon=True).start()

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            self._deliver(exc)
            return
        with self.lock:
            if self.abandoned:
                os.close(fd)  # (closing lets go of the hold)
                return
            self.fd = fd
        self._deliver(fd)

    def _deliver(self, outcome: int | OSError) -> None:
        def settle() -> None:
            if self.future.done():
                return
            if isinstance(outcome, OSError):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # its loop is closed: abandoned anyway
            self.loop.call_soon_threadsafe(settle)

    def abandon(self) -> None:
        with self.lock:
            self.abandoned = True
            fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def _rebuild(name: str, max_concurrent: int, root: str) -> SharedLimiter:
    return SharedLimiter(name, max_concurrent, directory=root)


class SharedLimiter(Limiter):
    """At most ``max_concurrent`` holders of resource ``name`` at once across every process
    of this machine that uses it (see the module doc).

    Args:
        name: the resource; processes that name the same one share its slots (letters,
            digits, ``._-``).
        max_concurrent: the cap; every user of ``name`` must give the same one.
        directory: where the slot files live (default: a per-user folder of the temp
            directory); processes share slots only if they use the same one.

    Use it as a :class:`~aenv.llm.Limiter` (``async with lim.slot():``, or a sandbox's
    ``limiter=``). :attr:`active` and :attr:`peak` count this process's holders (its
    waiters are in :attr:`waiting` while they queue here).

    Example:
        >>> import asyncio
        >>> from aenv.llm import SharedLimiter
        >>> lim = SharedLimiter("doc-example-sandboxes", 2)
        >>> async def job():
        ...     async with lim.slot():
        ...         await asyncio.sleep(0.01)
        ...         return lim.active
        >>> async def main():
        ...     return max(await asyncio.gather(*(job() for _ in range(6))))
        >>> asyncio.run(main())
        2
    """

    def __init__(self, name: str, max_concurrent: int, *, directory: str | None = None) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name or ""):
            raise ValueError(
                f"a shared limiter's name must be letters, digits, '._-'; got {name!r}"
            )
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
            raise TypeError(f"max_concurrent must be an int, got {max_concurrent!r}")
        super().__init__(max_concurrent, name=name)
        self.directory = os.path.join(directory or _default_root(), name)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        self._check_cap(max_concurrent)
        self._paths = [os.path.join(self.directory, f"slot-{k}") for k in range(max_concurrent)]
        # the slot files this process holds: (descriptor, path)
        self._held: list[tuple[int, str]] = []
        # the slot files one of this process's holders holds or one of its waiters waits for:
        # each by one at most, so that no waiter waits for a file this process holds itself
        self._claimed: set[str] = set()
        self._held_lock = threading.Lock()
        self._held_peak = 0
        self._turn = 0

    def _check_cap(self, cap: int) -> None:
        """Every user of the resource must have the same cap: the first writes it down."""
        path = os.path.join(self.directory, "cap")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            with open(path) as f:
                text = f.read().strip()
            if text and text != str(cap):
                raise ValueError(
                    f"shared limiter {self.name!r} ({self.directory}) has max_concurrent="
                    f"{text}; asked for {cap}"
                ) from None
            return
        with os.fdopen(fd, "w") as f:
            f.write(str(cap))

    @property
    def active(self) -> int:
        """How many slots this process holds now."""
        return len(self._held)

    @property
    def peak(self) -> int:
        """The most slots this process ever held at once."""
        return self._held_peak

    def __repr__(self) -> str:
        return (
            f"SharedLimiter({self.name!r}, max_concurrent={self.max_concurrent}, "
            f"active here={self.active}, directory={self.directory!r})"
        )

    def __reduce__(self) -> Any:
        # in another process: the same resource (the same files), its own holders
        root = os.path.dirname(self.directory)
        return (_rebuild, (self.name, self.max_concurrent, root))

    # ------------------------------------------------------------------ acquire / release
    async def acquire(self) -> None:
        """Wait for a slot of this process's queue, then for a slot file."""
        await self._acquire_slot()  # the in-process queue (Limiter's)
        try:
            held = await self._take_file()
        except BaseException:
            Limiter.release(self)
            raise
        with self._held_lock:
            self._held.append(held)
            self._held_peak = max(self._held_peak, len(self._held))

    def release(self) -> None:
        """Give a slot back (its file first, then this process's queue)."""
        with self._held_lock:
            if not self._held:
                raise RuntimeError(f"{self!r}: release() without a slot held")
            fd, path = self._held.pop()
            self._claimed.discard(path)
        os.close(fd)  # (closing lets go of the hold)
        Limiter.release(self)

    async def _take_file(self) -> tuple[int, str]:
        """A slot file this process neither holds nor waits for already: a free one at
        once, or else the wait for one (its descriptor and path, claimed)."""
        with self._held_lock:
            # (never empty: the in-process queue lets at most the cap's acquirers through,
            # this one among them, so the others claim fewer than the cap)
            free = [path for path in self._paths if path not in self._claimed]
        for path in free:
            fd = _try_lock(path)
            if fd is not None:
                with self._held_lock:
                    self._claimed.add(path)
                return fd, path
        # each of those slots is held by another process (or, for a moment, by a cancelled
        # waiter's thread about to let go): wait for one, in turn, so that this process's
        # waiters spread over them. Never for a file this process holds: another process
        # letting go of its slot would go unnoticed until this process let go of its own.
        self._turn = (self._turn + 1) % len(self._paths)
        path = free[self._turn % len(free)]
        with self._held_lock:
            self._claimed.add(path)
        wait = _Wait(path, asyncio.get_running_loop())
        try:
            wait.start()
            fd = await wait.future
        except BaseException:
            wait.abandon()
            with self._held_lock:
                self._claimed.discard(path)
            raise
        with wait.lock:
            wait.fd = None  # (ours now: the thread is done with it)
        return fd, path
