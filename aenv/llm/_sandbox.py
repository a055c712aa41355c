"""Running untrusted programs in a subprocess: limits, capped output, nothing left behind.

Each run starts in a new session (so a new process group) with ``resource`` limits set in
the child before ``exec``, a marker in its environment, and ``PR_SET_PDEATHSIG`` (Linux) so
it dies with the thread that started it. When the run ends, for whatever reason (normal
exit, wall-time timeout, output cap, cancellation of the awaiting task, :meth:`kill_all`
from another thread, the sandbox's close, the interpreter's exit), the whole process group
is killed, and then every process still carrying the run's marker in its environment, which
catches ``setsid`` escapees that left the group. Repeat until none is found.

Limits of this (a subprocess sandbox, not a container): a process that re-executes itself
with a cleared environment *and* leaves the session escapes the sweep; a hard kill of the
process that started a run (``SIGKILL``) takes the run's first process down through the death
signal, but not its own children: where that process is a process pool's worker, the pool
kills them when it sees the worker die (each run's environment names the process that
started it). A process cap (``RLIMIT_NPROC``) counts every process of
the user and does not apply to root: run as root, give ``user=`` (e.g. ``"nobody"``) for it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio

from aenv.exceptions import SandboxError
from aenv.llm._limiter import Limiter
from aenv.pool._process_support import OWNER_VAR, SCRATCH_PREFIX

__all__ = ["SandboxLimits", "SandboxResult", "SubprocessSandbox", "live_sandboxes"]

MARKER = "AENV_SANDBOX_RUN"

# every live run of this process: token -> process group id (for kill_all, atexit)
_live: dict[str, int] = {}
_live_lock = threading.Lock()


def live_sandboxes() -> int:
    """How many sandbox runs of this process are live now (started, not yet killed)."""
    with _live_lock:
        return len(_live)


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run.

    Attributes:
        wall_time_s: seconds before the run is killed and reported ``timed_out``.
        cpu_time_s: CPU seconds per process (``RLIMIT_CPU``).
        memory_bytes: address space per process (``RLIMIT_AS``).
        max_processes: processes of the run's user (``RLIMIT_NPROC``; see the module doc).
        max_output_bytes: stdout and stderr kept (each); past it the run is killed and
            reported ``truncated``.
        max_file_bytes: largest file the run may write (``RLIMIT_FSIZE``).
    """

    wall_time_s: float = 10.0
    cpu_time_s: float | None = None
    memory_bytes: int | None = None
    max_processes: int | None = None
    max_output_bytes: int = 1 << 16
    max_file_bytes: int | None = None


@dataclass(frozen=True)
class SandboxResult:
    """What a run gave: its output (decoded, capped), exit code (negative: killed by that
    signal; None: not known), whether it ran past its wall time, whether output was cut."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        """Exited with code 0, in time, with all of its output."""
        return self.exit_code == 0 and not self.timed_out and not self.truncated


def _resolve_user(user: str | int | None) -> tuple[int, int] | None:
    if user is None:
        return None
    import pwd

    try:
        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except KeyError:
        raise SandboxError(f"no such user {user!r} to run the sandbox as") from None
    return entry.pw_uid, entry.pw_gid


def _prctl() -> Any:
    """libc's prctl, looked up in the parent: the child between fork and exec should not
    load libraries (locks held by other threads at the fork would never be released)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return None


_PRCTL = _prctl()
_PR_SET_PDEATHSIG = 1


def _cloexec_inherited() -> None:
    """In the child before ``exec``: mark every descriptor above stderr close-on-exec.

    The loop's spawn need not close them: uvloop's ignores ``close_fds`` and passes every
    inheritable descriptor on (a forkserver worker's socket to its pool is one), and a run
    left holding that socket hides the worker's death from the pool, which then never
    sweeps what the run started. The spawn's own pipes are dup'ed onto 0-2 afterwards
    (``dup2`` clears the flag) or are close-on-exec already."""
    try:
        fds: Any = [
            int(n)
            for n in os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd")
        ]
    except OSError:
        fds = range(3, 4096)
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):  # (the listing's own, closed since)
                os.set_inheritable(fd, False)


