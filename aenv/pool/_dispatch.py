"""Bookkeeping of the operations a pool has in flight: tickets, admission, deadlines, faults.

Every operation on a sub-env (whole-batch or streamed) is a :class:`_Ticket` in the slot of
its env (one at most: a second one is :class:`~aenv.exceptions.EnvBusyError`). Backends
report outcomes through :meth:`_Dispatcher._deliver`, which cancels the ticket's deadline,
applies the fault policy, and routes the outcome to the waiting whole-batch call or to the
stream's ready queue. Everything here runs on the pool's event loop thread and never awaits
except in :meth:`_Dispatcher._run_generic`.
"""

from __future__ import annotations

import asyncio
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import anyio

from aenv._mdp import put_text
from aenv.exceptions import (
    EnvBusyError,
    EnvCancelledError,
    EnvClosedError,
    EnvStepError,
    StepTimeoutError,
)
from aenv.pool._backend import Backend, Failure, Stacked
from aenv.pool._gc import GcFreeze
from aenv.pool._stacking import split_inputs

__all__ = [
    "ERROR_KEYS",
    "STREAM_OPS",
    "_Batch",
    "_Dispatcher",
    "_Ticket",
    "error_fields",
    "write_error",
]

STREAM_OPS = ("step", "reset", "step_and_maybe_reset")

#: With ``on_error="observe"``, the entries of every step's ``"next"`` that describe the
#: step's error (empty strings when it went well): the exception's type name, its message
#: and its formatted traceback (from the process or thread where it was raised).
ERROR_KEYS = ("error_type", "error_message", "error_traceback")


def error_fields(err: BaseException) -> tuple[str, str, str]:
    """An error as data: its type name, message and formatted traceback (for a sub-env's
    :class:`~aenv.exceptions.EnvStepError`, those of the exception the env raised)."""
    remote = getattr(err, "remote_traceback", None)
    kind = getattr(err, "remote_type", None) or type(err).__name__
    cause = err.__cause__ if isinstance(err, EnvStepError) else None
    message = str(cause) if cause is not None else str(err).split("\n\nRemote traceback")[0]
    return kind, message, remote or "".join(traceback.format_exception(err))


def write_error(nxt: Any, err: BaseException | None) -> Any:
    """Write :data:`ERROR_KEYS` for ``err`` (or empty ones) into a step's ``"next"``."""
    values = ("", "", "") if err is None else error_fields(err)
    for key, value in zip(ERROR_KEYS, values):
        put_text(nxt, key, value)
    return nxt


_TIMED_OPS = frozenset(STREAM_OPS)
_RESTARTABLE = frozenset(("step", "step_and_maybe_reset"))


class _Batch:
    __slots__ = ("future", "outcomes", "remaining")

    def __init__(self, n: int, future: asyncio.Future[None]) -> None:
        self.outcomes: list[Any] = [None] * n
        self.remaining = n
        self.future = future

    def store(self, pos: int, outcome: Any) -> None:
        self.outcomes[pos] = outcome
        self.remaining -= 1
        if not self.remaining and not self.future.done():
            self.future.set_result(None)


class _Ticket:
    __slots__ = (
        "batch",
        "error",
        "expired",
        "future",
        "index",
        "launched",
        "op",
        "orphan",
        "payload",
        "pos",
        "restarting",
        "timer",
    )

    def __init__(self, index: int, op: str, payload: Any, batch: _Batch | None, pos: int) -> None:
        self.index = index
        self.op = op
        self.payload = payload
        self.batch = batch
        self.pos = pos
        self.timer: asyncio.TimerHandle | None = None
        self.launched = False
        self.orphan = False
        self.restarting = False
        self.expired = False  # its deadline passed: its env's work was given up
        self.error: BaseException | None = None
        # set for a per-env call (``pool.step_one``): the outcome goes straight to it
        self.future: asyncio.Future[Any] | None = None


#: Marks the envs of a whole-batch call on a backend's fast path.
_FAST = _Ticket(-1, "", None, None, -1)


