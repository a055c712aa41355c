"""Parent-side pieces of the process backend: the handle on one worker, waiting and killing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import os
import shutil
import signal
import socket
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import torch

from aenv.pool._backend import Failure
from aenv.pool._channel import Channel, ChannelClosed
from aenv.pool._process_bell import Bell

__all__ = [
    "OWNER_VAR",
    "SCRATCH_PREFIX",
    "ClosingMixin",
    "Worker",
    "close_inherited",
    "kill_owned",
    "kill_all",
    "kill_quietly",
    "parent_only",
    "wait_exit",
]

# The parent's ends of every worker's sockets and of every lifeline pipe: a worker forked
# from this process (start method "fork") inherits copies of them, and while any worker
# holds one, another worker never sees EOF on its socket or lifeline when the parent dies.
_PARENT_ONLY: weakref.WeakSet[Any] = weakref.WeakSet()


#: Set by aenv's code sandbox in every run's environment: the pid of the process that
#: started the run, so that what a killed worker left running can be found.
OWNER_VAR = "AENV_OWNER_PID"

#: How aenv's code sandbox names a run's scratch folder (in the temp dir), followed by the
#: pid of the process that made it and a dash: what a killed worker left on disk is found
#: by that name.
SCRATCH_PREFIX = "aenv-sandbox-"


def kill_owned(pid: int, rounds: int = 10) -> int:
    """SIGKILL every process whose environment says process ``pid`` (a worker that died)
    started it: a sandbox run's first process dies with the worker (its death signal), the
    processes it started would not. Repeated until none is found (a fork storm races the
    sweep). Then remove the scratch folders ``pid``'s runs left. Linux only (``/proc``);
    returns how many processes were killed."""
    if not os.path.isdir("/proc"):
        return 0
    needle = f"{OWNER_VAR}={pid}".encode()
    killed = 0
    for _ in range(rounds):
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{name}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue  # dead already, its parent reaps it
            except OSError:  # gone, or not ours to read
                continue
            found.append(int(name))
        if not found:
            break
        for p in found:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        killed += len(found)
    # the scratch folders of the worker's runs: its own clean-up died with it
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{SCRATCH_PREFIX}{pid}-*")):
        shutil.rmtree(path, ignore_errors=True)
    return killed


def parent_only(*handles: Any) -> None:
    """Mark sockets / connections that a forked worker must close (see
    :func:`close_inherited`)."""
    for handle in handles:
        _PARENT_ONLY.add(handle)


def close_inherited() -> None:
    """In a worker: close the parent-only handles it inherited through a fork (none with
    forkserver or spawn, whose children start from a fresh interpreter)."""
    for handle in list(_PARENT_ONLY):
        with contextlib.suppress(Exception):
            handle.close()
    _PARENT_ONLY.clear()


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, wid: int, indices: list[int], blob: bytes) -> None:
        self.wid = wid
        self.indices = indices
        self.blob = blob
        self.proc: Any = None
        self.chan: Channel | None = None
        self.state = "starting"  # starting | ready | dead | broken | closed
        self.outbox: list[tuple[Any, ...]] = []
        self.region_fd = -1
        self.region_size = 0
        self.bank_size = 0
        self.layouts: dict[int, Any] = {}
        self.flat: torch.Tensor | None = None
        self.ack_timers: dict[int, asyncio.TimerHandle] = {}
        self.kill_reason: str | None = None
        self.failure: Failure | None = None
        self.exit_timer: asyncio.TimerHandle | None = None
        #: the ``(env, None)`` items of a stacked batch command (inputs in the blocks)
        self.stacked_items: list[tuple[int, None]] | None = None
        #: its answers' outcome bytes -> their ``"b"`` entries (see _process._answer_entries)
        self.answers: dict[bytes, list[tuple[int, int, Any]]] = {}
        #: the parent's end of the worker's probe socket (its watchdog thread says whether
        #: a given-up env still runs on the worker's loop), the answers not yet read, and
        #: whether the loop watches it
        self.probe: socket.socket | None = None
        self.probe_buf = b""
        self.probe_watched = False
        self.probe_count = 0
        self.probe_last: dict[int, int] = {}  # env -> number of its latest probe
        #: starts in a row whose envs could not be built, and the timer of the next try
        self.failed_starts = 0
        self.respawn_timer: asyncio.TimerHandle | None = None
        #: the worker's doorbell (:mod:`aenv.pool._process_bell`; None where the platform
        #: has none)
        self.bell: Bell | None = None

    def close_bell(self) -> None:
        """Close the doorbell (its page and go counter; the pool's tally stays)."""
        bell, self.bell = self.bell, None
        if bell is not None:
            bell.close()

    def close_probe(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Stop watching and close the probe socket."""
        sock, self.probe = self.probe, None
        self.probe_buf = b""
        if sock is None:
            return
        if self.probe_watched and loop is not None and not loop.is_closed():
            with contextlib.suppress(Exception):
                loop.remove_reader(sock.fileno())
        self.probe_watched = False
        sock.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


async def wait_exit(procs: list[Any], timeout: float) -> None:  # noqa: ASYNC109
    """Wait (without blocking the loop) until every process exited, at most ``timeout``."""
    loop = asyncio.get_running_loop()
    waits = []
    for proc in procs:
        if proc.exitcode is not None:
            continue
        proc.join(0)
        if proc.exitcode is not None:
            continue
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(proc.sentinel, _set_done, fut)
        waits.append((proc, fut))
    if not waits:
        return
    try:
        with anyio.move_on_after(timeout):
            await asyncio.gather(*(f for _, f in waits))
    finally:
        for proc, _ in waits:
            loop.remove_reader(proc.sentinel)
            proc.join(0)


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def kill_quietly(proc: Any) -> None:
    with contextlib.suppress(Exception):
        if proc.exitcode is None:
            proc.kill()


def kill_all(
    procs: list[Any], channels: list[Any] | None = None, probes: list[Any] | None = None
) -> None:
    """Finalizer of a backend dropped without being closed: its sockets stop being watched
    and are closed, its workers are killed."""
    for chan in channels or ():
        with contextlib.suppress(Exception):
            _detach_and_close(chan)
    for sock in probes or ():  # (watched only while a probe waits for its answer)
        with contextlib.suppress(Exception):
            sock.close()
    for proc in procs:
        kill_quietly(proc)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(1.0)


def _detach_and_close(chan: Any) -> None:
    loop = chan.loop
    if loop is not None and loop.is_running() and not _runs_here(loop):
        # the loop runs in another thread: it removes its own watch, then the socket goes
        loop.call_soon_threadsafe(_detach_and_close, chan)
        return
    chan.detach()
    chan.close()


def _runs_here(loop: Any) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def weak_callback(method: Callable[..., Any], *args: Any) -> Callable[[], None]:
    """A loop callback calling the bound ``method`` through a weak reference: the loop's
    registration (a reader on a worker's socket) does not keep a backend alive, so one
    dropped without ``aclose()`` is collected and its finalizer ends its workers."""
    # (the instance by a weak reference, the function as it is: a weakref.WeakMethod
    # would build a bound method on every call)
    ref = weakref.ref(method.__self__)  # type: ignore[attr-defined]
    func = method.__func__  # type: ignore[attr-defined]

    def call() -> None:
        obj = ref()
        if obj is not None:
            func(obj, *args)

    return call


class ClosingMixin:
    """Shutdown of :class:`~aenv.pool._process.ProcessBackend`: close, wait, terminate, kill."""

    _workers: list[Worker]
    _closing: bool
    _lifeline: Any
    _lifeline_r: Any
    _procs: list[Any]
    _loop: asyncio.AbstractEventLoop | None
    _tally: Any

    # ------------------------------------------------------------------ closing
    def abort(self) -> None:
        self._closing = True
        for w in self._workers:
            if w.respawn_timer is not None:
                w.respawn_timer.cancel()
            w.close_probe(self._loop)
            if w.chan is not None:
                w.chan.close()
            if w.proc is not None:
                kill_quietly(w.proc)
                w.proc.join(5.0)
            w.state = "closed"
        self._release()

    async def aclose(self, grace: float = 5.0) -> None:
        self._closing = True
        loop = asyncio.get_running_loop()
        live = [w for w in self._workers if w.proc is not None and w.state != "closed"]
        for w in self._workers:
            if w.respawn_timer is not None:
                w.respawn_timer.cancel()
            w.close_probe(loop)
        for w in live:
            for timer in w.ack_timers.values():
                timer.cancel()
            if w.exit_timer is not None:
                w.exit_timer.cancel()
            if w.chan is None or w.chan.closed:
                continue
            if w.state == "ready":
                with contextlib.suppress(ChannelClosed):
                    w.chan.send([("close",)])
                if w.chan.loop is not loop:
                    w.chan.attach(loop, functools.partial(self._drain, w))
            else:
                w.chan.close()  # a starting worker exits on EOF
        procs = [w.proc for w in live]
        deadline = time.monotonic() + grace
        await wait_exit(procs, grace)
        for proc in procs:
            if proc.exitcode is None:
                proc.terminate()
        await wait_exit(procs, min(1.0, max(0.1, deadline - time.monotonic())))
        for proc in procs:
            if proc.exitcode is None:
                kill_quietly(proc)
                proc.join(5.0)
                kill_owned(proc.pid)  # what its sandbox runs started dies with it
        for proc in procs:
            proc.join(5.0)
        for w in self._workers:
            if w.chan is not None:
                w.chan.close()
            w.state = "closed"
        self._release()

    def _drain(self, w: Worker) -> None:
        chan = w.chan
        if chan is None or chan.closed:
            return
        try:
            chan.read_frames()
        except ChannelClosed:
            chan.close()

    def _release(self) -> None:
        if self._tally is not None:
            _detach_and_close(self._tally)
        for w in self._workers:
            w.close_bell()
            if w.region_fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(w.region_fd)
                w.region_fd = -1
        for conn in (self._lifeline, self._lifeline_r):
            if conn is not None:
                conn.close()
        self._lifeline = self._lifeline_r = None
        self._procs.clear()
