"""The process backend: sub-envs in worker processes, several envs per worker.

Each worker (:mod:`aenv.pool._process_worker`) hosts a group of envs on its own event loop.
Per worker the parent holds one socket (the control plane, :mod:`aenv.pool._channel`),
watched by the pool's event loop with ``loop.add_reader``: results stream in as each env
finishes, with no polling thread and no busy wait. Tensors travel through shared-memory
slots planned from the specs the workers sent (:mod:`aenv.pool._shm`); a message per step
is a tiny tuple. Commands submitted in one loop turn go out as one frame per worker.

Whole-batch calls take :meth:`ProcessBackend.launch`: one ``("batch", ...)`` command per
worker (sent as soon as its envs' inputs are in their slots), one reply per worker once all
its envs are done (as each finishes when a step timeout needs to know), results read back
from the worker's blocks with one copy per leaf (:class:`~aenv.pool._shm.Block`). Where the
pool's envs are laid out as consecutive block rows (:class:`~aenv.pool._shm.StackedBlocks`),
a whole-batch step takes the pool's stacked input into the blocks and gives the stacked
results out of them, with no per-env TensorDict in the parent. One shared region holds
every worker's slots (planned at start from all the workers' specs), so a like pool's
results are one view per leaf across workers: they are handed out in place
(``Stacked.owned`` False) and copied once, by whoever keeps them (a rollout's time rows, the
pool's step). The streamed calls take the per-env path (:meth:`ProcessBackend.submit`) over
the same rows: a streamed send's inputs are staged into the shared ``"in"`` rows and each
result is held in its rows until it is received (:mod:`aenv.pool._process_stream`).

A stacked call's commands and replies skip the socket: each worker's share is rung on its
doorbell (:mod:`aenv.pool._process_bell`: a shared page and an eventfd per worker) and
each worker writes its answer into its page once all its envs' results are in the rows;
only the last worker of the call to finish wakes the parent (the pool's tally: one wake-up
per call, which then reads every worker's page). What cannot come back that way (a
failure, a pickled result, a streamed batch of a call with a step timeout) still takes a
``"b"`` frame, and a call is rung only when nothing waits to be written to the worker's
socket before it, so the worker, which reads its socket before taking a call (when the
doorbell's page says a frame waits there), sees every command in the order it was sent. A
chained step of an overlapped rollout, staged with its actions only, has its observation
and done flags carried over from the step before by the rung workers, each for its own
envs (the parent carries those of a call sent over the socket). Such a step is armed
ahead on every worker's doorbell (up to ``BANKS - 1`` of them, each after the one before,
each on the bank after the one before's), and the last worker of the step before it rings
it there once that step came back whole, before the parent is woken to take the step before
(:mod:`aenv.pool._process_bell`); the parent rings it where it armed it too late, and takes
it back (with every step armed after it) where the step before failed or was given up.

Faults: a worker that dies is seen at once (EOF on its socket); its envs' pending
operations fail with :class:`~aenv.exceptions.WorkerCrashedError` (exit code or signal
attached), its other envs are marked lost (their next step fails the same way until they
are reset), and it is respawned with fresh envs. :meth:`ProcessBackend.replace` tells the
worker to rebuild one env and kills the worker if it does not answer in time (a step stuck
in C code, a ``time.sleep`` in a sync env).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import multiprocessing
import multiprocessing.connection
import operator
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.exceptions import (
    BackendUnavailableError,
    EnvStepError,
    StepTimeoutError,
    WorkerCrashedError,
    WorkerRestartError,
)
from aenv.pool import _codec as codec
from aenv.pool._backend import Backend, BatchCall, Failure, Stacked
from aenv.pool._channel import Channel, ChannelClosed
from aenv.pool._process_bell import CARRY_NEXT, CARRY_RESET, MAX_PEERS, STEPS, Bell, Tally
from aenv.pool._process_stream import SharedRows
from aenv.pool._process_support import (
    ClosingMixin,
    kill_all,
    kill_owned,
    kill_quietly,
    parent_only,
    weak_callback,
)
from aenv.pool._process_support import Worker as _Worker
from aenv.pool._process_worker import PICKLED, SLOT, worker_main
from aenv.pool._rows import _copier as copier
from aenv.pool._shm import (
    BANKS,
    Block,
    Slot,
    StackedBlocks,
    make_region,
    map_blocks,
    map_region,
    map_slots,
    plan_layout,
    slice_blocks,
)

__all__ = ["DEFAULT_START_METHOD", "ProcessBackend"]

#: Start method used when none is given (the ``AENV_START_METHOD`` variable overrides it).
DEFAULT_START_METHOD = "forkserver"
_DUMP = pickle.HIGHEST_PROTOCOL
_DIRECT_OPS = frozenset(("reset", "seed", "getattr", "call"))
_SLOT_OPS = frozenset(("step", "step_and_maybe_reset"))
_TIMED_OPS = frozenset(("step", "reset", "step_and_maybe_reset"))
#: what an env with no call in flight compares as (no sequence number matches it)
_GONE = (None, None)
#: an answer entry's env, code and data (a result in the rows: whether the step reset it)
_ENV_OF, _CODE_OF, _THIRD = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


class _Flags(dict[int, bytes]):
    """``n`` -> the doorbell flags of ``n`` envs that all step and carry from "next"."""

    def __missing__(self, n: int) -> bytes:
        flags = self[n] = bytes([STEPS | CARRY_NEXT]) * n
        return flags


_CARRY_NEXT = _Flags()


def _answer_entries(w: _Worker, outcomes: bytes) -> list[tuple[int, int, Any]]:
    """The ``"b"`` entries of ``w``'s answer on its page (one outcome byte per env: 0 not
    in the call, 1 in the rows, 2 in the rows and reset), made once per pattern (the
    list is shared: not to be changed)."""
    made = w.answers.get(outcomes)
    if made is None:
        if len(w.answers) >= 64:
            w.answers.clear()
        made = w.answers[outcomes] = [
            (i, SLOT, flag == 2) for i, flag in zip(w.indices, outcomes) if flag
        ]
    return made


class _Batch(BatchCall):
    """A whole-batch call in flight (:meth:`ProcessBackend.launch`). ``raw`` for a stacked
    call: its outcomes are the workers' undecoded ``(env, code, data)`` entries at the
    envs' own positions, the results staying in the bank's blocks until all are in."""

    __slots__ = (
        "after",
        "ahead",
        "armed",
        "backend",
        "bank",
        "blocks",
        "future",
        "indices",
        "left",
        "op",
        "outcomes",
        "picked",
        "raw",
        "resets",
        "sent",
        "seq",
        "stepping",
        "stray",
        "then",
        "timer",
    )

    def __init__(
        self,
        backend: ProcessBackend,
        op: str,
        indices: Sequence[int],
        future: asyncio.Future[None],
        raw: bool = False,
    ) -> None:
        self.backend = backend
        self.op = op
        self.indices = indices
        self.outcomes: list[Any] = [None] * len(indices)
        self.left = len(indices)
        self.future = future
        self.raw = raw
        self.timer: asyncio.TimerHandle | None = None
        self.bank = 0
        self.sent = False
        #: once complete, a stacked call's: whether every env answered in the blocks, and
        #: which envs the step reset (see :meth:`in_blocks`, :meth:`reset_flags`)
        self.blocks: bool | None = None
        self.resets: list[bool] | None = None
        #: how many outcomes are not results in the blocks (decoded, failed, pickled)
        self.stray = 0
        #: a masked stacked call: the envs it steps, in the caller's order (None: every env)
        self.picked: Sequence[int] | None = None
        self.stepping: frozenset[int] | None = None
        #: the call this one is chained to (sent when that one ends well), and the call
        #: chained to this one, as the function that sends it
        self.after: _Batch | None = None
        self.then: Callable[[], None] | None = None
        #: the call chained to this one; this call's sequence number once sent or armed;
        #: whether it is armed for the workers to ring (see :meth:`ProcessBackend._arm`)
        self.ahead: _Batch | None = None
        self.seq = 0
        self.armed = False

    def wait(self) -> Coroutine[Any, Any, Stacked | list[Any]]:
        return self.backend._finish(self)  # (awaited by the caller: no frame of its own)

    def abandon(self) -> None:
        self.backend._give_up(self)

    def in_blocks(self) -> bool:
        """Whether every env answered with its results in the blocks (a stacked call
        complete: looked at once, by the call chained to it and by its waiter)."""
        blocks = self.blocks
        if blocks is None:
            if self.left:
                return False
            blocks = self.blocks = not self.stray
        return blocks

    def reset_flags(self) -> list[bool]:
        """Per env, whether the step reset it (a stacked call complete in the blocks)."""
        resets = self.resets
        if resets is None:
            # (every outcome an ``(env, SLOT, reset)`` entry: see in_blocks)
            resets = self.resets = list(map(bool, map(_THIRD, self.outcomes)))
        return resets

    def store(self, pos: int, outcome: Any) -> None:
        """An env's outcome (decoded, or a failure: not in the blocks)."""
        self.outcomes[pos] = outcome
        self.stray += 1
        self.took(1)

    def took(self, n: int) -> None:
        """``n`` more outcomes are in (stored by the caller): the call ends with the last."""
        self.left -= n
        if not self.left:
            if not self.future.done():
                self.future.set_result(None)  # (its waiter resumes later in this loop turn)
            # (a call given up has no ``then``, but for a chained call the workers rang,
            # recorded once this call is whole: see ProcessBackend._settle)
            then, self.then = self.then, None
            if then is not None:
                then()


