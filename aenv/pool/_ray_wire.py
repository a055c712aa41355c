"""The Ray backend's direct channel: a socket from the driver to each actor.

A Ray actor call costs ~1.3 ms of the driver's CPU and ~1.6 ms of the actor's on these
2-core machines (3 ms wall per round trip); a framed message over a TCP socket between the
same two processes costs ~0.1 ms on each side (measured side by side on one actor, see
``benchmarks/RESULTS.md``). So Ray places, starts, watches and kills the actors,
and the steps travel over a socket each actor opens for its pool (``transport="socket"``,
the default): the pool's operations submitted in one turn of its loop go to an actor in one
frame, and the actor pushes the results finished in one turn of its own loop in one frame,
as they finish (no call held open, nothing polled: the socket's fd is watched by each
side's event loop). ``transport="ray"`` keeps every step on Ray actor calls, for drivers that
cannot reach the actors' nodes directly (a ``ray://`` client outside the cluster's network).

The actor listens on its node's address (the one Ray reports), on a port the kernel picks,
and (on Linux) on a Unix socket under a random name in the abstract namespace; it takes the
first connection, on either, that presents the pool's token (16 random bytes the driver
made and handed to the actor with its constructor, through Ray); any other connection is
closed. A driver on the actor's host (and network namespace) reaches the Unix socket, which
costs a third of a TCP frame's CPU on each side here; elsewhere nothing listens under that
name and the driver connects over TCP. Frames are :mod:`aenv.pool._channel`'s (length-prefixed pickles), written without
blocking either loop. Frames, driver to actor: ``("x", items)`` operations (as
:meth:`~aenv.pool._ray_actor.EnvActor.exchange` takes them), ``("s", call id, op, packed,
local, step_timeout, whole)`` a whole-batch step (:meth:`~aenv.pool._ray_actor.EnvActor.stacked`),
``("c", env index, seq)`` a cancel; actor to driver: ``("r", results)`` finished operations,
``("S", call id, packed)`` a whole-batch step's answer. An actor's process that dies closes
its socket: the driver reads EOF at once (Ray's held ``watch`` call reports it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import os
import pickle
import secrets
import socket
import sys
from collections.abc import Coroutine
from typing import Any

from aenv.pool._channel import _HEADER, Channel, ChannelClosed

__all__ = ["ActorWire", "Address", "DriverWire", "dial", "frame_bytes", "send_frame"]

#: where a driver reaches an actor's channel: its TCP host and port, and the name of its
#: abstract Unix socket (None where it has none)
Address = tuple[str, int, "str | None"]

#: seconds a connection to an actor has to present the token, and the driver to connect
AUTH_TIMEOUT_S = 30.0


def frame_bytes(obj: Any) -> bytes:
    """One frame: plain pickle, or cloudpickle for what plain pickle cannot take (a lambda
    passed to ``call``), as Ray would have pickled it. Raises when neither can."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        import cloudpickle

        data = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def send_frame(chan: Channel, obj: Any) -> None:
    """Send ``obj`` as one frame on ``chan`` (see :func:`frame_bytes`)."""
    chan.send_bytes(frame_bytes(obj))


