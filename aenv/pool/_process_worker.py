"""The worker side of the process backend: a small event loop hosting several envs.

A worker builds its envs from cloudpickled factories, sends their metadata, receives its
shared-memory region, then serves commands from its socket on its own event loop (uvloop
when installed): sync envs run inline, async ones as tasks, so one process keeps many
high-latency envs busy. Results go back batched per loop turn, tensors through the slots.

Protocol (every frame is a list of tuples; see :mod:`aenv.pool._process` for the parent):

* parent -> worker: ``("slots", region_size, layouts, bank_size[, wid])`` once (after the
  region's and doorbell's descriptors; ``wid`` where it was sent every worker's go
  counter), ``("op", env, seq, op, data)`` (``data`` None: the input is in the env's
  ``"in"`` slot, or for a reset, no input and no keyword; else the pickled payload),
  ``("batch", seq, op, [(env, data), ...], stream[, bank])`` (one whole-batch call's share
  of this worker: one ``op`` per env, all under one ``seq``, its slots those of ``bank``,
  default 0; see :mod:`aenv.pool._shm`), ``("cancel", env, seq)``,
  ``("replace", env)``, ``("close",)``.
* worker -> parent: ``("meta", metas)`` / ``("failed", failure)`` once at start-up,
  ``("r", env, seq, code, data)`` per outcome (:data:`SLOT`: in the slots; :data:`PICKLED`:
  ``data`` is the pickled result; :data:`FAILED`: ``data`` is a pickled ``(exc, traceback)``),
  ``("b", seq, [(env, code, data), ...])`` for a batch (once, when all its envs are done;
  as they finish when ``stream`` was set), ``("ack", env)`` for a replace,
  ``("cx", env, n)`` for ``n`` cancels of the env once nothing runs for it (until then the
  parent sends the env's inputs pickled, not through its input slot).
* the doorbell (:mod:`aenv.pool._process_bell`), beside the socket: a stacked call rung
  there runs as a ``("batch", ...)`` would, and is answered there when all its envs' results
  are in the rows (else as a ``"b"`` frame).

The worker exits when told to, when its socket reaches EOF, and when the parent process
dies (``PR_SET_PDEATHSIG`` on Linux where the parent's main thread started it, and a
lifeline pipe watched by a thread everywhere; a forked worker first closes the parent's
ends of every pipe and socket it inherited, so that EOF comes).

A watchdog thread answers the parent's probes on a second socket: ``<ii`` (env index,
probe number) in, ``<ii?`` (env index, probe number, blocking) out, "blocking" meaning that the loop did not run a callback
for :data:`_GRACE` seconds while that env's code was on the stack of the loop's thread. A
step that timed out while it blocks the loop (a ``time.sleep`` in a sync env) is so told
apart from one merely waiting (an async hang, which the loop can cancel) or just over (a
frame that still holds the env as it returns), and the parent kills the worker at once
instead of waiting for an answer that cannot come.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.exceptions import EnvStepError
from aenv.pool import _codec as codec
from aenv.pool._channel import Channel, ChannelClosed
from aenv.pool._ops import drive, execute, execute_inline, runs_inline, step_rows
from aenv.pool._process_bell import CARRY_NEXT, CARRY_RESET, MAX_PEERS, STEP_BITS, Bell
from aenv.pool._process_support import close_inherited
from aenv.pool._shm import BANKS, Slot, carry_blocks, carry_pairs, map_region, map_slots

__all__ = ["FAILED", "PICKLED", "SLOT", "pack_failure", "worker_main"]

SLOT, PICKLED, FAILED = 0, 1, 2
_SLOT_OPS = frozenset(("step", "step_and_maybe_reset"))
#: a doorbell flag byte reduced to 1 when it carries something, and to its reset bit
_CARRIES = bytes(int(bool(b & (CARRY_NEXT | CARRY_RESET))) for b in range(256))
_RESETS = bytes(int(bool(b & CARRY_RESET)) for b in range(256))
_DUMP = pickle.HIGHEST_PROTOCOL
#: Seconds a finished result may wait for its siblings' to go out in the same frame.
_HOLD = 0.0005


def pack_failure(exc: BaseException, tb: str | None = None) -> bytes:
    """Pickle ``(exc, traceback)``; an exception that does not survive pickling is sent as
    an :class:`~aenv.exceptions.EnvStepError` naming its type, with the same traceback."""
    if tb is None:
        tb = "".join(traceback.format_exception(exc))
    try:
        blob = pickle.dumps((exc, tb), protocol=_DUMP)
        pickle.loads(blob)
    except Exception:
        name = type(exc).__name__
        sub = EnvStepError(f"{name}: {exc}", remote_type=name, remote_traceback=tb)
        blob = pickle.dumps((sub, tb), protocol=_DUMP)
    return blob


def _build(fn: Callable[[], EnvBase]) -> EnvBase:
    env = fn()
    if not isinstance(env, EnvBase):
        raise TypeError(f"an env factory must return an aenv EnvBase, got {type(env).__name__}")
    return env


def _guard_parent(lifeline_fd: int, parent_pid: int | None) -> None:
    """Exit when the parent dies: death signal (Linux) and a thread on the lifeline pipe."""
    if parent_pid is not None and sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent_pid:  # it died before the prctl
            os._exit(1)

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline_fd, 1):
                pass
        os._exit(1)

    threading.Thread(target=watch, name="aenv-lifeline", daemon=True).start()


_PROBE = struct.Struct("<ii")
_ANSWER = struct.Struct("<ii?")
#: seconds the loop must stay blocked, with the env's code on its stack, to count as stuck
_GRACE = 0.1


def _on_stack(env: Any, frame: Any) -> bool:
    """Whether ``env`` is a local of ``frame`` or of a frame below it: its code runs there."""
    if env is None:
        return False
    while frame is not None:
        for value in frame.f_locals.values():
            if value is env:
                return True
        frame = frame.f_back
    return False


def _blocking(runtime: _Runtime, i: int, loop_thread: int) -> bool:
    """Whether env ``i``'s code blocks the loop (see the module docstring)."""
    env = runtime.envs.get(i)
    loop = getattr(runtime, "loop", None)
    if loop is None or not _on_stack(env, sys._current_frames().get(loop_thread)):
        return False
    ran = threading.Event()
    try:
        loop.call_soon_threadsafe(ran.set)
    except RuntimeError:  # the loop closed: the worker is exiting
        return False
    if ran.wait(_GRACE):
        return False
    return _on_stack(env, sys._current_frames().get(loop_thread))


