"""The thread backend: one dedicated thread per sub-env.

For envs that block (C calls, blocking I/O, ``time.sleep``) or must always be called from
the same thread (GL contexts, some simulators). Env ``i`` is built *in* its thread and every
operation on it runs there: sync methods run inline (the thread is there to block, so the
env's ``blocking`` flag is switched off on that instance), async ones on a small event loop
private to the thread. Work reaches a thread through a ``queue.SimpleQueue`` (the thread
sleeps in ``get``), and results reach the pool's loop through ``loop.call_soon_threadsafe``:
no polling on either side.

A step past its deadline cannot be interrupted in a thread: the thread is abandoned (its
result will be dropped; it exits once its step returns) and the env is rebuilt in a new one.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.pool._backend import Backend, Failure
from aenv.pool._ops import drive, execute, runs_inline

__all__ = ["ThreadBackend"]

_STOP = None

# Env factories run one at a time, each still in its own thread: two factories importing the
# same package at once (``gymnasium.make`` imports an env's module on first use) can see it
# partially initialised and fail with an ImportError. A factory that builds a thread pool of
# its own holds the lock of its level while its envs are built: they take the next level's.
_build_locks: list[threading.Lock] = []
_build_locks_guard = threading.Lock()
_build_level = threading.local()


def _build_lock(level: int) -> threading.Lock:
    with _build_locks_guard:
        while len(_build_locks) <= level:
            _build_locks.append(threading.Lock())
        return _build_locks[level]


class _Worker:
    """One thread hosting one env."""

    def __init__(
        self,
        backend: ThreadBackend,
        index: int,
        fn: Callable[[], EnvBase],
        *,
        want_meta: bool,
    ) -> None:
        self.backend = backend
        self.index = index
        self.fn = fn
        self.want_meta = want_meta
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.built = threading.Event()
        self.meta: EnvMetaData | None = None
        self.error: Failure | None = None
        self.abandoned = False
        self.closing = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.env: EnvBase | None = None
        self.working = False
        self._lock = threading.Lock()
        self._exited = False
        self._on_exit: list[Callable[[], object]] = []
        self._level: int = getattr(_build_level, "value", 0)
        self.thread = threading.Thread(target=self._main, name=f"aenv-env-{index}", daemon=True)
        self.thread.start()

    # ---------------------------------------------------------------- in the thread
    def _main(self) -> None:
        try:
            env = None
            try:
                with _build_lock(self._level):
                    _build_level.value = self._level + 1
                    env = self.fn()
                if not isinstance(env, EnvBase):
                    raise TypeError(
                        f"an env factory must return an aenv EnvBase, got {type(env).__name__}"
                    )
                env.blocking = False  # type: ignore[misc]  # this thread is there to block
                self.env = env
                if self.want_meta:
                    self.meta = EnvMetaData.metadata_from_env(env)
            except BaseException as exc:
                self.error = Failure(exc)
            finally:
                self.built.set()
            if env is None:
                self._serve_failed()
            else:
                self._serve(env)
        finally:
            with self._lock:
                self._exited = True
                callbacks, self._on_exit = self._on_exit, []
            for cb in callbacks:
                with contextlib.suppress(RuntimeError):
                    cb()

    def _serve_failed(self) -> None:
        assert self.error is not None
        while (item := self.inbox.get()) is not _STOP:
            kind, a, _ = item
            if kind == "op":
                self.backend._post(self, self.error)
            else:
                a.set_exception(self.error.exc)

    def _serve(self, env: EnvBase) -> None:
        try:
            while (item := self.inbox.get()) is not _STOP:
                kind, a, b = item
                if kind == "getattr":
                    try:
                        a.set_result(getattr(env, b))
                    except Exception as exc:
                        a.set_exception(exc)
                    continue
                outcome: Any
                self.working = True
                if runs_inline(env, a, b):
                    try:
                        outcome = drive(execute(env, a, b))
                    except Exception as exc:
                        outcome = Failure(exc)
                else:
                    outcome = self._run_async(env, a, b)
                self.working = False
                self.backend._post(self, outcome)
        finally:
            self._close_env(env)

    def _run_async(self, env: EnvBase, op: str, payload: Any) -> Any:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        task = self.loop.create_task(execute(env, op, payload))
        self.task = task
        # after publishing the task: a concurrent cancel_current() either sees it, or set
        # the flag before this check
        if self.abandoned or self.closing:
            task.cancel()
        try:
            return self.loop.run_until_complete(task)
        except asyncio.CancelledError as exc:
            # Its caller was cancelled (the pool drops this outcome), or the worker was
            # abandoned or is closing (never posted).
            return Failure(exc)
        except Exception as exc:
            return Failure(exc)
        finally:
            self.task = None

    def _close_env(self, env: EnvBase) -> None:
        loop = self.loop
        with contextlib.suppress(Exception):  # the env is going away either way
            if loop is None and type(env)._aclose is EnvBase._aclose:
                drive(env.aclose())
            else:
                loop = self.loop = loop or asyncio.new_event_loop()
                loop.run_until_complete(env.aclose())
        if loop is not None:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    # ---------------------------------------------------------------- from the pool
    def cancel_current(self) -> None:
        task, loop = self.task, self.loop
        if task is not None and loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)

    def interrupt(self) -> None:
        """Let the env stop work a cancel cannot reach (a blocking call in this thread)."""
        if self.working and self.env is not None:
            with contextlib.suppress(Exception):
                self.env.interrupt()

    def stop(self) -> None:
        self.inbox.put(_STOP)

    def when_exited(self, callback: Callable[[], object]) -> None:
        with self._lock:
            if not self._exited:
                self._on_exit.append(callback)
                return
        callback()


class ThreadBackend(Backend):
    """Runs each sub-env in a thread of its own (see the module docstring)."""

    name = "thread"

    def __init__(self, deliver: Any, **options: Any) -> None:
        super().__init__(deliver, **options)
        self._workers: list[_Worker] = []
        self._retired: list[_Worker] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, env_fns: Sequence[Callable[[], EnvBase]]) -> list[EnvMetaData]:
        self.env_fns = list(env_fns)
        _live.add(self)
        self._workers = [_Worker(self, i, fn, want_meta=True) for i, fn in enumerate(self.env_fns)]
        for w in self._workers:
            w.built.wait()
        failed = [w for w in self._workers if w.error is not None]
        if failed:
            for w in self._workers:
                w.stop()
            for w in self._workers:
                w.thread.join()
            err = failed[0].error
            assert err is not None
            raise err.exc
        return [w.meta for w in self._workers]  # type: ignore[misc]

    def submit(self, env_index: int, op: str, payload: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._workers[env_index].inbox.put(("op", op, payload))

    def _post(self, worker: _Worker, outcome: Any) -> None:
        """Called in a worker thread: hand ``outcome`` to the pool's loop."""
        if worker.abandoned or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(self._arrive, worker, outcome)

    def _arrive(self, worker: _Worker, outcome: Any) -> None:
        if not worker.abandoned and self._workers[worker.index] is worker:
            self._deliver(worker.index, outcome)

    def cancel(self, env_index: int) -> bool:
        self._workers[env_index].cancel_current()
        return False

    def replace(self, env_index: int) -> None:
        old = self._workers[env_index]
        old.abandoned = True
        old.cancel_current()
        old.interrupt()
        old.stop()
        self._retired.append(old)
        # once its thread has closed its env and exited, nothing of it is kept
        old.when_exited(functools.partial(self._forget_retired, old))
        self._workers[env_index] = _Worker(
            self, env_index, self.env_fns[env_index], want_meta=False
        )

    def _forget_retired(self, worker: _Worker) -> None:
        # (from the worker's own thread, as it exits: a list removal is atomic)
        with contextlib.suppress(ValueError):
            self._retired.remove(worker)

    def getattr_sync(self, env_index: int, name: str) -> Any:
        """In the env's thread when it is idle; from the calling thread while it works
        (a plain attribute read, rather than waiting on a step that may never end)."""
        w = self._workers[env_index]
        w.built.wait()
        if w.error is not None:
            raise w.error.exc
        if w.working or not w.inbox.empty() or w.env is None:
            return getattr(w.env, name)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        w.inbox.put(("getattr", future, name))
        return future.result()

    def abort(self) -> None:
        for w in self._workers:
            w.stop()

    async def aclose(self, grace: float = 5.0) -> None:
        loop = asyncio.get_running_loop()
        workers = self._workers + self._retired
        waits = []
        for w in workers:
            w.closing = True
            w.stop()
            w.cancel_current()
            w.interrupt()
            fut: asyncio.Future[None] = loop.create_future()
            w.when_exited(functools.partial(loop.call_soon_threadsafe, _set_done, fut))
            waits.append(fut)
        if waits:
            # asyncio.wait, not gather under a timeout: a cancelled gather cancels the
            # futures too, and a stuck worker would then pass for an exited one
            await asyncio.wait(waits, timeout=grace)
        stuck = [w for w, f in zip(workers, waits) if not f.done()]
        for w in workers:
            if w not in stuck:
                w.thread.join()
        self._retired = stuck
        if stuck:
            warnings.warn(
                f"{len(stuck)} env thread(s) did not finish within {grace} s and were left "
                "running (daemon threads)",
                RuntimeWarning,
                stacklevel=2,
            )


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


# ---------------------------------------------------------------- at interpreter exit
# A pool nobody closed (user code raised mid-run) leaves its env threads alive at exit. As
# daemon threads they would be frozen by the interpreter's finalisation wherever they are;
# one inside torch (a C++ frame holding no GIL) then unwinds through C++ and aborts the
# process ("terminate called without an active exception", exit 134). So at exit every env
# thread is told to stop and given a moment to finish its step and close its env.
_live: weakref.WeakSet[ThreadBackend] = weakref.WeakSet()
_EXIT_GRACE = 5.0


def _stop_at_exit() -> None:
    workers = []
    for backend in list(_live):
        for w in [*backend._workers, *backend._retired]:
            w.closing = True
            w.stop()
            w.cancel_current()
            w.interrupt()
            workers.append(w)
    deadline = time.monotonic() + _EXIT_GRACE
    for w in workers:
        # a thread stuck in a call that never returns is left (a daemon, as before)
        w.thread.join(max(0.0, deadline - time.monotonic()))


atexit.register(_stop_at_exit)
