"""Blocking JSON POSTs to a loopback HTTP server over keep-alive connections (stdlib only).

For peer drivers whose library has no HTTP client of its own (TorchRL's LLM envs call sync
Python functions): each thread keeps one ``http.client`` connection per server and re-uses
it, as ``requests.Session`` would, so no request pays a TCP handshake.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any
from urllib.parse import urlsplit

__all__ = ["JsonPoster"]


class JsonPoster:
    """POSTs JSON bodies to ``base_url + path`` and returns the decoded JSON reply.

    Example:
        >>> poster = JsonPoster("http://127.0.0.1:8000/v1")  # doctest: +SKIP
        >>> poster.post("/chat/completions", {"messages": []})  # doctest: +SKIP
    """

    def __init__(self, base_url: str, timeout: float = 120.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"expected http://HOST:PORT[/prefix], got {base_url!r}")
        self.host, self.port = parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One request on this thread's connection; raises on a non-200 answer."""
        body = json.dumps(payload).encode()
        conn = self._conn()
        try:
            conn.request("POST", self.prefix + path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (http.client.HTTPException, OSError):
            # a broken keep-alive connection: drop it so the next call opens a fresh one
            conn.close()
            self._local.conn = None
            raise
        if resp.status != 200:
            raise RuntimeError(f"POST {path} answered {resp.status}: {data[:300]!r}")
        out: dict[str, Any] = json.loads(data)
        return out

    def close(self) -> None:
        """Closes every thread's connection."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
