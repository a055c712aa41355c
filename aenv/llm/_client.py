"""An async client of OpenAI-compatible chat-completions servers (vLLM, SGLang, llama.cpp,
Ollama, OpenAI itself), on ``httpx``.

Errors are data: :meth:`ChatClient.chat` returns a :class:`ChatResult` whatever happened
(a reply, an HTTP error, a timeout, a refused connection), after retrying what may pass
(connection errors, timeouts, 408, 409, 429, 5xx) with exponential backoff and jitter
(honouring ``Retry-After``). Only cancellation propagates. A :class:`Limiter` caps the
requests in flight.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aenv.exceptions import BackendUnavailableError
from aenv.llm._history import History, Message
from aenv.llm._limiter import Limiter
from aenv.llm._tools import Tool, tool_schema

try:
    import httpx
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise BackendUnavailableError(
        "aenv.llm.ChatClient needs httpx: pip install 'aenv[llm]'"
    ) from _exc

__all__ = ["ChatClient", "ChatResult"]

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
_PER_POOL = 16  # connections per httpx pool (see ChatClient.__init__)


@dataclass(frozen=True)
class ChatResult:
    """The outcome of one chat-completions call.

    ``messages`` holds one assistant :class:`Message` per choice (empty on error);
    ``error`` says what went wrong (None when it did not), ``status`` is the last HTTP
    status (None when no response came), ``attempts`` counts the requests sent.
    """

    messages: tuple[Message, ...] = ()
    finish_reasons: tuple[str, ...] = ()
    usage: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None
    status: int | None = None
    attempts: int = 0
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether a reply came back."""
        return self.error is None and bool(self.messages)

    @property
    def message(self) -> Message | None:
        """The first choice's message (None on error)."""
        return self.messages[0] if self.messages else None


class ChatClient:
    """Async client of an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: the model name sent with each request.
        api_key: sent as a bearer token when given.
        max_concurrency: requests in flight at once (a :class:`Limiter`, or pass
            ``limiter=`` to share one, e.g. by name across clients).
        timeout: seconds for one request (connect, read and write each).
        max_retries: retries after the first attempt for errors that may pass.
        backoff_s: the first retry's delay; doubles each time, up to ``max_backoff_s``,
            with full jitter (seeded by ``seed``).

    Example:
        >>> import asyncio
        >>> from aenv.llm import ChatClient, FakeChatServer, History
        >>> async def main():
        ...     async with FakeChatServer() as server, ChatClient(server.url) as client:
        ...         res = await client.chat(History().add("user", "hi"))
        ...         return res.ok, res.message.content
        >>> asyncio.run(main())
        (True, 'echo: hi')
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "default",
        api_key: str | None = None,
        max_concurrency: int | None = 64,
        limiter: Limiter | str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        seed: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        if isinstance(limiter, str):
            limiter = Limiter.named(limiter)
        self.limiter = limiter if limiter is not None else Limiter(max_concurrency)
        self._rng = random.Random(seed)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        cap = self.limiter.max_concurrent
        # httpcore's pool scans every connection for every queued request: its cost grows
        # with connections x requests in flight. Several small pools (requests spread
        # round-robin) keep that product small at hundreds of concurrent requests.
        n_pools = 1 if transport is not None else max(1, math.ceil((cap or 256) / _PER_POOL))
        per_pool = math.ceil(cap / n_pools) if cap else None
        self._pools = [
            httpx.AsyncClient(
                timeout=httpx.Timeout(timeout),
                headers=headers,
                limits=httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool),
                transport=transport,
            )
            for _ in range(n_pools)
        ]
        self._next_pool = 0

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def request_body(
        self,
        messages: History | Sequence[Message] | Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Tool] | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """The JSON body of a request (``params`` such as ``n``, ``temperature``,
        ``max_tokens`` or ``seed`` are passed through; None values are dropped)."""
        if isinstance(messages, History):
            wire = messages.to_openai()
        else:
            wire = [m.to_openai() if isinstance(m, Message) else dict(m) for m in messages]
        body: dict[str, Any] = {"model": self.model, "messages": wire}
        if tools:
            body["tools"] = [tool_schema(t) for t in tools]
        body.update({k: v for k, v in params.items() if v is not None})
        return body

    async def chat(
        self,
        messages: History | Sequence[Message] | Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Tool] | None = None,
        **params: Any,
    ) -> ChatResult:
        """One completion (``n=`` for several choices); see the class doc for errors."""
        body = self.request_body(messages, tools=tools, **params)
        start = time.monotonic()
        async with self.limiter.slot():
            result = await self._with_retries(body)
        return _with_latency(result, time.monotonic() - start)

    async def _with_retries(self, body: dict[str, Any]) -> ChatResult:
        url = f"{self.base_url}/chat/completions"
        attempt = 0
        while True:
            attempt += 1
            wait: float | None = None
            http = self._pools[self._next_pool]
            self._next_pool = (self._next_pool + 1) % len(self._pools)
            try:
                resp = await http.post(url, json=body)
            except httpx.TimeoutException as exc:
                result = ChatResult(
                    error=f"timed out after {self.timeout} s ({type(exc).__name__})"
                )
            except httpx.TransportError as exc:
                result = ChatResult(error=f"{type(exc).__name__}: {exc}")
            else:
                result = _parse(resp)
                if resp.status_code not in _RETRY_STATUS:
                    return _with_attempts(result, attempt)
                wait = _retry_after(resp)
            if attempt > self.max_retries:
                return _with_attempts(result, attempt)
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
            await asyncio.sleep(wait if wait is not None else self._rng.uniform(0, delay))


def _parse(resp: httpx.Response) -> ChatResult:
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code != 200:
        detail = ""
        if isinstance(data, dict):
            err = data.get("error")
            detail = err.get("message", "") if isinstance(err, dict) else str(err or "")
        return ChatResult(
            error=f"HTTP {resp.status_code}: {detail or resp.text[:200]}", status=resp.status_code
        )
    try:
        choices = data["choices"]
        msgs = tuple(Message.from_dict({**c["message"], "role": "assistant"}) for c in choices)
        reasons = tuple(str(c.get("finish_reason") or "") for c in choices)
    except (TypeError, KeyError, ValueError) as exc:
        return ChatResult(error=f"malformed reply ({exc!r}): {resp.text[:200]}", status=200)
    return ChatResult(
        messages=msgs, finish_reasons=reasons, usage=dict(data.get("usage") or {}), status=200
    )


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _with_attempts(result: ChatResult, attempts: int) -> ChatResult:
    return ChatResult(**{**result.__dict__, "attempts": attempts})


def _with_latency(result: ChatResult, latency: float) -> ChatResult:
    return ChatResult(**{**result.__dict__, "latency_s": latency})
