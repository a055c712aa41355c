"""A small OpenAI-compatible chat-completions server on loopback, with a deterministic
fake model behind it: for tests, examples and benchmarks of model clients and agent loops.

It speaks just enough HTTP/1.1 (keep-alive, ``Content-Length`` bodies) on an asyncio server,
serves ``POST /v1/chat/completions`` and ``GET /v1/models``, and can be told to fail or
hang the next requests, to add latency, and to count what it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

__all__ = ["FakeChatServer", "echo_model"]

#: ``model(request, choice_index)`` -> an assistant message dict (``content`` and, maybe,
#: ``tool_calls`` in OpenAI's form); may be ``async``.
FakeModel = Callable[[dict[str, Any], int], "dict[str, Any] | Awaitable[dict[str, Any]]"]


def echo_model(request: dict[str, Any], index: int) -> dict[str, Any]:
    """The default fake model: repeats the last user message."""
    last: dict[str, Any] = next(
        (m for m in reversed(request["messages"]) if m.get("role") == "user"), {}
    )
    return {"role": "assistant", "content": f"echo: {last.get('content', '')}"}


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}


class FakeChatServer:
    """An OpenAI-compatible server on ``127.0.0.1`` (a free port), model ``model``.

    Use as ``async with FakeChatServer(model) as server:`` in the loop of its clients, or
    ``with FakeChatServer(model).in_thread() as server:`` to serve from a thread of its own
    (its own event loop), e.g. for benchmarks that must not share the clients' loop.

    Args:
        model: the fake model (see :data:`FakeModel`); default :func:`echo_model`.
        latency_s: seconds each completion waits before answering (a float, or a function
            of the request).

    Example:
        >>> import asyncio, json, urllib.request
        >>> from aenv.llm import FakeChatServer
        >>> with FakeChatServer().in_thread() as server:
        ...     body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        ...     req = urllib.request.Request(server.url + "/chat/completions", body.encode(),
        ...                                  {"Content-Type": "application/json"})
        ...     reply = json.load(urllib.request.urlopen(req))
        >>> reply["choices"][0]["message"]["content"]
        'echo: hi'
    """

    def __init__(
        self,
        model: FakeModel | None = None,
        *,
        latency_s: float | Callable[[dict[str, Any]], float] = 0.0,
    ) -> None:
        self.model = model or echo_model
        self.latency_s = latency_s
        self.requests = 0
        self.completions = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        self._faults: list[tuple[str, Any]] = []
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing: asyncio.Event | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The base URL clients take (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------ fault injection
    def fail_next(self, n: int, status: int = 500, *, retry_after: float | None = None) -> None:
        """The next ``n`` completions answer ``status`` with an error body."""
        self._faults.extend([("status", (status, retry_after))] * n)

    def hang_next(self, n: int) -> None:
        """The next ``n`` completions never answer (until the server closes)."""
        self._faults.extend([("hang", None)] * n)

    def drop_next(self, n: int) -> None:
        """The next ``n`` completions close the connection without answering."""
        self._faults.extend([("drop", None)] * n)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> FakeChatServer:
        self._closing = asyncio.Event()
        self._server = await asyncio.start_server(self._serve_conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        if self._server is None:
            return
        self._server.close()
        # end the connections by closing them, not by cancelling their tasks (asyncio's
        # stream server logs a cancelled handler as an error)
        if self._closing is not None:
            self._closing.set()
        for writer in list(self._writers):
            writer.close()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> FakeChatServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[FakeChatServer]:
        """Serve from a daemon thread running its own event loop, for the block."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        stop: list[asyncio.Event] = []

        async def main() -> None:
            await self.start()
            stop.append(asyncio.Event())
            ready.set()
            await stop[0].wait()
            await self.aclose()

        thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
        thread.start()
        ready.wait(30)
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(stop[0].set)
            thread.join(30)
            loop.close()

    # ------------------------------------------------------------------ HTTP
    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests += 1
                keep = await self._handle(method, path, body, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass  # the client went away
        finally:
            self._conns.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(
        self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        if method == "GET" and path.rstrip("/").endswith("/models"):
            await self._send(writer, 200, {"object": "list", "data": [{"id": "fake"}]})
            return True
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            await self._send(writer, 404, {"error": {"message": f"no route {method} {path}"}})
            return True
        try:
            request = json.loads(body)
            messages = request["messages"]
            if not isinstance(messages, list):
                raise ValueError("messages must be a list")
        except (ValueError, KeyError, TypeError) as exc:
            await self._send(writer, 400, {"error": {"message": f"bad request: {exc}"}})
            return True
        self.bodies.append(request)
        fault = self._faults.pop(0) if self._faults else None
        if fault is not None and fault[0] == "drop":
            return False
        if fault is not None and fault[0] == "hang":
            assert self._closing is not None
            await self._closing.wait()  # until the server closes
            return False
        if fault is not None and fault[0] == "status":
            status, retry_after = fault[1]
            extra = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            await self._send(writer, status, {"error": {"message": "injected"}}, extra)
            return True
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            delay = self.latency_s(request) if callable(self.latency_s) else self.latency_s
            if delay:
                await asyncio.sleep(delay)
            reply = await self._complete(request)
        except Exception as exc:  # a broken fake model: say so, as a server would
            await self._send(writer, 500, {"error": {"message": f"model raised {exc!r}"}})
            return True
        finally:
            self.in_flight -= 1
        self.completions += 1
        await self._send(writer, 200, reply)
        return True

    async def _complete(self, request: dict[str, Any]) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for i in range(int(request.get("n") or 1)):
            msg = self.model(request, i)
            if asyncio.iscoroutine(msg):
                msg = await msg
            assert isinstance(msg, dict)
            msg = {"role": "assistant", "content": msg.get("content") or "", **msg}
            reason = "tool_calls" if msg.get("tool_calls") else "stop"
            choices.append({"index": i, "message": msg, "finish_reason": reason})
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in request["messages"])
        out_tokens = sum(len(str(c["message"]["content"]).split()) for c in choices)
        return {
            "id": f"chatcmpl-{self.completions}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "fake"),
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": out_tokens,
                "total_tokens": prompt_tokens + out_tokens,
            },
        }

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter,
        status: int,
        payload: Any,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()
