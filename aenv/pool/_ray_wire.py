"""The Ray backend's direct channel: a TCP connection from the driver to each actor.

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
and takes the first connection that presents the pool's token (16 random bytes the driver
made and handed to the actor with its constructor, through Ray); any other connection is
closed. Frames are :mod:`aenv.pool._channel`'s (length-prefixed pickles), written without
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
import pickle
import socket
from typing import Any

from aenv.pool._channel import _HEADER, Channel, ChannelClosed

__all__ = ["ActorWire", "DriverWire", "dial", "frame_bytes", "send_frame"]

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


def dial(address: tuple[str, int], token: bytes, timeout: float = AUTH_TIMEOUT_S) -> Channel:
    """Connect to an actor's channel and present the token (blocking: the connection is
    made by the kernel, from the actor's listening backlog, without the actor's help)."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        _nodelay(sock)
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

    async def stacked(
        self, op: str, packed: Any, local: Any, step_timeout: Any, whole: bool = False
    ) -> Any:
        raise NotImplementedError

    async def _listen(self, token: bytes) -> tuple[str, int]:
        """Open the listening socket on this node's address; accept in the background."""
        import ray  # (in the actor's process, which Ray started)

        host = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.bind((host, 0))
            listener.listen(8)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._accepting = asyncio.get_running_loop().create_task(self._accept(listener, token))
        return host, listener.getsockname()[1]

    async def _accept(self, listener: socket.socket, token: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                conn, _ = await loop.sock_accept(listener)
                try:
                    got = await asyncio.wait_for(_recv_exactly(loop, conn, len(token)), 5.0)
                except Exception:  # a stranger that said nothing, or a broken connection
                    conn.close()
                    continue
                if hmac.compare_digest(got, token):
                    break
                conn.close()
        finally:
            listener.close()
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
                task = asyncio.get_running_loop().create_task(self._stacked_frame(*frame[1:]))
                self._stacking.add(task)
                task.add_done_callback(self._stacking.discard)
            elif kind == "c":
                self._cancel_now(frame[1], frame[2])
        self._push_soon()

    async def _stacked_frame(self, cid: int, *args: Any) -> None:
        answer = await self.stacked(*args)
        self._send(("S", cid, answer))

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

    def _dial(self, g: Any, address: tuple[str, int] | None) -> None:
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