class _Ready:
    """One op's results that came back and were not received yet: in arrival order, and
    found by env, so a receive for one env (``env_index=``) takes its own without a scan.

    Items are ``(env index, outcome, ticket)``. Until a receive asks for one env, the queue
    holds the items themselves, in arrival order: a result costs an append, and a receive
    takes the oldest in C (a receive at a pool of thousands takes thousands at once). The
    first receive by env indexes what is waiting (once: an item is indexed at most once
    while it waits), and from then until the queue is empty again each item sits in a cell
    held by both the arrival queue and its env's entry; one taken by env is emptied in
    place (a hole) and skipped when the arrival queue reaches it, so every operation costs
    O(1) (amortised). An env's entry is its one cell, or a deque of them while it has
    several waiting (it was sent again before its last result was received): no deque made
    per result. While there is neither a hole nor an env with several, the oldest are taken
    in C there too.
    """

    __slots__ = ("_by_env", "_cells", "_count", "_holes", "_several")

    def __init__(self) -> None:
        # the items (not indexed) or their cells (indexed), in arrival order
        self._cells: deque[Any] = deque()
        # the cells by env; None while not indexed
        self._by_env: dict[int, list[Any] | deque[list[Any]]] | None = None
        self._count = 0
        # cells emptied in place and still queued; env entries that are deques
        self._holes = 0
        self._several = 0

    def __len__(self) -> int:
        return self._count

    def append(self, item: tuple[int, Any, _Ticket]) -> None:
        self._count += 1
        by_env = self._by_env
        if by_env is None:  # (the usual case: nobody receives by env)
            self._cells.append(item)
            return
        cell = [item]
        self._cells.append(cell)
        env = item[0]
        if env in by_env:
            self._file(env, cell, False)
        else:  # (the env's one waiting result)
            by_env[env] = cell

    def _index(self) -> dict[int, list[Any] | deque[list[Any]]]:
        """Index the waiting items by env (a receive by env asks for one)."""
        items, self._cells, self._by_env = self._cells, deque(), {}
        for item in items:
            cell = [item]
            self._cells.append(cell)
            self._file(item[0], cell, False)
        return self._by_env

    def waiting(self) -> list[tuple[int, Any, _Ticket]]:
        """The waiting items, oldest first, left waiting (to look at them)."""
        if self._by_env is None:
            return list(self._cells)
        return [cell[0] for cell in self._cells if cell[0] is not None]

    def _emptied(self) -> None:
        """Nothing waits any more: what is still queued is holes, and the index goes."""
        self._cells.clear()
        self._by_env = None
        self._holes = self._several = 0

    def _file(self, env: int, cell: list[Any], first: bool) -> None:
        by_env = self._by_env
        assert by_env is not None
        held = by_env.get(env)
        if held is None:
            by_env[env] = cell
        elif type(held) is list:
            by_env[env] = deque((cell, held) if first else (held, cell))
            self._several += 1
        elif first:
            held.appendleft(cell)  # type: ignore[union-attr]
        else:
            held.append(cell)  # type: ignore[union-attr]

    def has(self, env: int) -> bool:
        """Whether a result of env ``env`` is waiting."""
        if not self._count:
            return False
        by_env = self._by_env
        if by_env is None:
            by_env = self._index()
        return env in by_env

    def take(self, env: int) -> tuple[int, Any, _Ticket]:
        """The oldest waiting result of env ``env`` (see :meth:`has`)."""
        if self._by_env is None:
            self._index()
        self._holes += 1  # (its cell stays queued, empty)
        item = self._take(env)
        if not self._count:
            self._emptied()
        return item

    def _take(self, env: int) -> tuple[int, Any, _Ticket]:
        by_env = self._by_env
        assert by_env is not None
        held = by_env[env]
        if type(held) is list:
            cell = held
            del by_env[env]
        else:
            cell = held.popleft()  # type: ignore[union-attr]
            if len(held) == 1:
                by_env[env] = held[0]  # type: ignore[index]
                self._several -= 1
        item, cell[0] = cell[0], None
        self._count -= 1
        return item  # type: ignore[no-any-return]

    def pop_oldest(self, k: int) -> list[tuple[int, Any, _Ticket]]:
        """The ``k`` oldest waiting results, oldest first (at least ``k`` are waiting): one
        call for all of them, as a receive at a pool of thousands takes hundreds at once."""
        cells, by_env = self._cells, self._by_env
        if by_env is None:
            # the queue holds the items: taken in C
            if k == len(cells):
                out = list(cells)
                cells.clear()
            else:
                out = [cells.popleft() for _ in range(k)]
            self._count -= k
            return out
        if not self._holes and not self._several:
            # every queued cell holds an item, the one of its env: taken in C
            if k == len(cells):
                taken = list(cells)
                cells.clear()
            else:
                taken = [cells.popleft() for _ in range(k)]
            out = list(map(_first, taken))
            deque(map(by_env.__delitem__, map(_first, out)), 0)
            self._count -= k
        else:
            out = []
            for _ in range(k):
                cell: list[Any] = cells.popleft()
                while cell[0] is None:  # (taken by env already)
                    self._holes -= 1
                    cell = cells.popleft()
                item = cell[0]
                if by_env[item[0]] is cell:  # (the usual case: the env's one waiting result)
                    del by_env[item[0]]
                    cell[0] = None
                    self._count -= 1
                    out.append(item)
                else:  # (the oldest of the env's several: this one, same order)
                    out.append(self._take(item[0]))
        if not self._count:
            self._emptied()
        return out

    def put_back(self, items: list[tuple[int, Any, _Ticket]]) -> None:
        """Return ``items`` (taken oldest first, in that order) to the front."""
        self._count += len(items)
        if self._by_env is None:
            self._cells.extendleft(reversed(items))
            return
        for item in reversed(items):
            cell = [item]
            self._cells.appendleft(cell)
            self._file(item[0], cell, True)


