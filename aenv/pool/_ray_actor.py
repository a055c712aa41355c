"""The Ray actor that hosts some of a pool's sub-envs (see :mod:`aenv.pool._ray`).

This module is imported inside Ray worker processes and does not import Ray at import time
(the actor asks Ray for its node's address when it opens its socket): the backend turns
:class:`EnvActor` into an actor class with ``ray.remote`` when it needs one. The driver's
messages arrive on that socket (:mod:`aenv.pool._ray_wire`) or as Ray calls of the
methods below (``transport="ray"``); either way they run the same methods.
The actor is *async* (its methods are coroutines): Ray runs its calls concurrently on one
event loop, so one actor steps all its envs at once. Each operation is
:func:`aenv.pool._ops.execute` on the env, exactly as the in-process backends run it: a sync,
non-blocking env's step inline, an async env's awaited, a ``blocking`` env's in a worker
thread (as :class:`~aenv.EnvBase` arranges).

One call carries many operations: :meth:`EnvActor.exchange` starts the operations the
driver submitted in one loop turn (for any of the actor's envs) and answers with every
result finished by then, waiting for the first one if none is: the operations that run
inline (a sync env's step) come back in the call that brought them, and an env that takes
its time comes back in a later call (the next submission, or an empty ``exchange`` the
driver holds open while it waits). So a whole-batch step costs one call per actor, and
streamed envs come back as they finish, several per answer when they finish together.

A whole-batch step is :meth:`EnvActor.stacked`: the actor's slice of the pool's stacked
input in, its envs stepping into preallocated rows as an in-process pool's do (through the
coroutine backend's ``launch``), the stacked rows out, in one call.

Operations carry a sequence number per env. The driver gives an operation up (a cancel, a
step timeout, a replace) by telling the actor; an operation that arrives after a newer one
was seen for its env, or after it was given up, is stale and not run. An exception in an
env is returned as a :class:`~aenv.pool._backend.Failure` (the exception and its formatted
traceback), not raised, so that it crosses intact whatever Ray does with errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.pool._backend import Done, Failure, Stacked
from aenv.pool._coroutine import CoroutineBackend, _build, _quiet_close
from aenv.pool._ops import execute, execute_inline, runs_inline
from aenv.pool._ray_codec import pack, unpack
from aenv.pool._ray_wire import ActorWire, Address

__all__ = ["STALE", "TIMED_OUT", "EnvActor", "Item", "RayActor", "pack", "renice", "unpack"]

#: What :meth:`EnvActor.exchange` answers for an operation it did not run (given up, or
#: older than one already seen for its env); the driver has forgotten such operations.
STALE = "aenv-ray-stale-op"

#: How long the operations of an ``exchange`` after one that raised wait before they run:
#: the call's answer leaves the actor's loop first (Ray hands it on from the loop's next
#: turns), so an env that blocks the loop after the failure does not hold the failure back.
DEFER_S = 0.001

#: What :meth:`EnvActor.stacked` answers for an env whose step it gave up at the step
#: timeout (the env was rebuilt from its factory, as a replace does).
TIMED_OUT = "aenv-ray-timed-out"

#: One operation as :meth:`EnvActor.exchange` takes it: env index, sequence number, op,
#: packed payload.
Item = tuple[int, int, str, Any]


def portable(exc: BaseException) -> Failure:
    """A failure that will survive pickling: the exception itself where it pickles, else a
    RuntimeError naming it (the formatted traceback is kept either way)."""
    failure = Failure(exc)
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        failure.exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    return failure


def renice(nice: int) -> None:
    """Run this process's threads at ``nice``, where allowed.

    Ray starts its workers at nice 15 (``RAY_worker_niceness``) so that its own daemons
    stay responsive; an actor hosting envs is the pool's workload, and at 15 it gets about
    a thirtieth of the CPU share of a process at 0 on a busy machine (the process backend's
    workers run at the parent's priority). Linux keeps a nice value per thread, so each
    thread is set (those made later inherit it). Lowering it needs privileges
    (``CAP_SYS_NICE`` or ``RLIMIT_NICE``): without them Ray's value stays."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, nice)


def _nobody(env_index: int, outcome: Any) -> None:
    """The deliver callback of the actor's in-process host, which only ever runs whole
    batches (their outcomes are returned, never delivered)."""
    raise AssertionError("the Ray actor's rows host delivers nothing")


def _portable(outcome: Any) -> Any:
    """A per-env outcome of a whole-batch step, its failure made portable (keeping the
    traceback formatted where it was raised)."""
    if not isinstance(outcome, Failure):
        return outcome
    failure = portable(outcome.exc)
    failure.traceback = outcome.traceback
    return failure


class EnvActor(ActorWire):
    """Builds envs from pickled factories and runs pool operations on them.

    Args:
        blob: the cloudpickled factories of the envs ``indices``, in order.
        indices: the pool's indices of these envs.
        sys_path: entries to append to ``sys.path`` before unpickling the factories (the
            driver's own, so that factories from its project's modules import here).
        want_meta: build each env's :class:`~aenv.envs.EnvMetaData` (for the pool's start).
        token: the pool's secret for the direct channel (:mod:`aenv.pool._ray_wire`), or
            None when every step goes through Ray calls (``transport="ray"``).
        nice: the nice value to run at (None: Ray's, see :func:`renice`).
    """

    def __init__(
        self,
        blob: bytes,
        indices: list[int],
        sys_path: list[str],
        want_meta: bool,
        token: bytes | None = None,
        nice: int | None = None,
    ) -> None:
        if nice is not None:
            renice(nice)
        for entry in sys_path:
            if entry not in sys.path:
                sys.path.append(entry)
        import cloudpickle

        self.envs: dict[int, EnvBase] = {}
        self.broken: dict[int, Failure] = {}
        self.metas: dict[int, EnvMetaData] = {}
        self.tasks: dict[int, asyncio.Task[Any]] = {}
        self.latest: dict[int, int] = {}
        self.closers: set[asyncio.Task[Any]] = set()
        # results not yet answered, the operations still running, the calls waiting
        self.finished: list[tuple[int, int, Any]] = []
        self.running: set[asyncio.Task[Any]] = set()
        self.wakers: list[asyncio.Future[None]] = []
        # the pool's indices of these envs in order, and the in-process host of their
        # whole-batch steps (made on the first one)
        self.order = list(indices)
        self.rows_host: CoroutineBackend | None = None
        self.row_views: dict[int, Any] = {}  # (what packing its rows reads: see pack)
        # the direct channel (see ActorWire): its token, socket and pending pushes
        self.token = token
        self.chan = None
        self._pushing = False
        self._stacking = set()
        self._accepting = None
        self.address: Address | None = None
        try:
            fns: list[Callable[[], EnvBase]] = cloudpickle.loads(blob)
        except Exception as exc:
            failure = portable(exc)
            self.fns: dict[int, Callable[[], EnvBase]] = {}
            self.broken = dict.fromkeys(indices, failure)
            return
        self.fns = dict(zip(indices, fns))
        for i in indices:
            try:
                env = self.envs[i] = _build(self.fns[i])
                if want_meta:
                    self.metas[i] = EnvMetaData.metadata_from_env(env)
            except Exception as exc:
                self.broken[i] = portable(exc)

    async def ready(
        self,
    ) -> tuple[int, dict[int, EnvMetaData], dict[int, Failure], Address | None]:
        """The actor's pid, the envs' metadata, the envs whose factory failed, and the
        address of its direct channel (None with ``transport="ray"``)."""
        if self.token is not None and self.address is None:
            self.address = await self._listen(self.token)
        return os.getpid(), self.metas, self.broken, self.address

    async def watch(self) -> None:
        """Never returns: the driver holds this call so that the actor's death shows at
        once (the call fails), even while none of its envs works."""
        await asyncio.Event().wait()

    async def exchange(self, items: list[Item]) -> list[tuple[int, int, Any]]:
        """Start the operations ``items``; answer every result finished and not yet
        answered, as ``(env index, sequence number, packed result or Failure)``, once there
        is at least one. A call that could only wait for results another waiting call will
        take (no more operations running than calls waiting) answers at once, empty.

        Once an operation run inline has raised, the call's later operations run just
        after it answered (as tasks, see :data:`DEFER_S`): the failure reaches the pool
        at once, whatever an env after it in the call does (a sync env blocking the
        actor's loop held back its mates' failure, which the pool acts on)."""
        self._start_all(items)
        while not self.finished and len(self.wakers) < len(self.running):
            waker = asyncio.get_running_loop().create_future()
            self.wakers.append(waker)
            try:
                await waker
            finally:
                with contextlib.suppress(ValueError):
                    self.wakers.remove(waker)
        answer, self.finished = self.finished, []
        return answer

    def _start_all(self, items: list[Item]) -> None:
        """Start the operations ``items``, those after one that raised inline deferred
        (see :meth:`exchange`)."""
        inline = True
        for i, seq, op, packed in items:
            if self._start(i, seq, op, packed, inline):
                inline = False

    def _wake(self) -> None:
        self._push_soon()
        wakers, self.wakers = self.wakers, []
        for waker in wakers:
            if not waker.done():
                waker.set_result(None)

    def _start(self, i: int, seq: int, op: str, packed: Any, inline: bool) -> bool:
        """Start one operation (run it, where it runs inline and ``inline`` allows);
        True when it ran inline and raised."""
        if seq < self.latest.get(i, 0):
            self.finished.append((i, seq, STALE))
            return False
        self.latest[i] = seq
        self._stop(i)
        failure = self.broken.get(i)
        if failure is not None:
            self.finished.append((i, seq, pack(failure)))
            return False
        env = self.envs[i]
        try:
            payload = unpack(packed)
        except Exception as exc:
            self.finished.append((i, seq, pack(portable(exc))))
            return False
        defer = False
        if runs_inline(env, op, payload):
            if inline:
                try:
                    result = execute_inline(env, op, payload)
                except Exception as exc:
                    self.finished.append((i, seq, pack(portable(exc))))
                    return True
                self.finished.append((i, seq, pack(result)))
                return False
            defer = True
        task = asyncio.get_running_loop().create_task(self._run(i, seq, env, op, payload, defer))
        self.tasks[i] = task
        self.running.add(task)
        task.add_done_callback(functools.partial(self._done, i))
        return False

    def _done(self, i: int, task: asyncio.Task[Any]) -> None:
        if self.tasks.get(i) is task:
            del self.tasks[i]
        self.running.discard(task)
        self._wake()  # a result, or one operation fewer that a waiting call may wait for

    async def _run(
        self, i: int, seq: int, env: EnvBase, op: str, payload: Any, defer: bool
    ) -> None:
        if defer:
            await asyncio.sleep(DEFER_S)
        try:
            result = await execute(env, op, payload)
        except Exception as exc:
            result = portable(exc)
        if seq >= self.latest.get(i, 0):  # (not given up meanwhile)
            self.finished.append((i, seq, pack(result)))

    async def stacked(
        self,
        op: str,
        packed: Any,
        local: list[int] | None,
        step_timeout: float | None,
        whole: bool = False,
    ) -> Any:
        """One whole-batch ``op`` (``"step"`` or ``"step_and_maybe_reset"``) of this actor's
        envs, or of those at the positions ``local``; ``packed`` holds the stacked inputs
        of all of them (this actor's slice of the pool's batch), or with ``whole`` the
        pool's whole batch (packed once by the driver for all its actors: slicing and
        packing it per actor cost the driver ~65 us per actor and step).

        The envs step as the coroutine backend steps a pool's envs, through it: each writes
        into its own row of preallocated stacked buffers (:class:`~aenv.pool._rows.Rows`)
        where every env runs inline; the answer is then ``("S", next, reset, flags)``, the
        stacked rows (every env's, the ones left out as they were). Otherwise (an async or
        blocking env, a failed factory) the envs' operations run concurrently, each as
        :func:`~aenv.pool._ops.execute`, and the answer is ``("L", outcomes)``, one per
        stepped env: a result, a :class:`Failure`, or :data:`TIMED_OUT` for an env still
        working at ``step_timeout`` (given up and rebuilt). Packed (:func:`pack`) either way.
        """
        out = self.stacked_inline(op, packed, local, step_timeout, whole)
        return out if type(out) is tuple else await out

    def stacked_inline(
        self,
        op: str,
        packed: Any,
        local: list[int] | None,
        step_timeout: float | None,
        whole: bool = False,
    ) -> Any:
        """:meth:`stacked` as far as it goes without awaiting: its packed answer (a tuple)
        when the envs stepped inline into the rows (or the inputs could not be read), else
        the coroutine of the rest (the envs' operations as tasks) to await. The channel
        answers the first at once, with no task made per step."""
        positions = range(len(self.order)) if local is None else local
        stepping = [self.order[p] for p in positions]
        for i in stepping:
            self._stop(i)  # (work the driver gave up on this env, still unwinding)
        try:
            # with ``whole``: the pool's whole batch, packed once for every actor; these rows
            rows = (self.order[0], len(self.order)) if whole else None
            tensordict = unpack(packed, rows)
        except Exception as exc:
            return pack(("L", [portable(exc)] * len(stepping)))
        if not self.broken:
            host = self.rows_host
            if host is None:
                host = self.rows_host = CoroutineBackend(_nobody)
            host.envs = [self.envs[i] for i in self.order]
            call = host.launch(op, tensordict, None, local)
            # (the coroutine backend runs a whole batch inline or not at all)
            out = call.result if isinstance(call, Done) else None
            if isinstance(out, Stacked):
                flags = None if out.reset_mask is None else out.reset_mask.tolist()
                return pack(("S", out.next, out.reset, flags), self.row_views)
            if out is not None:
                return pack(("L", [_portable(o) for o in out]))
        return self._step_each_packed(op, tensordict, positions, step_timeout)

    async def _step_each_packed(
        self, op: str, tensordict: Any, positions: Any, step_timeout: float | None
    ) -> Any:
        return pack(("L", await self._step_each(op, tensordict, positions, step_timeout)))

    async def _step_each(
        self, op: str, tensordict: Any, positions: Any, step_timeout: float | None
    ) -> list[Any]:
        """``op`` on the envs at ``positions``, concurrently, each as a per-env operation
        is run; their outcomes in order (see :meth:`stacked`)."""
        inputs = tensordict.exclude("next", "_step")
        loop = asyncio.get_running_loop()
        outcomes: list[Any] = [None] * len(positions)
        tasks: dict[int, asyncio.Task[Any]] = {}
        for pos, p in enumerate(positions):
            i = self.order[p]
            failure = self.broken.get(i)
            if failure is not None:
                outcomes[pos] = failure
                continue
            task = self.tasks[i] = loop.create_task(execute(self.envs[i], op, inputs[p]))
            tasks[pos] = task
        if tasks:
            await asyncio.wait(tasks.values(), timeout=step_timeout)
        for pos, task in tasks.items():
            i = self.order[positions[pos]]
            if self.tasks.get(i) is task:
                del self.tasks[i]
            if not task.done():  # past the deadline: given up, as a replace gives it up
                task.cancel()
                self._rebuild(i)
                outcomes[pos] = TIMED_OUT
            elif task.cancelled():
                outcomes[pos] = portable(RuntimeError(f"env {i}: its step was cancelled"))
            elif task.exception() is not None:
                outcomes[pos] = portable(task.exception())  # type: ignore[arg-type]
            else:
                outcomes[pos] = task.result()
        return outcomes

    async def attr(self, i: int, name: str) -> Any:
        """Attribute ``name`` of env ``i`` (or a Failure), whatever work it has in flight."""
        failure = self.broken.get(i)
        if failure is not None:
            return failure
        try:
            return getattr(self.envs[i], name)
        except Exception as exc:
            return portable(exc)

    async def cancel(self, i: int, seq: int) -> None:
        """Give up operation ``seq`` on env ``i`` (running or still to come)."""
        self._cancel_now(i, seq)

    def _cancel_now(self, i: int, seq: int) -> None:
        self.latest[i] = max(self.latest.get(i, 0), seq + 1)
        self._stop(i)

    async def replace(self, i: int, seq: int) -> Failure | None:
        """Give up env ``i`` (and its operation ``seq``, if any) and build a fresh one from
        its factory; the old one is closed in the background. Returns the factory's
        failure, if it raised."""
        self.latest[i] = max(self.latest.get(i, 0), seq + 1)
        task = self.tasks.pop(i, None)
        if task is not None:
            task.cancel()
        self._rebuild(i)
        return self.broken.get(i)

    def _stop(self, i: int) -> None:
        """Cancel the operation still running on env ``i`` (the driver gave it up)."""
        task = self.tasks.pop(i, None)
        if task is None or task.done():
            return
        task.cancel()
        if self.envs[i].blocking:
            # its worker thread cannot be stopped and would go on using the env: give it up
            self._rebuild(i)

    def _rebuild(self, i: int) -> None:
        old = self.envs.pop(i, None)
        self.broken.pop(i, None)
        if i in self.fns:
            try:
                self.envs[i] = _build(self.fns[i])
            except Exception as exc:
                self.broken[i] = portable(exc)
        if old is not None:
            with contextlib.suppress(Exception):  # it is given up: let it stop what it can
                old.interrupt()
            closer = asyncio.get_running_loop().create_task(_quiet_close(old))
            self.closers.add(closer)
            closer.add_done_callback(self.closers.discard)

    async def close(self) -> list[Failure]:
        """Close every env (after cancelling their work); the failures of those whose
        close raised."""
        for i, task in list(self.tasks.items()):
            task.cancel()
            with contextlib.suppress(Exception):  # a blocking env's thread: let it stop
                self.envs[i].interrupt()
        self.tasks.clear()
        if self.closers:
            await asyncio.gather(*list(self.closers), return_exceptions=True)
        failures = []
        for env in self.envs.values():
            try:
                await env.aclose()
            except Exception as exc:
                failures.append(portable(exc))
        self.envs.clear()
        return failures


class RayActor:
    """The class Ray makes the actors of: an :class:`EnvActor` behind its remote methods.

    Ray wraps every method of an actor's class, the inherited ones too, in a tracing shim
    (a Python call more per call, a coroutine more around each coroutine): on
    :class:`EnvActor` itself that was every call the actor makes among its own methods on
    a streamed step, and every step's task. Held here, the EnvActor is a plain object and
    only the calls from the driver pass through Ray's shims."""

    def __init__(self, *args: Any) -> None:
        self.actor = EnvActor(*args)

    async def ready(self) -> Any:
        return await self.actor.ready()

    async def watch(self) -> None:
        await self.actor.watch()

    async def exchange(self, items: list[Item]) -> list[tuple[int, int, Any]]:
        return await self.actor.exchange(items)

    async def stacked(self, *args: Any) -> Any:
        return await self.actor.stacked(*args)

    async def attr(self, i: int, name: str) -> Any:
        return await self.actor.attr(i, name)

    async def cancel(self, i: int, seq: int) -> None:
        await self.actor.cancel(i, seq)

    async def replace(self, i: int, seq: int) -> Failure | None:
        return await self.actor.replace(i, seq)

    async def close(self) -> list[Failure]:
        return await self.actor.close()
