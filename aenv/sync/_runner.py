"""The loop runner: the one bridge from synchronous code to aenv's async implementation.

A :class:`Runner` owns one persistent event loop (asyncio's; uvloop's on request) and runs
coroutines to completion for sync callers. Objects bound to that loop (events, futures,
pool tasks, thread backends calling ``loop.call_soon_threadsafe``) keep working from one
call to the next because it is always the same loop object.

Where a call runs:

* the calling thread runs no event loop: the runner's loop runs right there, no thread hop;
* the calling thread runs a foreign loop (Jupyter, an async app calling sync code): the call
  is handed to one background thread owned by the runner and the caller blocks until done;
  torch's grad / inference mode and the caller's context variables travel with it;
* the calling thread runs the runner's own loop: :class:`RuntimeError` (it would deadlock).

Between calls the loop does not run: a task started in one call makes progress during later
calls, and a ``call_soon_threadsafe`` from another thread is delivered on the next call.
The loop runs for one call at a time, here or on the background thread, never both: calls
from several threads serialize on a lock. Sync code that runs *inside* a runner call (e.g. in
``loop.run_in_executor``) must not call the runner again: it would wait on that lock forever.
"""

from __future__ import annotations

import _signal
import asyncio
import atexit
import contextlib
import contextvars
import os
import queue
import signal
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aenv.exceptions import AsyncContextError, BackendUnavailableError

__all__ = ["Runner", "get_runner", "run_blocking", "run_sync"]

T = TypeVar("T")

_get_running_loop = asyncio._get_running_loop
_set_running_loop = asyncio._set_running_loop
_SIGINT = int(signal.SIGINT)

_SAME_LOOP_MSG = (
    "a synchronous aenv API was called from inside a coroutine running on aenv's own event "
    "loop; this would deadlock. Await the async API instead (e.g. `await env.step(td)` rather "
    "than a sync facade)."
)


def _new_loop(use_uvloop: bool | None) -> asyncio.AbstractEventLoop:
    # Default: asyncio's own loop. The runner runs its loop once per facade call, and uvloop
    # installs its signal wakeup (a new socket pair) on every run in the main thread: about
    # 53 us per call against 16 us for asyncio's loop (2 cores, Python 3.11), a third of a
    # SerialEnv step of 8 CartPoles. Inside a run the two are level for what the facades do.
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            raise BackendUnavailableError(
                "use_uvloop=True needs uvloop: pip install uvloop"
            ) from None
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class _Job:
    """One unit of work for the background thread, and its outcome."""

    __slots__ = (
        "cancel_requested",
        "context",
        "done",
        "error",
        "finished",
        "fn",
        "grad",
        "inference",
        "result",
        "task",
    )

    def __init__(self, fn: Callable[[_Job], Any]) -> None:
        self.fn = fn
        # A plain lock, held until the job is done: much cheaper to hand over than an Event.
        self.done = threading.Lock()
        self.done.acquire()
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.task: asyncio.Task[Any] | None = None
        self.cancel_requested = False
        self.context: contextvars.Context | None = None
        self.grad: bool | None = None
        self.inference = False

    def outcome(self) -> Any:
        err = self.error
        if err is None:
            return self.result
        self.error = None
        try:
            raise err
        finally:
            del err