def _watchdog(probe: socket.socket, runtime: _Runtime, loop_thread: int) -> None:
    """Answer the parent's probes (see the module docstring) until the socket closes."""
    buf = b""
    try:
        while data := probe.recv(4096):
            buf += data
            while len(buf) >= _PROBE.size:
                i, n = _PROBE.unpack_from(buf)
                buf = buf[_PROBE.size :]
                probe.sendall(_ANSWER.pack(i, n, _blocking(runtime, i, loop_thread)))
    except OSError:
        pass


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def worker_main(
    sock: socket.socket,
    lifeline: Any,
    fns_blob: bytes,
    indices: list[int],
    parent_pid: int | None,
    num_threads: int | None,
    probe: socket.socket | None = None,
) -> None:
    """Entry point of a worker process (see the module docstring)."""
    close_inherited()
    # Passed through the forkserver, these arrive inheritable: a program an env starts keeps
    # them open past this worker's death where its spawn does not close them (uvloop's), and
    # the parent, seeing no EOF, would never learn that the worker died.
    for handle in (sock, lifeline, probe):
        if handle is not None:
            os.set_inheritable(handle.fileno(), False)
    _guard_parent(lifeline.fileno(), parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    if num_threads:
        torch.set_num_threads(num_threads)
    chan = Channel(sock)
    import cloudpickle

    fns: dict[int, Callable[[], EnvBase]] = {}
    envs: dict[int, EnvBase] = {}
    try:
        for i, fn in zip(indices, cloudpickle.loads(fns_blob)):
            fns[i] = fn
            envs[i] = _build(fn)
        metas = {i: EnvMetaData.metadata_from_env(env) for i, env in envs.items()}
        chan.send([("meta", metas)])
        chan.flush_blocking()
    except BaseException as exc:
        with contextlib.suppress(Exception):
            chan.send([("failed", pack_failure(exc))])
            chan.flush_blocking(5.0)
        os._exit(1)
    try:
        fd, *bell_fds = chan.recv_fds(6 + BANKS + MAX_PEERS)
        ((_, size, layouts, bank_size, *wid),) = chan.recv_blocking(limit=1)[0]
        flat = map_region(fd, size)
        os.close(fd)
        # (the region's alone: the parent's platform has no doorbell)
        own = 5 + BANKS  # (its page and go counter, then the pool's: Tally.fds)
        bell = Bell(len(indices), bell_fds[:own]) if bell_fds else None
        if bell is not None and len(bell_fds) > own and wid:
            # every worker's go counter: it rings the chained calls it finds armed
            bell.link(wid[0], bell_fds[own:])
    except (ChannelClosed, OSError, ValueError):
        os._exit(1)
    banks = [
        {i: map_slots(flat[start:], layouts.get(i)) for i in indices}
        for start in range(0, size, bank_size)
    ]
    runtime = _Runtime(chan, envs, fns, banks[0], banks, bell, indices)
    if probe is not None:
        threading.Thread(
            target=_watchdog,
            args=(probe, runtime, threading.get_ident()),
            name="aenv-watchdog",
            daemon=True,
        ).start()
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(runtime.serve())
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)


