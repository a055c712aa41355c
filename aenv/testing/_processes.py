"""Checking that nothing a test started is still running (sandboxes, workers, their
children, and ``setsid`` escapees that left both the process tree and the group)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["assert_no_leaked_processes", "sandbox_processes"]

_MARKER = b"AENV_SANDBOX_RUN="


def _alive(proc: Any) -> bool:
    import psutil

    try:
        return proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def sandbox_processes() -> list[Any]:
    """Live processes of the machine started by an aenv sandbox run (``psutil.Process``)."""
    import psutil

    out = []
    for pid in psutil.pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if _MARKER not in f.read():
                    continue
        except OSError:
            continue
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if _alive(proc):
                out.append(proc)
    return out


def _multiprocessing_helpers() -> set[int]:
    """multiprocessing's forkserver and resource tracker: started on first use, kept for
    the life of the interpreter by design, so not a leak of the block that started them."""
    pids = set()
    with contextlib.suppress(Exception):
        from multiprocessing import forkserver, resource_tracker

        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if pid:
            pids.add(pid)
        pid = getattr(resource_tracker._resource_tracker, "_pid", None)
        if pid:
            pids.add(pid)
    return pids


@contextlib.contextmanager
def assert_no_leaked_processes(timeout: float = 10.0) -> Iterator[None]:
    """Fail if, once the block is done, a process it started is still alive.

    "Started by the block": a descendant of this process that was not there before it, or
    any process carrying an aenv sandbox marker (which finds escapees re-parented away
    from this process). Killed processes take a moment to go: the check waits up to
    ``timeout`` seconds for them before failing (and then kills them, so that one failing
    test does not poison the next). Zombies are dead and do not count.

    Example:
        >>> from aenv.testing import assert_no_leaked_processes
        >>> with assert_no_leaked_processes():
        ...     pass
    """
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + timeout
    while True:
        before |= _multiprocessing_helpers()
        leaked = {p.pid: p for p in me.children(recursive=True) if p.pid not in before}
        leaked.update((p.pid, p) for p in sandbox_processes())
        alive = [p for p in leaked.values() if _alive(p)]
        if not alive:
            return
        if time.monotonic() > deadline:
            described = []
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    described.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:80]!r}")
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)
            raise AssertionError(f"{len(alive)} leaked process(es): {described}")
        time.sleep(0.02)