def _preexec(limits: SandboxLimits, ids: tuple[int, int] | None, parent: int) -> Any:
    cpu = None if limits.cpu_time_s is None else max(1, math.ceil(limits.cpu_time_s))
    wanted: list[tuple[int, float | int | None]] = [
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_NPROC, limits.max_processes),
        (resource.RLIMIT_FSIZE, limits.max_file_bytes),
        (resource.RLIMIT_CORE, 0),
    ]
    caps = [(which, int(value)) for which, value in wanted if value is not None]

    def run() -> None:  # in the child, between fork and exec
        _cloexec_inherited()
        for which, value in caps:
            resource.setrlimit(which, (value, value))
        if ids is not None:
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])
        # after the uid change, which clears the death signal: die with the thread that
        # started the run (a worker killed hard takes its runs along)
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before the prctl
                os._exit(137)

    return run


def _marked_pids(token: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``token``."""
    needle = f"{MARKER}={token}".encode()
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:  # gone, or not ours to read
            continue
        if state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def _kill_run(token: str, pgid: int) -> None:
    """Kill the run's process group, then its marked stragglers, until none is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if not os.path.isdir("/proc"):
        return
    for _ in range(50):  # a fork storm may add processes between a scan and its kills
        pids = _marked_pids(token)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)  # let the kernel tear them down before the next scan


def _kill_all_live() -> None:
    with _live_lock:
        runs = list(_live.items())
    for token, pgid in runs:
        _kill_run(token, pgid)


atexit.register(_kill_all_live)


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Return once the process has exited (whatever its pipes do)."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return  # gone (and reaped) already
    except (AttributeError, OSError):  # no pidfd here: also waits for the pipes (the
        await proc.wait()  # wall time still bounds it)
        return
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        loop.remove_reader(fd)
        os.close(fd)


