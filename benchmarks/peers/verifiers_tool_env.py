"""verifiers 0.3.1's ``ToolEnv`` on bench_llm's loopback servers, with its own rollout.

The workload of ``benchmarks/bench_llm.py``: ``episodes`` concurrent episodes, each ``turns``
calls of a ``remote`` tool and a final answer, against bench_llm's fake OpenAI-compatible
model server and its loopback tool server (each call's latency is in its arguments, set by
the model per episode and turn). Only this script's process runs verifiers.

How verifiers' users run it: one ``vf.ToolEnv(tools=[remote], max_turns=turns + 1)``; the
tool is an ``async`` Python function (verifiers builds its JSON schema from the signature
and docstring) that POSTs to the tool server with one shared ``httpx.AsyncClient``; the
model is reached through verifiers' ``OpenAIChatCompletionsClient`` around an
``openai.AsyncOpenAI`` pointed at the model server, which answers with OpenAI
``tool_calls``. Each episode is one ``await env.rollout(input, client, model)`` (verifiers'
multi-turn loop: prompt, model, ``env_response`` running the tool calls, stop conditions),
all episodes gathered on one event loop, as ``env.generate`` does without its scoring.

Reported: ``episode_s`` (each episode's rollout time in the best round), ``wall_s`` and the
wall time of every round; a warm-up round of all episodes runs first. A rollout that ends
with an error, or without ``turns`` tool results and the answer, fails the run.

Params (JSON object in argv[1]):
    model_url, tool_url (str): the servers' base URLs (``http://127.0.0.1:PORT/v1``).
    episodes (int): concurrent episodes. Default 256; quick 32.
    turns (int): tool turns per episode. Default 3; quick 2.
    rounds (int): measured rounds, best wall time kept. Default 2; quick 1.

Run: ``benchmarks/_venvs/verifiers031/bin/python benchmarks/peers/verifiers_tool_env.py
'{"model_url": "...", "tool_url": "..."}'`` (bench_llm starts the servers and runs it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {
    "model_url": "",
    "tool_url": "",
    "episodes": 256,
    "turns": 3,
    "rounds": 2,
}
QUICK: dict[str, Any] = {"episodes": 32, "turns": 2, "rounds": 1}


async def _measure(p: dict[str, Any]) -> dict[str, Any]:
    import httpx
    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    n, turns = int(p["episodes"]), int(p["turns"])
    # no connection cap: the aenv rows' clients have none either
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    tool_http = httpx.AsyncClient(timeout=120, limits=limits)
    tool_url = p["tool_url"].rstrip("/") + "/chat/completions"

    async def remote(seconds: float) -> str:
        """Wait on the loopback tool server.

        Args:
            seconds: how long the server waits before answering.
        """
        reply = await tool_http.post(
            tool_url,
            json={
                "model": "tool",
                "messages": [{"role": "user", "content": "x"}],
                "seconds": seconds,
            },
        )
        reply.raise_for_status()
        return str(reply.json()["choices"][0]["message"]["content"])

    def prompt(e: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"openai episode {e}"}]

    # verifiers wants a dataset at construction; rollouts below take their inputs directly
    dataset = Dataset.from_list([{"prompt": prompt(e), "answer": ""} for e in range(n)])
    env = vf.ToolEnv(tools=[remote], max_turns=turns + 1, eval_dataset=dataset)
    openai = AsyncOpenAI(
        base_url=p["model_url"],
        api_key="unused",
        timeout=120,
        max_retries=0,
        http_client=httpx.AsyncClient(timeout=120, limits=limits),
    )
    client = OpenAIChatCompletionsClient(openai)

    async def episode(e: int) -> float:
        start = time.perf_counter()
        state = await env.rollout(
            {"prompt": prompt(e), "answer": "", "example_id": e}, client, "fake"
        )
        took = time.perf_counter() - start
        if state.get("error") is not None:
            raise RuntimeError(f"episode {e} failed: {state['error']!r}")
        done = state["completion"]
        tools = sum(m.role == "tool" for m in done)
        if tools != turns or not str(done[-1].content or "").startswith("done after"):
            raise RuntimeError(f"episode {e} ended wrong: {done[-3:]}")
        return took

    walls: list[float] = []
    best: tuple[float, list[float]] | None = None
    try:
        for r in range(int(p["rounds"]) + 1):  # round 0 warms up
            t0 = time.perf_counter()
            each = list(await asyncio.gather(*(episode(e) for e in range(n))))
            wall = time.perf_counter() - t0
            if r:
                walls.append(wall)
                if best is None or wall < best[0]:
                    best = (wall, each)
    finally:
        await tool_http.aclose()
        await openai.close()
    assert best is not None
    return {
        "driver": "verifiers 0.3.1 ToolEnv.rollout",
        "episode_s": best[1],
        "wall_s": best[0],
        "round_walls_s": walls,
        "verifiers": vf.__version__,
    }


def workload(p: dict[str, Any]) -> dict[str, Any]:
    if not p["model_url"] or not p["tool_url"]:
        raise SystemExit("model_url and tool_url are required (bench_llm starts the servers)")
    return asyncio.run(_measure(p))


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