class _Batch:
    """One whole-batch command's share on this worker: its envs' outcomes go back together
    (``("b", seq, entries)``) once all are in, or as they come when ``stream`` is set (the
    parent has a step timeout and must know which envs finished)."""

    __slots__ = ("bank", "entries", "left", "listed", "rung", "seq", "stream")

    def __init__(self, seq: int, left: int, stream: bool, bank: int = 0) -> None:
        self.seq = seq
        self.left = left
        self.stream = stream
        self.bank = bank
        self.entries: list[tuple[int, int, Any]] = []
        self.listed = False
        #: started by the doorbell (:mod:`aenv.pool._process_bell`): answered there when
        #: every env's results are in the rows
        self.rung = False


# An operation on one env: (env, seq, op, data, batch or None).
_Op = tuple[int, int, str, Any, "_Batch | None"]
# A batch's op on one env in one bank (see _Runtime._lane): the env, its input slot (None:
# not inline), its result and reset slots' TensorDicts.
_Lane = tuple[EnvBase, "Slot | None", Any, Any]


class _Runtime:
    """The serving loop of one worker."""

    def __init__(
        self,
        chan: Channel,
        envs: dict[int, EnvBase],
        fns: dict[int, Callable[[], EnvBase]],
        slots: dict[int, dict[str, Slot] | None],
        banks: list[dict[int, dict[str, Slot] | None]] | None = None,
        bell: Bell | None = None,
        indices: list[int] | None = None,
    ) -> None:
        self.chan = chan
        self.bell = bell
        self.indices = indices if indices is not None else list(envs)
        #: env -> its position among the worker's envs (its byte in the doorbell's page)
        self.local = {i: j for j, i in enumerate(self.indices)}
        #: per doorbell mask: the ``(env, None)`` items of the batch it starts
        self.bell_items: dict[bytes, list[tuple[int, None]]] = {}
        #: (bank, env) -> its carried input leaves and their sources (see :meth:`_carry`)
        self.carries: dict[tuple[int, int], list[tuple[Any, Any, Any]]] = {}
        #: bank -> the carried leaves as blocks over the worker's rows, or None where the
        #: rows do not lie one after another (see :meth:`_carry`)
        self.carry_blocks: dict[int, list[tuple[Any, Any, Any]] | None] = {}
        #: a page's flags translated by _CARRIES when every env carries, by _RESETS when
        #: none was reset
        self.all_carry = bytes([1]) * len(self.indices)
        self.no_reset = bytes(len(self.indices))
        #: (op, bank) -> env -> its lane (see :meth:`_lane`)
        self.lanes: dict[tuple[str, int], dict[int, _Lane]] = {}
        self.envs = envs
        self.fns = fns
        self.slots = slots  # bank 0's
        self.banks = banks if banks is not None else [slots]
        self.broken: dict[int, bytes] = {}
        self.seq: dict[int, int | None] = dict.fromkeys(envs)
        self.tasks: dict[int, asyncio.Task[Any]] = {}
        self.task_batch: dict[int, _Batch | None] = {}
        self.queued: dict[int, deque[_Op]] = {i: deque() for i in envs}
        self.retired: set[asyncio.Task[Any]] = set()
        #: env -> cancels to acknowledge when its running task is over
        self.cancel_acks: dict[int, int] = {}
        #: env -> the doorbell call it was cancelled from before the worker took that call
        self.skip: dict[int, int] = {}
        self.out: list[tuple[Any, ...]] = []
        self.out_batches: list[_Batch] = []
        self.out_since = 0.0
        self.flush_scheduled = False
        self.parent_gone = False

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.chan.attach(loop, self._on_readable)
        if self.bell is not None:
            loop.add_reader(self.bell.go_fd, self._on_bell)
        # Commands that arrived with the handshake's last frame are already buffered.
        self._handle_frames(self.chan.take_buffered())
        await self.done
        await self._shutdown(1.0 if self.parent_gone else 5.0)

    # ------------------------------------------------------------------ commands
    def _on_readable(self) -> None:
        try:
            frames = self.chan.read_frames()
        except ChannelClosed:
            self.parent_gone = True
            self._stop()
            return
        self._handle_frames(frames)

    def _on_bell(self) -> None:
        """The doorbell rang: a stacked step of some of this worker's envs, inputs in the
        rows of the bank it names. Commands the parent wrote to the socket before ringing
        are handled first (a cancel or replace must not find the step already run): the
        page says how many frames it wrote, so the socket is read only when one waits."""
        bell = self.bell
        assert bell is not None
        chan = self.chan
        sent = bell.sent()
        while chan.received < sent:
            before = chan.received, chan.buffered
            self._on_readable()
            if self.done.done() or (chan.received, chan.buffered) == before:
                break  # (the peer is gone, or the rest is not here: the reader takes it)
        if self.done.done():
            return
        go = bell.take_go()
        if go is None:
            return  # taken with an earlier ring
        seq, op, bank, flags = go
        steps = flags.translate(STEP_BITS)
        items = self.bell_items.get(steps)
        if items is None:
            items = self.bell_items[steps] = [
                (i, None) for i, flag in zip(self.indices, steps) if flag
            ]
        if self.skip:
            skip = self.skip
            items = [item for item in items if skip.pop(item[0], None) != seq]
            if not items:
                return
        if flags != steps:
            self._carry(bank, items, flags)
        batch = _Batch(seq, len(items), False, bank)
        batch.rung = True
        self._slot_batch(seq, op, items, batch)
        self._flush()

    def _carry(self, bank: int, items: list[tuple[int, None]], flags: bytes) -> None:
        """Fill the envs' carried input leaves in ``bank`` from their results in the other
        bank (:func:`~aenv.pool._shm.carry_pairs`), as the parent's flags say. When every
        env of the worker carries and their rows lie one after another (one group of like
        envs: :func:`~aenv.pool._shm.plan_layout`), each leaf is one copy over the rows
        from ``"next"``, then the envs just reset take theirs from ``"reset"``."""
        local, carries = self.local, self.carries
        if len(items) == len(self.indices) and flags.translate(_CARRIES) == self.all_carry:
            if bank not in self.carry_blocks:
                self.carry_blocks[bank] = carry_blocks(
                    [self._carry_pairs(bank, i) for i in self.indices]
                )
            blocks = self.carry_blocks[bank]
            if blocks is not None:
                for dst, src, _ in blocks:
                    dst[...] = src
                if flags.translate(_RESETS) == self.no_reset:
                    return
                items = [item for item in items if flags[local[item[0]]] & CARRY_RESET]
        for i, _ in items:
            flag = flags[local[i]]
            if not flag & (CARRY_NEXT | CARRY_RESET):
                continue
            pairs = carries.get((bank, i))
            if pairs is None:
                pairs = self._carry_pairs(bank, i)
            if flag & CARRY_RESET:
                for dst, _, src in pairs:
                    dst[...] = src
            else:
                for dst, src, _ in pairs:
                    dst[...] = src

    def _carry_pairs(self, bank: int, i: int) -> list[tuple[Any, Any, Any]]:
        pairs = self.carries.get((bank, i))
        if pairs is None:
            # (from the bank of the call before: the banks go round in turn)
            slots, other = self.banks[bank].get(i), self.banks[(bank - 1) % BANKS].get(i)
            assert slots is not None and other is not None
            pairs = self.carries[bank, i] = carry_pairs(slots["in"], other["next"], other["reset"])
        return pairs

    def _handle_frames(self, frames: list[Any]) -> None:
        for frame in frames:
            for cmd in frame:
                self._handle(cmd)
        self._flush()

    def _handle(self, cmd: tuple[Any, ...]) -> None:
        kind = cmd[0]
        if kind == "batch":
            seq, op, items, stream = cmd[1:5]
            batch = _Batch(seq, len(items), stream, cmd[5] if len(cmd) > 5 else 0)
            if op in _SLOT_OPS:
                self._slot_batch(seq, op, items, batch)
            else:
                for i, data in items:
                    self._submit((i, seq, op, data, batch))
        elif kind == "op":
            _, i, seq, op, data = cmd
            if data is None and op in _SLOT_OPS:
                # a streamed step, its input in the env's slot: a batch's step of one env
                self._slot_batch(seq, op, [(i, None)], None)
            else:
                self._submit((i, seq, op, data, None))
        elif kind == "cancel":
            _, i, seq = cmd
            task = self.tasks.get(i)
            current = self.seq.get(i)
            if self.bell is not None and seq > (current or 0) and seq > self.bell.taken:
                # a call rung on the doorbell and not taken yet (the socket is read first):
                # the env sits it out, so it never reads the input slot the parent may
                # write again once this cancel is acknowledged
                self.skip[i] = seq
            if current == seq:
                self._forget(i)
                if task is not None:
                    task.cancel()
            if task is None:
                self._put(("cx", i, 1))
            else:
                # acknowledged once the task is over: until then it may read the env's
                # input slot, which the parent must not write over
                self.cancel_acks[i] = self.cancel_acks.get(i, 0) + 1
        elif kind == "replace":
            self._replace(cmd[1])
        elif kind == "close":
            self._stop()

    def _stop(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _submit(self, rec: _Op) -> None:
        i = rec[0]
        self.seq[i] = rec[1]
        if i in self.tasks:
            # the running task's outcome is superseded (it was given up): it no longer
            # counts for its batch
            self._drop_from(self.task_batch.get(i))
            self.task_batch[i] = None
            self.queued[i].append(rec)
        else:
            self._start(rec)

    def _slot_batch(
        self, seq: int, op: str, items: list[tuple[int, Any]], batch: _Batch | None
    ) -> None:
        """A batch's steps: each env whose input is in its slot and whose step cannot
        suspend runs right here, in a plain loop (:func:`step_rows`, or
        :func:`execute_inline` under type checks), its result going straight into its
        slots; any other env takes the general path (:meth:`_submit`). ``batch`` None: a
        streamed step of one env (bank 0, answered on its own)."""
        envs, tasks, broken, seqs = self.envs, self.tasks, self.broken, self.seq
        bank = 0 if batch is None else batch.bank
        stream = batch is not None and batch.stream
        lanes = self.lanes.get((op, bank))
        if lanes is None:
            lanes = self.lanes[op, bank] = {}
        step = op == "step"
        for i, data in items:
            env = envs.get(i)
            lane = lanes.get(i)
            if lane is None or lane[0] is not env:
                if env is None:
                    self._submit((i, seq, op, data, batch))
                    continue
                lane = lanes[i] = self._lane(op, bank, i, env)
            slot = lane[1]
            if data is not None or slot is None or i in tasks or i in broken:
                self._submit((i, seq, op, data, batch))
                continue
            seqs[i] = seq
            if (self.out or self.out_batches) and (
                stream or time.perf_counter() - self.out_since > _HOLD
            ):
                # do not hold finished results behind a slow env (a streamed batch's
                # parent has a step timeout: it hears of each env as it finishes)
                self._flush()
            try:
                # lean_inline less what runs_inline settled in the lane, and less the
                # "_step" mask, which no slot holds (lend hands out the slot's entries alone)
                if env.run_type_checks or env._closed:
                    result = execute_inline(env, op, slot.view())
                else:
                    # the env's step straight into its result slot where it can write
                    # there, and the reset into its reset slot
                    nxt, rst = drive(step_rows(env, op, slot.lend(), lane[2], lane[3]))
                    if nxt.__class__ is bool and (rst is None or rst is True):
                        # every result is in the slots already
                        self._done(i, seq, batch, SLOT, None if step else rst is True)
                        continue
                    slots = self.banks[bank][i]
                    assert slots is not None
                    if isinstance(nxt, bool):
                        nxt = slots["next"].read()
                    if rst is True:
                        rst = slots["reset"].read()
                    result = nxt if step else (nxt, rst)
            except Exception as exc:
                self._done(i, seq, batch, FAILED, pack_failure(exc))
            else:
                self._result(i, seq, op, batch, result)

    def _lane(self, op: str, bank: int, i: int, env: EnvBase) -> _Lane:
        """What a batch's ``op`` on env ``i`` in ``bank`` needs, settled once per env (until
        it is replaced): its input slot (None: the op does not run inline on it, by class,
        or it has no slots) and the TensorDicts of its result and reset slots."""
        slots = self.banks[bank].get(i)
        if slots is None or not runs_inline(env, op):
            return (env, None, None, None)
        reset = slots.get("reset")
        return (env, slots["in"], slots["next"].td, None if reset is None else reset.td)

    def _forget(self, i: int) -> None:
        """Env ``i``'s current operation (and any queued) is given up: no outcome goes
        back for it; a batch it belonged to no longer waits for it."""
        self.seq[i] = None
        for rec in self.queued[i]:
            self._drop_from(rec[4])
        self.queued[i].clear()
        if i in self.tasks:
            self._drop_from(self.task_batch.get(i))
            self.task_batch[i] = None

    def _drop_from(self, batch: _Batch | None) -> None:
        if batch is not None:
            batch.left -= 1
            if not batch.left:
                self._list(batch)

    def _start(self, rec: _Op) -> None:
        i, seq, op, data, batch = rec
        if i in self.broken:
            self._done(i, seq, batch, FAILED, self.broken[i])
            return
        env = self.envs[i]
        try:
            if data is None:
                if op == "reset":
                    payload: Any = (None, {})
                else:
                    slots = self.banks[batch.bank if batch is not None else 0][i]
                    assert slots is not None
                    # a shallow copy: the env reads the slot's tensors (as TorchRL's workers
                    # read their buffers); entries it adds do not land in the slot
                    payload = slots["in"].view()
            else:
                payload = codec.loads(data)
        except Exception as exc:
            self._done(i, seq, batch, FAILED, pack_failure(exc))
            return
        if runs_inline(env, op, payload):
            if (self.out or self.out_batches) and time.perf_counter() - self.out_since > _HOLD:
                self._flush()  # do not hold finished results behind a slow env
            try:
                result = execute_inline(env, op, payload)
            except Exception as exc:
                self._done(i, seq, batch, FAILED, pack_failure(exc))
            else:
                self._result(i, seq, op, batch, result)
            return
        task = self.loop.create_task(self._run(rec, env, payload))
        self.tasks[i] = task
        self.task_batch[i] = batch
        task.add_done_callback(functools.partial(self._never_ran, i))

    async def _run(self, rec: _Op, env: EnvBase, payload: Any) -> None:
        i, seq, op, _, batch = rec
        failure: bytes | None = None
        result: Any = None
        try:
            result = await execute(env, op, payload)
        except asyncio.CancelledError:
            failure = b""
        except Exception as exc:
            failure = pack_failure(exc)
        task = asyncio.current_task()
        if self.tasks.get(i) is not task:
            return  # given up by a replace
        del self.tasks[i]
        self.task_batch.pop(i, None)
        if self.seq.get(i) == seq:
            if failure is None:
                self._result(i, seq, op, batch, result)
            elif failure:
                self._done(i, seq, batch, FAILED, failure)
        self._next(i)

    def _never_ran(self, i: int, task: asyncio.Task[Any]) -> None:
        # A task cancelled before its first step never runs its body (asyncio throws the
        # cancellation in before the first line), so the body's bookkeeping is done here:
        # without it, the env's next op would queue for ever behind the dead task.
        if self.tasks.get(i) is task:
            del self.tasks[i]
            self.task_batch.pop(i, None)
            self._next(i)

    def _ack_cancels(self, i: int) -> None:
        n = self.cancel_acks.pop(i, 0)
        if n:
            self._put(("cx", i, n))

    def _next(self, i: int) -> None:
        self._ack_cancels(i)
        queued = self.queued[i]
        if queued:
            self._start(queued.popleft())
        # An async op usually ends alone in its loop turn: stream it out at once.
        self._flush()

    def _result(self, i: int, seq: int, op: str, batch: _Batch | None, result: Any) -> None:
        slots = self.banks[batch.bank if batch is not None else 0].get(i)
        if slots is not None:
            if op == "step":
                if slots["next"].write(result):
                    self._done(i, seq, batch, SLOT, None)
                    return
            elif op == "reset":
                if slots["reset"].write(result):
                    self._done(i, seq, batch, SLOT, None)
                    return
            elif op == "step_and_maybe_reset":
                nxt, rst = result
                if slots["next"].write(nxt) and (rst is None or slots["reset"].write(rst)):
                    self._done(i, seq, batch, SLOT, rst is not None)
                    return
        try:
            data = codec.dumps(result)
        except Exception as exc:
            self._done(i, seq, batch, FAILED, pack_failure(exc))
        else:
            self._done(i, seq, batch, PICKLED, data)

    def _done(self, i: int, seq: int, batch: _Batch | None, code: int, data: Any) -> None:
        if batch is None:
            self._put(("r", i, seq, code, data))
            return
        batch.entries.append((i, code, data))
        batch.left -= 1
        if batch.stream or not batch.left:
            self._list(batch)

    def _list(self, batch: _Batch) -> None:
        if not batch.listed and batch.entries:
            batch.listed = True
            if not self.out and not self.out_batches:
                self.out_since = time.perf_counter()
            self.out_batches.append(batch)

    def _replace(self, i: int) -> None:
        self._forget(i)
        self._put(("ack", i))
        self._flush()
        task = self.tasks.pop(i, None)
        self.task_batch.pop(i, None)
        if task is not None:
            task.cancel()
            self._retire(task)
        self._ack_cancels(i)
        old = self.envs.pop(i, None)
        if old is not None:
            self._retire(self.loop.create_task(_quiet_close(old)))
        self.broken.pop(i, None)
        try:
            self.envs[i] = _build(self.fns[i])
        except Exception as exc:
            self.broken[i] = pack_failure(exc)

    def _retire(self, task: asyncio.Task[Any]) -> None:
        self.retired.add(task)
        task.add_done_callback(self.retired.discard)

    # ------------------------------------------------------------------ replies
    def _put(self, item: tuple[Any, ...]) -> None:
        if not self.out and not self.out_batches:
            self.out_since = time.perf_counter()
        self.out.append(item)

    def _schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        finished = False  # (the call rung last, answered in a frame: counted once it is sent)
        if self.out_batches:
            for batch in self.out_batches:
                if not (batch.rung and self._answer_bell(batch)):
                    self.out.append(("b", batch.seq, batch.entries))
                    if batch.rung and not batch.left and batch.seq == self.bell.taken:  # type: ignore[union-attr]
                        finished = True
                batch.entries = []
                batch.listed = False
            self.out_batches = []
        if self.out and not self.parent_gone:
            out, self.out = self.out, []
            try:
                self.chan.send(out)
            except ChannelClosed:
                self.parent_gone = True
                self._stop()
        if finished:
            self.bell.finished()  # type: ignore[union-attr]

    def _answer_bell(self, batch: _Batch) -> bool:
        """Answer a rung batch through the doorbell: only when every env's results are in
        the rows and it is the latest call rung (else it goes back as a frame)."""
        bell = self.bell
        if bell is None or batch.left or bell.taken != batch.seq:
            return False
        outcomes = bytearray(bell.n)
        local = self.local
        for i, code, data in batch.entries:
            if code != SLOT:
                return False
            outcomes[local[i]] = 2 if data else 1
        bell.answer(batch.seq, bytes(outcomes), batch.bank)
        return True

    # ------------------------------------------------------------------ closing
    async def _shutdown(self, grace: float) -> None:
        pending = [*self.tasks.values(), *self.retired]
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(grace):
                if pending:
                    await asyncio.wait(pending)
                for env in self.envs.values():
                    await _quiet_close(env)
        self._flush()
        with contextlib.suppress(Exception):
            self.chan.flush_blocking(grace)


async def _quiet_close(env: EnvBase) -> None:
    with contextlib.suppress(Exception):
        await env.aclose()
