"""The process backend: sub-envs in worker processes, several envs per worker.

Each worker (:mod:`aenv.pool._process_worker`) hosts a group of envs on its own event loop.
Per worker the parent holds one socket (the control plane, :mod:`aenv.pool._channel`),
watched by the pool's event loop with ``loop.add_reader``: results stream in as each env
finishes, with no polling thread and no busy wait. Tensors travel through shared-memory
slots planned from the specs the workers sent (:mod:`aenv.pool._shm`); a message per step
is a tiny tuple. Commands submitted in one loop turn go out as one frame per worker.

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
import os
import pickle
import signal
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.exceptions import BackendUnavailableError, EnvStepError, WorkerCrashedError
from aenv.pool._backend import Backend, Failure
from aenv.pool._channel import Channel, ChannelClosed
from aenv.pool._process_support import ClosingMixin, kill_all, kill_quietly
from aenv.pool._process_support import Worker as _Worker
from aenv.pool._process_worker import FAILED, PICKLED, SLOT, worker_main
from aenv.pool._shm import Slot, make_region, map_region, map_slots, plan_layout

__all__ = ["DEFAULT_START_METHOD", "ProcessBackend"]

#: Start method used when none is given (the ``AENV_START_METHOD`` variable overrides it).
DEFAULT_START_METHOD = "spawn"
_DUMP = pickle.HIGHEST_PROTOCOL
_DIRECT_OPS = frozenset(("reset", "seed", "getattr", "call"))


class ProcessBackend(ClosingMixin, Backend):
    """Runs sub-envs in worker processes (see the module docstring).

    Options (``backend_options=`` of the pool):
        num_workers: number of worker processes (default: ``min(num_envs, cpu_count)``).
        envs_per_worker: envs per worker instead (the last worker may hold fewer).
        start_method: ``"spawn"`` (default), ``"forkserver"`` or ``"fork"``.
        num_threads: ``torch.set_num_threads`` in each worker (default 1; None leaves it).
        restart_workers: respawn a worker that died (default True).
        replace_timeout: seconds a worker has to answer when one of its envs is given up
            (step timeout, restart) before it is killed and respawned (default 2).
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
        self._ctx = multiprocessing.get_context(self.start_method)
        self._workers: list[_Worker] = []
        self._of_env: list[_Worker] = []
        self._slots: list[dict[str, Slot] | None] = []
        self._inflight: list[tuple[int, str] | None] = []
        self._lost: list[str | None] = []
        self._last_cmd: list[tuple[Any, ...] | None] = []
        self._seq = itertools.count(1)
        self._requests = itertools.count(1)
        self._replies: dict[int, tuple[int, bytes]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_pending = False
        self._closing = False
        self._procs: list[Any] = []
        self._lifeline: Any = None
        self._lifeline_r: Any = None
        self._finalizer = weakref.finalize(self, kill_all, self._procs)

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
        self._slots = [None] * n
        self._inflight = [None] * n
        self._lost = [None] * n
        self._last_cmd = [None] * n
        try:
            for wid, indices in enumerate(groups):
                blob = cloudpickle.dumps([self.env_fns[i] for i in indices])
                w = _Worker(wid, indices, blob)
                self._workers.append(w)
                self._spawn(w)
            self._of_env = [w for w in self._workers for _ in w.indices]
            metas: dict[int, EnvMetaData] = {}
            for w in self._workers:
                metas.update(self._handshake_blocking(w))
        except BaseException:
            self.abort()
            raise
        self._note_creator_metas(metas)
        return [metas[i] for i in range(n)]

    def _spawn(self, w: _Worker) -> None:
        parent_sock, child_sock = socket.socketpair()
        main_thread = threading.current_thread() is threading.main_thread()
        watch_pid = os.getpid() if self.start_method != "forkserver" and main_thread else None
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(child_sock, self._lifeline_r, w.blob, w.indices, watch_pid, self.num_threads),
            name=f"aenv-worker-{w.wid}",
            daemon=True,
        )
        try:
            proc.start()
        finally:
            child_sock.close()
        w.proc = proc
        w.chan = Channel(parent_sock)
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
        if w.region_fd < 0:
            w.layouts, w.region_size = plan_layout(metas)
            w.region_fd = make_region(w.region_size)
            w.flat = map_region(w.region_fd, w.region_size)
            for i in w.indices:
                self._slots[i] = map_slots(w.flat, w.layouts[i])
        assert w.chan is not None
        w.chan.send_fd(w.region_fd)
        w.chan.send([("slots", w.region_size, w.layouts)])
        w.state = "ready"
        if w.outbox:
            out, w.outbox = w.outbox, []
            w.chan.send(out)
        return metas

    def _note_creator_metas(self, metas: dict[int, EnvMetaData]) -> None:
        from aenv.envs._creator import EnvCreator

        for i, fn in enumerate(self.env_fns):
            if isinstance(fn, EnvCreator):
                fn._note_meta_data(metas[i])

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.pid for w in self._workers if w.pid is not None and w.state != "closed"]

    # ------------------------------------------------------------------ the loop
    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for w in self._workers:
            if w.chan is not None and not w.chan.closed:
                w.chan.attach(loop, functools.partial(self._on_readable, w))

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
                    w.chan.send(out)

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

    def _on_message(self, w: _Worker, msg: tuple[Any, ...]) -> None:
        if self._closing:
            return
        kind = msg[0]
        if kind == "r":
            _, i, seq, code, data = msg
            inflight = self._inflight[i]
            if inflight is None or inflight[0] != seq:
                return  # given up (replace / cancel)
            self._inflight[i] = None
            self._deliver(i, self._decode(i, inflight[1], code, data))
        elif kind == "ack":
            timer = w.ack_timers.pop(msg[1], None)
            if timer is not None:
                timer.cancel()
        elif kind == "attr":
            self._replies[msg[1]] = (msg[2], msg[3])
        elif kind in ("meta", "failed"):
            try:
                self._on_meta(w, msg)
            except BaseException:
                self._fail_worker_envs(w, w.failure)

    def _decode(self, i: int, op: str, code: int, data: Any) -> Any:
        try:
            if code == SLOT:
                slots = self._slots[i]
                assert slots is not None
                if op == "step":
                    return slots["next"].read()
                if op == "reset":
                    return slots["reset"].read()
                return slots["next"].read(), (slots["reset"].read() if data else None)
            if code == PICKLED:
                return pickle.loads(data)
            exc, tb = pickle.loads(data)
            return Failure(exc, tb)
        except Exception as exc:
            return Failure(exc)

    # ------------------------------------------------------------------ operations
    def submit(self, env_index: int, op: str, payload: Any) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        w = self._of_env[env_index]
        if w.state == "broken":
            self._deliver(env_index, w.failure)
            return
        lost = self._lost[env_index]
        if lost is not None:
            if op not in _DIRECT_OPS:
                err = WorkerCrashedError(
                    f"env {env_index} was lost: {lost}; it was rebuilt and needs a reset",
                    env_index=env_index,
                )
                self._deliver(env_index, Failure(err, ""))
                return
            if op == "reset":
                self._lost[env_index] = None
        data: Any = None
        slots = self._slots[env_index]
        if not (
            slots is not None
            and op in ("step", "step_and_maybe_reset")
            and slots["in"].write_input(payload)
        ):
            data = pickle.dumps(payload, protocol=_DUMP)
        seq = next(self._seq)
        self._inflight[env_index] = (seq, op)
        cmd = ("op", env_index, seq, op, data)
        self._last_cmd[env_index] = cmd
        w.outbox.append(cmd)
        self._schedule_flush()

    def cancel(self, env_index: int) -> bool:
        inflight = self._inflight[env_index]
        if inflight is not None:
            self._inflight[env_index] = None
            w = self._of_env[env_index]
            if w.state in ("ready", "starting"):
                w.outbox.append(("cancel", env_index, inflight[0]))
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

    def _unresponsive(self, w: _Worker, env_index: int) -> None:
        w.ack_timers.pop(env_index, None)
        if w.state != "ready" or w.proc is None:
            return
        w.kill_reason = (
            f"it was killed after env {env_index} was given up and the worker did not answer "
            f"within {self.replace_timeout} s"
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
        w.state = "dead"
        if w.chan is not None:
            w.chan.close()
        for timer in w.ack_timers.values():
            timer.cancel()
        w.ack_timers.clear()
        proc, loop = w.proc, self._loop
        proc.join(0)
        if proc.exitcode is not None or loop is None:
            self._reap(w, starting)
            return
        # The socket closes a moment before the process is gone: wait for its sentinel.
        loop.add_reader(proc.sentinel, self._reap, w, starting)
        w.exit_timer = loop.call_later(2.0, kill_quietly, proc)

    def _reap(self, w: _Worker, starting: bool) -> None:
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
                self._deliver(i, Failure(self._crash_error(w, i), ""))
        if starting or not self.restart_workers:
            w.failure = Failure(self._crash_error(w, None, "and was not restarted"), "")
            self._fail_worker_envs(w, w.failure)
            return
        w.kill_reason = None
        self._spawn(w)
        if self._loop is not None and w.chan is not None:
            w.chan.attach(self._loop, functools.partial(self._on_readable, w))

    def _fail_worker_envs(self, w: _Worker, failure: Failure | None) -> None:
        w.state = "broken"
        if failure is None:
            failure = Failure(EnvStepError(f"worker {w.wid} could not build its envs"), "")
        w.failure = failure
        queued, w.outbox = w.outbox, []
        for msg in queued:
            if msg[0] == "op" and self._inflight[msg[1]] is not None:
                self._inflight[msg[1]] = None
                self._deliver(msg[1], failure)

    # ------------------------------------------------------------------ attributes
    def getattr_sync(self, env_index: int, name: str) -> Any:
        w = self._of_env[env_index]
        if w.state == "broken" and w.failure is not None:
            raise w.failure.exc
        chan = w.chan
        if (w.state != "ready" and w.state != "starting") or chan is None:
            raise self._crash_error(w, env_index)
        request = next(self._requests)
        later: list[tuple[_Worker, tuple[Any, ...]]] = []
        try:
            if w.state == "starting":
                (frame,) = chan.recv_blocking(limit=1)
                self._on_meta(w, frame[0])
            out, w.outbox = w.outbox, []
            chan.send([*out, ("attr", request, env_index, name)])
            chan.flush_blocking()
            while request not in self._replies:
                for frame in chan.recv_blocking():
                    for msg in frame:
                        if msg[0] == "attr":
                            self._replies[msg[1]] = (msg[2], msg[3])
                        else:
                            later.append((w, msg))
        except ChannelClosed:
            self._defer(self._worker_died, w)
            raise self._crash_error(w, env_index, "during an attribute read") from None
        finally:
            for item in later:
                self._defer(self._on_message, *item)
        code, data = self._replies.pop(request)
        if code == FAILED:
            exc, _ = pickle.loads(data)
            raise exc
        return pickle.loads(data)

    def _defer(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon(fn, *args)
        else:
            fn(*args)