def _nodelay(sock: socket.socket) -> None:
    # small frames both ways, each awaited: Nagle's delay would add tens of ms per step
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def dial(
    address: Address,
    token: bytes,
    timeout: float = AUTH_TIMEOUT_S,
) -> Channel:
    """Connect to an actor's channel and present the token (blocking: the connection is
    made by the kernel, from the actor's listening backlog, without the actor's help).

    ``address`` is the actor's TCP address, and the name of its abstract Unix socket where
    it opened one: an actor on this host (and network namespace) is reached through that
    (a third of a TCP frame's cost on each side here); elsewhere, nothing listens under
    that name on this host and the TCP address is used."""
    local = address[2]
    sock = None
    if local is not None and hasattr(socket, "AF_UNIX"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect("\0" + local)
        except OSError:
            sock.close()
            sock = None
    if sock is None:
        sock = socket.create_connection((address[0], address[1]), timeout=timeout)
        _nodelay(sock)
    try:
        sock.sendall(token)
    except BaseException:
        sock.close()
        raise
    return Channel(sock)


class ActorWire:
    """The actor's end of the channel (a mixin of :class:`~aenv.pool._ray_actor.EnvActor`):
    listen, accept the driver, read its frames and push the results."""

    chan: Channel | None
    finished: list[tuple[int, int, Any]]
    _pushing: bool
    _stacking: set[asyncio.Task[Any]]
    _accepting: asyncio.Task[None] | None

    def _start_all(self, items: list[Any]) -> None:  # (EnvActor's)
        raise NotImplementedError

    def _cancel_now(self, i: int, seq: int) -> None:  # (EnvActor's)
        raise NotImplementedError

    def stacked_inline(
        self, op: str, packed: Any, local: Any, step_timeout: Any, whole: bool = False
    ) -> Any:
        raise NotImplementedError

    async def _listen(self, token: bytes) -> Address:
        """Open the listening sockets: TCP on this node's address, and a Unix socket in the
        abstract namespace that a driver on the same host (and network namespace) reaches
        instead; accept in the background."""
        import ray  # (in the actor's process, which Ray started)

        host = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listeners: list[socket.socket] = []
        local: str | None = None
        try:
            listener = socket.socket(family, socket.SOCK_STREAM)
            listeners.append(listener)
            listener.bind((host, 0))
            if hasattr(socket, "AF_UNIX") and sys.platform.startswith("linux"):
                unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listeners.append(unix)
                local = f"aenv-ray-{os.getpid()}-{secrets.token_hex(8)}"
                unix.bind("\0" + local)
            for sock in listeners:
                sock.listen(8)
                sock.setblocking(False)
        except BaseException:
            for sock in listeners:
                sock.close()
            raise
        self._accepting = asyncio.get_running_loop().create_task(self._accept(listeners, token))
        return host, listener.getsockname()[1], local

    async def _accept(self, listeners: list[socket.socket], token: bytes) -> None:
        """Take the first connection, on any of ``listeners``, that presents ``token``."""
        loop = asyncio.get_running_loop()
        waiting = {loop.create_task(loop.sock_accept(sock)): sock for sock in listeners}
        try:
            while True:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                conn = None
                for task in done:
                    sock = waiting.pop(task)
                    if task.exception() is not None:  # (that listener is broken: drop it)
                        if not waiting:
                            raise task.exception()  # type: ignore[misc]
                        continue
                    waiting[loop.create_task(loop.sock_accept(sock))] = sock
                    candidate, _ = task.result()
                    try:
                        got = await asyncio.wait_for(
                            _recv_exactly(loop, candidate, len(token)), 5.0
                        )
                    except Exception:  # a stranger that said nothing, or a broken connection
                        candidate.close()
                        continue
                    if conn is None and hmac.compare_digest(got, token):
                        conn = candidate
                    else:
                        candidate.close()
                if conn is not None:
                    break
        finally:
            for task in waiting:
                task.cancel()
            for sock in listeners:
                sock.close()
        if conn.family != socket.AF_UNIX:
            _nodelay(conn)
        self.chan = Channel(conn)
        self.chan.attach(loop, self._on_readable)
        self._push_soon()  # (results finished before the driver connected)

    def _on_readable(self) -> None:
        chan = self.chan
        assert chan is not None
        try:
            frames = chan.read_frames()
        except ChannelClosed:  # the driver is gone (its pool closed): nobody to answer
            chan.close()
            self.chan = None
            return
        for frame in frames:
            kind = frame[0]
            if kind == "x":
                self._start_all(frame[1])
            elif kind == "s":
                out = self.stacked_inline(*frame[2:])
                if type(out) is tuple:  # (answered inline: the rows' case)
                    self._send(("S", frame[1], out))
                    continue
                task = asyncio.get_running_loop().create_task(self._stacked_frame(frame[1], out))
                self._stacking.add(task)
                task.add_done_callback(self._stacking.discard)
            elif kind == "c":
                self._cancel_now(frame[1], frame[2])
        self._push_soon()

    async def _stacked_frame(self, cid: int, rest: Coroutine[Any, Any, Any]) -> None:
        self._send(("S", cid, await rest))

    def _push_soon(self) -> None:
        """Push the finished results at the end of this turn of the loop (one frame for
        all that finish in it)."""
        if self.chan is not None and not self._pushing:
            self._pushing = True
            asyncio.get_running_loop().call_soon(self._push)

    def _push(self) -> None:
        self._pushing = False
        if self.finished and self.chan is not None:
            answer, self.finished = self.finished, []
            self._send(("r", answer))

    def _send(self, frame: Any) -> None:
        chan = self.chan
        if chan is None:
            return
        try:
            send_frame(chan, frame)
        except ChannelClosed:
            return
        except Exception:  # a result neither pickle takes: send the others, fail that one
            if frame[0] != "r":
                raise
            for item in frame[1]:
                try:
                    send_frame(chan, ("r", [item]))
                except ChannelClosed:
                    return
                except Exception as exc:
                    from aenv.pool._ray_actor import portable
                    from aenv.pool._ray_codec import pack

                    send_frame(chan, ("r", [(item[0], item[1], pack(portable(exc)))]))


async def _recv_exactly(loop: asyncio.AbstractEventLoop, conn: socket.socket, n: int) -> bytes:
    conn.setblocking(False)
    got = b""
    while len(got) < n:
        chunk = await loop.sock_recv(conn, n - len(got))
        if not chunk:
            raise ConnectionError("closed before presenting the token")
        got += chunk
    return got


class DriverWire:
    """The driver's end of the channels (a mixin of :class:`~aenv.pool._ray.RayBackend`,
    with no state of its own: each actor's channel is its group's ``chan``)."""

    _token: bytes | None
    _loop: asyncio.AbstractEventLoop | None
    _actor_died: Any
    _on_answer: Any
    _break: Any
    _flush_soon: Any

    def _dial(self, g: Any, address: Address | None) -> None:
        """Connect to the channel of ``g``'s (new) actor; watch it from the pool's loop
        when there is one."""
        if self._token is None:
            return
        if address is None:
            raise RuntimeError(f"the Ray actor for envs {g.indices} opened no channel")
        try:
            g.chan = dial(tuple(address), self._token)  # type: ignore[arg-type]
        except OSError as exc:
            raise ConnectionError(
                f"cannot reach the Ray actor for envs {g.indices} at {address[0]}:{address[1]} "
                f"({exc}); where the driver cannot reach the cluster's nodes directly, pass "
                'backend_options={"transport": "ray"}'
            ) from exc
        if self._loop is not None:
            self._watch_wire(g)

    def _watch_wire(self, g: Any) -> None:
        loop = self._loop
        if g.chan is not None and loop is not None and g.chan.loop is not loop:
            g.chan.attach(loop, functools.partial(self._on_wire, g, g.gen))

    def _on_wire(self, g: Any, gen: int) -> None:
        chan = g.chan
        if chan is None:
            return
        try:
            frames = chan.read_frames()
        except ChannelClosed as exc:  # the actor's process is gone
            self._actor_died(g, gen, exc)
            if g.chan is chan:
                self._drop_wire(g, exc)
            return
        for frame in frames:
            if frame[0] == "r":
                self._on_answer(g, frame[1])
            elif frame[0] == "S":
                future = g.stacks.pop(frame[1], None)
                if future is not None and not future.done():
                    future.set_result(frame[2])

    def _wire_send(self, g: Any, frame: Any) -> bool:
        """Send ``frame`` to ``g``'s actor; False when its channel is gone (the actor died:
        what was in flight fails as its death is handled). Raises for a frame that cannot
        be pickled."""
        chan = g.chan
        if chan is None:
            return False
        data = frame_bytes(frame)
        try:
            chan.send_bytes(data)
        except ChannelClosed:
            return False
        return True

    def _drop_wire(self, g: Any, exc: BaseException) -> None:
        """Close ``g``'s channel; its whole-batch steps in flight fail with ``exc``."""
        chan, g.chan = g.chan, None
        if chan is not None:
            chan.close()
        stacks, g.stacks = g.stacks, {}
        for future in stacks.values():
            if not future.done():
                future.set_exception(exc)