class Runner:
    """Runs coroutines to completion on one persistent event loop, for synchronous callers.

    Args:
        use_uvloop: ``True`` runs uvloop's loop (it must be installed); ``None`` (default)
            and ``False`` run asyncio's own, which costs less per call: the runner starts
            its loop once per facade call, and uvloop sets up its signal handling on each
            start in the main thread.

    Example:
        >>> import asyncio
        >>> from aenv.sync import Runner
        >>> async def add(a, b):
        ...     await asyncio.sleep(0)
        ...     return a + b
        >>> with Runner() as runner:
        ...     runner.run(add, 1, 2)
        3
    """

    def __init__(self, *, use_uvloop: bool | None = None) -> None:
        self._loop = _new_loop(use_uvloop)
        self._lock = threading.Lock()  # held while the loop runs, in whichever thread
        self._closed = False
        self._forked = False
        #: the task :meth:`_drive` runs the loop for (its end stops the loop)
        self._driving: asyncio.Task[Any] | None = None
        self._call: Awaitable[Any] | None = None  # (the coroutine of the call in it)
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        _live_runners.add(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The runner's event loop (not running between calls)."""
        return self._loop

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or the runner was inherited through a fork)."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"{type(self).__name__}(loop={type(self._loop).__module__}, {state})"

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ running

    def run(
        self,
        async_fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T:
        """Calls ``async_fn(*args, **kwargs)`` and runs the awaitable it returns to completion.

        Args:
            async_fn: an async function (or any callable returning an awaitable).
            *args: positional arguments for ``async_fn``.
            timeout: seconds for the whole call, waiting for the loop included; on expiry
                the coroutine is cancelled, its cleanup runs, and :class:`TimeoutError` is
                raised.
            **kwargs: keyword arguments for ``async_fn``.

        Returns:
            What the coroutine returned; its exception, with its traceback, is raised instead.

        Raises:
            RuntimeError: when called from inside a coroutine running on this runner's loop,
                or after :meth:`close`.
            TimeoutError: when ``timeout`` expired.
        """
        if _get_running_loop() is self._loop:
            raise RuntimeError(_SAME_LOOP_MSG)
        return self.run_coro(async_fn(*args, **kwargs), timeout=timeout)

    def run_coro(self, coro: Awaitable[T], *, timeout: float | None = None) -> T:
        """Runs a coroutine (or other awaitable) to completion; see :meth:`run`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        running = _get_running_loop()
        if running is None:
            return self._run_here(coro, deadline, timeout, None)
        if running is self._loop:
            _discard(coro)
            raise RuntimeError(_SAME_LOOP_MSG)
        job = _Job(lambda j: self._run_in_worker(j, coro, deadline, timeout))
        job.context = contextvars.copy_context()
        torch = sys.modules.get("torch")
        if torch is not None:
            job.grad = torch.is_grad_enabled()
            job.inference = torch.is_inference_mode_enabled()
        try:
            return self._submit(job)  # type: ignore[no-any-return]
        except BaseException:
            if not job.finished:  # never reached the background thread
                _discard(coro)
            raise

    def _run_here(
        self,
        coro: Awaitable[T],
        deadline: float | None,
        timeout: float | None,
        job: _Job | None,
    ) -> T:
        """Runs the loop in the current thread (which runs no loop) until ``coro`` is done.

        On the main thread, Ctrl-C cancels the call instead of raising wherever the loop
        is (see :class:`_SigintGuard`): the call raises :class:`KeyboardInterrupt` once its
        cleanup ran, and the next call finds the loop and the pools consistent."""
        guard = _SigintGuard.install(self._loop)
        if guard is None:
            return self._run_locked(coro, deadline, timeout, job, None)
        try:
            result = self._run_locked(coro, deadline, timeout, job, guard)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            if guard.fired:
                # the cancellation (or what it caused) is the interrupt's doing
                raise KeyboardInterrupt from (
                    None if isinstance(exc, asyncio.CancelledError) else exc
                )
            raise
        finally:
            guard.restore()
        if guard.fired:
            raise KeyboardInterrupt  # the call finished first: its result is dropped
        return result

    def _run_locked(
        self,
        coro: Awaitable[T],
        deadline: float | None,
        timeout: float | None,
        job: _Job | None,
        guard: _SigintGuard | None,
    ) -> T:
        if deadline is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _discard(coro)
            raise TimeoutError(f"the event loop stayed busy past the {timeout} s deadline")
        try:
            if self._closed:
                _discard(coro)
                raise RuntimeError(f"{self!r} is closed")
            loop = self._loop
            self._call = coro
            coro = self._stopping(coro)
            if job is None:
                task = loop.create_task(coro)
            else:
                assert job.context is not None
                task = job.context.run(loop.create_task, coro)
                job.task = task
                if job.cancel_requested:
                    task.cancel()
            if guard is not None:
                guard.task = task
                if guard.fired:
                    task.cancel()
            if deadline is None:
                if _step_now(loop, task) and task.done():
                    return task.result()
                return self._drive(task)
            expired: list[bool] = []

            def expire() -> None:
                expired.append(True)
                task.cancel()

            timer = loop.call_later(max(0.0, deadline - time.monotonic()), expire)
            try:
                return self._drive(task)
            except asyncio.CancelledError as exc:
                if expired:
                    raise TimeoutError(f"the call did not finish within {timeout} s") from exc
                raise
            finally:
                timer.cancel()
        finally:
            self._lock.release()

    async def _stopping(self, coro: Awaitable[T]) -> T:
        """``coro``, whose end stops the loop while :meth:`_drive` runs it for this task and
        nothing else is ready to run: the loop exits in the turn the call ends, where the
        task's done callback would stop it one turn later (a loop turn per facade call, its
        selector poll included). Where callbacks are ready (or the loop does not show its
        ready queue: uvloop), the done callback stops the loop after them, as
        ``run_until_complete`` does."""
        try:
            return await coro
        finally:
            task = self._driving
            # (``coro`` is the call driven now, not one left by an interrupted call)
            if task is not None and self._call is coro and not getattr(self._loop, "_ready", True):
                self._driving = None
                task.remove_done_callback(self._stop_driving)
                self._loop.stop()

    def _stop_driving(self, task: asyncio.Task[Any]) -> None:
        """``task`` ended with callbacks ready, or without :meth:`_stopping`'s ``finally``
        (cancelled before its first step: the call's own coroutine, never started, is
        closed): stop the loop as ``run_until_complete`` would."""
        if self._driving is task:
            self._driving = None
            self._loop.stop()
            _discard(self._call)

    def _drive(self, task: asyncio.Task[T]) -> T:
        loop = self._loop
        try:
            if task.done():  # (finished in its first step, other callbacks ready)
                return loop.run_until_complete(task)
            self._driving = task
            task.add_done_callback(self._stop_driving)
            try:
                loop.run_forever()
            finally:
                if self._driving is task:
                    self._driving = None
                    task.remove_done_callback(self._stop_driving)
            if not task.done():  # (stopped by someone else: run_until_complete's error)
                raise RuntimeError("Event loop stopped before Future completed.")
            return task.result()
        except BaseException:
            # KeyboardInterrupt (or a stopped loop) left the task pending: cancel it and let
            # its cleanup run before the exception goes on.
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    loop.run_until_complete(task)
            raise

    def _run_in_worker(
        self, job: _Job, coro: Awaitable[T], deadline: float | None, timeout: float | None
    ) -> T:
        """Body of a job on the background thread: the caller's torch modes, then the loop."""
        torch = sys.modules.get("torch")
        if torch is None or job.grad is None:
            return self._run_here(coro, deadline, timeout, job)
        if job.inference:
            with torch.inference_mode(), torch.set_grad_enabled(job.grad):
                return self._run_here(coro, deadline, timeout, job)
        with torch.set_grad_enabled(job.grad):
            return self._run_here(coro, deadline, timeout, job)

    # ----------------------------------------------------------- background thread

    def _submit(self, job: _Job) -> Any:
        """Hands ``job`` to the background thread and blocks until it is done."""
        with self._worker_lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._worker_main, name="aenv-loop-runner", daemon=True
                )
                self._worker.start()
            self._jobs.put(job)
        try:
            job.done.acquire()
        except BaseException:
            self._cancel_job(job)
            if not job.finished:
                job.done.acquire()  # let the coroutine's cleanup run
            raise
        return job.outcome()

    def _cancel_job(self, job: _Job) -> None:
        # The worker publishes job.task, then reads cancel_requested; we write the flag, then
        # read job.task: at least one side sees the other.
        job.cancel_requested = True
        task = job.task
        if task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(task.cancel)

    def _worker_main(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            try:
                job.result = job.fn(job)
            except BaseException as exc:
                job.error = exc
            finally:
                job.task = None
                job.finished = True
                job.done.release()
                del job

    # ------------------------------------------------------------------- closing

    def close(self) -> None:
        """Cancels leftover tasks, shuts down async generators and the default executor,
        closes the loop and stops the background thread. Idempotent.

        Raises:
            RuntimeError: when called from inside a coroutine running on this runner's loop.
        """
        self._close(lock_timeout=None)

    def _close(self, lock_timeout: float | None) -> None:
        if self._closed and self._worker is None:
            return
        if self._forked:
            self._closed = True
            return
        running = _get_running_loop()
        if running is self._loop:
            raise RuntimeError("a Runner cannot be closed from inside a coroutine it runs")
        if not self._closed:
            if running is None:
                self._shutdown_loop(lock_timeout)
            else:
                self._submit(_Job(lambda _: self._shutdown_loop(lock_timeout)))
        with self._worker_lock:
            worker, self._worker = self._worker, None
            if worker is not None:
                self._jobs.put(None)
        if worker is not None and worker is not threading.current_thread():
            worker.join(lock_timeout)

    def _shutdown_loop(self, lock_timeout: float | None) -> None:
        if not self._lock.acquire(timeout=-1 if lock_timeout is None else lock_timeout):
            return  # a call that never ends holds the loop (at exit): leave it be
        try:
            if self._closed:
                return
            self._closed = True
            loop = self._loop
            try:
                tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in tasks:
                    t.cancel()
                if tasks:
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
        finally:
            self._lock.release()


_MAIN_THREAD = threading.main_thread().ident


def _noop() -> None:
    pass


class _SigintGuard:
    """Ctrl-C during a runner call on the main thread: the call's task is cancelled, rather
    than :class:`KeyboardInterrupt` raised at whatever line the loop runs (inside a pool's
    callback, half-way through handing a result over, inside the loop's own machinery),
    which can leave a result queued for a later call, a loop marked running, or a task
    nobody waits for. Installed only over Python's default handler, for one call (as
    :class:`asyncio.Runner` does); a second Ctrl-C raises at once."""

    __slots__ = ("fired", "loop", "previous", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, previous: Any) -> None:
        self.loop = loop
        self.previous = previous
        self.fired = False
        self.task: asyncio.Task[Any] | None = None

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop) -> _SigintGuard | None:
        if threading.get_ident() != _MAIN_THREAD:
            return None
        # (the C functions: signal.signal's enum conversions cost more than the swap itself,
        # and this runs twice per facade call)
        previous = _signal.getsignal(_SIGINT)
        if previous is not signal.default_int_handler:
            return None  # the user's own handler (or SIG_IGN) stays in charge
        guard = cls(loop, previous)
        _signal.signal(_SIGINT, guard._on_sigint)
        return guard

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.fired:
            raise KeyboardInterrupt
        self.fired = True
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(_noop)  # wake a loop asleep in its selector

    def restore(self) -> None:
        _signal.signal(_SIGINT, self.previous)