class SubprocessSandbox:
    """Runs programs in subprocesses under :class:`SandboxLimits`; see the module doc.

    Args:
        limits: the default limits of a run (each run may override them).
        user: a user name or uid to run as (needs root; makes ``max_processes`` apply).
        env: extra environment variables of each run (the environment is otherwise
            minimal: ``PATH``, ``HOME`` = the run's scratch dir, ``LANG``).
        limiter: a :class:`Limiter` (or its name) each run holds a slot of.
        python: the interpreter of :meth:`run_python`.

    Example:
        >>> import asyncio
        >>> from aenv.llm import SandboxLimits, SubprocessSandbox
        >>> box = SubprocessSandbox(SandboxLimits(wall_time_s=5))
        >>> res = asyncio.run(box.run_python("print(6 * 7)"))
        >>> res.stdout, res.exit_code, res.timed_out
        ('42\\n', 0, False)
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        user: str | int | None = None,
        env: Mapping[str, str] | None = None,
        limiter: Limiter | str | None = None,
        python: str = sys.executable,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.user = user
        self._ids = _resolve_user(user)
        self.extra_env = dict(env or {})
        self.limiter = Limiter.named(limiter) if isinstance(limiter, str) else limiter
        self.python = python
        self._runs: dict[str, int] = {}  # this sandbox's live runs (token -> pgid)
        self._closed = False

    @property
    def live_runs(self) -> int:
        """How many runs of this sandbox are live now."""
        with _live_lock:
            return len(self._runs)

    async def run_python(
        self, code: str, *, stdin: str | None = None, limits: SandboxLimits | None = None
    ) -> SandboxResult:
        """Run ``code`` as a Python script (``main.py`` in a scratch directory)."""
        return await self.run(
            [self.python, "-I", "main.py"], files={"main.py": code}, stdin=stdin, limits=limits
        )

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, str] | None = None,
        stdin: str | None = None,
        limits: SandboxLimits | None = None,
    ) -> SandboxResult:
        """Run ``argv`` in a fresh scratch directory holding ``files``.

        Returns whatever happened as a :class:`SandboxResult`; raises only for a sandbox
        that is closed or a run that could not start (:class:`SandboxError`). Cancelling the
        awaiting task kills the run (its whole process group) before the cancellation goes on.
        """
        if self._closed:
            raise SandboxError("the sandbox is closed")
        lim = limits or self.limits
        if self.limiter is None:
            return await self._run(argv, files, stdin, lim)
        async with self.limiter.slot():
            return await self._run(argv, files, stdin, lim)

    def with_limits(self, **changes: Any) -> SandboxLimits:
        """The sandbox's limits with some fields changed."""
        return replace(self.limits, **changes)

    def kill_all(self) -> None:
        """Kill every live run of this sandbox now; safe from any thread (the awaiting
        tasks then see their runs end, killed)."""
        with _live_lock:
            runs = list(self._runs.items())
        for token, pgid in runs:
            _kill_run(token, pgid)

    async def aclose(self) -> None:
        """Kill every live run; later runs raise :class:`SandboxError`."""
        self._closed = True
        self.kill_all()

    # ------------------------------------------------------------------ one run
    def _environment(self, workdir: str, token: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": workdir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            **self.extra_env,
        }
        env[MARKER] = token
        # the pid of this process: a process pool that sees its worker killed sweeps up
        # what the worker's runs started (aenv.pool._process_support.kill_owned)
        env[OWNER_VAR] = str(os.getpid())
        return env

    def _scratch(self, files: Mapping[str, str] | None) -> str:
        # (named by this process: a worker that dies leaves it to kill_owned to remove)
        workdir = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        for name, text in (files or {}).items():
            path = os.path.join(workdir, name)
            if os.path.dirname(os.path.abspath(path)) != workdir:
                shutil.rmtree(workdir, ignore_errors=True)
                raise SandboxError(f"sandbox file names must be plain names, got {name!r}")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        if self._ids is not None:
            for name in [".", *(files or {})]:
                os.chown(os.path.join(workdir, name), *self._ids)
        return workdir

    async def _run(
        self,
        argv: Sequence[str],
        files: Mapping[str, str] | None,
        stdin: str | None,
        lim: SandboxLimits,
    ) -> SandboxResult:
        token = uuid.uuid4().hex
        workdir = await anyio.to_thread.run_sync(self._scratch, files)
        start = time.monotonic()
        proc = None
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE
                    if stdin is not None
                    else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    cwd=workdir,
                    env=self._environment(workdir, token),
                    start_new_session=True,
                    preexec_fn=_preexec(lim, self._ids, os.getpid()),
                )
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                raise SandboxError(f"could not start {list(argv)[:3]}: {exc}") from exc
            with _live_lock:  # the new session's id is the child's pid
                _live[token] = self._runs[token] = proc.pid
            return await self._supervise(proc, token, stdin, lim, start)
        finally:
            # whatever ended the run (cancellation included): nothing of it may survive.
            # Synchronous, so that no second cancellation (a pool closing an env whose
            # step it already cancelled) can cut the clean-up short; it takes milliseconds.
            if proc is not None:
                _kill_run(token, proc.pid)
                with _live_lock:
                    _live.pop(token, None)
                    self._runs.pop(token, None)
            shutil.rmtree(workdir, ignore_errors=True)
            if proc is not None and proc.returncode is None:
                # reap it (killed: at once); if cancelled again, the child watcher reaps it
                with anyio.CancelScope(shield=True):
                    await proc.wait()

    async def _supervise(
        self,
        proc: asyncio.subprocess.Process,
        token: str,
        stdin: str | None,
        lim: SandboxLimits,
        start: float,
    ) -> SandboxResult:
        cap = lim.max_output_bytes
        bufs = {"stdout": bytearray(), "stderr": bytearray()}
        truncated = False

        async def pump(name: str, stream: asyncio.StreamReader | None) -> None:
            nonlocal truncated
            if stream is None:
                return
            buf = bufs[name]
            while chunk := await stream.read(1 << 16):
                room = cap - len(buf)
                buf += chunk[: max(room, 0)]
                if len(chunk) > room:
                    truncated = True
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)  # a flood ends the run
                    return

        async def feed() -> None:
            if proc.stdin is None:
                return
            with contextlib.suppress(OSError):  # the program need not read it all
                proc.stdin.write((stdin or "").encode())
                await proc.stdin.drain()
            proc.stdin.close()

        timed_out = False
        with anyio.move_on_after(lim.wall_time_s) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pump, "stdout", proc.stdout)
                tg.start_soon(pump, "stderr", proc.stderr)
                tg.start_soon(feed)
                # not proc.wait(): asyncio's waits for the pipes to close too, and a child
                # left behind may hold them open
                await _exited(proc)
                # the run's first process is done: what it left behind goes with it (and
                # holds the pipes open no longer)
                await anyio.to_thread.run_sync(_kill_run, token, proc.pid)
                await proc.wait()
        if scope.cancelled_caught:
            timed_out = True
            await anyio.to_thread.run_sync(_kill_run, token, proc.pid)
            with anyio.CancelScope(shield=True):
                await proc.wait()
        return SandboxResult(
            stdout=bufs["stdout"].decode("utf-8", "replace"),
            stderr=bufs["stderr"].decode("utf-8", "replace"),
            exit_code=proc.returncode,
            timed_out=timed_out,
            truncated=truncated,
            duration_s=time.monotonic() - start,
        )
