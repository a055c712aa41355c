"""The Ray backend's faults (see :mod:`aenv.pool._ray`): giving an env up, an actor that
dies or stops answering, and restarting it with fresh envs.

:class:`RayFaults` is a mixin of :class:`~aenv.pool._ray.RayBackend`: it holds no state of
its own and works on the backend's (declared here for the type checker).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
from collections.abc import Callable
from typing import Any

from aenv.exceptions import WorkerCrashedError
from aenv.pool._backend import Deliver, Failure
from aenv.pool._channel import Channel, ChannelClosed
from aenv.pool._ray_actor import Item
from aenv.pool._ray_cluster import kill_actors

__all__ = ["RayFaults"]


class _Group:
    """The envs of one actor, and the actor now hosting them."""

    __slots__ = (
        "actor",
        "blob",
        "calls",
        "chan",
        "failure",
        "gen",
        "gid",
        "indices",
        "outbox",
        "pid",
        "quiet",
        "stacks",
        "state",
        "watch",
    )

    def __init__(self, gid: int, indices: list[int], blob: bytes) -> None:
        self.gid = gid
        self.indices = indices
        self.blob = blob
        self.actor: Any = None
        self.gen = 0
        self.pid: int | None = None
        # "starting" (not yet answered), "ready", "broken" (dead, not restarted), "closed"
        self.state = "starting"
        self.failure: Failure | None = None
        self.watch: concurrent.futures.Future[Any] | None = None
        # operations submitted since the last flush, ``exchange`` calls of this actor in
        # flight, and whether the last empty ``exchange`` came back empty (the actor runs
        # nothing: no need to hold one open until something is sent)
        self.outbox: list[Item] = []
        self.calls = 0
        self.quiet = False
        # the actor's direct channel (transport="socket"), and its whole-batch steps in
        # flight on it by call id (see aenv.pool._ray_wire)
        self.chan: Channel | None = None
        self.stacks: dict[int, asyncio.Future[Any]] = {}


class RayFaults:
    """Fault handling of :class:`~aenv.pool._ray.RayBackend` (a mixin)."""

    _ray: Any
    _deliver: Deliver
    _groups: list[_Group]
    _group_of: list[_Group]
    _pending: list[int | None]
    _lost: list[str | None]
    _held: dict[int, tuple[str, Any]]
    _replacing: dict[int, tuple[int, asyncio.TimerHandle | None]]
    _kill_reasons: dict[tuple[int, int], str]
    _seq: itertools.count[int]
    _loop: asyncio.AbstractEventLoop | None
    _closing: bool
    _handles: list[Any]
    restart_actors: bool
    replace_timeout: float
    _bind: Callable[[], asyncio.AbstractEventLoop]
    _hop: Callable[..., Callable[[Any], None]]
    _send: Callable[[int, str, Any], None]
    _spawn: Callable[..., None]
    _dial: Callable[[_Group, Any], None]
    _drop_wire: Callable[[_Group, BaseException], None]
    _flush_soon: Callable[[], None]

    def replace(self, env_index: int) -> None:
        loop = self._bind()
        self._pending[env_index] = None
        self._held.pop(env_index, None)
        if self._lost[env_index] is not None:
            self._lost[env_index] = None  # fresh since its actor was restarted
            return
        g = self._group_of[env_index]
        if g.failure is not None or g.state == "closed" or env_index in self._replacing:
            return
        seq = next(self._seq)
        future = g.actor.replace.remote(env_index, seq).future()
        timer = None
        if g.state == "ready":  # (a starting actor answers once started: timed from then)
            timer = loop.call_later(self.replace_timeout, self._unresponsive, g, g.gen, env_index)
        self._replacing[env_index] = (seq, timer)
        future.add_done_callback(self._hop(self._on_replaced, env_index, seq, g.gen))

    def _on_replaced(self, i: int, seq: int, gen: int, future: Any) -> None:
        entry = self._replacing.get(i)
        if entry is None or entry[0] != seq:
            return
        exc = future.exception()
        if isinstance(exc, self._ray.exceptions.RayActorError):
            self._actor_died(self._group_of[i], gen, exc)  # (a new actor takes env i's work)
            return
        del self._replacing[i]
        if entry[1] is not None:
            entry[1].cancel()
        held = self._held.pop(i, None)
        if held is not None:
            self._send(i, *held)

    def _unresponsive(self, g: _Group, gen: int, i: int) -> None:
        if g.gen != gen or i not in self._replacing or self._closing:
            return
        reason = (
            f"was killed after env {i} was given up and the actor did not answer within "
            f"{self.replace_timeout} s"
        )
        self._kill_reasons[(g.gid, gen)] = reason
        self._restart(g, reason)

    # ------------------------------------------------------------------ faults
    def _on_watch(self, g: _Group, gen: int, future: Any) -> None:
        exc = future.exception()
        if exc is not None:
            self._actor_died(g, gen, exc)

    def _on_ready(self, g: _Group, gen: int, future: Any) -> None:
        if g.gen != gen or g.state != "starting":
            return
        try:
            g.pid, _, _, address = future.result()
        except Exception as exc:
            self._actor_died(g, gen, exc)
            return
        try:
            self._dial(g, address)
        except Exception as exc:
            kill_actors(self._ray, [g.actor])
            self._break(g, f"could not be reached ({_first_line(exc)})")
            return
        g.state = "ready"
        self._flush_soon()  # (what was submitted while it started)
        loop = self._loop
        assert loop is not None
        for i in g.indices:
            entry = self._replacing.get(i)
            if entry is not None and entry[1] is None:
                timer = loop.call_later(self.replace_timeout, self._unresponsive, g, gen, i)
                self._replacing[i] = (entry[0], timer)

    def _actor_died(self, g: _Group, gen: int, exc: BaseException) -> None:
        if g.gen != gen or self._closing or g.state in ("broken", "closed"):
            return
        reason = self._kill_reasons.get((g.gid, gen)) or f"died ({_first_line(exc)})"
        if g.state == "starting" or not self.restart_actors:
            self._break(g, reason)
            return
        self._restart(g, reason)

    def _restart(self, g: _Group, reason: str) -> None:
        """Kill ``g``'s actor (if still alive) and start a new one with fresh envs; the
        operations in flight on the old one (or not yet sent to it) fail."""
        old, pid = g.actor, g.pid
        with contextlib.suppress(ValueError):
            self._handles.remove(old)
        kill_actors(self._ray, [old])
        lost = f"Ray actor {g.gid} (pid {pid}) {reason}"
        self._drop_wire(g, ChannelClosed(lost))
        for i in g.indices:
            self._lost[i] = lost
        failed = self._take_pending(g)
        self._spawn(g, want_meta=False)
        assert g.actor is not None
        g.actor.ready.remote().future().add_done_callback(self._hop(self._on_ready, g, g.gen))
        # an env being replaced is fresh in the new actor: its held work goes there
        for i in g.indices:
            entry = self._replacing.pop(i, None)
            if entry is None:
                continue
            if entry[1] is not None:
                entry[1].cancel()
            self._lost[i] = None
            held = self._held.pop(i, None)
            if held is not None:
                self._send(i, *held)
        for i in failed:
            err = WorkerCrashedError(f"env {i}: its {lost}", env_index=i)
            self._deliver(i, Failure(err, ""))

    def _take_pending(self, g: _Group) -> list[int]:
        """Forget the operations of ``g``'s envs in flight or still to send; their envs."""
        g.outbox = []
        pending = self._pending
        failed = [i for i in g.indices if pending[i] is not None]
        for i in failed:
            pending[i] = None
        return failed

    def _break(self, g: _Group, reason: str) -> None:
        """``g``'s actor died and is not restarted: its envs' work fails from now on."""
        g.state = "broken"
        err = WorkerCrashedError(
            f"Ray actor {g.gid} (envs {g.indices}) {reason} and was not restarted"
        )
        g.failure = Failure(err, "")
        self._drop_wire(g, ChannelClosed(str(err)))
        with contextlib.suppress(ValueError):
            self._handles.remove(g.actor)
        failed = set(self._take_pending(g))
        for i in g.indices:
            if i in failed or i in self._held:
                self._held.pop(i, None)
                self._deliver(i, g.failure)
            entry = self._replacing.pop(i, None)
            if entry is not None and entry[1] is not None:
                entry[1].cancel()


def _ignore(ref: Any) -> None:
    """Fetch a fire-and-forget call's outcome, so Ray does not report it as unhandled."""
    ref.future().add_done_callback(concurrent.futures.Future.exception)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