_first = itemgetter(0)


class _Dispatcher:
    """Mixin of :class:`~aenv.pool.AsyncEnvPool` holding the in-flight state."""

    num_envs: int
    close_timeout: float
    on_error: str
    step_timeout: float | None
    max_concurrency: int | None
    _backend: Backend
    last_errors: dict[int, BaseException]
    _restart_result: Callable[[int, _Ticket, Any], Any]
    _gc: GcFreeze

    def _init_dispatch(self, n: int) -> None:
        self._tickets: list[_Ticket | None] = [None] * n
        self._waiting: deque[_Ticket] = deque()
        self._running = 0
        self._pumping = False
        self._orphans = 0
        self._orphan_waiter: asyncio.Future[None] | None = None
        self._ready: dict[str, _Ready] = {op: _Ready() for op in STREAM_OPS}
        self._streaming = dict.fromkeys(STREAM_OPS, 0)
        # per op: the futures of the receivers waiting, by the env they wait for (None: any)
        self._recv_waiters: dict[str, dict[int | None, list[asyncio.Future[None]]]] = {
            op: {} for op in STREAM_OPS
        }
        self.last_errors = {}
        # the tasks awaiting a whole-batch call's work (see _wait_call), and those the
        # pool's close cancelled there
        self._in_calls: set[asyncio.Task[Any]] = set()
        self._closed_calls: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ errors
    def _to_error(self, i: int, op: str, failure: Failure) -> BaseException:
        exc = failure.exc
        if isinstance(exc, StepTimeoutError):
            return exc
        if isinstance(exc, EnvStepError):
            if exc.env_index is None:
                exc.env_index = i
            return exc
        err = EnvStepError(
            f"env {i} raised {type(exc).__name__} in {op}: {exc}",
            env_index=i,
            remote_type=type(exc).__name__,
            remote_traceback=failure.traceback,
        )
        err.__cause__ = exc
        return err

    # ------------------------------------------------------------------ slots
    def _check_free(self, indices: Sequence[int]) -> None:
        tickets = self._tickets
        if not any(map(tickets.__getitem__, indices)):  # (all free: one pass in C)
            return
        for i in indices:
            if tickets[i] is not None:
                raise EnvBusyError(
                    f"env {i} is still working on an earlier {tickets[i].op or 'call'!r}; "  # type: ignore[union-attr]
                    "receive its result first",
                    env_index=i,
                )

    async def _wait_orphans(self) -> None:
        while self._orphans:
            fut = self._orphan_waiter
            if fut is None or fut.done():
                fut = self._orphan_waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(fut)
        self._check_open()  # type: ignore[attr-defined]  # (closed meanwhile)

    def _enqueue(self, t: _Ticket) -> None:
        self._tickets[t.index] = t
        if self.max_concurrency is None:
            self._launch(t)
        else:
            self._waiting.append(t)
            self._pump()

    def _pump(self) -> None:
        if self._pumping:
            return
        self._pumping = True
        try:
            cap = self.max_concurrency or 0
            while self._waiting and self._running < cap:
                t = self._waiting.popleft()
                if self._tickets[t.index] is t and not t.launched:
                    self._launch(t)
        finally:
            self._pumping = False

    def _launch(self, t: _Ticket) -> None:
        t.launched = True
        self._running += 1
        if self.step_timeout is not None and t.op in _TIMED_OPS:
            t.timer = asyncio.get_running_loop().call_later(self.step_timeout, self._expire, t)
        try:
            self._backend.submit(t.index, t.op, t.payload)
        except BaseException:
            self._release(t)
            raise

    def _release(self, t: _Ticket) -> None:
        if self._tickets[t.index] is t:
            self._tickets[t.index] = None
        if t.timer is not None:
            t.timer.cancel()
            t.timer = None
        if t.launched:
            t.launched = False
            self._running -= 1

    # ------------------------------------------------------------------ outcomes
    def _expire(self, t: _Ticket) -> None:
        i = t.index
        if self._tickets[i] is not t:
            return
        t.timer = None
        t.expired = True
        self._backend.replace(i)
        err = StepTimeoutError(
            f"env {i}: {t.op} did not finish within {self.step_timeout} s; it was abandoned "
            "and the env rebuilt from its factory",
            env_index=i,
        )
        self._deliver(i, Failure(err, ""))

    def _deliver(self, i: int, outcome: Any) -> None:
        t = self._tickets[i]
        if t is None or t is _FAST:
            return
        if self._gc.countdown:
            self._gc.results(1)
        if t.timer is not None:
            t.timer.cancel()
            t.timer = None
        if isinstance(outcome, Failure):
            err = self._to_error(i, "reset after a restart" if t.restarting else t.op, outcome)
            self.last_errors[i] = err
            if (
                self.on_error != "raise"
                and t.op in _RESTARTABLE
                and not t.restarting
                and not t.orphan
            ):
                self._restart(t, err)
                return
            if t.restarting and t.error is not None:
                err.__context__ = t.error
            outcome = Failure(err, outcome.traceback)
        elif t.restarting:
            outcome = self._restart_result(i, t, outcome)
        elif (
            self.on_error == "observe"
            and t.op in _RESTARTABLE
            and (t.future is not None or t.batch is not None)
        ):
            # (a streamed result gets its empty error entries when it is received, once
            # for the receive's batch: AsyncEnvPool._stack_stream)
            outcome = self._observed(outcome)
        self._release(t)
        if t.future is not None:
            if not t.future.done():
                t.future.set_result(outcome)
        elif t.orphan:
            self._orphans -= 1
            if not self._orphans and self._orphan_waiter is not None:
                if not self._orphan_waiter.done():
                    self._orphan_waiter.set_result(None)
        elif t.batch is not None:
            t.batch.store(t.pos, outcome)
        else:
            self._streaming[t.op] -= 1
            self._ready[t.op].append((i, outcome, t))
            if self._recv_waiters[t.op]:  # (usually none: the receiver was woken already)
                self._wake(t.op, i)
        if self._waiting:
            self._pump()

    def _restart(self, t: _Ticket, err: BaseException) -> None:
        """Rebuild ``t``'s env (unless a timeout did already), reset it, and report the
        step as truncated once the reset comes back (see :meth:`_deliver`)."""
        t.restarting = True
        t.error = err
        if not isinstance(err, StepTimeoutError):
            self._backend.replace(t.index)
        if self.step_timeout is not None:
            t.timer = asyncio.get_running_loop().call_later(self.step_timeout, self._expire, t)
        self._backend.submit(t.index, "reset", (None, {}))

    async def _restart_failed(
        self, op: str, outcomes: list[Any], indices: Sequence[int]
    ) -> frozenset[int]:
        """Unless ``on_error="raise"``, restart the envs whose step failed in a whole-batch
        call that ran outside tickets (env ``indices[pos]`` at position ``pos``), as a
        ticketed step's failure is restarted: their outcomes become the truncated steps.
        Returns the positions restarted."""
        failed = [pos for pos, o in enumerate(outcomes) if isinstance(o, Failure)]
        if self.on_error == "raise" or op not in _RESTARTABLE or not failed:
            return frozenset()
        batch = _Batch(len(failed), asyncio.get_running_loop().create_future())
        tickets = []
        for k, pos in enumerate(failed):
            t = _Ticket(indices[pos], op, None, batch, k)
            self._tickets[t.index] = t
            t.launched = True
            self._running += 1
            tickets.append(t)
            self._restart(t, outcomes[pos].exc)
        for pos, outcome in zip(failed, await self._await_batch(batch, tickets)):
            outcomes[pos] = outcome
        return frozenset(failed)

    def _observed(self, outcome: Any) -> Any:
        """A step that went well, under ``on_error="observe"``: empty error entries."""
        write_error(outcome[0] if isinstance(outcome, tuple) else outcome, None)
        return outcome

    def _wake(self, op: str, i: int | None) -> None:
        """Wake the receivers of ``op`` waiting for env ``i`` and those waiting for any
        env (``i=None``: every receiver of ``op``); each checks again what it waits for."""
        waiters = self._recv_waiters[op]
        if not waiters:  # the usual case: one receiver, already woken by an earlier result
            return
        for key in list(waiters) if i is None else (i, None):
            for fut in waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)

    # ------------------------------------------------------------------ cancelling
    def cancel(self, env_index: int) -> bool:
        """Stop env ``env_index``'s streamed or per-env operation and free the env at once.

        The env can be sent work again right away. Where the backend cannot stop the work
        in flight (a thread running sync code), the env is given up and rebuilt from its
        factory; either way its episode was interrupted, so reset it before stepping it
        again. A receiver waiting for that env's result gets a :class:`RuntimeError`; the
        per-env call awaiting it (``step_one``...) gets
        :class:`~aenv.exceptions.EnvCancelledError`. Whole-batch calls are cancelled by
        cancelling their caller. Returns False when the env had no such work.
        """
        if not 0 <= env_index < self.num_envs:
            raise IndexError(f"env index {env_index} out of range for a pool of {self.num_envs}")
        t = self._tickets[env_index]
        if t is None or t is _FAST or t.batch is not None or t.orphan:
            return False
        self._drop(t)
        if t.future is not None:
            if not t.future.done():
                t.future.set_exception(
                    EnvCancelledError(
                        f"env {env_index}: its {t.op} was cancelled by pool.cancel()",
                        env_index=env_index,
                    )
                )
        else:
            self._streaming[t.op] -= 1
            self._wake(t.op, env_index)
        return True

    def _drop(self, t: _Ticket) -> None:
        """Stop ``t``'s work and free its env now (rebuilt where the work cannot stop)."""
        if t.launched and not self._backend.cancel(t.index):
            self._backend.replace(t.index)
        self._release(t)
        if self._waiting:
            self._pump()

    async def _run_one(self, op: str, i: int, payload: Any) -> Any:
        """``op`` on env ``i`` alone: its outcome (result or Failure). A cancelled caller
        stops the work and frees the env (see :meth:`cancel`)."""
        if self._orphans:
            await self._wait_orphans()
        self._check_free((i,))
        t = _Ticket(i, op, payload, None, 0)
        fut = t.future = asyncio.get_running_loop().create_future()
        self._enqueue(t)
        try:
            outcome = await fut
        except BaseException:
            if self._tickets[i] is t:
                self._drop(t)
                await self._settle((i,))
            raise
        if t.expired:
            await self._settle((i,))
        return outcome

    async def _wait_call(self, call: Any, op: str) -> Any:
        """``await call.wait()`` (a backend's whole-batch call), raising
        :class:`~aenv.exceptions.EnvClosedError` when the pool is closed meanwhile: the
        close cancels this wait (see :meth:`_fail_in_flight`), which stops the call's work."""
        task = asyncio.current_task()
        assert task is not None
        self._in_calls.add(task)
        try:
            return await call.wait()
        except asyncio.CancelledError:
            if task in self._closed_calls:
                self._closed_calls.discard(task)
                if not task.uncancel():  # (not cancelled for another reason too)
                    raise EnvClosedError(_closed_msg(op)) from None
            raise
        finally:
            self._in_calls.discard(task)

    def _fail_in_flight(self) -> None:
        """The pool is closing: every call waiting on its envs raises
        :class:`~aenv.exceptions.EnvClosedError` instead of waiting for work the closed
        backend will never deliver (tickets' futures fail, whole-batch waits are
        cancelled). Streamed receivers are woken by the close and raise it themselves."""
        for t in self._tickets:
            if t is None or t is _FAST:
                continue
            self._release(t)
            err = EnvClosedError(_closed_msg(t.op, t.index))
            fut = t.future if t.future is not None else (t.batch.future if t.batch else None)
            if fut is not None and not fut.done():
                fut.set_exception(err)
        self._waiting.clear()
        self._orphans = 0
        if self._orphan_waiter is not None and not self._orphan_waiter.done():
            self._orphan_waiter.set_result(None)
        for task in self._in_calls:
            self._closed_calls.add(task)
            task.cancel()

    # ------------------------------------------------------------------ whole batch
    async def _run_ops(self, op: str, indices: Sequence[int], payloads: Sequence[Any]) -> list[Any]:
        """Run ``op`` on each env of ``indices``; one outcome (result or Failure) per env."""
        # a closed pool's backend would never answer (set_seed after close hung)
        self._check_open()  # type: ignore[attr-defined]
        out = await self._run_batch(op, payloads, indices)
        if out is None:
            return await self._run_generic(op, indices, payloads)
        assert isinstance(out, list)  # (per-env payloads never come back stacked)
        return out

    async def _run_batch(
        self, op: str, inputs: Any, indices: Sequence[int] | None = None
    ) -> Stacked | list[Any] | None:
        """``op`` on every env (or on ``indices``) through the backend's one whole-batch
        operation (:meth:`~aenv.pool._backend.Backend.launch`), ``inputs`` the pool's
        stacked input or per-env payloads (one per index), under the fault policy
        (:meth:`_batch_faults`): a :class:`Stacked` result (a masked step's other rows
        stale, their reset flags False), per-env outcomes (one per index), or None when
        the backend did not take it (nothing started). Under ``max_concurrency`` the batch
        goes in waves of at most that many envs (fewer while streamed envs work), each
        wave one call."""
        if self._orphans:
            await self._wait_orphans()
        envs = range(self.num_envs) if indices is None else indices
        self._check_free(envs)
        cap = len(envs) if self.max_concurrency is None else self.max_concurrency - self._running
        if cap < 1:
            return None
        tickets, backend = self._tickets, self._backend
        stacked = not isinstance(inputs, list | tuple)
        results: list[Any] = []
        for start in range(0, len(envs), cap):
            wave = envs[start : start + cap]
            whole = len(wave) == len(envs)
            part = inputs if stacked else inputs[start : start + cap]
            for i in wave:
                tickets[i] = _FAST
            self._running += len(wave)
            try:
                call = backend.launch(op, part, self.step_timeout, indices if whole else wave)
                out = None if call is None else await self._wait_call(call, op)
                if out is not None and self._gc.countdown:
                    self._gc.results(len(wave))
            finally:
                self._running -= len(wave)
                for i in wave:
                    if tickets[i] is _FAST:
                        tickets[i] = None
            if out is None:  # (not taken: what is left goes per env)
                if not start:
                    return None
                rest = envs[start:]
                if stacked:
                    keys = self._step_keys(inputs)  # type: ignore[attr-defined]
                    part = split_inputs(inputs, rest, keys, self._sub_batch)  # type: ignore[attr-defined]
                else:
                    part = inputs[start:]
                return results + await self._run_generic(op, rest, part)
            if isinstance(out, Stacked):
                if whole:
                    return self._stacked_went_well(out)
                out = out.outcomes(op, wave)
            results += await self._batch_faults(op, out, wave)
        return results

    async def _hold_all(self) -> None:
        """Mark every env busy with a whole-batch call (see :meth:`_release_all`)."""
        if self._orphans:
            await self._wait_orphans()
        indices = range(self.num_envs)
        self._check_free(indices)
        tickets = self._tickets
        for i in indices:
            tickets[i] = _FAST

    def _release_all(self) -> None:
        tickets = self._tickets
        for i in range(self.num_envs):
            if tickets[i] is _FAST:
                tickets[i] = None

    async def _batch_faults(
        self, op: str, outcomes: list[Any], indices: Sequence[int]
    ) -> list[Any]:
        """The fault policy on the per-env outcomes of a whole-batch call that ran outside
        tickets (:meth:`_run_batch`), as :meth:`_deliver` applies it to a
        ticket's: failures become the pool's errors; under ``"restart"`` and ``"observe"``
        failed steps restart their envs (truncated steps), and under ``"observe"`` every
        step carries its error entries."""
        for pos, o in enumerate(outcomes):
            if isinstance(o, Failure):
                err = self.last_errors[indices[pos]] = self._to_error(indices[pos], op, o)
                outcomes[pos] = Failure(err, o.traceback)
        failed = await self._restart_failed(op, outcomes, indices)
        if self.on_error == "observe" and op in _RESTARTABLE:
            for pos, o in enumerate(outcomes):
                if pos not in failed and not isinstance(o, Failure):
                    outcomes[pos] = self._observed(o)
        return outcomes

    def _stacked_went_well(self, out: Stacked) -> Stacked:
        """A stacked result (every env's step went well) under the fault policy: with
        ``"observe"``, its empty error entries, written once for the whole batch."""
        if self.on_error == "observe":
            write_error(out.own().next, None)
        return out

    async def _run_generic(
        self, op: str, indices: Sequence[int], payloads: Sequence[Any]
    ) -> list[Any]:
        batch = _Batch(len(indices), asyncio.get_running_loop().create_future())
        tickets = [
            _Ticket(i, op, p, batch, pos) for pos, (i, p) in enumerate(zip(indices, payloads))
        ]
        for t in tickets:
            self._enqueue(t)
        return await self._await_batch(batch, tickets)

    async def _await_batch(self, batch: _Batch, tickets: list[_Ticket]) -> list[Any]:
        """The outcomes of a batch of tickets once all are in; a cancelled caller stops
        what can be stopped and orphans the rest."""
        try:
            if batch.remaining:
                await batch.future
        except BaseException:
            self._abandon_batch(tickets)
            if not self._closed:  # type: ignore[attr-defined]
                await self._settle([t.index for t in tickets])
            raise
        expired = [t.index for t in tickets if t.expired]
        if expired:  # the given-up work unwinds before the call returns its timeouts
            await self._settle(expired)
        return batch.outcomes

    async def _settle(self, indices: Sequence[int]) -> None:
        """Let the work cancelled on these envs unwind before the cancelled caller goes
        on (a structured cancel: its envs' cleanup has run), shielded from the caller's
        own cancellation and bounded by ``close_timeout``."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.close_timeout):
            await self._backend.settle(indices)

    def _abandon_batch(self, tickets: list[_Ticket]) -> None:
        """The caller was cancelled: stop what can be stopped, orphan the rest."""
        for t in tickets:
            if self._tickets[t.index] is not t:
                continue
            if not t.launched or self._backend.cancel(t.index):
                self._release(t)
            else:
                t.orphan = True
                self._orphans += 1
        if self._waiting:
            self._pump()


def _closed_msg(op: str, index: int | None = None) -> str:
    where = "" if index is None else f" of env {index}"
    return f"the pool was closed while a {op!r}{where} was in flight"
