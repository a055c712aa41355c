"""Tool-calling episodes: a model client, a ToolEnv and one coroutine per episode.

A small deterministic fake model serves the OpenAI chat-completions API on 127.0.0.1 (swap
its URL for a vLLM / SGLang / llama.cpp / Ollama server to run a real one). Each episode
(one coroutine, run by ``aenv.agents.run_episodes``) asks an arithmetic question; the model
answers it with tool calls (two at once on the first turn, run concurrently by the env),
reads the results, and gives its answer, which the scorer checks. Some questions ask for a tool that does not exist: the env answers
with an error message instead of raising, and the model gives up on them.

Run: ``python examples/tool_calling.py``
"""

from __future__ import annotations

import asyncio
import json
import re

from tensordict import NonTensorData

from aenv import AsyncEnvPool
from aenv.agents import run_episodes
from aenv.llm import ChatClient, FakeChatServer, FunctionTool, ToolEnv, get_data

N_EPISODES = 16


# ---------------------------------------------------------------- tools
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


async def add(a: int, b: int) -> int:
    """Add two integers (a remote service: it takes a while)."""
    await asyncio.sleep(0.01)
    return a + b


TOOLS = [FunctionTool(multiply), FunctionTool(add)]


# ---------------------------------------------------------------- the fake model
def fake_model(request: dict, index: int) -> dict:
    """Turn 1: ask for a*b and c+0 at once; turn 2: add them; turn 3: answer."""
    msgs = request["messages"]
    question = next(m["content"] for m in msgs if m["role"] == "user")
    a, b, c = map(int, re.findall(r"\d+", question)[:3])
    results = [m for m in msgs if m["role"] == "tool"]
    if "cube root" in question and not results:
        return _calls(("cube_root", {"x": a}))
    if results and results[-1]["content"].startswith("unknown tool"):
        return {"content": "I cannot answer that."}
    if not results:
        return _calls(("multiply", {"a": a, "b": b}), ("add", {"a": c, "b": 0}))
    if len(results) == 2:
        return _calls(("add", {"a": int(results[0]["content"]), "b": int(results[1]["content"])}))
    return {"content": f"The answer is {results[-1]['content']}."}


def _calls(*calls: tuple[str, dict]) -> dict:
    return {
        "content": "",
        "tool_calls": [
            {"id": f"call_{name}_{k}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for k, (name, args) in enumerate(calls)
        ],
    }  # fmt: skip


def score(history, answer) -> float:
    found = re.search(r"The answer is (-?\d+)", history[-1].content)
    return float(found is not None and int(found.group(1)) == answer)


# ---------------------------------------------------------------- episodes
async def main() -> None:
    prompts = []
    for i in range(N_EPISODES):
        a, b, c = 3 + i, 7 + 2 * i, 100 + i
        if i % 4 == 3:
            prompts.append(
                {"prompt": f"What is the cube root of {a**3} (then {b}, {c})?", "answer": a}
            )
        else:
            prompts.append({"prompt": f"What is {a} * {b} + {c}?", "answer": a * b + c})
    async with FakeChatServer(fake_model, latency_s=0.02) as server:
        async with ChatClient(server.url, model="fake", max_concurrency=8) as client:

            async def policy(td):  # one episode's turn: ask the model, answer the env
                reply = await client.chat(get_data(td, "history"), tools=TOOLS)
                if not reply.ok:
                    raise RuntimeError(reply.error)  # the runner ends the episode with it
                return td.set("response", NonTensorData(reply.message))

            make = lambda: ToolEnv(TOOLS, scorer=score, per_call_timeout=5.0, max_turns=4)  # noqa: E731
            async with AsyncEnvPool([make] * 8) as pool:  # 8 envs serve 16 episodes
                episodes = []
                async with run_episodes(pool, policy, prompts, emit="episodes") as stream:
                    async for ep in stream:  # one coroutine per episode, streamed as they end
                        episodes.append(ep)
    episodes.sort(key=lambda ep: ep.prompt_index)
    for ep in episodes[:4]:
        history = ep.final_observation["history"]
        errors = sum(m.is_error for m in history)
        print(
            f"episode {ep.prompt_index}: {len(ep)} turns, reward {ep.total_reward}, "
            f"{errors} tool error(s), ended: {ep.done_reason}"
        )
    solved = sum(ep.total_reward for ep in episodes)
    errors = sum(sum(m.is_error for m in ep.final_observation["history"]) for ep in episodes)
    print(
        f"{N_EPISODES} episodes, {solved:.0f} solved, {errors} tool errors turned into "
        f"messages, {server.completions} model calls, at most {server.max_in_flight} in flight"
    )
    assert solved == N_EPISODES - N_EPISODES // 4  # the cube-root questions fail


if __name__ == "__main__":
    asyncio.run(main())
