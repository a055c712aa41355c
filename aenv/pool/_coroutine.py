"""The coroutine backend: sub-envs live in the pool's event loop.

Async envs run in the pool's loop, each in a worker task of its own; a sync, non-blocking
env's operation is run inline (no task: it cannot suspend anyway), and one declared
``blocking`` runs in a worker (daemon) thread as :class:`~aenv.EnvBase` arranges.

One worker per env for the pool's life, not one task per operation: a worker runs its env's
operations one after another and, in between, waits on a future of its own that the next
``submit`` sets. A task per step made a task, its context, its weak reference and three
coroutine frames for every step, all alive as long as the step; with thousands of slow envs
in flight the cyclic garbage collector promoted every one of them and its full collections
(which walk every env of the pool) came that much more often. A step in flight now holds
only the env's own coroutines (and, for a lean step, calls the env's step hook directly).

Workers are not held by a task group: they outlive any one caller's scope (a streamed step
is sent by one call and received by another). The backend owns them instead: each catches
its env's exception and delivers it as a :class:`~aenv.pool._backend.Failure` (so no
failure goes unseen), a cancelled or replaced env's worker ends (a fresh one starts with the
next operation), and :meth:`CoroutineBackend.aclose` cancels and awaits them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import warnings
from asyncio import Future
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from tensordict import TensorDictBase, is_leaf_nontensor

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.pool._backend import Backend, BatchCall, Done, Failure
from aenv.pool._build import env_metadata, paused_gc, share_specs
from aenv.pool._ops import drive, execute, lean_step_ok, runs_inline
from aenv.pool._rows import Rows
from aenv.pool._stacking import split_inputs

__all__ = ["CoroutineBackend"]


class CoroutineBackend(Backend):
    """Runs sub-envs in the pool's own event loop (see the module docstring)."""

    name = "coroutine"
    #: streamed steps may hand each env its row of the pool's input buffers
    #: (:mod:`aenv.pool._stream_rows`): the envs read it here, in the pool's loop
    stream_rows = True

    def __init__(self, deliver: Any, **options: Any) -> None:
        super().__init__(deliver, **options)
        self.envs: list[EnvBase] = []
        # env i's lane (see _Lane): its worker, its idle future, an operation queued;
        # made with its first worker (an env whose operations all run inline needs none,
        # and a pool's build makes no object per env for it)
        self._lanes: list[_Lane | None] = []
        self._retired: set[asyncio.Task[Any]] = set()
        # the cancelled operations still unwinding, by env (see settle)
        self._cancelled: dict[int, asyncio.Task[Any]] = {}
        self._rows: Rows | None = None

    def start(self, env_fns: Sequence[Callable[[], EnvBase]]) -> list[EnvMetaData]:
        self.env_fns = list(env_fns)
        self.envs = []
        with paused_gc():
            try:
                for fn in self.env_fns:
                    self.envs.append(_build(fn))
            except BaseException:
                for env in self.envs:
                    if not _async_close(env):
                        with contextlib.suppress(Exception):
                            drive(env.aclose())
                raise
            self._lanes = [None] * len(self.envs)
            share_specs(self.envs)
            return env_metadata(self.envs)

    # ------------------------------------------------------------------ streaming
    def submit(self, env_index: int, op: str, payload: Any) -> None:
        lane = self._lanes[env_index]
        # (the usual streamed step, to the idle worker of an env whose steps are known not
        # to run inline, skips the check)
        if lane is None or lane.idle is None or not (lane.steps and op == "step"):
            env = self.envs[env_index]
            if runs_inline(env, op, payload):
                try:
                    result = drive(execute(env, op, payload))
                except Exception as exc:
                    self._deliver(env_index, Failure(exc))
                else:
                    self._deliver(env_index, result)
                return
            if lane is None:
                lane = self._lanes[env_index] = _Lane()
            if op == "step":
                lane.steps = True
        idle = lane.idle
        if idle is not None:
            lane.idle = None
            idle.set_result((op, payload))
        elif lane.worker is not None:
            # its worker is busy handing back the last outcome (a restart's reset is
            # submitted from inside that delivery): it takes this one next
            lane.queued = (op, payload)
        else:
            lane.worker = asyncio.get_running_loop().create_task(
                self._work(env_index, lane, self.envs[env_index], op, payload)
            )

    async def _work(self, env_index: int, lane: _Lane, env: EnvBase, op: str, payload: Any) -> None:
        """Env ``env_index``'s worker: runs its operations one after another, from the
        first (``op``, ``payload``) to the last, and waits in between on a future of its
        own (``lane.idle``). One task per env for the pool's life, not one per operation:
        a step in flight holds only its own coroutines (see the module docstring)."""
        me = asyncio.current_task()
        loop = asyncio.get_running_loop()
        deliver = self._deliver
        try:
            while True:
                outcome: Any
                try:
                    if op == "step" and lean_step_ok(env, payload):
                        # the step hook straight away: two coroutines fewer per step than
                        # execute() (the same call its lean path makes)
                        outcome = await env._step_into(payload, None)
                    else:
                        outcome = await execute(env, op, payload)
                except Exception as exc:
                    outcome = Failure(exc)
                payload = None  # (a waiting worker holds no input)
                if lane.worker is not me:
                    return  # given up: cancelled (and the env ignored it) or replaced
                deliver(env_index, outcome)
                outcome = None
                if lane.worker is not me:
                    return  # the delivery replaced the env (a restart): a new worker runs it
                nxt = lane.queued
                if nxt is None:
                    # (the Future itself, not loop.create_future(): one Python call
                    # fewer per step, and any loop's tasks await an asyncio.Future)
                    fut: asyncio.Future[tuple[str, Any]] = Future(loop=loop)
                    lane.idle = fut
                    nxt = await fut
                else:
                    lane.queued = None
                op, payload = nxt
                nxt = None
        finally:
            if lane.worker is me:
                lane.clear()

    def cancel(self, env_index: int) -> bool:
        lane = self._lanes[env_index]
        if (lane is not None and lane.idle is not None) or not self._drop_task(env_index):
            return False
        if self.envs[env_index].blocking:
            # its worker thread cannot be stopped and would go on using the env: give it up
            self._rebuild(env_index)
        return True

    def _drop_task(self, env_index: int) -> bool:
        lane = self._lanes[env_index]
        task = lane.worker if lane is not None else None
        if task is None:
            return False
        assert lane is not None
        lane.clear()
        task.cancel()
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)
        self._cancelled[env_index] = task
        task.add_done_callback(functools.partial(self._forget_cancelled, env_index))
        return True

    def _forget_cancelled(self, env_index: int, task: asyncio.Task[Any]) -> None:
        if self._cancelled.get(env_index) is task:
            del self._cancelled[env_index]

    async def settle(self, indices: Sequence[int]) -> None:
        """Wait until the cancelled operations of these envs have unwound (their cleanup,
        such as killing a sandbox, has run)."""
        tasks = [t for i in indices if (t := self._cancelled.get(i)) is not None]
        if tasks:
            await asyncio.wait(tasks)

    def replace(self, env_index: int) -> None:
        self._drop_task(env_index)
        self._rebuild(env_index)

    def _rebuild(self, env_index: int) -> None:
        old = self.envs[env_index]
        self.envs[env_index] = _build(self.env_fns[env_index])
        closer = asyncio.get_running_loop().create_task(_quiet_close(old))
        self._retired.add(closer)
        closer.add_done_callback(self._retired.discard)

    def getattr_sync(self, env_index: int, name: str) -> Any:
        return getattr(self.envs[env_index], name)

    # ------------------------------------------------------------------ whole batch
    def launch(
        self,
        op: str,
        inputs: TensorDictBase | Sequence[Any],
        step_timeout: float | None,
        indices: Sequence[int] | None = None,
        *,
        bank: int = 0,
        after: BatchCall | None = None,
    ) -> BatchCall | None:
        """A whole-batch step of every env (or of the envs ``indices``), run here, each env
        writing into its rows (:mod:`aenv.pool._rows`): taken when every env's step runs
        inline (sync, non-blocking, EnvBase's step); None, with nothing started, otherwise."""
        if (op != "step" and op != "step_and_maybe_reset") or not isinstance(
            inputs, TensorDictBase
        ):
            return None
        tensordict = inputs
        rows = self._rows
        if rows is None:
            rows = self._rows = Rows(self.envs)
        if not (rows.ok and rows.direct):
            return None
        staged = rows.stage(tensordict)
        if staged is not None:
            rows_in = staged if indices is None else [staged[i] for i in indices]
        else:
            keys = [
                k
                # is_leaf_nontensor: non-tensor entries (a NonTensorStack of prompts) are leaves
                for k in tensordict.keys(True, True, is_leaf=is_leaf_nontensor)
                # ("_step": the pool's mask, not an env input)
                if k != "next" and k != "_step" and not (type(k) is tuple and k[0] == "next")
            ]
            if not all(type(k) is str for k in keys):
                return None
            # each env's whole input row, as a bare env gets it
            rows_in = split_inputs(
                tensordict,
                range(len(self.envs)) if indices is None else indices,
                keys,
                tensordict.batch_size[1:],
            )
        if not rows.takes(self.envs, op, rows_in, staged is not None, indices):
            return None
        try:
            return Done(rows.run(self.envs, op, rows_in, indices))
        finally:
            if staged is not None:
                rows.restore_inputs()

    # ------------------------------------------------------------------ closing
    async def aclose(self, grace: float = 5.0) -> None:
        for i, lane in enumerate(self._lanes):
            if lane is None or lane.worker is None:
                continue
            if lane.idle is not None:
                self._drop_task(i)
            else:
                self.cancel(i)
        if self._retired:
            with anyio.move_on_after(grace):
                await asyncio.gather(*list(self._retired), return_exceptions=True)
            if self._retired:
                warnings.warn(
                    f"{len(self._retired)} env task(s) ignored cancellation for {grace} s "
                    "and were left running",
                    RuntimeWarning,
                    stacklevel=2,
                )
        errors = []
        for env in self.envs:
            try:
                await env.aclose()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


