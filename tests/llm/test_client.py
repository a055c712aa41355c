"""ChatClient against a real HTTP server on loopback (FakeChatServer)."""

from __future__ import annotations

import asyncio
import json
import socket

import anyio
import pytest

pytest.importorskip("httpx")

from aenv.llm import ChatClient, FakeChatServer, FunctionTool, History, Limiter, Message


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def tool_model(request, index):
    """Calls ``add`` when tools are offered and no tool answered yet; then answers."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return {"content": f"it is {last['content']}"}
    if request.get("tools"):
        args = json.dumps({"a": 2, "b": index + 1})
        return {
            "content": "",
            "tool_calls": [
                {
                    "id": f"c{index}",
                    "type": "function",
                    "function": {"name": "add", "arguments": args},
                }
            ],
        }
    return {"content": f"choice {index}"}


def fast_client(server, **kw):
    kw.setdefault("backoff_s", 0.001)
    kw.setdefault("seed", 0)
    return ChatClient(server.url, model="fake", **kw)


async def test_completion_with_choices_usage_and_tools():
    async with FakeChatServer(tool_model) as server, fast_client(server) as client:
        res = await client.chat(History().add("user", "hi"), n=2, temperature=0.5)
        assert res.ok and [m.content for m in res.messages] == ["choice 0", "choice 1"]
        assert res.finish_reasons == ("stop", "stop") and res.usage["total_tokens"] > 0
        assert server.bodies[-1]["temperature"] == 0.5 and server.bodies[-1]["model"] == "fake"
        h = History().add("user", "2+1?")
        res = await client.chat(h, tools=[FunctionTool(add)])
        call = res.message.tool_calls[0]
        assert (call.name, call.arguments, call.id) == ("add", {"a": 2, "b": 1}, "c0")
        assert res.finish_reasons == ("tool_calls",)
        assert server.bodies[-1]["tools"][0]["function"]["name"] == "add"
        h = h.append(res.message).add("tool", "3", tool_call_id="c0", name="add")
        res = await client.chat(h)
        assert res.message == Message("assistant", "it is 3")
        assert server.bodies[-1]["messages"][1]["tool_calls"][0]["function"]["arguments"] == (
            '{"a": 2, "b": 1}'
        )


async def test_retries_server_errors_with_backoff_then_succeeds():
    async with FakeChatServer() as server, fast_client(server, max_retries=3) as client:
        server.fail_next(2, 503)
        res = await client.chat([{"role": "user", "content": "x"}])
        assert res.ok and res.attempts == 3 and res.message.content == "echo: x"
        server.fail_next(1, 429, retry_after=0.01)
        res = await client.chat([{"role": "user", "content": "y"}])
        assert res.ok and res.attempts == 2
        server.drop_next(1)  # connection closed without a reply
        res = await client.chat([{"role": "user", "content": "z"}])
        assert res.ok and res.attempts == 2


async def test_errors_are_data():
    async with FakeChatServer() as server, fast_client(server, max_retries=2) as client:
        server.fail_next(3, 500)
        res = await client.chat([{"role": "user", "content": "x"}])
        assert not res.ok and res.status == 500 and res.attempts == 3
        assert "HTTP 500: injected" in res.error and res.message is None
        server.fail_next(1, 400)
        res = await client.chat([{"role": "user", "content": "x"}])
        assert res.status == 400 and res.attempts == 1  # not retried
    async with (
        FakeChatServer() as server,
        fast_client(server, timeout=0.2, max_retries=1) as client,
    ):
        server.hang_next(2)
        res = await client.chat([{"role": "user", "content": "x"}])
        assert not res.ok and "timed out" in res.error and res.attempts == 2
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with ChatClient(f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.001) as client:
        res = await client.chat([{"role": "user", "content": "x"}])
        assert not res.ok and res.status is None and "Connect" in res.error


@pytest.mark.timeout(60)
async def test_concurrency_cap_and_shared_limiter():
    async with FakeChatServer(latency_s=0.02) as server:
        async with fast_client(server, max_concurrency=3) as client:
            results = await asyncio.gather(
                *(client.chat([{"role": "user", "content": str(i)}]) for i in range(24))
            )
        assert all(r.ok for r in results) and server.max_in_flight == 3
        assert [r.message.content for r in results] == [f"echo: {i}" for i in range(24)]
        server.max_in_flight = 0
        shared = Limiter(2)
        async with (
            fast_client(server, limiter=shared) as a,
            fast_client(server, limiter=shared) as b,
        ):
            await asyncio.gather(*(c.chat([{"role": "user", "content": "x"}]) for c in [a, b] * 6))
        assert server.max_in_flight == 2 and shared.peak == 2


@pytest.mark.timeout(30)
async def test_cancelling_a_call_frees_its_slot():
    async with FakeChatServer() as server, fast_client(server, max_concurrency=1) as client:
        server.hang_next(1)
        with anyio.move_on_after(0.3):
            await client.chat([{"role": "user", "content": "stuck"}])
        assert client.limiter.active == 0
        res = await client.chat([{"role": "user", "content": "next"}])
        assert res.ok and res.message.content == "echo: next"


async def test_server_refuses_bad_requests():
    import httpx

    async with FakeChatServer() as server, httpx.AsyncClient() as http:
        r = await http.post(server.url + "/chat/completions", content=b"{bad")
        assert r.status_code == 400 and "bad request" in r.json()["error"]["message"]
        r = await http.get(server.url + "/nope")
        assert r.status_code == 404
        r = await http.get(server.url + "/models")
        assert r.json()["data"][0]["id"] == "fake"


@pytest.mark.timeout(60)
async def test_hundreds_of_uncapped_requests_spread_over_pools():
    async with FakeChatServer(latency_s=0.01) as server:
        async with fast_client(server, max_concurrency=None) as client:
            assert len(client._pools) > 1  # several small connection pools
            results = await asyncio.gather(
                *(client.chat([{"role": "user", "content": str(i)}]) for i in range(200))
            )
        assert [r.message.content for r in results] == [f"echo: {i}" for i in range(200)]
        assert server.max_in_flight > 16  # not capped by one pool's connections
