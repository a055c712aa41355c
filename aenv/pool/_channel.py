"""Length-prefixed pickled frames over one Unix socket, without ever blocking an event loop.

The process backend's control plane: one socket pair per worker. Both ends write without
blocking (what the kernel does not take at once is buffered and written from a
``loop.add_writer`` callback), so two ends sending large frames at the same time cannot
deadlock; both read from a ``loop.add_reader`` callback that takes whatever is there and
parses every complete frame. The ``*_blocking`` methods serve the moments without a running
loop (the start-up handshake, synchronous attribute reads).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Channel", "ChannelClosed"]

_HEADER = struct.Struct("!Q")
_READ_SIZE = 1 << 18


class ChannelClosed(ConnectionError):
    """Raised when the other end of a channel is gone (EOF or a broken socket)."""


class Channel:
    """One end of a framed socket (see the module docstring).

    Args:
        sock: a connected stream socket; it is switched to non-blocking mode.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self._rbuf = bytearray()
        self._wbuf = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writing = False
        self.closed = False
        #: frames sent and frames parsed, counted from the start: a peer told how many
        #: were sent knows without a read whether any waits for it (the doorbell's)
        self.sent = 0
        self.received = 0

    # ------------------------------------------------------------------ loop wiring
    def attach(self, loop: asyncio.AbstractEventLoop, on_readable: Callable[[], None]) -> None:
        """Watch the socket from ``loop`` (moving from a previous loop if any)."""
        self.detach()
        self._loop = loop
        loop.add_reader(self.fd, on_readable)
        if self._wbuf:
            self._want_write()

    def detach(self) -> None:
        """Stop watching the socket (from a loop that may already be closed)."""
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed() or self.closed:
            self._writing = False
            return
        loop.remove_reader(self.fd)
        if self._writing:
            loop.remove_writer(self.fd)
            self._writing = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    # ------------------------------------------------------------------ writing
    def send(self, obj: Any) -> None:
        """Queue one frame; written at once where the socket takes it, later otherwise."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.send_bytes(_HEADER.pack(len(data)) + data)

    def send_bytes(self, frame: bytes) -> None:
        if self.closed:
            raise ChannelClosed("the channel is closed")
        self.sent += 1
        if self._wbuf:
            self._wbuf += frame
            return
        try:
            n = self.sock.send(frame)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        if n < len(frame):
            self._wbuf += frame[n:]
            self._want_write()

    def _want_write(self) -> None:
        if self._loop is not None and not self._writing and not self._loop.is_closed():
            self._loop.add_writer(self.fd, self._on_writable)
            self._writing = True

    def _on_writable(self) -> None:
        try:
            n = self.sock.send(self._wbuf)
        except BlockingIOError:
            return
        except OSError:
            # The peer is gone; the reader sees EOF and reports it.
            self._wbuf.clear()
            n = 0
        del self._wbuf[:n]
        if not self._wbuf and self._loop is not None:
            self._loop.remove_writer(self.fd)
            self._writing = False

    def flush_blocking(self, timeout: float | None = None) -> None:
        """Write everything queued, waiting for the socket as needed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._wbuf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, w, _ = select.select([], [self.fd], [], left)
            if not w:
                raise TimeoutError("the peer did not read its socket in time")
            try:
                n = self.sock.send(self._wbuf)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc
            del self._wbuf[:n]

    def send_fds(self, fds: list[int]) -> None:
        """Pass file descriptors (one marker byte); nothing may be queued before them."""
        self.flush_blocking()
        socket.send_fds(self.sock, [b"F"], fds)

    def recv_fds(self, most: int, timeout: float | None = None) -> list[int]:
        """Receive the descriptors (at most ``most``) sent with :meth:`send_fds`
        (blocking)."""
        self._wait_readable(timeout)
        msg, fds, _, _ = socket.recv_fds(self.sock, 1, most)
        if not msg or not fds:
            for fd in fds:
                os.close(fd)
            raise ChannelClosed("the peer closed the channel during the handshake")
        return fds

    @property
    def buffered(self) -> int:
        """Bytes read and kept for a frame not whole yet."""
        return len(self._rbuf)

    @property
    def pending(self) -> bool:
        """Whether bytes wait to be written (a frame sent now would go out after them)."""
        return bool(self._wbuf)

    # ------------------------------------------------------------------ reading
    def read_frames(self) -> list[Any]:
        """Everything readable now, parsed into objects.

        Raises:
            ChannelClosed: the peer closed its end (after the frames read before the EOF
                were consumed: call again to get them first).
        """
        try:
            chunk = self.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        if not chunk:
            raise ChannelClosed("the peer closed the channel")
        if self._rbuf:
            self._rbuf += chunk
            return self._parse(self._rbuf)
        # common case: the chunk holds whole frames only; skip the buffer copy
        frames, used = _split(chunk)
        self.received += len(frames)
        if used < len(chunk):
            # the start of a frame (all of the chunk when one frame outgrows a read)
            self._rbuf += chunk[used:]
        return frames

    def _parse(self, buf: bytearray) -> list[Any]:
        frames, used = _split(buf)
        del buf[:used]
        self.received += len(frames)
        return frames

    def take_buffered(self) -> list[Any]:
        """The whole frames already read from the socket but not yet returned."""
        return self._parse(self._rbuf) if self._rbuf else []

    def recv_blocking(self, timeout: float | None = None, limit: int | None = None) -> list[Any]:
        """Wait until at least one whole frame is here; return the frames read (at most
        ``limit``; the others stay buffered)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            frames, used = _split(self._rbuf, limit)
            if frames:
                del self._rbuf[:used]
                self.received += len(frames)
                return frames
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._wait_readable(left)
            try:
                chunk = self.sock.recv(_READ_SIZE)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc
            if not chunk:
                raise ChannelClosed("the peer closed the channel")
            self._rbuf += chunk

    def _wait_readable(self, timeout: float | None) -> None:
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            raise TimeoutError("no message from the peer in time")

    def close(self) -> None:
        if self.closed:
            return
        self.detach()
        self.closed = True
        self._wbuf.clear()
        self.sock.close()


def _split(buf: bytes | bytearray, limit: int | None = None) -> tuple[list[Any], int]:
    """Whole frames at the start of ``buf`` and the number of bytes they use."""
    frames: list[Any] = []
    pos = 0
    size = len(buf)
    hsize = _HEADER.size
    view = memoryview(buf)
    try:
        while size - pos >= hsize and (limit is None or len(frames) < limit):
            (n,) = _HEADER.unpack_from(buf, pos)
            end = pos + hsize + n
            if end > size:
                break
            frames.append(pickle.loads(view[pos + hsize : end]))
            pos = end
    finally:
        view.release()
    return frames, pos