class _Lane:
    """One env's streaming state, kept together: its worker task (once an operation of the
    env did not run inline), the future the idle worker waits on (an operation is handed
    over by setting it), and an operation submitted while the worker was busy delivering.
    One object per env rather than a dict per field: a step reads and writes them all,
    and at thousands of envs each dict lookup was a trip to a different part of memory."""

    __slots__ = ("idle", "queued", "steps", "worker")

    def __init__(self) -> None:
        self.worker: asyncio.Task[Any] | None = None
        self.idle: asyncio.Future[tuple[str, Any]] | None = None
        self.queued: tuple[str, Any] | None = None
        # the worker's env does not run its steps inline (found by submit)
        self.steps = False

    def clear(self) -> None:
        """The worker ended or was given up."""
        self.worker = self.idle = self.queued = None
        self.steps = False


def _build(fn: Callable[[], EnvBase]) -> EnvBase:
    env = fn()
    if not isinstance(env, EnvBase):
        raise TypeError(f"an env factory must return an aenv EnvBase, got {type(env).__name__}")
    return env


def _async_close(env: EnvBase) -> bool:
    return type(env)._aclose is not EnvBase._aclose


async def _quiet_close(env: EnvBase) -> None:
    with contextlib.suppress(Exception):
        await env.aclose()