class ProcessBackend(ClosingMixin, Backend):
    """Runs sub-envs in worker processes (see the module docstring).

    Options (``backend_options=`` of the pool):
        num_workers: number of worker processes (default: ``min(num_envs, cpu_count)``).
        envs_per_worker: envs per worker instead (the last worker may hold fewer).
        start_method: ``"forkserver"`` (default: workers are forked from a server process
            that imported the worker module, torch and tensordict once, shared by the pools
            of the process and safe beside a loop thread), ``"spawn"`` or ``"fork"``;
            the ``AENV_START_METHOD`` environment variable sets the default.
        num_threads: ``torch.set_num_threads`` in each worker (default 1; None leaves it).
        restart_workers: respawn a worker that died (default True).
        replace_timeout: seconds a worker has to answer when one of its envs is given up
            (step timeout, restart) before it is killed and respawned (default 2). A worker
            whose loop is blocked by the given-up env itself (its watchdog thread sees the
            env's code running there) is killed at once.
        restart_attempts: starts in a row whose envs fail to build (a factory that raises
            after a crash) before a worker is given up, its envs then failing with
            :class:`~aenv.exceptions.WorkerRestartError` (default 5); the tries back off,
            ``restart_backoff`` seconds doubling each time (default 0.1).
    """

    name = "process"

    def __init__(
        self,
        deliver: Any,
        *,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        start_method: str | None = None,
        num_threads: int | None = 1,
        restart_workers: bool = True,
        replace_timeout: float = 2.0,
        restart_attempts: int = 5,
        restart_backoff: float = 0.1,
    ) -> None:
        super().__init__(deliver)
        if sys.platform == "win32":  # pragma: no cover
            raise BackendUnavailableError("the process backend needs a Unix platform")
        if num_workers is not None and envs_per_worker is not None:
            raise ValueError("pass num_workers or envs_per_worker, not both")
        for name, value in (("num_workers", num_workers), ("envs_per_worker", envs_per_worker)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.num_workers = num_workers
        self.envs_per_worker = envs_per_worker
        self.start_method = (
            start_method or os.environ.get("AENV_START_METHOD") or DEFAULT_START_METHOD
        )
        self.num_threads = num_threads
        self.restart_workers = restart_workers
        self.replace_timeout = replace_timeout
        if restart_attempts < 1:
            raise ValueError(f"restart_attempts must be >= 1, got {restart_attempts}")
        self.restart_attempts = restart_attempts
        self.restart_backoff = restart_backoff
        #: the doorbell call last rung: its sequence number and the workers rung
        self._rung: tuple[int, list[_Worker]] | None = None
        #: the pool's tally of the workers that finished a doorbell call (None: no doorbell)
        self._tally: Tally | None = None
        #: every worker of the call rung last answered it on its page (no token left)
        self._drained = False
        #: whether the workers ring chained calls (each has every worker's go counter:
        #: until a worker is started again), and per bank the chained call armed for them
        self._peer_rings = False
        self._armed: dict[int, _Batch] = {}
        #: answers of armed calls the workers rang, taken before the call was recorded
        #: as rung (the call before it not whole yet here): handled once it is
        self._parked: dict[int, list[tuple[int, int, Any]]] = {}
        self._taking = False  # (in _take_answers)
        self._ctx = multiprocessing.get_context(self.start_method)
        self._workers: list[_Worker] = []
        self._of_env: list[_Worker] = []
        self._slots: list[dict[str, Slot] | None] = []
        self._inflight: list[tuple[int, str] | None] = []
        self._lost: list[str | None] = []
        self._last_cmd: list[tuple[Any, ...] | None] = []
        self._batch_of: list[tuple[_Batch, int] | None] = []
        self._rows: list[tuple[dict[str, Block], int] | None] = []
        # per bank (see aenv.pool._shm): the slots and block rows of each env; bank 0's are
        # _slots and _rows
        self._bank_slots: list[list[dict[str, Slot] | None]] = []
        self._bank_rows: list[list[tuple[dict[str, Block], int] | None]] = []
        # per bank: the blocks as one stacked batch, or None
        self._stacked: list[StackedBlocks] | None = None
        self._copiers: list[Callable[[], TensorDictBase] | None] = []
        #: the streamed steps' shared rows (see :meth:`shared_stream_rows`), and per env
        #: whether its operation in flight reads its input from them (its result is then
        #: held there too, when it fits)
        self._srows: SharedRows | None = None
        self._row_op: bytearray = bytearray()
        # env -> cancels sent for it whose "cx" acknowledgement has not come back: until
        # it has, the worker may still read the env's input slot for the cancelled op, so
        # the env's inputs travel pickled (never written over that op's input)
        self._fences: dict[int, int] = {}
        self._seq = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_pending = False
        self._closing = False
        self._planning = False  # (start: metadata taken, regions planned after)
        self._procs: list[Any] = []
        self._lifeline: Any = None
        self._lifeline_r: Any = None
        self._channels: list[Any] = []  # every worker socket watched (the finalizer's)
        self._probes: list[socket.socket] = []  # every worker's probe socket (the finalizer's)
        self._finalizer = weakref.finalize(
            self, kill_all, self._procs, self._channels, self._probes
        )

    # ------------------------------------------------------------------ start
    def start(self, env_fns: Sequence[Callable[[], EnvBase]]) -> list[EnvMetaData]:
        import cloudpickle

        self.env_fns = list(env_fns)
        n = len(self.env_fns)
        if self.envs_per_worker is not None:
            per = self.envs_per_worker
        else:
            workers = self.num_workers or min(n, os.cpu_count() or 1)
            per = -(-n // min(workers, n))
        groups = [list(range(k, min(k + per, n))) for k in range(0, n, per)]
        if self.start_method == "forkserver":
            self._ctx.set_forkserver_preload(["aenv.pool._process_worker"])
        self._lifeline_r, self._lifeline = self._ctx.Pipe(duplex=False)
        parent_only(self._lifeline)
        if Bell.available():
            self._tally = Tally()
            self._channels.append(self._tally)  # (the finalizer's, as the sockets)
        self._bank_slots = [[None] * n for _ in range(BANKS)]
        self._bank_rows = [[None] * n for _ in range(BANKS)]
        self._slots = self._bank_slots[0]
        self._inflight = [None] * n
        self._lost = [None] * n
        self._last_cmd = [None] * n
        self._batch_of = [None] * n
        self._row_op = bytearray(n)
        self._rows = self._bank_rows[0]
        try:
            for wid, indices in enumerate(groups):
                blob = cloudpickle.dumps([self.env_fns[i] for i in indices])
                w = _Worker(wid, indices, blob)
                self._workers.append(w)
                self._spawn(w)
            self._of_env = [w for w in self._workers for _ in w.indices]
            metas: dict[int, EnvMetaData] = {}
            # every worker's metadata first: one region is planned for all of them
            self._planning = True
            for w in self._workers:
                metas.update(self._handshake_blocking(w))
            self._planning = False
            self._plan_region(self._workers, metas)
            peers = self._ring_peers()
            for w in self._workers:
                self._hand_over(w, peers)
        except BaseException:
            self.abort()
            raise
        self._note_creator_metas(metas)
        self._stacked = self._plan_stacked()
        # per bank: a fresh copy of its "next" rows through numpy views made once
        self._copiers = [
            None if rows is None else copier(rows)
            for rows in (s.rows("next") for s in self._stacked or ())
        ]
        return [metas[i] for i in range(n)]

    def _plan_stacked(self) -> list[StackedBlocks] | None:
        """Per bank, the blocks of the workers as one stacked batch, when each worker's
        envs are one group whose rows are the envs in order (see :class:`StackedBlocks`)."""
        banks = []
        n = len(self._inflight)
        for rows in self._bank_rows:
            first = rows[0]
            if first is not None and all(
                (at := rows[i]) is not None and at[0] is first[0] and at[1] == i for i in range(n)
            ):
                # one set of blocks for the whole pool (one region): the parts slice it
                whole = first[0]
                parts = [
                    (
                        slice_blocks(whole, w.indices[0], w.indices[-1] + 1),
                        w.indices[0],
                        w.indices[-1] + 1,
                    )
                    for w in self._workers
                ]
                stacked = StackedBlocks.plan(parts, whole)
                if stacked is None:
                    return None
                banks.append(stacked)
                continue
            parts = []
            for w in self._workers:
                first = rows[w.indices[0]]
                if first is None:
                    return None
                blocks = first[0]
                for row, i in enumerate(w.indices):
                    at = rows[i]
                    if at is None or at[0] is not blocks or at[1] != row:
                        return None
                parts.append((blocks, w.indices[0], w.indices[-1] + 1))
            stacked = StackedBlocks.plan(parts)
            if stacked is None:
                return None
            banks.append(stacked)
        return banks

    def _spawn(self, w: _Worker) -> None:
        parent_sock, child_sock = socket.socketpair()
        probe, child_probe = socket.socketpair()
        parent_only(parent_sock, probe)
        main_thread = threading.current_thread() is threading.main_thread()
        watch_pid = os.getpid() if self.start_method != "forkserver" and main_thread else None
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(
                child_sock,
                self._lifeline_r,
                w.blob,
                w.indices,
                watch_pid,
                self.num_threads,
                child_probe,
            ),
            name=f"aenv-worker-{w.wid}",
            daemon=True,
        )
        try:
            proc.start()
        except BaseException:
            probe.close()
            raise
        finally:
            child_sock.close()
            child_probe.close()
        w.close_probe(self._loop)
        probe.setblocking(False)
        w.probe = probe
        self._probes[:] = [p for p in self._probes if p.fileno() >= 0]
        self._probes.append(probe)
        w.proc = proc
        w.chan = Channel(parent_sock)
        self._channels[:] = [c for c in self._channels if not c.closed]
        self._channels.append(w.chan)
        w.state = "starting"
        self._procs.append(proc)

    def _handshake_blocking(self, w: _Worker) -> dict[int, EnvMetaData]:
        chan = w.chan
        assert chan is not None
        while True:
            ready = multiprocessing.connection.wait([chan.sock, w.proc.sentinel])
            if chan.sock in ready:
                try:
                    (frame,) = chan.recv_blocking(limit=1)
                except ChannelClosed:
                    w.proc.join(5.0)
                    raise self._crash_error(w, None, "while building its envs") from None
                return self._on_meta(w, frame[0])
            w.proc.join(0)
            if w.proc.exitcode is not None:
                raise self._crash_error(w, None, "while building its envs")

    def _on_meta(self, w: _Worker, msg: tuple[Any, ...]) -> dict[int, EnvMetaData]:
        """First message of a worker: its envs' metadata, or the error that stopped it."""
        if msg[0] == "failed":
            exc, tb = pickle.loads(msg[1])
            w.failure = Failure(exc, tb)
            w.state = "broken"
            if tb:
                exc.add_note(f"Remote traceback (worker {w.wid}):\n{tb.rstrip()}")
            raise exc
        metas: dict[int, EnvMetaData] = msg[1]
        w.failed_starts = 0
        if w.region_fd < 0:
            if self._planning:
                return metas  # (start plans one region for every worker, then hands over)
            self._plan_region([w], metas)
        self._hand_over(w)
        return metas

    def _plan_region(self, workers: list[_Worker], metas: dict[int, EnvMetaData]) -> None:
        """Lay the slots of ``workers``' envs out in one new shared region (see
        :func:`~aenv.pool._shm.plan_layout`). Planned for the whole pool at once, like
        envs' rows are consecutive across workers: a whole batch's results are then one
        view per leaf, read in place (:meth:`StackedBlocks.rows`)."""
        layouts, groups, bank_size = plan_layout(metas)
        size = BANKS * bank_size
        fd = make_region(size)
        try:
            flat = map_region(fd, size)
            for k, w in enumerate(workers):
                # (each worker its own descriptor: each is closed with its worker)
                w.region_fd = fd if k == 0 else os.dup(fd)
                w.region_size, w.bank_size, w.flat = size, bank_size, flat
                w.layouts = {i: layouts[i] for i in w.indices}
        except BaseException:
            if workers[0].region_fd != fd:
                os.close(fd)
            raise
        for bank in range(BANKS):
            view = flat[bank * bank_size :]
            for i, layout in layouts.items():
                self._bank_slots[bank][i] = map_slots(view, layout)
            for group in groups:
                blocks = map_blocks(view, group)
                for row, i in enumerate(group[0]):
                    self._bank_rows[bank][i] = (blocks, row)

    def _ring_peers(self) -> list[int] | None:
        """Make every worker's doorbell (at start): each worker is given every worker's
        go counter, to ring the chained calls (see :mod:`aenv.pool._process_bell`); None
        where there is no doorbell, or too many workers."""
        tally = self._tally
        if tally is None or len(self._workers) > MAX_PEERS:
            return None
        for w in self._workers:
            w.close_bell()
            w.bell = Bell(len(w.indices), tally=tally)
        tally.set_workers(len(self._workers))
        self._peer_rings = True
        return [w.bell.go_fd for w in self._workers]  # type: ignore[union-attr]

    def _hand_over(self, w: _Worker, peers: list[int] | None = None) -> None:
        """Give a worker that sent its metadata its region and doorbell (made already,
        and every worker's go counter, with ``peers``): it is ready."""
        assert w.chan is not None
        if peers is None:
            # a doorbell per start: nothing a dead worker rang or answered reaches this one
            w.close_bell()
            if self._tally is not None:
                w.bell = Bell(len(w.indices), tally=self._tally)
        fds = [w.region_fd, *(w.bell.fds if w.bell is not None else ())]
        slots: tuple[Any, ...] = ("slots", w.region_size, w.layouts, w.bank_size)
        if peers is not None:
            fds += peers
            slots += (w.wid,)
        w.chan.send_fds(fds)
        self._send_out(w, [slots])
        w.state = "ready"
        if w.outbox:
            out, w.outbox = w.outbox, []
            self._send_out(w, out)

    def _note_creator_metas(self, metas: dict[int, EnvMetaData]) -> None:
        # an EnvCreator (aenv.sync) keeps the metadata its envs reported: told by duck
        # typing, the pool sitting below the sync layer
        for i, fn in enumerate(self.env_fns):
            note = getattr(fn, "_note_meta_data", None)
            if note is not None:
                note(metas[i])

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.pid for w in self._workers if w.pid is not None and w.state != "closed"]

    # ------------------------------------------------------------------ the loop
    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for w in self._workers:
            if w.chan is not None and not w.chan.closed:
                w.chan.attach(loop, weak_callback(self._on_readable, w))
        if self._tally is not None:
            self._tally.attach(loop, weak_callback(self._on_done))

    def _schedule_flush(self) -> None:
        if not self._flush_pending and self._loop is not None:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        for w in self._workers:
            if w.outbox and w.state == "ready" and w.chan is not None:
                out, w.outbox = w.outbox, []
                with contextlib.suppress(ChannelClosed):
                    self._send_out(w, out)

    def _send_out(self, w: _Worker, out: list[tuple[Any, ...]]) -> None:
        """Send a frame of commands to ``w``; its doorbell's page counts it, so that the
        worker, rung, reads its socket first only when a frame waits there."""
        assert w.chan is not None
        w.chan.send(out)
        if w.bell is not None:
            w.bell.note_sent(w.chan.sent)

    def _on_readable(self, w: _Worker) -> None:
        chan = w.chan
        if chan is None or chan.closed:
            return
        try:
            frames = chan.read_frames()
        except ChannelClosed:
            self._worker_died(w)
            return
        for frame in frames:
            for msg in frame:
                self._on_message(w, msg)

    def _on_done(self) -> None:
        """The last worker of a doorbell call finished: its envs' answers, and the other
        rung workers', are in their pages (see :mod:`aenv.pool._process_bell`)."""
        tally = self._tally
        if tally is None or self._closing:
            return
        tally.take()
        self._take_answers()

    def _take_answers(self) -> None:
        """Take every answer the workers wrote into their pages since last taken; each is
        handled as the ``"b"`` frame it replaces (results in the rows)."""
        taking, self._taking = self._taking, True
        try:
            self._take_pages()
        finally:
            self._taking = taking

    def _take_pages(self) -> None:
        answers = []
        for w in self._workers:
            bell = w.bell
            if bell is not None:
                done = bell.take_done()
                while done is not None:  # (a chained call may be answered before this)
                    answers.append((w, done))
                    done = bell.take_done()
        rung = self._rung
        if rung is not None:
            # (before the answers are handled: they may ring the call chained to these)
            seq, drained = rung[0], True
            for w in rung[1]:
                if w.bell is None or w.bell.taken != seq:
                    drained = False
            self._drained = drained
        if not answers:
            return
        # (one reply per call: the workers rung for it answer together; the common case,
        # every answer of one call, without sorting)
        seq = answers[0][1][0]
        entries: list[tuple[int, int, Any]] = []
        for w, (at, outcomes) in answers:
            if at != seq:
                break
            entries += _answer_entries(w, outcomes)
        else:
            if entries:
                self._on_batch_reply(seq, entries)
            return
        # (a call before the call chained to it, which the workers rang)
        replies: dict[int, list[tuple[int, int, Any]]] = {}
        for w, (seq, outcomes) in answers:
            replies[seq] = replies.get(seq, []) + _answer_entries(w, outcomes)
        for seq in sorted(replies):
            entries = replies[seq]
            if entries:
                self._on_batch_reply(seq, entries)

    def _on_message(self, w: _Worker, msg: tuple[Any, ...]) -> None:
        if self._closing:
            return
        kind = msg[0]
        if kind == "b":
            self._on_batch_reply(msg[1], msg[2])
        elif kind == "r":
            _, i, seq, code, data = msg
            inflight = self._inflight[i]
            if inflight is None or inflight[0] != seq:
                return  # given up (replace / cancel)
            self._inflight[i] = None
            row_op = self._row_op[i]
            if row_op:
                self._row_op[i] = 0
                if code == SLOT and self._srows is not None:
                    # the result stays in the rows until it is received
                    self._complete(i, self._srows.hold(i, inflight[1], bool(data)))
                    return
            self._complete(i, self._decode(i, inflight[1], code, data))
        elif kind == "cx":
            _, i, n = msg
            left = self._fences.get(i, 0) - n
            if left > 0:
                self._fences[i] = left
            else:
                self._fences.pop(i, None)
        elif kind == "ack":
            timer = w.ack_timers.pop(msg[1], None)
            if timer is not None:
                timer.cancel()
        elif kind in ("meta", "failed"):
            try:
                self._on_meta(w, msg)
            except BaseException:
                self._fail_worker_envs(w, w.failure)

    def _complete(self, i: int, outcome: Any) -> None:
        """Hand env ``i``'s outcome to the whole-batch call waiting for it, or to the pool."""
        entry = self._batch_of[i]
        if entry is None:
            self._deliver(i, outcome)
        else:
            self._batch_of[i] = None
            entry[0].store(entry[1], outcome)

    def _on_batch_reply(self, seq: int, entries: list[tuple[int, int, Any]]) -> None:
        inflight = self._inflight
        for first in entries:  # (the first env still waiting for this call)
            current = inflight[first[0]]
            if current is not None and current[0] == seq:
                break
        else:
            if self._armed_as(seq) is not None:
                # a chained call the workers rang, answered before it was recorded as
                # rung here (the call before it is not whole here yet: some of its answers
                # are still in the pages, or held by the pass taking them): kept for then
                self._parked.setdefault(seq, []).extend(entries)
                if not self._taking:  # (over the socket: the pages are taken first)
                    self._take_answers()
            return
        batch_of = self._batch_of
        held = batch_of[first[0]]
        if held is not None and held[0].raw:
            # a stacked batch (its envs at their own positions, each waiting with the
            # call's one ``(seq, op)``): the results are read from the blocks once all
            # are in
            batch = held[0]
            outcomes = batch.outcomes
            n = len(entries)
            start = entries[0][0]
            stop = start + n
            if inflight[start:stop].count(current) == n and list(map(_ENV_OF, entries)) == list(
                range(start, stop)
            ):
                # (a run of envs all waiting for the call, in order, as the pages answer:
                # one slice write per list)
                inflight[start:stop] = [None] * n
                batch_of[start:stop] = [None] * n
                outcomes[start:stop] = entries
                batch.stray += n - list(map(_CODE_OF, entries)).count(SLOT)
                batch.took(n)
                return
            n = 0
            for entry in entries:
                i = entry[0]
                if inflight[i] is current:
                    inflight[i] = None
                    batch_of[i] = None
                    outcomes[i] = entry
                    if entry[1] != SLOT:
                        batch.stray += 1
                    n += 1
            batch.took(n)
            return
        live = [entry for entry in entries if (inflight[entry[0]] or _GONE)[0] == seq]
        op = current[1]
        for entry, outcome in zip(live, self._decode_batch(op, live)):
            inflight[entry[0]] = None
            self._complete(entry[0], outcome)

    def _decode_batch(self, op: str, entries: list[tuple[int, int, Any]]) -> list[Any]:
        """The outcomes of some envs of one worker; results in consecutive rows of one
        group's blocks are copied out at once."""
        first = self._rows[entries[0][0]]
        if first is not None and op in _TIMED_OPS:
            blocks, start = first
            rows = self._rows
            fast = True
            for k, (i, code, _) in enumerate(entries):
                at = rows[i]
                if code != SLOT or at is None or at[0] is not blocks or at[1] != start + k:
                    fast = False
                    break
            if fast:
                try:
                    tds = blocks["reset" if op == "reset" else "next"].read_rows(
                        start, start + len(entries)
                    )
                except Exception as exc:
                    return [Failure(exc)] * len(entries)
                if op != "step_and_maybe_reset":
                    return tds
                out: list[Any] = []
                for td, (i, _, reset) in zip(tds, entries):
                    if reset:
                        slots = self._slots[i]
                        assert slots is not None
                        out.append((td, slots["reset"].read()))
                    else:
                        out.append((td, None))
                return out
        return [self._decode(i, op, code, data) for i, code, data in entries]

    def _decode(self, i: int, op: str, code: int, data: Any, bank: int = 0) -> Any:
        try:
            if code == SLOT:
                slots = self._bank_slots[bank][i]
                assert slots is not None
                if op == "step":
                    return slots["next"].read()
                if op == "reset":
                    return slots["reset"].read()
                return slots["next"].read(), (slots["reset"].read() if data else None)
            if code == PICKLED:
                return codec.loads(data)
            exc, tb = pickle.loads(data)
            return Failure(exc, tb)
        except Exception as exc:
            return Failure(exc)

    # ------------------------------------------------------------------ operations
    def submit(self, env_index: int, op: str, payload: Any) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        refused = self._refuse(env_index, op)
        if refused is not None:
            self._deliver(env_index, refused)
            return
        srows = self._srows
        row_op = 0
        if srows is not None:
            if srows.held[env_index] is not None:
                srows.evict(env_index)  # (its rows are about to be written)
            if op in _SLOT_OPS and srows.row_of(env_index, payload):
                # a streamed send's input, in the env's shared row already
                row_op = 1
        self._row_op[env_index] = row_op
        data = None if row_op else self._encode(env_index, op, payload)
        seq = next(self._seq)
        self._inflight[env_index] = (seq, op)
        cmd = ("op", env_index, seq, op, data)
        self._last_cmd[env_index] = cmd
        self._of_env[env_index].outbox.append(cmd)
        self._schedule_flush()

    def _refuse(self, env_index: int, op: str) -> Failure | None:
        """The failure of an op that cannot be sent (broken worker, lost env), else None."""
        w = self._of_env[env_index]
        if w.state == "broken":
            return w.failure
        lost = self._lost[env_index]
        if lost is not None:
            if op not in _DIRECT_OPS:
                err = WorkerCrashedError(
                    f"env {env_index} was lost: {lost}; it was rebuilt and needs a reset",
                    env_index=env_index,
                )
                return Failure(err, "")
            if op == "reset":
                self._lost[env_index] = None
        return None

    def _encode(self, env_index: int, op: str, payload: Any) -> bytes | None:
        """The command's data: None when the input went into the env's slot (or for a
        plain reset), else the pickled payload. The slot is not written while something
        may still read it: a cancelled op (the fences) or a streamed result not received
        yet (the shared stream rows' ``pending``)."""
        if op in _SLOT_OPS:
            slots = self._slots[env_index]
            srows = self._srows
            if (
                slots is not None
                and env_index not in self._fences
                and (srows is None or not srows.pending[env_index])
                and slots["in"].write_input(payload)
            ):
                return None
        elif op == "reset" and payload[0] is None and not payload[1]:
            return None
        return codec.dumps(payload)

    def shared_stream_rows(self, sub_batch: torch.Size) -> SharedRows | None:
        """The input rows of streamed steps over the shared rows the whole-batch steps use
        (:mod:`aenv.pool._process_stream`), where one view per leaf holds the whole pool;
        their results are held in the rows until received."""
        stacked = self._stacked
        if self._srows is None and stacked is not None:
            rows = {kind: stacked[0].rows(kind) for kind in ("in", "next", "reset")}
            if all(td is not None for td in rows.values()):
                srows = SharedRows(rows, sub_batch, self._fences)  # type: ignore[arg-type]
                if srows.ok:
                    self._srows = srows
        return self._srows

    # ------------------------------------------------------------------ whole batch
    @property
    def overlaps_steps(self) -> bool:
        return self._stacked is not None

    def launch(
        self,
        op: str,
        inputs: Any,
        step_timeout: float | None,
        indices: Sequence[int] | None = None,
        *,
        bank: int = 0,
        after: BatchCall | None = None,
    ) -> BatchCall | None:
        """One ``("batch", ...)`` command per worker with envs to work (or its doorbell);
        each worker runs its envs' ops (inline when sync, as tasks when async) and answers
        once with all of them. A stacked input (the envs laid out as consecutive block
        rows) is written into ``bank``'s blocks with one copy per leaf and the results come
        out of them the same way, with no per-env TensorDict in the parent; per-env
        payloads go into the envs' slots, or pickled. Failures, crashes, timeouts and
        cancellation are per env, as for :meth:`submit`."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        srows = self._srows
        if srows is not None:
            # (the rows are about to be written; a chained call's, staged already, come
            # after the first call of their rollout, which evicted what was held)
            srows.evict_all()
        stacked = self._stacked
        if inputs is None:  # (a chained call's actions, staged already: see stager)
            if stacked is None or after is None or not stacked[bank].partial:
                return None
        elif type(inputs) is not TensorDict and not isinstance(inputs, TensorDictBase):
            assert indices is not None
            return self._send_payloads(op, indices, inputs, step_timeout)
        if op not in _SLOT_OPS or stacked is None or self._fences or self._refusing():
            return None
        if self._rows_still_read(indices):
            return None
        staged = stacked[bank]
        if inputs is not None and not staged.write_inputs(inputs):
            return None
        if after is not None:
            assert isinstance(after, _Batch) and after.then is None
            batch = self._stacked_call(op, bank)
            batch.after = after
            after.ahead = batch
            if not after.left:  # (back already, with the answers of the call before it)
                self._send_chained(after, batch, step_timeout)
                return batch
            after.then = functools.partial(self._send_chained, after, batch, step_timeout)
            if self._may_arm(after, batch, step_timeout):
                self._arm(after, batch)
            return batch
        if staged.partial:
            return None  # (only the actions were staged: the rest is a chained call's)
        batch = self._stacked_call(op, bank, indices)
        self._send_stacked(batch, step_timeout)
        return batch

    def stager(self, rows: dict[str, torch.Tensor]) -> Callable[[int, int], None] | None:
        """Row ``t`` of a rollout's random actions ``rows`` staged into a bank's input
        blocks (:meth:`~aenv.pool._shm.StackedBlocks.stager`, planned once per bank),
        for a chained :meth:`launch` with no inputs; None where they do not fit."""
        if self._stacked is None:
            return None
        stages = [blocks.stager(rows) for blocks in self._stacked]
        if any(stage is None for stage in stages):
            return None

        def stage(bank: int, t: int) -> None:
            stages[bank](t)  # type: ignore[misc]

        return stage

    def _send_payloads(
        self, op: str, indices: Sequence[int], payloads: Sequence[Any], step_timeout: float | None
    ) -> _Batch:
        batch = _Batch(self, op, indices, self._loop.create_future())  # type: ignore[union-attr]
        timed = step_timeout is not None and op in _TIMED_OPS
        seq = next(self._seq)
        current: _Worker | None = None
        items: list[tuple[int, Any]] = []
        try:
            for pos, (i, payload) in enumerate(zip(indices, payloads)):
                refused = self._refuse(i, op)
                if refused is not None:
                    batch.store(pos, refused)
                    continue
                try:
                    data = self._encode(i, op, payload)
                except Exception as exc:
                    batch.store(pos, Failure(exc))
                    continue
                w = self._of_env[i]
                if w is not current:
                    # a worker's envs are consecutive: send its share as soon as it is
                    # complete, so it starts while the next worker's inputs are written
                    if current is not None:
                        self._send_batch(current, seq, op, items, timed)
                    current, items = w, []
                items.append((i, data))
                self._inflight[i] = (seq, op)
                self._batch_of[i] = (batch, pos)
                self._last_cmd[i] = ("op", i, seq, op, data)
            if current is not None:
                self._send_batch(current, seq, op, items, timed)
        except BaseException:
            self._abandon(batch)
            raise
        batch.sent = True
        if timed and batch.left:
            self._start_timer(batch, step_timeout)  # type: ignore[arg-type]
        return batch

    def _start_timer(self, batch: _Batch, step_timeout: float) -> None:
        batch.timer = batch.future.get_loop().call_later(
            step_timeout, self._expire_batch, batch, step_timeout
        )

    async def _finish(self, batch: _Batch) -> Stacked | list[Any]:
        """Wait until every env of ``batch`` has its outcome; a cancelled caller stops the
        batch's work. A stacked call's results are read from its bank's blocks when all
        are there (before that bank is written again), else decoded per env."""
        try:
            if batch.left:
                await batch.future
        except BaseException:
            self._give_up(batch)
            raise
        finally:
            if batch.timer is not None:
                batch.timer.cancel()
                batch.timer = None
        if not batch.raw:
            return batch.outcomes
        picked = batch.picked
        if batch.in_blocks():
            try:
                return self._read(batch)
            except Exception as exc:
                return [Failure(exc)] * (len(batch.outcomes) if picked is None else len(picked))
        op, bank = batch.op, batch.bank
        outcomes = [
            self._decode(i, op, o[1], o[2], bank) if type(o) is tuple else o
            for i, o in enumerate(batch.outcomes)
        ]
        return outcomes if picked is None else [outcomes[i] for i in picked]

    def _read(self, batch: _Batch) -> Stacked:
        """A stacked call's results: the bank's rows in place where one view per leaf
        holds the whole pool (copied once, by whoever keeps them: see Stacked), else a
        copy of the workers' parts put together."""
        bank = batch.bank
        stacked = self._stacked[bank]  # type: ignore[index]
        nxt = stacked.rows("next")
        owned = nxt is None
        if nxt is None:
            nxt = stacked.read("next")
        copy = self._copiers[bank]
        if batch.op == "step":
            return Stacked(nxt, owned=owned, copy=copy)
        flags = batch.reset_flags()
        if True not in flags:
            return Stacked(nxt, owned=owned, copy=copy)
        mask = torch.from_numpy(np.array(flags, dtype=np.bool_))
        reset = stacked.rows("reset") if not owned else stacked.read("reset")
        return Stacked(nxt, reset, mask, owned=owned, copy=copy)

    def _rows_still_read(self, indices: Sequence[int] | None) -> bool:
        """Whether an input row a stacked call would write (it writes every env's) may
        still be read: a streamed step in flight or a streamed result not received yet
        that reads it (the shared stream rows' ``pending``, once held results are copied
        out), or an operation in flight of an env the call leaves out. Such a call goes
        per env, each input into its own slot."""
        srows = self._srows
        if srows is not None and any(srows.pending):
            return True
        if indices is None:
            return False
        chosen = set(indices)
        return any(
            current is not None and i not in chosen for i, current in enumerate(self._inflight)
        )

    def _refusing(self) -> bool:
        """Whether some env would be refused an op (a broken worker, a lost env)."""
        for w in self._workers:
            if w.state == "broken":
                return True
        lost = self._lost
        return lost.count(None) != len(lost)

    def _armed_as(self, seq: int) -> _Batch | None:
        """The chained call armed as ``seq``, if any."""
        for batch in self._armed.values():
            if batch.seq == seq:
                return batch
        return None

    def _may_arm(self, after: _Batch, batch: _Batch, step_timeout: float | None) -> bool:
        """Whether the workers may ring ``batch``, chained to ``after``: every env steps
        in both, ``batch`` on the bank after ``after``'s (the one the workers ring after
        it) with nothing armed there, ``after`` rung on every worker or armed itself (the
        workers run the chain of armed calls one after the other), no step timeout (a
        timed call goes over the sockets), and nothing waits to be written to a worker's
        socket (the doorbell would overtake it)."""
        if (
            not self._peer_rings
            or step_timeout is not None
            or batch.bank in self._armed
            or after.stepping is not None
            or batch.bank != (after.bank + 1) % BANKS
        ):
            return False
        if not after.armed:
            rung = self._rung
            if rung is None or rung[0] != after.seq or len(rung[1]) != len(self._workers):
                return False
        return all(self._rings(w) for w in self._workers)

    def _arm(self, after: _Batch, batch: _Batch) -> None:
        """Arm ``batch`` for the last worker of ``after`` to ring when every worker
        answered ``after`` whole (see :mod:`aenv.pool._process_bell`): written into every
        worker's page, then armed on the tally."""
        assert self._tally is not None
        seq = batch.seq = next(self._seq)
        op, bank = batch.op, batch.bank
        carry = self._stacked[bank].partial  # type: ignore[index]
        for w in self._workers:
            w.bell.arm(seq, op, bank, carry)  # type: ignore[union-attr]
        batch.armed = True
        self._armed[bank] = batch
        self._tally.arm_chain(bank, after.seq, seq)

    def _settle(self, batch: _Batch) -> bool:
        """Take an armed ``batch`` back from the workers: False when it was still armed
        (not rung), True when a worker rang it (it is then in flight, as if sent here)."""
        if not batch.armed:
            return False
        batch.armed = False
        del self._armed[batch.bank]
        assert self._tally is not None
        try:
            if self._tally.disarm(batch.bank, self._all_alive):
                return False
        except OSError:  # (closed with the pool: its workers ring nothing more)
            return False
        after = batch.after
        if after is not None and after.left:
            # (given up, or a worker died, before ``after``'s answers were taken: every
            # worker answered it whole on its page, which is what rang this call, so they
            # are taken first, and this call is recorded once ``after`` is whole, before
            # any answer of its own is handled)
            after.then = functools.partial(self._record_rung, batch)
            self._take_answers()
            return True
        self._record_rung(batch)
        return True

    def _all_alive(self) -> bool:
        """Whether every worker's process still runs (see :meth:`Tally.disarm`)."""
        return all(w.proc is None or w.proc.exitcode is None for w in self._workers)

    def _record_rung(self, batch: _Batch) -> None:
        """A chained call the workers rang: in flight, as :meth:`_send_stacked` leaves a
        call it rings."""
        seq, n = batch.seq, len(batch.indices)
        current = (seq, batch.op)
        # (every env: one slice write per list)
        self._inflight[:n] = [current] * n
        self._batch_of[:n] = zip(itertools.repeat(batch, n), range(n))
        self._rung = (seq, list(self._workers))
        self._drained = False
        self._stacked[batch.bank].partial = False  # type: ignore[index]
        batch.sent = True
        parked = self._parked.pop(seq, None)
        if parked is not None:
            self._on_batch_reply(seq, parked)

    def _send_chained(self, after: _Batch, batch: _Batch, step_timeout: float | None) -> None:
        if self._settle(batch):  # (rung by the workers)
            return
        if not after.in_blocks() or self._closing or self._fences or self._refusing():
            return
        carry = None
        if self._stacked[batch.bank].partial:  # type: ignore[index]
            # only the actions were staged: the rest is what ``after`` gave, carried over
            # by the workers rung (each for its envs) and here for the others
            resets = after.reset_flags() if after.op != "step" else None
            carry = (self._stacked[after.bank], resets)  # type: ignore[index]
            if after.bank != (batch.bank - 1) % BANKS:
                # (a worker carries from the bank before its call's only)
                self._stacked[batch.bank].carry(*carry)  # type: ignore[index]
                carry = None
        try:
            self._send_stacked(batch, step_timeout, carry)
        except Exception:  # (abandoned there: it was not sent)
            pass

    def _stacked_call(self, op: str, bank: int, indices: Sequence[int] | None = None) -> _Batch:
        n = self._stacked[bank].n  # type: ignore[index]
        batch = _Batch(self, op, range(n), self._loop.create_future(), raw=True)  # type: ignore[union-attr]
        batch.bank = bank
        if indices is not None and len(indices) < n:
            # a masked step: the envs sitting it out are answered already (their rows
            # left as they are, no reset), so the call is whole once the others are in
            batch.picked = indices
            batch.stepping = frozenset(indices)
            for i in range(n):
                if i not in batch.stepping:
                    batch.outcomes[i] = (i, SLOT, 0)
                    batch.left -= 1
        return batch

    def _send_stacked(
        self,
        batch: _Batch,
        step_timeout: float | None,
        carry: tuple[StackedBlocks, list[bool] | None] | None = None,
    ) -> None:
        """Send a stacked call's commands: one ``("batch", ...)`` per worker with envs to
        step, or its doorbell. ``carry``: the call's inputs were staged without their
        carried leaves, to be taken from these results (and reset flags) of the call
        before: a rung worker carries its envs' itself, the parent the others'."""
        op, bank = batch.op, batch.bank
        timed = step_timeout is not None
        seq = batch.seq = batch.seq or next(self._seq)
        inflight, batch_of = self._inflight, self._batch_of
        current = (seq, op)
        stepping = batch.stepping
        staged = self._stacked[bank]  # type: ignore[index]
        # (no _last_cmd: it is only read back for resets)
        try:
            shares = []
            for part, w in enumerate(self._workers):
                if stepping is None:
                    envs = w.indices
                    items = w.stacked_items
                    if items is None:
                        items = w.stacked_items = [(i, None) for i in envs]
                else:
                    envs = [i for i in w.indices if i in stepping]
                    if not envs:
                        continue
                    items = [(i, None) for i in envs]
                shares.append((part, w, envs, items, not timed and self._rings(w)))
            rung = [share[1] for share in shares if share[4]]
            if rung:
                assert self._tally is not None
                # (before the first ring: the last one rings back)
                self._tally.arm(len(rung), self._drained)
                self._drained = False
            for part, w, envs, items, ring in shares:
                for i in envs:
                    inflight[i] = current
                    batch_of[i] = (batch, i)
                if ring:
                    self._ring(w, seq, op, bank, stepping, carry)
                else:
                    if carry is not None:
                        staged.carry(carry[0], carry[1], [part])
                    self._send_batch(w, seq, op, items, timed, bank)
            self._rung = (seq, rung) if rung else None
        except BaseException:
            self._abandon(batch)
            raise
        staged.partial = False
        batch.sent = True
        if step_timeout is not None and batch.left:
            self._start_timer(batch, step_timeout)

    def _give_up(self, batch: _Batch) -> None:
        """Give up a call (or a chained call) that nobody will finish, with the calls
        chained after it: their envs' work is cancelled where it can be and their
        outcomes dropped; a chained call not sent yet never will be, and none is left
        armed."""
        after = batch.after
        if after is not None and after.then is not None:
            after.then = None
        chain = []
        link: _Batch | None = batch
        while link is not None:
            link.then = None  # (nothing sent from here on)
            chain.append(link)
            ahead, link.ahead = link.ahead, None
            link = ahead
        for link in chain:
            # (in order: a call the workers rang is recorded after the one before it, in
            # flight, and given up with it below)
            self._settle(link)
        for link in chain:
            self._parked.pop(link.seq, None)
            if link.timer is not None:
                link.timer.cancel()
                link.timer = None
            self._abandon(link)

    def _ring(
        self,
        w: _Worker,
        seq: int,
        op: str,
        bank: int,
        stepping: frozenset[int] | None,
        carry: tuple[StackedBlocks, list[bool] | None] | None = None,
    ) -> None:
        """Start a stacked call's share of ``w`` with its doorbell (see :meth:`_rings`)."""
        bell = w.bell
        assert bell is not None
        flags = None
        if stepping is not None:
            resets = None if carry is None else carry[1]
            flags = bytes(
                0
                if i not in stepping
                else STEPS
                if carry is None
                else STEPS | (CARRY_RESET if resets is not None and resets[i] else CARRY_NEXT)
                for i in w.indices
            )
        elif carry is not None:
            # (the common chained step: every env steps and carries from its "next" row,
            # those just reset from their "reset" row)
            resets = carry[1]
            flags = _CARRY_NEXT[len(w.indices)]
            if resets is not None:
                reset_here = [k for k, i in enumerate(w.indices) if resets[i]]
                if reset_here:
                    patched = bytearray(flags)
                    for k in reset_here:
                        patched[k] = STEPS | CARRY_RESET
                    flags = bytes(patched)
        bell.ring(seq, op, bank, flags)

    @staticmethod
    def _rings(w: _Worker) -> bool:
        """Whether a stacked call's share of ``w`` may go on its doorbell; not where the
        socket must carry it: no doorbell, a worker not ready, or commands still queued
        for it (the doorbell would overtake them)."""
        chan = w.chan
        return not (
            w.bell is None or w.state != "ready" or w.outbox or chan is None or chan.pending
        )

    def _send_batch(
        self,
        w: _Worker,
        seq: int,
        op: str,
        items: list[tuple[int, Any]],
        stream: bool,
        bank: int = 0,
    ) -> None:
        w.outbox.append(
            ("batch", seq, op, items, stream, bank) if bank else ("batch", seq, op, items, stream)
        )
        if w.state == "ready" and w.chan is not None:
            out, w.outbox = w.outbox, []
            # a closed channel: its reader sees the EOF and fails the batch's envs
            with contextlib.suppress(ChannelClosed):
                self._send_out(w, out)

    def _pending(self, batch: _Batch) -> list[tuple[int, int]]:
        """(position, env) of the envs of ``batch`` still working."""
        batch_of = self._batch_of
        out = []
        for pos, i in enumerate(batch.indices):
            entry = batch_of[i]
            if entry is not None and entry[0] is batch:
                out.append((pos, i))
        return out

    def _abandon(self, batch: _Batch) -> None:
        """Stop the work of ``batch``'s envs still working and drop their outcomes."""
        for _, i in self._pending(batch):
            self._batch_of[i] = None
            self.cancel(i)

    def _expire_batch(self, batch: _Batch, step_timeout: float) -> None:
        for pos, i in self._pending(batch):
            self._batch_of[i] = None
            self.replace(i)
            err = StepTimeoutError(
                f"env {i}: {batch.op} did not finish within {step_timeout} s; it was abandoned "
                "and the env rebuilt from its factory",
                env_index=i,
            )
            batch.store(pos, Failure(err, ""))

    def cancel(self, env_index: int) -> bool:
        inflight = self._inflight[env_index]
        if self._row_op[env_index] and self._srows is not None:
            self._row_op[env_index] = 0
            self._srows.forget(env_index)  # (fenced below while the worker may read it)
        if inflight is not None:
            self._inflight[env_index] = None
            w = self._of_env[env_index]
            if w.state in ("ready", "starting"):
                w.outbox.append(("cancel", env_index, inflight[0]))
                self._fences[env_index] = self._fences.get(env_index, 0) + 1
                self._schedule_flush()
        return True

    def replace(self, env_index: int) -> None:
        self._inflight[env_index] = None
        self._lost[env_index] = None
        w = self._of_env[env_index]
        if w.state != "ready":
            return  # a starting worker builds fresh envs anyway
        w.outbox.append(("replace", env_index))
        self._schedule_flush()
        if self._loop is not None and env_index not in w.ack_timers:
            w.ack_timers[env_index] = self._loop.call_later(
                self.replace_timeout, self._unresponsive, w, env_index
            )
            self._probe(w, env_index)

    def _probe(self, w: _Worker, env_index: int) -> None:
        """Ask the worker's watchdog whether env ``env_index`` still runs on its loop."""
        sock, loop = w.probe, self._loop
        if sock is None or loop is None:
            return
        n = w.probe_count = w.probe_count + 1
        w.probe_last[env_index] = n
        try:
            sock.send(struct.pack("<ii", env_index, n))
        except OSError:
            return  # the worker is going: its socket's EOF says so
        if not w.probe_watched:
            w.probe_watched = True
            loop.add_reader(sock.fileno(), weak_callback(self._on_probe, w))

    def _on_probe(self, w: _Worker) -> None:
        sock = w.probe
        if sock is None:
            return
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            w.close_probe(self._loop)
            return
        buf = w.probe_buf + data
        size = struct.calcsize("<ii?")
        while len(buf) >= size:
            env_index, n, running = struct.unpack_from("<ii?", buf)
            buf = buf[size:]
            # (an answer to an earlier probe of the env, whose replace was acknowledged,
            # says nothing of the current one)
            current = w.probe_last.get(env_index) == n
            timer = w.ack_timers.get(env_index) if running and current else None
            if timer is not None:
                # the given-up env blocks the worker's loop: the replace cannot be read
                timer.cancel()
                self._unresponsive(w, env_index, blocked=True)
        w.probe_buf = buf
        if not w.ack_timers and not buf and w.probe is sock and self._loop is not None:
            # no probe waits for an answer: unwatched until the next one
            w.probe_watched = False
            self._loop.remove_reader(sock.fileno())

    def _unresponsive(self, w: _Worker, env_index: int, blocked: bool = False) -> None:
        w.ack_timers.pop(env_index, None)
        if w.state != "ready" or w.proc is None:
            return
        if blocked:
            w.kill_reason = (
                f"it was killed because env {env_index}, given up, kept the worker's loop "
                "blocked (its code was still running there)"
            )
        else:
            w.kill_reason = (
                f"it was killed after env {env_index} was given up and the worker did not "
                f"answer within {self.replace_timeout} s"
            )
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.proc.pid, signal.SIGKILL)

    # ------------------------------------------------------------------ faults
    def _crash_error(self, w: _Worker, env_index: int | None, when: str = "") -> WorkerCrashedError:
        code = w.proc.exitcode if w.proc is not None else None
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else f"exited with code {code}"
        )
        msg = f"worker {w.wid} (pid {w.pid}) {how}" + (f" {when}" if when else "")
        if w.kill_reason:
            msg += f": {w.kill_reason}"
        where = f"env {env_index}: " if env_index is not None else ""
        return WorkerCrashedError(where + msg, env_index=env_index, exitcode=code)

    def _worker_died(self, w: _Worker) -> None:
        if w.state in ("dead", "closed"):
            return
        if self._closing:
            if w.chan is not None:
                w.chan.close()
            return
        starting = w.state == "starting"
        # its envs failed to build on this start (a factory raising after a crash)
        unbuilt = w.state == "broken"
        w.state = "dead"
        for i in w.indices:
            self._fences.pop(i, None)
        w.close_bell()
        # (a worker started again has a doorbell the others do not ring)
        self._peer_rings = False
        for batch in sorted(self._armed.values(), key=lambda b: b.seq):
            # (armed: taken back, so that no worker rings it on a doorbell that is gone;
            # rung already: in flight, its envs on this worker failed with the others)
            self._settle(batch)
        rung = self._rung
        if rung is not None and w in rung[1] and self._tally is not None:
            # it will not finish the call rung on it: finish for it, in case the others
            # are done already (their answers wait in their pages, no wake-up to come)
            self._tally.stand_in()
            self._take_answers()
        if w.chan is not None:
            w.chan.close()
        w.close_probe(self._loop)
        for timer in w.ack_timers.values():
            timer.cancel()
        w.ack_timers.clear()
        proc, loop = w.proc, self._loop
        proc.join(0)
        if proc.exitcode is not None or loop is None:
            self._reap(w, starting, unbuilt)
            return
        # The socket closes a moment before the process is gone: wait for its sentinel.
        loop.add_reader(proc.sentinel, weak_callback(self._reap, w, starting, unbuilt))
        w.exit_timer = loop.call_later(2.0, kill_quietly, proc)

    def _reap(self, w: _Worker, starting: bool, unbuilt: bool = False) -> None:
        proc = w.proc
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_reader(proc.sentinel)
        if w.exit_timer is not None:
            w.exit_timer.cancel()
            w.exit_timer = None
        proc.join(1.0)
        with contextlib.suppress(ValueError):
            self._procs.remove(proc)
        kill_owned(proc.pid)  # what its sandbox runs started dies with it
        if self._closing:
            return
        pending = [i for i in w.indices if self._inflight[i] is not None]
        # A reset sent to a worker we killed for not answering is sent again to its
        # successor (it is what a lost env needs); everything else in flight failed.
        retry = [
            self._last_cmd[i]
            for i in pending
            if w.kill_reason and self._inflight[i][1] == "reset"  # type: ignore[index]
        ]
        for i in w.indices:
            self._inflight[i] = None
            self._lost[i] = str(self._crash_error(w, None))
        w.outbox = []
        for cmd in retry:
            assert cmd is not None
            i = cmd[1]
            self._inflight[i] = (cmd[2], cmd[3])
            self._lost[i] = None
            w.outbox.append(cmd)
        for i in pending:
            if self._inflight[i] is None:
                self._complete(i, Failure(self._crash_error(w, i), ""))
        if starting or not self.restart_workers:
            w.failure = Failure(self._crash_error(w, None, "and was not restarted"), "")
            self._fail_worker_envs(w, w.failure)
            return
        if unbuilt:
            self._respawn_later(w)
            return
        self._respawn(w)

    def _respawn_later(self, w: _Worker) -> None:
        """The worker's envs could not be built on its last start: try again after a
        backoff, or give it up after ``restart_attempts`` such starts in a row. Meanwhile
        its envs are refused with the factory's error."""
        w.failed_starts += 1
        last = w.failure
        if w.failed_starts >= self.restart_attempts or self._loop is None:
            cause = last.exc if last is not None else None
            err = WorkerRestartError(
                f"worker {w.wid} was given up: its envs failed to build on "
                f"{w.failed_starts} restarts in a row"
                + (f" (last: {type(cause).__name__}: {cause})" if cause is not None else ""),
                attempts=w.failed_starts,
            )
            err.__cause__ = cause
            self._fail_worker_envs(w, Failure(err, last.traceback if last is not None else ""))
            return
        self._fail_worker_envs(w, last)
        delay = self.restart_backoff * 2 ** (w.failed_starts - 1)
        w.respawn_timer = self._loop.call_later(delay, weak_callback(self._respawn, w))

    def _respawn(self, w: _Worker) -> None:
        w.respawn_timer = None
        if self._closing:
            return
        w.kill_reason = None
        self._spawn(w)
        if self._loop is not None and w.chan is not None:
            w.chan.attach(self._loop, weak_callback(self._on_readable, w))

    def _fail_worker_envs(self, w: _Worker, failure: Failure | None) -> None:
        w.state = "broken"
        if failure is None:
            failure = Failure(EnvStepError(f"worker {w.wid} could not build its envs"), "")
        w.failure = failure
        queued, w.outbox = w.outbox, []
        for msg in queued:
            if msg[0] == "op":
                envs = [msg[1]]
            elif msg[0] == "batch":
                envs = [i for i, _ in msg[3]]
            else:
                continue
            for i in envs:
                if self._inflight[i] is not None:
                    self._inflight[i] = None
                    self._complete(i, failure)
