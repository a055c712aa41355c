"""Blocking env calls in daemon threads.

An env whose sync methods block (``blocking = True``) has them run off the event loop. They
run in daemon worker threads kept here (idle ones are reused), not in anyio's default
threads: a call that never returns (a hung C call, a dead socket) must not keep the
interpreter from exiting once everything awaiting it was given up (a pool's step timeout
abandons the step and rebuilds the env). Otherwise this behaves as
``anyio.to_thread.run_sync``: a cancelled caller waits for the call to return before the
cancellation goes on, so an env's next call never overlaps the one still running.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any

import anyio

__all__ = ["run_blocking"]

_IDLE_SECONDS = 10.0  # an idle worker thread exits after this long


class _Worker(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="aenv-blocking", daemon=True)
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with _lock:
                    if self in _idle:
                        _idle.remove(self)
                        return
                continue  # taken for a job just now: it is in the queue
            if job is None:
                return
            job()
            with _lock:
                _idle.append(self)


_lock = threading.Lock()
_idle: list[_Worker] = []


def _submit(job: Callable[[], None]) -> None:
    with _lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        worker = _Worker()
        worker.start()
    worker.jobs.put(job)


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


async def run_blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` in a daemon worker thread and return its result."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    call = functools.partial(fn, *args, **kwargs)

    def job() -> None:
        try:
            ok, value = True, call()
        except BaseException as exc:  # handed to the caller, whatever it is
            ok, value = False, exc
        try:
            loop.call_soon_threadsafe(_settle, future, ok, value)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this call any more

    _submit(job)
    with anyio.CancelScope(shield=True):
        # (a cancelled caller waits for the call to return, as anyio's threads do)
        return await future