def _step_now(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> bool:
    """Runs the first step of ``task``, just created, here and now instead of on the loop's
    next iteration (what Python 3.12's eager tasks do): a facade call whose coroutine never
    suspends (a whole-batch step of inline envs) then costs no loop start, no selector poll
    and no done-callback round. Returns whether it ran: only on asyncio's own loop, where
    the task's step is the last handle in the ready queue (so no other callback is skipped
    or reordered); anything else is left to the loop. The step runs as the loop would run it:
    the loop set as running, its async-generator hooks installed, the task current; a
    coroutine that suspends carries on when the loop runs.

    When the step finished the task and nothing else became ready, the caller may take the
    result without running the loop at all; otherwise it runs the loop as usual."""
    ready = getattr(loop, "_ready", None)
    if not ready:
        return False
    handle = ready[-1]
    if getattr(handle._callback, "__self__", None) is not task:
        return False
    ready.pop()
    hooks = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(
        firstiter=loop._asyncgen_firstiter_hook,  # type: ignore[attr-defined]
        finalizer=loop._asyncgen_finalizer_hook,  # type: ignore[attr-defined]
    )
    _set_running_loop(loop)
    try:
        handle._run()
    finally:
        _set_running_loop(None)
        sys.set_asyncgen_hooks(*hooks)
    return not ready


def _discard(coro: object) -> None:
    """Closes a coroutine that will never run, so that Python does not warn about it."""
    close = getattr(coro, "close", None)
    if asyncio.iscoroutine(coro) and close is not None:
        close()


# ------------------------------------------------------------- process-wide runner

_live_runners: weakref.WeakSet[Runner] = weakref.WeakSet()
_default: Runner | None = None
_default_lock = threading.Lock()
# Loops inherited through fork: never closed in the child (closing would unregister fds from
# the epoll instance the parent still shares), never collected.
_fork_orphans: list[asyncio.AbstractEventLoop] = []


def get_runner() -> Runner:
    """Returns the process-wide default :class:`Runner`, creating it on first use.

    A closed default runner is replaced; a forked child gets its own, never the parent's.

    Example:
        >>> from aenv.sync import get_runner
        >>> get_runner() is get_runner()
        True
    """
    global _default
    runner = _default
    if runner is not None and not runner._closed:
        return runner
    with _default_lock:
        if _default is None or _default._closed:
            _default = Runner()
        return _default


def run_sync(
    async_fn: Callable[..., Awaitable[T]],
    /,
    *args: Any,
    timeout: float | None = None,
    **kwargs: Any,
) -> T:
    """Runs ``async_fn(*args, **kwargs)`` on the default runner; see :meth:`Runner.run`.

    Example:
        >>> import asyncio
        >>> from aenv.sync import run_sync
        >>> async def double(x):
        ...     await asyncio.sleep(0)
        ...     return 2 * x
        >>> run_sync(double, 21)
        42
    """
    return get_runner().run(async_fn, *args, timeout=timeout, **kwargs)


def run_blocking(
    async_fn: Callable[..., Awaitable[T]], /, *args: Any, api: str, twin: str, **kwargs: Any
) -> T:
    """The body of a sync API under a TorchRL name (``close()``, ``check_env_specs``...) whose
    coroutine is its ``a``-prefixed twin: runs ``async_fn`` on the default runner from sync
    code, and raises :class:`~aenv.exceptions.AsyncContextError` inside a running event loop
    (blocking there would stall the loop, and the object may belong to it).

    Example:
        >>> import asyncio
        >>> async def aping():
        ...     return "pong"
        >>> run_blocking(aping, api="ping()", twin="await aping()")
        'pong'
    """
    if _get_running_loop() is not None:
        raise AsyncContextError(
            f"{api} was called inside a running event loop, where it would block: "
            f"use `{twin}` there"
        )
    return get_runner().run(async_fn, *args, **kwargs)


def _after_fork_in_child() -> None:
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()
    for runner in list(_live_runners):
        runner._forked = True
        runner._closed = True
        runner._worker = None
        _fork_orphans.append(runner._loop)


def _close_default_at_exit() -> None:
    runner = _default
    if runner is not None:
        with contextlib.suppress(BaseException):
            runner._close(lock_timeout=1.0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_default_at_exit)
